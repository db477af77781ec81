"""The collator: examples tokenized once and padded into micro-batches, hard negatives and all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from medfaq.summarizer.training.examples import Example


@dataclass
class Batch:
    """One micro-batch. Seq2seq: `source` is the CHQ, `labels` the FAQ. Decoder-only: `source` is CHQ + separator +
    FAQ + EOS and `labels` is -100 except on the FAQ and EOS. `keys` holds the FAQs (B rows) followed by the valid
    hard negatives, for one batched key-encoder pass; `negative_mask` (B, n_h) marks which slots those fill.
    `candidates` (variant rank): the FAQ's and then its hard negatives' target tokens, (B, 1 + n_h, T) padded with
    -100 (empty slots are all -100)."""

    ids: torch.Tensor
    source: dict[str, torch.Tensor]
    anchor_mask: torch.Tensor  # (B, T_source): the CHQ tokens the anchor is pooled over
    labels: torch.Tensor
    keys: dict[str, torch.Tensor]  # input_ids, attention_mask, pool_mask: (B + valid negatives, T)
    negative_mask: torch.Tensor
    candidates: torch.Tensor | None = None

    def to(self, device: str) -> Batch:
        def move(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {key: value.to(device) for key, value in tensors.items()}

        return Batch(
            self.ids.to(device),
            move(self.source),
            self.anchor_mask.to(device),
            self.labels.to(device),
            move(self.keys),
            self.negative_mask.to(device),
            None if self.candidates is None else self.candidates.to(device),
        )


@dataclass(frozen=True)
class EncodedExample:
    """An example's token ids, computed once per run."""

    source: list[int]
    anchor: list[int]  # 1 where `source` holds a CHQ token the anchor pools over
    labels: list[int]
    keys: list[list[int]]  # the FAQ, then its hard negatives
    key_pools: list[list[int]]
    targets: list[list[int]]  # rank: the FAQ's and its hard negatives' target tokens (else empty)


def pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad integer rows to one (N, T) tensor."""
    width = max((len(row) for row in rows), default=1) or 1
    return torch.tensor([list(row) + [value] * (width - len(row)) for row in rows], dtype=torch.long)


class Collator:
    """Tokenizes each example once (cached by id) and pads batches; hard negatives fill up to `n_hard` slots.

    `causal`: the decoder-only layout (see :class:`Batch`). `strip_start`: a token id dropped from the front of the
    labels (BERT2BERT: its decoder starts from [CLS], so [CLS] is no target). `rank_targets`: also the target tokens of
    the FAQ and its hard negatives (`Batch.candidates`).
    """

    def __init__(
        self,
        tokenizer,
        max_source_len: int,
        max_target_len: int,
        n_hard: int,
        causal: bool = False,
        strip_start: int | None = None,
        rank_targets: bool = False,
    ):
        self.tokenizer, self.n_hard, self.causal, self.strip_start = tokenizer, n_hard, causal, strip_start
        self.rank_targets = rank_targets
        self.max_source_len, self.max_target_len = max_source_len, max_target_len
        self.special = set(tokenizer.all_special_ids)
        self._cache: dict[int, EncodedExample] = {}

    def _ids(self, text: str, max_len: int) -> list[int]:
        return self.tokenizer(text, max_length=max_len, truncation=True)["input_ids"]

    def _pool(self, ids: list[int]) -> list[int]:
        """Decoder-only keys pool over text tokens only (Gemma's BOS state is huge and the same for every input)."""
        return [int(not self.causal or token not in self.special) for token in ids]

    def _target(self, text: str) -> list[int]:
        from medfaq.summarizer.likelihood import target_ids

        return target_ids(self.tokenizer, text, self.max_target_len, self.causal, self.strip_start)

    def encode(self, example: Example) -> EncodedExample:
        cached = self._cache.get(example.id)
        if cached is not None:
            return cached
        texts = (example.faq, *example.negatives[: self.n_hard])
        keys = [self._ids(text, self.max_target_len) for text in texts]
        targets = [self._target(text) for text in (texts if self.rank_targets else texts[:1])]
        if self.causal:
            from medfaq.summarizer.modeling import prompt_ids

            prompt, n_question = prompt_ids(self.tokenizer, example.chq, self.max_source_len)
            source, labels = prompt + targets[0], [-100] * len(prompt) + targets[0]
            anchor = [int(i < n_question and token not in self.special) for i, token in enumerate(source)]
        else:
            source = self._ids(example.chq, self.max_source_len)
            anchor = [1] * len(source)
            labels = targets[0]
        pools = [self._pool(ids) for ids in keys]
        encoded = EncodedExample(source, anchor, labels, keys, pools, targets if self.rank_targets else [])
        self._cache[example.id] = encoded
        return encoded

    def __call__(self, examples: Sequence[Example]) -> Batch:
        encoded = [self.encode(e) for e in examples]
        pad_id = self.tokenizer.pad_token_id
        sources = [e.source for e in encoded]
        source = {"input_ids": pad(sources, pad_id), "attention_mask": pad([[1] * len(x) for x in sources], 0)}
        negatives = [e.keys[1:] for e in encoded]
        key_ids = [e.keys[0] for e in encoded] + [ids for e in encoded for ids in e.keys[1:]]
        key_pools = [e.key_pools[0] for e in encoded] + [p for e in encoded for p in e.key_pools[1:]]
        keys = {
            "input_ids": pad(key_ids, pad_id),
            "attention_mask": pad([[1] * len(x) for x in key_ids], 0),
            "pool_mask": pad(key_pools, 0),
        }
        mask = torch.tensor([[slot < len(g) for slot in range(self.n_hard)] for g in negatives], dtype=torch.bool)
        candidates = None
        if self.rank_targets:
            slots = [ids for e in encoded for ids in e.targets + [[]] * (1 + self.n_hard - len(e.targets))]
            candidates = pad(slots, -100).view(len(encoded), 1 + self.n_hard, -1)
        return Batch(
            torch.tensor([e.id for e in examples], dtype=torch.long),
            source,
            pad([e.anchor for e in encoded], 0),
            pad([e.labels for e in encoded], -100),
            keys,
            mask.view(len(examples), self.n_hard),
            candidates,
        )
