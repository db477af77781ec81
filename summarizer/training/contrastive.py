"""The MoCo contrastive module of ECL: momentum key encoder, key queue, InfoNCE losses, learned negatives.

Anchors are CHQs through the trained (query) encoder; positives are reference FAQs through the momentum key encoder;
simple negatives are the queue of earlier FAQ keys; hard negatives are the example's own entity-swapped FAQs, also
through the key encoder. Every sentence representation is the masked mean of the last encoder states, L2-normalised.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `hidden` (B, T, D) over the positions where `mask` (B, T) is 1, L2-normalised to (B, D), in fp32
    (contrastive logits divide cosines by a small temperature: bf16's rounding would be magnified)."""
    hidden = hidden.float()
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return F.normalize(pooled, dim=-1)


def info_nce(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    negatives: torch.Tensor,
    negative_mask: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """InfoNCE over one positive and per-example negatives; examples without any valid negative are skipped.

    `anchor` and `positive` are (B, D); `negatives` is (N, D) shared by the batch or (B, N, D) per example;
    `negative_mask` (B, N) marks the valid negatives (None: all valid). Returns the mean loss (0 when none counts).
    """
    positive_logit = (anchor * positive).sum(-1, keepdim=True)
    if negatives.dim() == 2:
        negative_logits = anchor @ negatives.T
    else:
        negative_logits = torch.einsum("bd,bnd->bn", anchor, negatives)
    if negative_mask is None:
        negative_mask = torch.ones_like(negative_logits, dtype=torch.bool)
    negative_logits = negative_logits.masked_fill(~negative_mask, float("-inf"))
    logits = torch.cat([positive_logit, negative_logits], dim=1) / temperature
    counted = negative_mask.any(dim=1)
    if not counted.any():
        return anchor.sum() * 0.0
    losses = -F.log_softmax(logits[counted], dim=1)[:, 0]
    return losses.mean()


def mean_cosine(anchor: torch.Tensor, negatives: torch.Tensor, negative_mask: torch.Tensor) -> float | None:
    """Mean cosine between anchors and their valid negatives (shapes as in :func:`info_nce`); None if none is valid."""
    if negatives.dim() == 2:
        cosines = anchor @ negatives.T
    else:
        cosines = torch.einsum("bd,bnd->bn", anchor, negatives)
    if not negative_mask.any():
        return None
    return float(cosines[negative_mask].mean())


class KeyQueue(nn.Module):
    """A FIFO queue of `size` normalised key vectors with the ids of the examples they came from.

    Only positives' keys are enqueued. `negatives_for(ids)` masks the entries that came from the same example, so a
    queue longer than the data set never holds an example's own (stale) positive as its negative.
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        if size < 1:
            raise ValueError("queue size must be at least 1")
        self.register_buffer("keys", torch.zeros(size, dim))
        self.register_buffer("ids", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    @property
    def size(self) -> int:
        return self.keys.size(0)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        """Append `keys` (B, D) with their example `ids` (B,), overwriting the oldest entries."""
        keys, ids = keys.detach()[-self.size :], ids[-self.size :]
        positions = (self.pointer + torch.arange(keys.size(0), device=keys.device)) % self.size
        self.keys[positions] = keys.to(self.keys.dtype)
        self.ids[positions] = ids.to(self.ids.device)
        self.pointer.fill_(int((self.pointer + keys.size(0)) % self.size))
        self.filled.fill_(min(self.size, int(self.filled) + keys.size(0)))

    def negatives_for(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queued keys (N, D) and a (B, N) mask of those valid as negatives for the examples `ids`."""
        valid = torch.arange(self.size, device=self.keys.device) < self.filled
        mask = valid.unsqueeze(0) & (self.ids.unsqueeze(0) != ids.to(self.ids.device).unsqueeze(1))
        return self.keys.detach().clone(), mask


@torch.no_grad()
def momentum_update(key_module: nn.Module, query_module: nn.Module, momentum: float) -> None:
    """θk ← m·θk + (1 − m)·θq for every parameter pair; parameters the two modules share (frozen ones) are skipped."""
    for key_param, query_param in zip(key_module.parameters(), query_module.parameters(), strict=True):
        if key_param is not query_param:
            key_param.mul_(momentum).add_(query_param.detach(), alpha=1.0 - momentum)


def momentum_copy(module: nn.Module) -> nn.Module:
    """A frozen deep copy of `module` that shares (does not copy) the parameters `module` does not train."""
    shared = {id(param): param for param in module.parameters() if not param.requires_grad}
    copied = copy.deepcopy(module, memo=dict(shared))
    for param in copied.parameters():
        param.requires_grad_(False)
    return copied


class NegativeGenerator(nn.Module):
    """Maps a positive key plus Gaussian noise drawn per negative to `count` normalised (learned) negatives."""

    def __init__(self, dim: int, count: int, hidden: int = 256, noise_scale: float = 1.0):
        super().__init__()
        self.count, self.noise_scale = count, noise_scale
        self.net = nn.Sequential(nn.Linear(2 * dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, positive: torch.Tensor) -> torch.Tensor:
        expanded = positive.unsqueeze(1).expand(-1, self.count, -1)
        noise = torch.randn_like(expanded) * self.noise_scale
        out = self.net(torch.cat([expanded, noise], dim=-1))
        return F.normalize(out + expanded, dim=-1)


def diversity_loss(negatives: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine among each example's generated negatives (B, K, D); lower is more diverse."""
    count = negatives.size(1)
    if count < 2:
        return negatives.sum() * 0.0
    sims = negatives @ negatives.transpose(1, 2)
    off_diagonal = ~torch.eye(count, dtype=torch.bool, device=negatives.device)
    return sims[:, off_diagonal].mean()


class MoCo(nn.Module):
    """Key encoder (a momentum copy of the query encoder), the key queue and, optionally, a negative generator."""

    def __init__(
        self,
        encoder: nn.Module,
        dim: int,
        queue_size: int,
        momentum: float,
        temperature: float,
        learned_negatives: int = 0,
    ):
        super().__init__()
        self.key_encoder = momentum_copy(encoder)
        self.key_encoder.eval()
        self.queue = KeyQueue(queue_size, dim)
        self.momentum, self.temperature = momentum, temperature
        self.generator = NegativeGenerator(dim, learned_negatives) if learned_negatives > 0 else None

    def train(self, mode: bool = True):
        super().train(mode)
        self.key_encoder.eval()  # keys come from a dropout-free encoder
        return self

    @torch.no_grad()
    def keys(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Normalised key vectors of a batch of right-padded token sequences, pooled over `pool_mask`
        (default: `attention_mask`)."""
        if input_ids.size(0) == 0:
            return torch.zeros(0, self.queue.keys.size(1), device=input_ids.device)
        hidden = self.key_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return masked_mean(hidden, attention_mask if pool_mask is None else pool_mask)

    @torch.no_grad()
    def update(self, query_encoder: nn.Module) -> None:
        momentum_update(self.key_encoder, query_encoder, self.momentum)
