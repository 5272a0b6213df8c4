"""Cross-modal retrieval metrics shared by every stage.

Given an (images x captions) score matrix and the image of each caption (5 per image in COCO /
Flickr): image->text Recall@K (a hit when ANY of the image's captions is in the top K, the standard
VSE/COCO protocol), text->image Recall@K (its one image in the top K), their sum ``rsum`` and the
median/mean ranks (1-based). Recalls are percentages. Ties count against the ground truth (every
competitor scoring >= the true item ranks above it), so a constant scorer cannot look perfect.

COCO-1K: the 5K test images split into 5 folds of 1,000 consecutive images (with their captions);
the metrics are averaged over folds (``fold_size``; applied automatically at >= 5,000 images).
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from grounding.errors import UserInputError
from grounding.utils.io import atomic_path, sha1_of_json

DEFAULT_KS = (1, 5, 10)


@torch.no_grad()
def break_ties(scores: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``scores`` (float64) plus a seeded random jitter that orders equal scores at random (the same order for the
    same seed) and keeps every other order. Ties broken by item index instead would favour low ids (a store whose
    images share a vector lists them in index order).

    Float32 / float16 scores: each value moves by less than half the gap to the next representable value of its own
    dtype, so two distinct values never swap (O(QN), no sort). Float64 scores: by less than half the smallest gap
    between distinct finite values (a sort). Non-finite values are left as they are."""
    gen = torch.Generator(device=scores.device).manual_seed(seed)
    noise = torch.rand(scores.shape, generator=gen, device=scores.device, dtype=torch.float64)
    finite = torch.isfinite(scores)
    if scores.dtype != torch.float64:
        spacing = (torch.nextafter(scores, torch.full_like(scores, float("inf"))) - scores).double()
        return scores.double() + torch.where(finite, noise * spacing / 2, torch.zeros_like(noise))
    values = torch.sort(scores[finite].flatten()).values
    gaps = values.diff()
    gap = float(gaps[gaps > 0].min()) if bool((gaps > 0).any()) else 1.0
    return scores + torch.where(finite, noise * (gap / 2), torch.zeros_like(noise))


def retrieval_ranks(scores: torch.Tensor, caption_image_index: torch.Tensor,
                    chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks: image->text (I,) of the best-ranked true caption; text->image (N,) of the true image.

    Images without any caption get rank -1 (left out of the image->text metrics).
    """
    if scores.dim() != 2 or caption_image_index.shape != (scores.shape[1],):
        raise ValueError(f"scores must be (images, captions) and caption_image_index (captions,); got "
                         f"{tuple(scores.shape)} and {tuple(caption_image_index.shape)}")
    scores = scores.float()
    n_img, n_cap = scores.shape
    idx = caption_image_index.to(scores.device).long()
    if n_cap and (idx.min() < 0 or idx.max() >= n_img):
        raise ValueError(f"caption_image_index must lie in [0, {n_img}); got range [{int(idx.min())}, {int(idx.max())}]")
    cols = torch.arange(n_cap, device=scores.device)
    true = scores[idx, cols]  # (N,) score of each caption with its own image
    best = torch.full((n_img,), float("-inf"), device=scores.device).scatter_reduce(0, idx, true, "amax")
    i2t = torch.zeros(n_img, dtype=torch.long, device=scores.device)
    t2i = torch.empty(n_cap, dtype=torch.long, device=scores.device)
    for a in range(0, n_cap, chunk):  # bounded memory: (I x chunk) comparisons at a time
        block = scores[:, a:a + chunk]
        t2i[a:a + chunk] = (block >= true[a:a + chunk]).sum(0) - 1  # minus the true image itself
        i2t += (block >= best[:, None]).sum(1)
    # Captions of the image itself that tie its best score are not competitors.
    own_ties = torch.zeros(n_img, dtype=torch.long, device=scores.device).scatter_add(0, idx, (true >= best[idx]).long())
    i2t -= own_ties
    has_caption = torch.isfinite(best)
    i2t[~has_caption] = -1
    return i2t, t2i


def _recalls(ranks: torch.Tensor, ks, prefix: str) -> dict[str, float]:
    ranks = ranks[ranks >= 0].float()
    out = {f"{prefix}_r{k}": 100.0 * (ranks < k).float().mean().item() for k in ks}
    # VSE++ convention: floor(median of 0-based ranks) + 1 (numpy median: mean of the middle two).
    out[f"{prefix}_medr"] = math.floor(ranks.quantile(0.5).item()) + 1 if len(ranks) else float("nan")
    out[f"{prefix}_meanr"] = ranks.mean().item() + 1 if len(ranks) else float("nan")
    return out


def recall_metrics(i2t_ranks: torch.Tensor, t2i_ranks: torch.Tensor, ks=DEFAULT_KS) -> dict[str, float]:
    out = {**_recalls(i2t_ranks, ks, "i2t"), **_recalls(t2i_ranks, ks, "t2i")}
    out["rsum"] = sum(out[f"{p}_r{k}"] for p in ("i2t", "t2i") for k in ks)
    return out


def retrieval_metrics(scores: torch.Tensor, caption_image_index: torch.Tensor, ks=DEFAULT_KS,
                      fold_size: int | None = None, folds_from: int = 5000) -> dict[str, float]:
    """All metrics over the full matrix, plus ``<fold_size>k/...`` fold means (COCO-1K protocol).

    Folds are taken when ``fold_size`` is given or, with fold_size 1000, when there are at least
    ``folds_from`` images. Keys: i2t_r1.. i2t_medr, t2i_r1.. t2i_medr, rsum; fold keys prefixed
    e.g. ``1k/i2t_r1``.
    """
    out = recall_metrics(*retrieval_ranks(scores, caption_image_index), ks=ks)
    n_img = scores.shape[0]
    if fold_size is None and n_img >= folds_from:
        fold_size = 1000
    if fold_size and n_img >= 2 * fold_size:
        idx = caption_image_index.to(scores.device).long()
        per_fold = []
        for start in range(0, n_img - fold_size + 1, fold_size):
            cap = ((idx >= start) & (idx < start + fold_size)).nonzero().squeeze(1)
            sub = scores[start:start + fold_size][:, cap]
            per_fold.append(recall_metrics(*retrieval_ranks(sub, idx[cap] - start), ks=ks))
        name = f"{fold_size // 1000}k" if fold_size % 1000 == 0 else f"fold{fold_size}"
        for key in per_fold[0]:
            out[f"{name}/{key}"] = sum(f[key] for f in per_fold) / len(per_fold)
    return out


def subset_t2i_recalls(scores: torch.Tensor, caption_image_index: torch.Tensor, subset: torch.Tensor, ks=(1, 5),
                       ) -> dict[str, float]:
    """Text->image R@K (%) of the captions in ``subset`` (bool, (N,)) ranked against every image: the
    compositional captions of a test set (the world's held-out pairs) next to the others."""
    _, t2i = retrieval_ranks(scores, caption_image_index)
    subset = subset.to(t2i.device).bool()
    return {f"t2i_r{k}": 100.0 * (t2i[subset] < k).float().mean().item() for k in ks} if subset.any() else {}


def rsum_interval(scores, caption_image_index: torch.Tensor, ks=DEFAULT_KS, n_resamples: int = 1000,
                  confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of rsum over the test queries: the images are resampled with replacement, each
    bringing its image->text query and its captions' text->image queries (a caption never leaves its image), so
    i2t R@K is the mean over drawn images and t2i R@K the hits of their captions over their number
    (scipy.stats.bootstrap, vectorised over resamples, seeded). The point estimate is :func:`recall_metrics`' rsum.

    ``scores``: one (I, N) matrix, or a list of them (runs of one model with other seeds, on the same test split):
    then the interval is that of their mean rsum, every run scored on the same resampled images."""
    matrices = list(scores) if isinstance(scores, (list, tuple)) else [scores]
    idx = caption_image_index.long().cpu().numpy()
    n_img = matrices[0].shape[0]
    data, keep = [], None
    for matrix in matrices:
        i2t, t2i = retrieval_ranks(matrix, caption_image_index)
        keep = (i2t >= 0).cpu().numpy()  # images with a caption (the others are no query of either direction)
        data += [(i2t.cpu().numpy() < k).astype(np.float64) for k in ks]
        data += [np.bincount(idx, weights=(t2i.cpu().numpy() < k).astype(np.float64), minlength=n_img) for k in ks]
    data.append(np.bincount(idx, minlength=n_img).astype(np.float64))
    data = [a[keep] for a in data]
    if len(data[-1]) < 2:
        return float("nan"), float("nan")
    per_run = 2 * len(ks)

    def mean_rsum(*arrays, axis=-1):
        n_caps = arrays[-1].sum(axis)
        total = 0.0
        for r in range(len(matrices)):
            run = arrays[r * per_run:(r + 1) * per_run]
            total = total + sum(h.mean(axis) for h in run[:len(ks)]) + sum(h.sum(axis) for h in run[len(ks):]) / n_caps
        return 100.0 * total / len(matrices)

    res = stats.bootstrap(tuple(data), mean_rsum, paired=True, vectorized=True, method="percentile",
                          n_resamples=n_resamples, confidence_level=confidence, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class RetrievalScores:
    """What an evaluation loop scored, kept on the module (``module.scored[split]``) for the leaderboard:
    ``scores`` (I, N) images x captions, ``caption_image`` (N,) the score row of each caption's image,
    ``caption_index`` (N,) each column's caption in the split's flat caption order (image by image)."""

    scores: torch.Tensor
    caption_image: torch.Tensor
    caption_index: torch.Tensor


def flat_order(scored: RetrievalScores) -> tuple[torch.Tensor, torch.Tensor]:
    """``scored``'s (images, captions) matrix with its columns in the split's flat caption order (image by image),
    and each column's image."""
    order = scored.caption_index.long().cpu()
    scores = torch.empty(scored.scores.shape, dtype=torch.float32)
    scores[:, order] = scored.scores.float().cpu()
    caption_image = torch.empty(len(order), dtype=torch.long)
    caption_image[order] = scored.caption_image.long().cpu()
    return scores, caption_image


def fuse_scores(members: list[RetrievalScores], weights: list[float] | None = None) -> RetrievalScores:
    """Late fusion of several models' scores of one test split (an ensemble, as SCAN's t2i + i2t models): each
    member's matrix standardised over all its entries (z-score: the members' scales differ, e.g. a dot product at a
    learnt temperature, a cosine, a match map; an affine map keeps each member's own rankings), then their weighted
    mean (equal weights by default). The standardisation reads no label: only the member's score distribution."""
    if len(members) < 2:
        raise ValueError(f"fusing scores needs at least 2 members; got {len(members)}")
    weights = [1.0] * len(members) if weights is None else [float(w) for w in weights]
    if len(weights) != len(members) or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"weights must be {len(members)} non-negative numbers with a positive sum; got {weights}")
    fused, reference = None, None
    for member, weight in zip(members, weights):
        scores, caption_image = flat_order(member)
        if not torch.isfinite(scores).all():
            raise ValueError("a member's scores are not all finite (a reranked matrix?); fuse exhaustive scores only")
        if reference is None:
            reference = caption_image
        elif scores.shape[1] != len(reference) or not torch.equal(caption_image, reference):
            raise ValueError("the members scored different test splits (their captions' images differ)")
        z = (scores.double() - scores.double().mean()) / scores.double().std().clamp_min(1e-12)
        fused = weight * z if fused is None else fused + weight * z
    return RetrievalScores((fused / sum(weights)).float(), reference, torch.arange(len(reference)))


# A first stage for a cross-encoder's rerank: another model's test scores on the same test split, as a file.
FIRST_STAGE_FORMAT = 1


class FirstStageError(UserInputError, ValueError):
    """A first-stage score file that is unreadable or of another test split (one line: the file and the mismatch)."""


def save_first_stage(path, scored: RetrievalScores, captions: list[str], source: str) -> None:
    """Write ``scored`` (a dual encoder's test scores) as a first stage: a dense (images, captions) float32 matrix in
    the split's image order and flat caption order, with the caption texts' sha1 so that a reranker refuses another
    test set's scores (written under a temporary name, then renamed)."""
    matrix = torch.full((scored.scores.shape[0], len(captions)), float("-inf"))
    matrix[:, scored.caption_index.long()] = scored.scores.float().cpu()
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save({"format": FIRST_STAGE_FORMAT, "scores": matrix, "captions_sha1": sha1_of_json(list(captions)),
                    "source": source}, tmp)


def load_first_stage(path, n_images: int, captions: list[str]) -> torch.Tensor:
    """The (images, captions) matrix of :func:`save_first_stage`, checked against the split it will rerank (its image
    count, caption count and caption texts); a :class:`FirstStageError` naming the file and the mismatch otherwise."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        scores = saved["scores"]
    except (OSError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError) as e:
        raise FirstStageError(f"first_stage_scores {path}: not a first-stage score file ({' '.join(str(e).split())[:120]}); "
                         "write one with grounding.retrieval_metrics.save_first_stage (the leaderboard does)") from None
    if tuple(scores.shape) != (n_images, len(captions)) or saved.get("captions_sha1") != sha1_of_json(list(captions)):
        raise FirstStageError(f"first_stage_scores {path}: scores of {tuple(scores.shape)} (images, captions) from "
                         f"{saved.get('source', '?')}, not of this test split's ({n_images}, {len(captions)}) images "
                         "and caption texts; score the same test set with the first stage again")
    return scores.float()


def rerank_pairs(first: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs a reranker scores: each caption's (column's) top-``k`` images by ``first`` (I, C), as
    (pair_image, pair_caption), k * C of each."""
    top = first.topk(k, dim=0).indices  # (k, C)
    return top.reshape(-1), torch.arange(first.shape[1], device=first.device).repeat(k)


def place_reranked(first: torch.Tensor, pair_image: torch.Tensor, pair_caption: torch.Tensor,
                   reranked: torch.Tensor) -> torch.Tensor:
    """(I, C) scores in which each caption's reranked images rank above its other images, in the reranker's order,
    and the others keep the first stage's order below them (``first`` shifted under the lowest reranked score)."""
    finite = torch.isfinite(first)
    high = first[finite].max() if finite.any() else first.new_zeros(())
    out = first - high + reranked.min().to(first.dtype) - 1
    out[pair_image, pair_caption] = reranked.to(out.dtype)
    return out
