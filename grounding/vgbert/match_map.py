"""VG-BERT's match-map similarity (paper Eq. 1).

M_ijk = V_ij . L_k for every image location (i, j) and every word k; S(V, L) = sum_k max_ij M_ijk.
Training scores come from :class:`MaxMatchScores`, an autograd function whose forward is one GEMM per
image chunk plus the max over locations, and which keeps only *where* each maximum was: since every
(image, caption, word) sends its gradient to its best location alone, the backward is a sparse product
with I*J*T non-zeros (O(I*J*T*d)) instead of dense GEMMs over all N locations (O(I*J*N*T*d)), and
nothing is recomputed. Ties split the gradient evenly among the tied locations, as autograd's ``amax``
does. Evaluation scores every image against every caption in blocks (:func:`chunked_match_scores`).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

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


def word_weights(word_mask: torch.Tensor, reduction: str, dtype: torch.dtype) -> torch.Tensor:
    """Each word's weight in S: 1 for counted words (``sum``, Eq. 1), 1 / their number (``mean``), 0 for the rest."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
    weight = word_mask.to(dtype)
    if reduction == "mean":
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1)
    return weight


def _best_matches(flat_words: torch.Tensor, visual: torch.Tensor, captions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One GEMM for the match maps of every caption word and c images, laid out (J, T, c, N) so that the max over
    locations reduces contiguous memory: returns the maps and their max over locations (J, T, c)."""
    c, n, d = visual.shape
    maps = (flat_words @ visual.reshape(c * n, d).t()).view(captions, -1, c, n)
    return maps, maps.amax(dim=-1)


def _image_chunk(n_images: int, per_image: int, max_elements: int) -> int:
    return max(1, min(n_images, max_elements // max(1, per_image)))


class MaxMatchScores(torch.autograd.Function):
    """S[a, b] = sum_t weight[b, t] * max_n <visual[a, n], words[b, t]> with a sparse backward.

    Forward keeps, per (image, caption, counted word), the location of its maximum: a sparse (I*N, J*T)
    selection matrix P with I*J*T non-zeros (more where locations tie, each tied one with an equal share).
    Backward: with P's entries scaled by dL/dS[a, b] * weight[b, t], dL/dvisual = P @ words and
    dL/dwords = P^T @ visual, two sparse-dense products.
    """

    @staticmethod
    def forward(ctx, visual, words, weight, max_elements):
        i, n, d = visual.shape
        j, t = words.shape[:2]
        flat_words = words.reshape(j * t, d)
        counted = weight != 0
        n_counted = int(counted.sum())
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        chunk = _image_chunk(i, n * j * t, max_elements)
        scores, rows, cols, shares = [], [], [], []
        for start in range(0, i, chunk):  # memory bound: one (J, T, chunk, N) block of match maps at a time
            maps, best = _best_matches(flat_words, visual[start:start + chunk], j)
            c = best.shape[-1]
            scores.append((best * weight.unsqueeze(-1)).sum(1).t())
            if not needs_grad:
                continue
            # every maximal location of a counted word (padding's gradient is 0; a zero-padded word ties everywhere)
            b, k, a, loc = ((maps == best.unsqueeze(-1)) & counted[:, :, None, None]).nonzero(as_tuple=True)
            rows.append((a + start) * n + loc)
            cols.append(b * t + k)
            share = torch.ones(len(a), dtype=visual.dtype, device=visual.device)
            if len(a) > n_counted * c:  # some word's maximum is reached at several locations
                entry = (a * j + b) * t + k
                share = share / torch.bincount(entry, minlength=c * j * t)[entry]  # as amax's backward
            shares.append(share)
        if needs_grad:
            ctx.save_for_backward(visual, words, weight, torch.cat(rows), torch.cat(cols), torch.cat(shares))
        return torch.cat(scores)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        visual, words, weight, rows, cols, shares = ctx.saved_tensors
        i, n, d = visual.shape
        j, t = words.shape[:2]
        # d S[a,b] / d best[a,b,t] = weight[b,t]; entry (a*N+n, b*T+t) carries that times its share
        grad_best = (grad_scores.unsqueeze(-1) * weight).reshape(i, j * t)
        values = grad_best[torch.div(rows, n, rounding_mode="floor"), cols] * shares
        selection = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (i * n, j * t), check_invariants=False)
        grad_visual = grad_words = None
        if ctx.needs_input_grad[0]:
            grad_visual = torch.sparse.mm(selection, words.reshape(j * t, d)).view(i, n, d)
        if ctx.needs_input_grad[1]:
            grad_words = torch.sparse.mm(selection.t(), visual.reshape(i * n, d)).view(j, t, d)
        return grad_visual, grad_words, None, None


@full_precision
def match_map_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor, reduction: str = "sum",
                     max_elements: int = 1 << 28) -> torch.Tensor:
    """S(V_a, L_b) for every image a and caption b (Eq. 1): (I,h,w,d)|(I,N,d) x (J,T,d) -> (I,J).

    ``reduction`` over words: "sum" (the paper) or "mean" (over valid words; length-invariant).
    ``max_elements`` caps the (chunk, N, J, T) match maps built at once (images are processed in chunks).
    Gradients flow through :class:`MaxMatchScores` (sparse backward, no recomputation).
    """
    visual = _flat(visual)
    if word_mask.shape != words.shape[:2]:
        raise ValueError(f"word_mask {tuple(word_mask.shape)} must match words {tuple(words.shape[:2])}")
    weight = word_weights(word_mask, reduction, visual.dtype)
    if torch.is_grad_enabled() and (visual.requires_grad or words.requires_grad):
        return MaxMatchScores.apply(visual, words, weight, max_elements)
    flat_words = words.reshape(-1, words.shape[-1])
    chunk = _image_chunk(len(visual), visual.shape[1] * words.shape[0] * words.shape[1], max_elements)
    return torch.cat([(_best_matches(flat_words, visual[a:a + chunk], len(words))[1] * weight.unsqueeze(-1)).sum(1).t()
                      for a in range(0, len(visual), chunk)])


def einsum_match_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor,
                        reduction: str = "sum") -> torch.Tensor:
    """Reference: the (I, J, N, T) match maps from one einsum and autograd's dense ``amax`` backward (tests and
    the benchmark compare :func:`match_map_scores` with it)."""
    m = torch.einsum("ind,jtd->ijnt", _flat(visual), words)
    return (m.amax(dim=2) * word_weights(word_mask, reduction, m.dtype)).sum(-1)


@torch.no_grad()
def chunked_match_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor, reduction: str = "sum",
                         image_chunk: int = 64, text_chunk: int = 256, device: torch.device | str | None = None,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """Evaluation scoring of all images x all captions in (image_chunk x text_chunk) blocks.

    Inputs may live on the CPU (e.g. 5K images x 25K captions of fp16 features); each block is
    moved to ``device``, scored in fp32, and written into the (I, J) fp32 result on the CPU, so no
    tensor larger than image_chunk*text_chunk*N*T is ever built. Inputs are read by row slices only, so
    anything sliceable into tensors works (the evaluation loop passes its batches unconcatenated).
    """
    device = torch.device(device) if device is not None else visual.device
    i, j = visual.shape[0], words.shape[0]
    if out is None:
        out = torch.empty(i, j, dtype=torch.float32)
    for a in range(0, i, image_chunk):
        v = _flat(visual[a:a + image_chunk]).to(device, torch.float32, non_blocking=True)
        for b in range(0, j, text_chunk):
            w = words[b:b + text_chunk].to(device, torch.float32, non_blocking=True)
            weight = word_weights(word_mask[b:b + text_chunk].to(device), reduction, torch.float32)
            _, best = _best_matches(w.reshape(-1, w.shape[-1]), v, w.shape[0])
            out[a:a + image_chunk, b:b + text_chunk] = (best * weight.unsqueeze(-1)).sum(1).t().to(out.device)
    return out


def pair_loop_scores(visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor,
                     reduction: str = "sum") -> torch.Tensor:
    """Reference implementation: one (image, caption) pair at a time (tests)."""
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


__all__ = ["match_map", "match_map_scores", "MaxMatchScores", "einsum_match_scores", "chunked_match_scores",
           "pair_loop_scores", "match_map_flops", "word_weights", "REDUCTIONS"]
