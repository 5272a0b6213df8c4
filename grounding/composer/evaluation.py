"""COMPOSER's retrieval evaluation (§5, App. B): every caption composed with every image (the paper's
exhaustive protocol) or, with ``rerank_top_k``, with the top-K images of a cheap first stage; sentence
text→image / image→text recalls, Table 5's phrase R@1 and R@1/R@5 on a compositional caption subset.

Per caption batch the Predicate Transformer runs once (image-independent) and the Composition
Transformer once per tree height over all (image, application) pairs of an image chunk.
"""

from __future__ import annotations

import numpy as np
import torch

from grounding.retrieval_metrics import DEFAULT_KS, rerank_pairs, retrieval_metrics, subset_t2i_recalls

from .batch import pair_schedule, ragged_arange
from .model import Composer


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def primitive_first_stage(net: Composer, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor,
                          image_chunk: int = 64) -> torch.Tensor:
    """The rerank first stage (I, C): the mean primitive score θᵀû over each caption's primitives, for every image."""
    batch = _to(batch, regions.device)
    index = batch["host"]
    n_img, n_cap = len(regions), index.n_captions
    n_prim = np.diff(index.prim_ptr)  # >= 1: every caption has a primitive node
    first = regions.new_zeros(n_img, n_cap, dtype=torch.float32)  # scores in float32 (under bf16 autocast too)
    for start in range(0, n_img, image_chunk):
        img = np.arange(start, min(start + image_chunk, n_img))
        pair_image, pair_caption = np.tile(img, n_cap), np.repeat(np.arange(n_cap), len(img))
        schedule = pair_schedule(index, pair_caption, pair_image, max_height=0)
        owner, k = ragged_arange(n_prim[pair_caption])  # a caption's primitives are its first nodes
        schedule.attach(prim_rows=schedule.pair_ptr[owner] + k, prim_owner=owner, prim_count=n_prim[pair_caption])
        sched = schedule.to(regions.device)
        s, _ = _node_scores(net, batch, regions, region_mask, sched, max_height=0)
        total = torch.zeros(len(pair_image), device=regions.device).index_add_(0, sched.prim_owner, s[sched.prim_rows])
        first[sched.pair_image, sched.pair_caption] = total / sched.prim_count
    return first


def score_captions(net: Composer, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor, image_chunk: int = 64,
                   rerank_top_k: int | None = None, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence scores (I, C), phrase scores (I, Q)) of one caption batch against all I images.

    With ``rerank_top_k`` the first stage is ``first`` (I, C) or else the mean primitive score θᵀû over the
    caption's primitives (:func:`primitive_first_stage`, one cheap cross-attention layer); only each caption's
    top-K images are composed fully, and they rank above the rest (which keep their first-stage order).
    Every index is built on the host (:func:`grounding.composer.batch.pair_schedule`); the reranked images, chosen on
    the device, are open images there.
    """
    batch = _to(batch, regions.device)
    index = batch["host"]
    n_img, n_cap = len(regions), index.n_captions
    phrase = index.phrase_node if index.phrase_node is not None else np.zeros(0, dtype=np.int64)
    phrase_caption = np.searchsorted(index.node_ptr, phrase, side="right") - 1
    phrase_local = phrase - index.node_ptr[phrase_caption]

    def schedule_of(pair_caption: np.ndarray, pair_image: np.ndarray | None):
        """The pairs' schedule with the rows of their roots and of the phrase queries of their captions."""
        schedule = pair_schedule(index, pair_caption, pair_image)
        ptr = schedule.pair_ptr
        p, q = np.nonzero(pair_caption[:, None] == phrase_caption[None, :])  # pairs of each phrase's caption
        schedule.attach(root_rows=ptr[:-1] + index.caption_root[pair_caption], phrase_rows=ptr[p] + phrase_local[q],
                        phrase_pair=p, phrase_query=q)
        return schedule.to(regions.device)

    # float32 like the scores (Composer.score): under bf16 autocast the regions are bfloat16, whose steps would tie
    sentence = regions.new_full((n_img, n_cap), float("-inf"), dtype=torch.float32)
    phrases = regions.new_full((n_img, len(phrase)), float("-inf"), dtype=torch.float32)
    if rerank_top_k is None or rerank_top_k >= n_img:
        for start in range(0, n_img, image_chunk):
            img = np.arange(start, min(start + image_chunk, n_img))
            sched = schedule_of(np.repeat(np.arange(n_cap), len(img)), np.tile(img, n_cap))
            s, _ = _node_scores(net, batch, regions, region_mask, sched)
            sentence[sched.pair_image, sched.pair_caption] = s[sched.root_rows]
            phrases[sched.pair_image[sched.phrase_pair], sched.phrase_query] = s[sched.phrase_rows]
        return sentence, phrases
    if first is None:  # first stage: mean primitive score of every (image, caption)
        first = primitive_first_stage(net, batch, regions, region_mask, image_chunk)
    pair_image, _ = rerank_pairs(first, rerank_top_k)  # each caption's top K images (on the device)
    pair_caption = np.tile(np.arange(n_cap), rerank_top_k)  # rerank_pairs' caption order
    offset = first.max() - first.min() + 1
    sentence = first - 2 * offset  # below every reranked score
    phrases = first[:, torch.from_numpy(phrase_caption).to(first.device)] - 2 * offset
    for start in range(0, len(pair_caption), image_chunk * n_cap):
        pi = pair_image[start:start + image_chunk * n_cap]
        sched = schedule_of(pair_caption[start:start + image_chunk * n_cap], None)
        s, _ = _node_scores(net, batch, regions, region_mask, sched, pair_image=pi)
        sentence[pi, sched.pair_caption] = s[sched.root_rows]
        phrases[pi[sched.phrase_pair], sched.phrase_query] = s[sched.phrase_rows]
    return sentence, phrases


def _node_scores(net, batch, regions, region_mask, schedule, pair_image=None, max_height=None):
    """s of every row of the schedule's table (its pairs' images: the schedule's, or ``pair_image`` on the device)."""
    table, ptr = net.compose(batch, regions, region_mask, pair_image, None, max_height=max_height, schedule=schedule)
    image = schedule.pair_image if pair_image is None else pair_image
    return net.node_scores(table, ptr, regions, region_mask, image), ptr


def phrase_hits(top_image: torch.Tensor, denotation_ptr: torch.Tensor, denotation: torch.Tensor) -> torch.Tensor:
    """Table 5, per phrase query: is its top-1 image in its denotation (an image whose captions contain
    the concept)? (Q,) bool."""
    counts = denotation_ptr[1:] - denotation_ptr[:-1]
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts)
    hits = torch.zeros(len(counts), dtype=torch.long).index_add_(0, owner, (denotation == top_image[owner]).long())
    return hits > 0


def composer_metrics(sentence: torch.Tensor, caption_image: torch.Tensor, compositional: torch.Tensor | None = None,
                     phrase_r1: float | None = None, ks=DEFAULT_KS) -> dict[str, float]:
    """Sentence retrieval (i2t/t2i R@K, rsum), phrase R@1, and text→image R@1/R@5 of the compositional
    captions (the world's held-out pairs / an MCD test split) next to the other captions."""
    out = retrieval_metrics(sentence, caption_image, ks=ks)
    if phrase_r1 is not None:
        out["phrase_r1"] = phrase_r1
    if compositional is not None and compositional.any():
        for name, sel in (("compositional", compositional), ("in_distribution", ~compositional)):
            out.update({f"{name}/{k}": v for k, v in subset_t2i_recalls(sentence, caption_image, sel).items()})
        out["compositional/captions"] = float(compositional.sum())
    return out
