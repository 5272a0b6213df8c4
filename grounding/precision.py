"""Numerics under mixed precision: similarities and contrastive losses in float32.

The shared trainer picks ``bf16-mixed`` on a bf16 GPU. Under autocast a match map (VG-BERT Eq. 1: a raw inner
product summed over words, S ≈ 200, then divided by τ = 0.1) comes out in bfloat16, whose neighbouring
values around 200 are 1.0 apart: a batch's logits collapse onto a few distinct values. Functions decorated
with :func:`full_precision` run with autocast off and their half-precision tensor arguments in float32, whatever
the surrounding precision; under 32-bit training they are unchanged.
"""

from __future__ import annotations

import functools

import torch


def _float32(x):
    # half precisions up to float32; float32 and float64 (reference tests, gradcheck) stay as they are
    return x.float() if torch.is_tensor(x) and x.dtype in (torch.float16, torch.bfloat16) else x


def full_precision(fn):
    """Run ``fn`` with autocast disabled (CUDA and CPU) and its float16 / bfloat16 tensor arguments cast to
    float32 (wider ones are kept)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return fn(*(_float32(a) for a in args), **{k: _float32(v) for k, v in kwargs.items()})

    return wrapper


@full_precision
def dot_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(A, d) x (B, d) -> (A, B) inner products in float32 (the dual encoders' similarity)."""
    return a @ b.t()
