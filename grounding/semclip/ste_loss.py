"""The STE's multi-positive supervised contrastive loss (SemCLIP Eq. 3), and the GEMM it runs on."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ONEDNN = hasattr(torch.ops.mkldnn, "_linear_pointwise") and torch.backends.mkldnn.is_available()


def mm_nt(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, relu: bool = False) -> torch.Tensor:
    """``x @ w.T (+ bias) (then ReLU)`` for 2-D tensors, without autograd (for custom backward passes).

    float32 / bfloat16 on CPU go through oneDNN's matmul (strided views welcome, bias and ReLU fused),
    which runs at about twice the GFLOP/s of the MKL sgemm behind ``torch.mm`` on AVX-512 CPUs where MKL
    takes its AVX2 path (AMD EPYC here; benchmarks/bench_semclip.py). Same product up to float rounding;
    anything else, or a build without oneDNN, falls back on ``torch.mm``.
    """
    if (_ONEDNN and x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and w.dtype == x.dtype
            and x.dim() == w.dim() == 2 and x.shape[1] == w.shape[1] and x.numel() and w.numel()):
        try:
            return torch.ops.mkldnn._linear_pointwise(x, w, bias, "relu" if relu else "none", [], "")
        except RuntimeError:  # a layout this build's kernel refuses: torch.mm below
            pass
    y = x @ w.T if bias is None else torch.addmm(bias, x, w.T)
    return y.relu_() if relu else y


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


class _ListContrastive(torch.autograd.Function):
    """Eq. 3 with the label vectors in list form: one B x C pass for the softmax's denominator, the
    numerator's terms gathered at the M list members only. Backward: ∂L_i/∂s_ia = ΣY_i · p_ia − Y_ia
    (p = the softmax over a ≠ i), written straight into one B x C buffer; no dense Y, no log-probabilities."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)  # bf16-mixed on a GPU: float32 here
    def forward(ctx, anchor_z, candidate_z, anchor_position, member_owner, member_position, member_weight,
                temperature, reduction):
        rows = torch.arange(len(anchor_z), device=anchor_z.device)
        logits = mm_nt(anchor_z / temperature, candidate_z)  # s_ia = z_i·z_a / τ, the 1/τ folded into B x D
        logits[rows, anchor_position] = float("-inf")  # a ≠ i (supervised contrastive masking)
        s_member = logits[member_owner, member_position]
        top, arg = logits.max(dim=1)
        p = torch.softmax(logits, dim=1)  # one fused row kernel; p at the row max is 1 / Σ_a exp(s_ia − max)
        log_denominator = top - torch.log(p[rows, arg])  # log Σ_{a≠i} exp(s_ia)
        y_total = torch.zeros_like(top).index_add_(0, member_owner, member_weight)  # Σ_j Y_ij
        # where Y_ij = 0 the term vanishes (also at a masked column: no 0 · −inf)
        numerator = torch.where(member_weight == 0, 0.0, member_weight * s_member)
        per_anchor = y_total * log_denominator - torch.zeros_like(top).index_add_(0, member_owner, numerator)
        ctx.save_for_backward(anchor_z, candidate_z, p, y_total, member_owner, member_position, member_weight)
        ctx.temperature, ctx.reduction = temperature, reduction
        if reduction == "mean":
            return per_anchor.mean()
        if reduction == "sum":
            return per_anchor.sum()
        return per_anchor

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        anchor_z, candidate_z, p, y_total, owner, position, weight = ctx.saved_tensors
        n = len(anchor_z)
        g = grad.expand(n) / n if ctx.reduction == "mean" else grad.expand(n)
        g = g / ctx.temperature  # ∂s/∂z carries 1/τ
        d_logits = p * (g * y_total)[:, None]  # ΣY_i · p_ia (0 at the masked anchor column) ...
        d_logits.index_put_((owner, position), -(g[owner] * weight), accumulate=True)  # ... − Y_ia
        grad_anchor = mm_nt(d_logits, candidate_z.T) if ctx.needs_input_grad[0] else None
        grad_candidate = mm_nt(anchor_z.T, d_logits.T).T if ctx.needs_input_grad[1] else None  # (zᵀ·G)ᵀ = Gᵀ·z
        return grad_anchor, grad_candidate, None, None, None, None, None, None


def list_contrastive_loss(anchor_z: torch.Tensor, candidate_z: torch.Tensor, anchor_position: torch.Tensor,
                          member_owner: torch.Tensor, member_position: torch.Tensor, member_weight: torch.Tensor,
                          temperature: float = 0.05, normalize: bool = True, reduction: str = "mean") -> torch.Tensor:
    """Eq. 3 as :func:`multi_positive_contrastive_loss` (same value, same gradients), with Y in list form.

    The M list members of the batch: ``member_owner`` (M,) the anchor row each belongs to,
    ``member_position`` (M,) its column in the candidates, ``member_weight`` (M,) its Y_ij (pairs
    unique). ``anchor_position`` (B,) is always masked out of the denominator. Memory and time: one
    B x C logit buffer forward and one backward, instead of the dense form's B x C Y, mask and
    log-probability tensors and their autograd copies.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if normalize:
        anchor_z = F.normalize(anchor_z, dim=-1)
        candidate_z = F.normalize(candidate_z, dim=-1)
    member_weight = member_weight.to(anchor_z.dtype)
    return _ListContrastive.apply(anchor_z, candidate_z, anchor_position, member_owner, member_position,
                                  member_weight, temperature, reduction)


class _LinearReLU(torch.autograd.Function):
    """ReLU(x Wᵀ + b) with every GEMM through :func:`mm_nt` (the STE's encoder and projection layers)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)  # bf16-mixed on a GPU: float32 here
    def forward(ctx, x, weight, bias):
        y = mm_nt(x, weight, bias, relu=True)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, weight, y = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad, y, 0)  # ReLU': grad where y > 0, else 0 (torch's own)
        grad_x = mm_nt(grad, weight.T) if ctx.needs_input_grad[0] else None
        grad_w = mm_nt(grad.T, x.T) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def linear_relu(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """``relu(layer(x))`` (same values and gradients as ``nn.Linear`` + ``nn.ReLU``; leading dims flattened)."""
    y = _LinearReLU.apply(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias)
    return y.reshape(*x.shape[:-1], y.shape[-1])
