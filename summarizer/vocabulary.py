"""A decoder-only model's output layer trimmed to the tokens a task uses.

Gemma 3 270M predicts each token over 262,144 rows: about two thirds of a step's arithmetic, and the sampler then
draws from 262,144 probabilities. A question writer or a summarizer only ever needs the tokens of its training texts
and of the texts it reads. :class:`TrimmedVocabulary` keeps those rows of the tied embedding (input and output alike),
so the model reads and predicts in the kept ids; the softmax runs over the kept rows only, which is the full softmax
restricted to them and renormalised (`tests/test_vocabulary.py` checks it). Ids are mapped in (`to_kept`) before the
model and back (`to_full`) after it.

A scorer reads any text but predicts only known ones (the likelihood stage scores a bank's FAQ questions given any
consumer question): :meth:`TrimmedVocabulary.predicting` trims the output layer alone, so the model reads full ids
and its logits come out in kept ids (:class:`KeptRowsHead`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from medfaq.common.runtime import MedfaqError


def token_ids(tokenizer, texts: Iterable[str]) -> set[int]:
    """Every token id the tokenizer gives `texts` (with and without a leading space, as prompts and targets differ)."""
    found: set[int] = set()
    batch = list(texts)
    for start in range(0, len(batch), 512):
        chunk = batch[start : start + 512]
        for ids in tokenizer([*chunk, *(" " + text for text in chunk)], add_special_tokens=False)["input_ids"]:
            found.update(ids)
    return found


class TrimmedVocabulary:
    """The kept token ids (sorted) of one tokenizer: the special tokens always, and `ids`."""

    def __init__(self, tokenizer, ids: Iterable[int]) -> None:
        special = {i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        self.kept = torch.tensor(sorted(set(ids) | special | set(tokenizer.all_special_ids)), dtype=torch.long)
        self.size = int(tokenizer.vocab_size if hasattr(tokenizer, "vocab_size") else len(tokenizer))
        self.size = max(self.size, len(tokenizer), int(self.kept.max()) + 1)
        self._index = torch.full((self.size,), -1, dtype=torch.long)
        self._index[self.kept] = torch.arange(len(self.kept))

    def __len__(self) -> int:
        return len(self.kept)

    def to_kept(self, ids: torch.Tensor) -> torch.Tensor:
        """Full ids -> kept ids; an id that was not kept is a one-line error (its text was not among the kept)."""
        mapped = self._index[ids]
        if bool((mapped < 0).any()):
            missing = ids[mapped < 0].unique()[:5].tolist()
            raise MedfaqError(f"token ids {missing} are not in the trimmed vocabulary; add the texts that use them")
        return mapped

    def to_kept_targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Target ids (-100 where padded) -> kept ids, the padding kept as -100, on `labels`' device."""
        kept = self.to_kept(labels.clamp(min=0).cpu()).to(labels.device)
        return torch.where(labels == -100, labels, kept)

    def to_full(self, ids: torch.Tensor) -> torch.Tensor:
        return self.kept[ids]

    def head(self, model, differentiable: bool = False) -> KeptRowsHead:
        """`model`'s output layer over the kept rows (see :class:`KeptRowsHead`); the model must tie its output layer
        to its input embedding (its head may since have been quantised: the rows are read from the embedding)."""
        if not getattr(model.config, "tie_word_embeddings", False):
            raise MedfaqError("a trimmed vocabulary needs a model whose output layer is its input embedding (tied)")
        return KeptRowsHead(model.get_input_embeddings().weight, self.kept, differentiable)

    @contextmanager
    def predicting(self, model, head: KeptRowsHead | None = None) -> Iterator[None]:
        """`model` reads full ids but predicts the kept ids only, inside the block (through `head`, else a fresh
        :meth:`head`)."""
        full = model.get_output_embeddings()
        model.set_output_embeddings(head if head is not None else self.head(model))
        try:
            yield
        finally:
            model.set_output_embeddings(full)

    @contextmanager
    def applied(self, model) -> Iterator[None]:
        """`model` (tied input and output embedding) reads and predicts the kept ids only, inside the block."""
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        if head is None or head.weight is not embedding.weight:
            raise MedfaqError("a trimmed vocabulary needs a model whose output layer is its input embedding (tied)")
        full, vocab_size = embedding.weight, model.config.vocab_size
        trimmed = torch.nn.Parameter(full.detach()[self.kept.to(full.device)], requires_grad=False)
        embedding.weight = head.weight = trimmed
        embedding.num_embeddings = model.config.vocab_size = len(self.kept)
        try:
            yield
        finally:
            embedding.weight = head.weight = full
            embedding.num_embeddings = model.config.vocab_size = vocab_size


class KeptRowsHead(torch.nn.Module):
    """An output layer whose rows are the kept rows of a tied embedding: logits in kept ids. Frozen, it copies the
    rows once (inference: `quantize` makes that copy an int8 layer); `differentiable`, it gathers them on every call,
    so gradients reach the embedding."""

    def __init__(self, embedding: torch.Tensor, kept: torch.Tensor, differentiable: bool = False) -> None:
        super().__init__()
        self.__dict__["embedding"] = embedding  # a reference, not a parameter of this layer
        self.register_buffer("kept", kept.to(embedding.device), persistent=False)
        self.linear: torch.nn.Module | None = None
        if not differentiable:
            self.linear = torch.nn.Linear(embedding.shape[1], len(kept), bias=False, dtype=embedding.dtype)
            self.linear.weight = torch.nn.Parameter(embedding.detach()[self.kept].clone(), requires_grad=False)

    def quantize(self) -> KeptRowsHead:
        """int8 rows (PyTorch dynamic quantisation), for inference."""
        from medfaq.common.runtime import quantize_linear

        if self.linear is not None:
            self.linear = quantize_linear(torch.nn.Sequential(self.linear))[0]
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.linear is None:
            return torch.nn.functional.linear(hidden, self.embedding[self.kept].to(hidden.dtype))
        # One 2-d product: a strided 3-d slice (the prompt's last position) would make PyTorch's matmul copy the
        # transposed rows for a batched product on every call, which took longer than the product itself.
        return self.linear(hidden.reshape(-1, hidden.shape[-1])).reshape(*hidden.shape[:-1], -1)
