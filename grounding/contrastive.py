"""Cross-modal contrastive losses shared by every stage (VG-BERT Eq. 2, CLIP's symmetric InfoNCE, VSE++'s hinge).

One function computes the loss from a (B_images x B_texts) similarity matrix whose diagonal holds
the positive pairs; the match-map similarity (VG-BERT Eq. 1) and the dot-product similarity of the
dual-encoder baseline both feed it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grounding.precision import full_precision


@full_precision
def cross_modal_contrastive_loss(similarity: torch.Tensor, temperature: float | torch.Tensor = 0.1,
                                 use_loss_l: bool = True, use_loss_v: bool = True,
                                 combine: str = "sum") -> dict[str, torch.Tensor]:
    """Eq. 2: ``Loss_l`` (anchor image i, positive caption i, negatives: the batch's other captions)
    plus ``Loss_v`` (anchor caption i, negatives: the other images). Row i / column i of
    ``similarity`` = image i / caption i; S[i, i] are the positives.

    Either term can be switched off (App. A.2 Table 2 ablation); both are always returned for
    logging. ``loss`` = the enabled terms summed (``combine="sum"``, VG-BERT) or averaged
    (``combine="mean"``, CLIP's symmetric InfoNCE).
    """
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (images x texts) matrix; got {tuple(similarity.shape)}")
    if not (use_loss_l or use_loss_v):
        raise ValueError("At least one of use_loss_l / use_loss_v must be enabled.")
    logits = similarity / temperature
    target = torch.arange(logits.shape[0], device=logits.device)
    loss_l = F.cross_entropy(logits, target)  # softmax over captions j for image anchor i
    loss_v = F.cross_entropy(logits.t(), target)  # softmax over images j for caption anchor i
    loss = (loss_l if use_loss_l else 0) + (loss_v if use_loss_v else 0)
    if combine == "mean":
        loss = loss / (int(use_loss_l) + int(use_loss_v))
    elif combine != "sum":
        raise ValueError(f"combine must be 'sum' or 'mean'; got {combine!r}")
    return {"loss": loss, "loss_l": loss_l, "loss_v": loss_v}


@full_precision
def vse_hinge_loss(similarity: torch.Tensor, margin: float = 0.2, hardest: bool = True) -> torch.Tensor:
    """VSE's triplet ranking loss (Kiros et al., 2014) with VSE++'s hardest negatives (Faghri et al., 2018, Eq. 5):
    Σ_i max_c [α − s(i, i) + s(i, c)]₊ + max_j [α − s(i, i) + s(j, i)]₊ over the batch's positives (i, i), the
    negatives c (captions) and j (images) ranging over the rest of the batch; ``hardest=False`` sums every
    violation instead of the largest (Eq. 4, VSE0). Row i / column i of ``similarity`` = image i / caption i.
    """
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (images x texts) matrix; got {tuple(similarity.shape)}")
    positive = similarity.diagonal()
    off_diagonal = ~torch.eye(len(similarity), dtype=torch.bool, device=similarity.device)
    cost_caption = ((margin - positive[:, None] + similarity).clamp(min=0)) * off_diagonal  # anchor image i, caption c
    cost_image = ((margin - positive[None, :] + similarity).clamp(min=0)) * off_diagonal  # anchor caption i, image j
    if hardest:
        return cost_caption.max(1).values.sum() + cost_image.max(0).values.sum()
    return cost_caption.sum() + cost_image.sum()
