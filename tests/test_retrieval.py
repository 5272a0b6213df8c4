"""Retrieval metrics (grounding.retrieval_metrics) against hand-computed cases and torchmetrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grounding.retrieval_metrics import (
    RetrievalScores,
    fuse_scores,
    load_first_stage,
    place_reranked,
    rerank_pairs,
    retrieval_metrics,
    retrieval_ranks,
    rsum_interval,
    save_first_stage,
)


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


def test_rsum_interval_hand_cases():
    """Images are resampled with their captions. Two images, one caption each: image 0's queries rank their match
    first both ways (600), image 1's second of two (R@1 0, R@5 and R@10 100 in each direction: 400). A draw of two
    image-0s scores 600, of two image-1s 400, a mix 500 (the point); the 95 % percentile interval spans the two
    extremes (each drawn with probability 1/4)."""
    scores = torch.tensor([[1.0, 0.0], [0.0, -1.0]])  # caption 1 prefers image 0, image 1 prefers caption 0
    caption_image = torch.tensor([0, 1])
    assert retrieval_metrics(scores, caption_image)["rsum"] == 500.0
    low, high = rsum_interval(scores, caption_image, n_resamples=2000)
    assert (low, high) == (400.0, 600.0)
    # a perfect scorer has no spread; the same seed gives the same interval
    perfect = torch.eye(3).repeat_interleave(2, dim=1)
    assert rsum_interval(perfect, torch.arange(3).repeat_interleave(2)) == (600.0, 600.0)
    rng = torch.Generator().manual_seed(0)
    noisy, idx = torch.randn(20, 60, generator=rng), torch.arange(20).repeat_interleave(3)
    a, b = rsum_interval(noisy, idx, seed=3), rsum_interval(noisy, idx, seed=3)
    assert a == b and a[0] < retrieval_metrics(noisy, idx)["rsum"] < a[1]
    # runs of other seeds: the interval of their mean, on the same resampled images. The hand case with a perfect
    # second run: draws give (600 + 600) / 2, (400 + 600) / 2 or the mix's (500 + 600) / 2
    assert rsum_interval([scores, torch.eye(2)], caption_image, n_resamples=2000) == (500.0, 600.0)
    assert rsum_interval([noisy, noisy], idx, seed=3) == pytest.approx(a)  # two copies of one run: its interval


def test_rerank_places_the_top_k_above_the_rest_hand_computed():
    first = torch.tensor([[0.9, 0.1], [0.5, 0.7], [0.2, 0.3]])  # (3 images, 2 captions)
    pair_image, pair_caption = rerank_pairs(first, 2)
    assert sorted(zip(pair_image.tolist(), pair_caption.tolist())) == [(0, 0), (1, 0), (1, 1), (2, 1)]
    reranked = torch.tensor([-5.0, -3.0, 8.0, 9.0])  # any range: the reranker's own scores of those pairs
    out = place_reranked(first, pair_image, pair_caption, reranked)
    # caption 0: image 1 (-3) above image 0 (-5) above the unreranked image 2; caption 1: image 2 (9) above 1 (8)
    assert out[:, 0].argsort(descending=True).tolist() == [1, 0, 2]
    assert out[:, 1].argsort(descending=True).tolist() == [2, 1, 0]


def test_first_stage_file_round_trip_and_refusal(tmp_path):
    scored = RetrievalScores(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([0, 0, 1]),
                             torch.tensor([2, 0, 1]))  # columns in another order than the split's captions
    texts = ["a dog", "a cat", "a bird"]
    save_first_stage(tmp_path / "first.pt", scored, texts, "VSE")
    loaded = load_first_stage(tmp_path / "first.pt", 2, texts)
    assert loaded.tolist() == [[2.0, 3.0, 1.0], [5.0, 6.0, 4.0]]  # column j = caption j
    with pytest.raises(ValueError, match="not of this test split"):
        load_first_stage(tmp_path / "first.pt", 2, ["a dog", "a cat", "a fish"])
    (tmp_path / "bad.pt").write_text("not a tensor file")
    with pytest.raises(ValueError, match="not a first-stage score file"):
        load_first_stage(tmp_path / "bad.pt", 2, texts)


def test_fused_scores_hand_computed():
    """Member A in flat caption order; member B scored the captions in the other order (its column 0 is caption 1).
    A's entries [1, 0, 0, 1]: mean 0.5, sd (n - 1) sqrt(1/3), z = +-sqrt(3)/2. B's in flat order [[3, 0], [0, 1]]:
    mean 1, sd sqrt(2), z = [2, -1, -1, 0] / sqrt(2). The fusion is their mean, in flat order."""
    a = RetrievalScores(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]), torch.tensor([0, 1]))
    b = RetrievalScores(torch.tensor([[0.0, 3.0], [1.0, 0.0]]), torch.tensor([1, 0]), torch.tensor([1, 0]))
    h, r = 3 ** 0.5 / 2, 2 ** -0.5
    za = torch.tensor([[h, -h], [-h, h]])
    zb = torch.tensor([[2 * r, -r], [-r, 0.0]])
    fused = fuse_scores([a, b])
    assert torch.allclose(fused.scores, (za + zb) / 2, atol=1e-6)
    assert fused.caption_image.tolist() == [0, 1] and fused.caption_index.tolist() == [0, 1]
    assert torch.allclose(fuse_scores([a, b], [3, 1]).scores, (3 * za + zb) / 4, atol=1e-6)
    # an affine map of one member changes nothing; a member alone twice keeps its own rankings
    scaled = RetrievalScores(10 * b.scores - 4, b.caption_image, b.caption_index)
    assert torch.allclose(fuse_scores([a, scaled]).scores, fused.scores, atol=1e-6)
    assert torch.allclose(fuse_scores([a, a]).scores, za, atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        fuse_scores([a])
    with pytest.raises(ValueError, match="weights"):
        fuse_scores([a, b], [1.0])
    with pytest.raises(ValueError, match="different test splits"):
        fuse_scores([a, RetrievalScores(a.scores, torch.tensor([1, 0]), torch.tensor([0, 1]))])
    with pytest.raises(ValueError, match="not all finite"):
        fuse_scores([a, RetrievalScores(torch.tensor([[1.0, float("-inf")], [0.0, 1.0]]), a.caption_image,
                                        a.caption_index)])
