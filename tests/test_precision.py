"""Similarities and contrastive losses stay in float32 under bf16 autocast (issue 12, numerics)."""

from __future__ import annotations

import torch

from grounding.contrastive import cross_modal_contrastive_loss
from grounding.precision import dot_similarity, full_precision
from grounding.vgbert.match_map import match_map_scores
from grounding.vgbert.relational import bilinear_scores, relation_loss


def _match_inputs(b: int = 60, n: int = 49, t: int = 16, d: int = 64):
    g = torch.Generator().manual_seed(0)
    # non-negative features scaled so S = Σ_k max_ij M_ijk is ≈ 200, the regime of a trained VG-BERT
    visual = torch.rand(b, n, d, generator=g) * 0.9
    words = torch.rand(b, t, d, generator=g) * 0.9
    return visual, words, torch.ones(b, t, dtype=torch.bool)


def test_match_map_and_loss_under_bf16_autocast_equal_float32():
    visual, words, mask = _match_inputs()
    reference = match_map_scores(visual, words, mask)
    assert 150 < reference.mean() < 300
    with torch.autocast("cpu", dtype=torch.bfloat16):
        naive = torch.einsum("ind,jtd->ijnt", visual, words).amax(2).sum(-1)  # what autocast alone gives
        scores = match_map_scores(visual, words, mask)
        loss = cross_modal_contrastive_loss(scores, 0.1)["loss"]
    # without the guard the 3,600 logits collapse onto a handful of bf16 values
    assert naive.dtype == torch.bfloat16 and naive.unique().numel() < 100
    assert scores.dtype == torch.float32 and scores.unique().numel() > 3000
    torch.testing.assert_close(scores, reference)
    torch.testing.assert_close(loss, cross_modal_contrastive_loss(reference, 0.1)["loss"])


def test_dot_similarity_and_relation_scores_are_float32_under_autocast():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 32, generator=g) * 10, torch.randn(6, 32, generator=g) * 10
    ops = torch.randn(3, 32, 32, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim = dot_similarity(a, b)
        rel = bilinear_scores(a[:6], b, ops)
        loss = relation_loss(rel, torch.tensor([0, 1, 2, 0, 1, 2]))
    torch.testing.assert_close(sim, a @ b.t())
    torch.testing.assert_close(rel, torch.einsum("nd,pde,ne->np", a[:6], ops, b))
    assert loss.dtype == torch.float32


def test_full_precision_keeps_gradients_and_non_tensors():
    @full_precision
    def f(x, scale=2, name="s"):
        assert x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
        return (x * scale).sum()

    x = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f(x, scale=3).backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.tolist() == [3.0, 3.0, 3.0]
    y = torch.ones(2, dtype=torch.float64)
    assert full_precision(lambda t: t)(y).dtype == torch.float64  # wider inputs are kept (reference tests)
