"""COMPOSER's objectives (§3.3): ℓ_match (the 4-way NLL of ViLBERT retrieval fine-tuning), ℓ_MVSA (a
hinge, or NLL, at every concept of the caption) and ℓ_order (a parent concept scores above its children).

Each is averaged over the positive pairs of the batch: the paper's sums over i divided by B, so the
λ = 1 weighting of the three terms is the paper's whatever the batch size. Within a caption, ℓ_MVSA and
ℓ_order sum over its concepts / edges as the paper writes them (``reduction: sum``); ``mean`` averages
them per caption instead, so a long caption does not outweigh ℓ_match (the tiny configs' choice).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MVSA_LOSSES = ("hinge", "nll")
REDUCTIONS = ("sum", "mean")


def _per_positive(per_item: torch.Tensor, owner: torch.Tensor, n_positives: int, reduction: str) -> torch.Tensor:
    """Σ over items then mean over positives (``sum``), or mean within each positive first (``mean``)."""
    if reduction == "sum":
        return per_item.sum() / max(n_positives, 1)
    if reduction != "mean":
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
    total = per_item.new_zeros(n_positives).index_add(0, owner, per_item)
    count = per_item.new_zeros(n_positives).index_add(0, owner, torch.ones_like(per_item)).clamp(min=1)
    return (total / count).sum() / max(n_positives, 1)


def match_nll(scores: torch.Tensor) -> torch.Tensor:
    """ℓ_match: ``scores`` (B, 1 + negatives), column 0 the positive pair (x_i, y_i)."""
    return F.cross_entropy(scores.float(), torch.zeros(len(scores), dtype=torch.long, device=scores.device))


def mvsa_loss(positive: torch.Tensor, negative_concept: torch.Tensor, negative_image: torch.Tensor, owner: torch.Tensor,
              n_positives: int, margin: float = 0.8, kind: str = "hinge", reduction: str = "sum") -> torch.Tensor:
    """ℓ_MVSA over concepts c of positive captions: s(x_i, c) against s(x_i, c⁻) and s(x⁻, c).

    ``hinge`` (the paper): [α − s(x,c) + s(x,c⁻)]₊ + [α − s(x,c) + s(x⁻,c)]₊; ``nll`` (Table 9's alternative):
    −log softmax over (s(x,c), s(x,c⁻), s(x⁻,c)). ``owner`` is the positive pair of each concept.
    """
    pos, neg_c, neg_x = positive.float(), negative_concept.float(), negative_image.float()
    if kind == "hinge":
        per = F.relu(margin - pos + neg_c) + F.relu(margin - pos + neg_x)
    elif kind == "nll":
        per = -torch.log_softmax(torch.stack([pos, neg_c, neg_x], 1), 1)[:, 0]
    else:
        raise ValueError(f"mvsa_loss must be one of {MVSA_LOSSES}; got {kind!r}")
    return _per_positive(per, owner, n_positives, reduction)


def order_loss(parent: torch.Tensor, child: torch.Tensor, owner: torch.Tensor, n_positives: int, margin: float = 0.2,
               reduction: str = "sum") -> torch.Tensor:
    """ℓ_order over parent→argument edges (``owner``: the positive of each): [β − s(x, parent) + s(x, child)]₊."""
    return _per_positive(F.relu(margin - parent.float() + child.float()), owner, n_positives, reduction)
