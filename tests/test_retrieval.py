"""Retrieval metrics (grounding.retrieval) against hand-computed cases and torchmetrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grounding.retrieval import retrieval_metrics, retrieval_ranks


def test_ranks_hand_computed():
    # 2 images, 3 captions (image of each: 0, 0, 1)
    scores = torch.tensor([[0.1, 0.9, 0.5],
                           [0.8, 0.2, 0.3]])
    cap = torch.tensor([0, 0, 1])
    i2t, t2i = retrieval_ranks(scores, cap)
    # image 0: best true caption 1 (0.9) is first -> 0; image 1: true caption 2 (0.3) behind 0.8 -> 1
    assert i2t.tolist() == [0, 1]
    # caption 0: 0.1 vs image 1 0.8 -> 1; caption 1: 0.9 best -> 0; caption 2: 0.3 vs 0.5 -> 1
    assert t2i.tolist() == [1, 0, 1]
    m = retrieval_metrics(scores, cap, ks=(1, 2))
    assert m["i2t_r1"] == pytest.approx(50.0) and m["i2t_r2"] == pytest.approx(100.0)
    assert m["t2i_r1"] == pytest.approx(100 / 3) and m["t2i_r2"] == pytest.approx(100.0)
    assert m["rsum"] == pytest.approx(50 + 100 + 100 / 3 + 100)
    assert m["i2t_medr"] == 1 and m["t2i_medr"] == 2  # VSE++: floor(median(0-based)) + 1


def test_constant_scores_are_not_perfect():
    m = retrieval_metrics(torch.zeros(4, 8), torch.arange(8) // 2)
    assert m["i2t_r1"] == 0 and m["t2i_r1"] == 0  # ties count against the ground truth


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recalls_match_torchmetrics(seed):
    from torchmetrics.retrieval import RetrievalHitRate, RetrievalRecall

    g = torch.Generator().manual_seed(seed)
    n_img, per = 9, 5
    cap = torch.arange(n_img).repeat_interleave(per)
    scores = torch.randn(n_img, n_img * per, generator=g)
    scores[cap, torch.arange(len(cap))] += 1.0  # some signal
    m = retrieval_metrics(scores, cap, ks=(1, 5, 10))
    preds = scores.sigmoid()  # torchmetrics reads preds as probabilities: a pred <= 0 never counts as retrieved
    relevant = cap[None, :] == torch.arange(n_img)[:, None]  # (images, captions)
    img_q = torch.arange(n_img)[:, None].expand_as(scores)
    cap_q = torch.arange(len(cap))[:, None].expand(len(cap), n_img)
    for k in (1, 5, 10):
        # image->text: a hit if any of the 5 true captions is in the top k (HitRate, not fractional recall)
        i2t = RetrievalHitRate(top_k=k)(preds.flatten(), relevant.flatten(), indexes=img_q.flatten())
        t2i = RetrievalRecall(top_k=k)(preds.t().flatten(), relevant.t().flatten(), indexes=cap_q.flatten())
        assert m[f"i2t_r{k}"] == pytest.approx(100 * i2t.item(), abs=1e-4)
        assert m[f"t2i_r{k}"] == pytest.approx(100 * t2i.item(), abs=1e-4)
    _, t2i_ranks = retrieval_ranks(scores, cap)
    assert m["t2i_medr"] == np.floor(np.median(t2i_ranks.numpy())) + 1


def test_fold_means():
    g = torch.Generator().manual_seed(0)
    n_img = 6
    cap = torch.arange(n_img).repeat_interleave(2)
    scores = torch.randn(n_img, 2 * n_img, generator=g)
    m = retrieval_metrics(scores, cap, fold_size=3)
    f1 = retrieval_metrics(scores[:3, :6], cap[:6])
    f2 = retrieval_metrics(scores[3:, 6:], cap[6:] - 3)
    for key in ("i2t_r1", "t2i_r5", "rsum", "t2i_medr"):
        assert m[f"fold3/{key}"] == pytest.approx((f1[key] + f2[key]) / 2)
    assert "1k/rsum" not in retrieval_metrics(scores, cap)


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match="caption_image_index"):
        retrieval_ranks(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="must lie in"):
        retrieval_ranks(torch.zeros(2, 3), torch.tensor([0, 1, 2]))
