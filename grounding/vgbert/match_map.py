"""VG-BERT's match-map similarity (paper Eq. 1).

M_ijk = V_ij . L_k for every image location (i, j) and every word k; S(V, L) = sum_k max_ij M_ijk.
Scores for a whole (images x captions) batch come from one einsum; its (I, J, N, T) intermediate
is bounded by ``max_elements`` (chunks over images, recomputed in backward via checkpointing so
the autograd graph does not keep every chunk alive) and, for evaluation, by chunking over both
images and captions (:func:`chunked_match_scores`).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grounding.precision import full_precision

REDUCTIONS = ("sum", "mean")


def _flat(visual: torch.Tensor) -> torch.Tensor:
    # (B,h,w,d) -> (B,h*w,d): locations (i,j) flattened; (B,N,d) passes through.
    return visual.flatten(1, 2) if visual.dim() == 4 else visual


def match_map(visual: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Paired match maps M for aligned rows: visual (B,h,w,d), words (B,T,d) -> (B,h,w,T).

    For explanation/visualisation: how each word of caption b matches each location of image b.
    """
    if visual.dim() != 4:
        raise ValueError(f"match_map expects visual tokens (B,h,w,d); got {tuple(visual.shape)}")
    return torch.einsum("bhwd,btd->bhwt", visual, words)


def _scores_block(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor, reduction: str) -> torch.Tensor:
    m = torch.einsum("ind,jtd->ijnt", visual, words)  # the match maps of every (image, caption) pair
    best = m.amax(dim=2)  # max over locations -> (I, J, T)
    mask = word_mask.to(best.dtype)
    s = (best * mask).sum(-1)  # sum over real words (padding, optionally [CLS]/[SEP], masked out)
    if reduction == "mean":
        s = s / mask.sum(-1).clamp(min=1)
    return s


@full_precision
def match_map_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor, reduction: str = "sum",
                     max_elements: int = 1 << 28) -> torch.Tensor:
    """S(V_a, L_b) for every image a and caption b (Eq. 1): (I,h,w,d)|(I,N,d) x (J,T,d) -> (I,J).

    ``reduction`` over words: "sum" (the paper) or "mean" (over valid words; length-invariant).
    ``max_elements`` caps the I*J*N*T intermediate: images are processed in chunks, and under
    autograd each chunk is checkpointed (recomputed in backward) so peak memory stays bounded.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
    visual = _flat(visual)
    if word_mask.shape != words.shape[:2]:
        raise ValueError(f"word_mask {tuple(word_mask.shape)} must match words {tuple(words.shape[:2])}")
    i, n = visual.shape[:2]
    j, t = words.shape[:2]
    per_image = max(1, j * n * t)
    chunk = max(1, max_elements // per_image)
    if chunk >= i:
        return _scores_block(visual, words, word_mask, reduction)
    grad = torch.is_grad_enabled() and (visual.requires_grad or words.requires_grad)
    parts = []
    for start in range(0, i, chunk):
        v = visual[start:start + chunk]
        if grad:
            parts.append(checkpoint(_scores_block, v, words, word_mask, reduction, use_reentrant=False))
        else:
            parts.append(_scores_block(v, words, word_mask, reduction))
    return torch.cat(parts, 0)


@torch.no_grad()
def chunked_match_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor, reduction: str = "sum",
                         image_chunk: int = 128, text_chunk: int = 512, device: torch.device | str | None = None,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Evaluation scoring of all images x all captions in (image_chunk x text_chunk) blocks.

    Inputs may live on the CPU (e.g. 5K images x 25K captions of fp16 features); each block is
    moved to ``device``, scored in fp32, and written into the (I, J) fp32 result on the CPU, so no
    tensor larger than image_chunk*text_chunk*N*T is ever built.
    """
    visual = _flat(visual)
    device = torch.device(device) if device is not None else visual.device
    i, j = visual.shape[0], words.shape[0]
    if out is None:
        out = torch.empty(i, j, dtype=torch.float32)
    for a in range(0, i, image_chunk):
        v = visual[a:a + image_chunk].to(device, torch.float32, non_blocking=True)
        for b in range(0, j, text_chunk):
            w = words[b:b + text_chunk].to(device, torch.float32, non_blocking=True)
            m = word_mask[b:b + text_chunk].to(device)
            out[a:a + image_chunk, b:b + text_chunk] = _scores_block(v, w, m, reduction).to(out.device)
    return out


def pair_loop_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor,
                     reduction: str = "sum") -> torch.Tensor:
    """Reference implementation: one (image, caption) pair at a time (tests and the benchmark)."""
    visual = _flat(visual)
    out = torch.empty(visual.shape[0], words.shape[0])
    for a in range(visual.shape[0]):
        for b in range(words.shape[0]):
            w = words[b][word_mask[b].bool()]
            s = (visual[a] @ w.t()).amax(0).sum()
            if reduction == "mean":
                s = s / max(1, w.shape[0])
            out[a, b] = s
    return out


def match_map_flops(n_images: int, n_texts: int, locations: int, tokens: int, width: int) -> float:
    """Multiply-add FLOPs of the einsum for a full score matrix (2 per MAC)."""
    return 2.0 * n_images * n_texts * locations * tokens * width


__all__ = ["match_map", "match_map_scores", "chunked_match_scores", "pair_loop_scores", "match_map_flops", "REDUCTIONS"]
