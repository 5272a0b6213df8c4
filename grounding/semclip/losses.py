"""The STE's multi-positive supervised contrastive loss (SemCLIP Eq. 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def multi_positive_contrastive_loss(anchor_z: torch.Tensor, candidate_z: torch.Tensor, targets: torch.Tensor,
                                    temperature: float = 0.05, anchor_position: torch.Tensor | None = None,
                                    normalize: bool = True, reduction: str = "mean") -> torch.Tensor:
    """Eq. 3: ``-Σ_{j∈S_i} Y_ij · log softmax_a(z_i·z_a / τ)_j`` for each anchor i.

    anchor_z: (B, D) projected anchors; candidate_z: (C, D) projected candidates (the "a ∈ V" of
    the denominator: the batch's anchors, their list members and any sampled negatives);
    targets: (B, C) the label vectors Y_i (the list scores at the members' columns, 0 elsewhere);
    anchor_position: (B,) column of each anchor in the candidates, masked out of the denominator
    as in supervised contrastive learning [10] (its logit is the constant 1/τ after
    normalisation). ``normalize`` L2-normalises z so z_i·z_a is a cosine. Returns the mean over
    anchors of the per-list loss (``reduction="sum"`` gives Eq. 3's cumulative L_contrast).
    """
    if normalize:
        anchor_z = F.normalize(anchor_z, dim=-1)
        candidate_z = F.normalize(candidate_z, dim=-1)
    logits = anchor_z @ candidate_z.T / temperature
    if anchor_position is not None:
        rows = torch.arange(len(anchor_z), device=logits.device)
        logits = logits.index_put((rows, anchor_position), torch.tensor(float("-inf"), device=logits.device, dtype=logits.dtype))
    log_prob = torch.log_softmax(logits, dim=-1)
    # where Y_ij = 0 the term vanishes; avoid 0 * -inf at the masked anchor column
    per_anchor = -(targets * log_prob.masked_fill(targets == 0, 0.0)).sum(dim=-1)
    if reduction == "mean":
        return per_anchor.mean()
    if reduction == "sum":
        return per_anchor.sum()
    if reduction == "none":
        return per_anchor
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
