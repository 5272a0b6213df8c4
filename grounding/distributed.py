"""Cross-rank gathering for contrastive losses and evaluation.

Contrastive negatives must span the *global* batch under DDP (Eq. 2 sums over all B samples), so
features are all-gathered with autograd. Every helper is a no-op on a single process.

Shapes may differ between ranks (the last batch is smaller; captions are padded to the longest in
each rank's batch), so tensors are zero-padded to the largest extent of every dimension before the
collective and concatenated along dim 0; masks padded with zeros keep padded tokens out.

Gradient convention: every rank computes the loss over the whole gathered batch, so the backward
of the gather all-reduces (sums) the incoming gradient and keeps this rank's rows. DDP then averages
parameter gradients over ranks, which gives exactly the single-process gradient of the global loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def _all_shapes(x: torch.Tensor) -> torch.Tensor:
    shape = torch.tensor(x.shape, dtype=torch.long, device=x.device)
    shapes = [torch.zeros_like(shape) for _ in range(world_size())]
    dist.all_gather(shapes, shape)
    return torch.stack(shapes)  # (W, ndim)


def _pad_to(x: torch.Tensor, shape: list[int], value: float = 0) -> torch.Tensor:
    if list(x.shape) == shape:
        return x
    out = x.new_full(shape, value)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, pad_value: float):
        shapes = _all_shapes(x)
        max_shape = shapes.max(0).values.tolist()
        padded = _pad_to(x.contiguous(), max_shape, pad_value)
        parts = [torch.empty_like(padded) for _ in range(shapes.shape[0])]
        dist.all_gather(parts, padded)
        rows = shapes[:, 0].tolist()
        ctx.me, ctx.rows, ctx.local_shape = rank(), rows, tuple(x.shape)
        return torch.cat([p[:r] for p, r in zip(parts, rows)], 0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)  # every rank's loss used our rows
        start = sum(ctx.rows[:ctx.me])
        local = grad[start:start + ctx.rows[ctx.me]]
        return local[tuple(slice(0, s) for s in ctx.local_shape)], None


def gather_with_grad(x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
    """All ranks' ``x`` concatenated along dim 0 (other dims zero-padded), differentiable."""
    if not is_distributed():
        return x
    return _GatherWithGrad.apply(x, pad_value)


@torch.no_grad()
def gather_no_grad(x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
    """As :func:`gather_with_grad` without autograd (evaluation features, indices)."""
    if not is_distributed():
        return x
    return _GatherWithGrad.forward(_Ctx(), x, pad_value)


class _Ctx:  # stand-in for autograd's ctx when the forward is called directly
    pass
