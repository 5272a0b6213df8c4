"""A re-statement of the authors' VG-BERT stage-1 loss, for benchmarking only (not used by the suite).

Written from the paper's Eq. 1-2 and the reduction and loop structure of the public code
(yizhen-zhang/VG-Bert, ``models/ContrastiveLoss.py``), not copied from it:

* the match maps of every (image, caption) pair come from one broadcast ``matmul`` of
  (B, 1, N, d) image tokens against (B, d, T) word tokens, i.e. the full (B, B, N, T) tensor, and
  autograd differentiates its max over locations densely;
* a caption's score is the *mean* over its first ``nwords`` tokens ([CLS]/[SEP] included), one caption
  at a time in a Python loop;
* each direction of Eq. 2 is a softmax cross-entropy taken one anchor at a time in a Python loop,
  with temperature ``sigma``, averaged over the batch; the two terms are added.
"""

from __future__ import annotations

import torch


def official_match_map_loss(image_tokens: torch.Tensor, word_tokens: torch.Tensor, nwords: torch.Tensor,
                            sigma: float = 0.1) -> torch.Tensor:
    """image_tokens (B, d, h, w) as the official visual stream lays them out; word_tokens (B, T, d); nwords (B,)."""
    b, d = image_tokens.shape[:2]
    locations = image_tokens.flatten(2).transpose(1, 2)  # (B, N, d)
    maps = torch.matmul(locations.unsqueeze(1), word_tokens.transpose(1, 2))  # (B, B, N, T) via broadcasting
    best = maps.max(dim=2).values  # (B images, B captions, T)
    similarity = torch.zeros(b, b, dtype=best.dtype, device=best.device)
    for c in range(b):  # a caption's score: mean over its counted tokens
        similarity[:, c] = best[:, c, :max(1, int(nwords[c]))].mean(1)
    loss_image_anchor = torch.zeros((), dtype=best.dtype, device=best.device)
    loss_caption_anchor = torch.zeros((), dtype=best.dtype, device=best.device)
    for i in range(b):
        loss_image_anchor = loss_image_anchor - torch.log(torch.softmax(similarity[i, :] / sigma, 0)[i])
        loss_caption_anchor = loss_caption_anchor - torch.log(torch.softmax(similarity[:, i] / sigma, 0)[i])
    return loss_image_anchor / b + loss_caption_anchor / b
