"""COMPOSER's retrieval evaluation (§5, App. B): every caption composed with every image (the paper's
exhaustive protocol) or, with ``rerank_top_k``, with the top-K images of a cheap first stage; sentence
text→image / image→text recalls, Table 5's phrase R@1 and R@1/R@5 on a compositional caption subset.

Per caption batch the Predicate Transformer runs once (image-independent) and the Composition
Transformer once per tree height over all (image, application) pairs of an image chunk.
"""

from __future__ import annotations

import torch

from grounding.retrieval_metrics import DEFAULT_KS, rerank_pairs, retrieval_metrics, subset_t2i_recalls

from .model import Composer, expand_counts


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
@torch.no_grad()
def primitive_first_stage(net: Composer, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor,
                          image_chunk: int = 64) -> torch.Tensor:
    """The rerank first stage (I, C): the mean primitive score θᵀû over each caption's primitives, for every image."""
    batch = _to(batch, regions.device)
    n_img, n_cap = len(regions), len(batch["captions"])
    first = regions.new_zeros(n_img, n_cap, dtype=torch.float32)  # scores in float32 (under bf16 autocast too)
    n_prim = torch.bincount(batch["prim_caption"], minlength=n_cap)  # >= 1: every caption has a primitive node
    for start in range(0, n_img, image_chunk):
        img = torch.arange(start, min(start + image_chunk, n_img), device=regions.device)
        pair_image, pair_caption = img.repeat(n_cap), torch.arange(n_cap, device=img.device).repeat_interleave(len(img))
        s, ptr = _node_scores(net, batch, regions, region_mask, pair_image, pair_caption, max_height=0)
        owner, k = expand_counts(n_prim[pair_caption])
        total = torch.zeros(len(pair_image), device=regions.device).index_add_(0, owner, s[ptr[owner] + k])
        first[pair_image, pair_caption] = total / n_prim[pair_caption]
    return first


def score_captions(net: Composer, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor, image_chunk: int = 64,
                   rerank_top_k: int | None = None, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence scores (I, C), phrase scores (I, Q)) of one caption batch against all I images.

    With ``rerank_top_k`` the first stage is ``first`` (I, C) or else the mean primitive score θᵀû over the
    caption's primitives (:func:`primitive_first_stage`, one cheap cross-attention layer); only each caption's
    top-K images are composed fully, and they rank above the rest (which keep their first-stage order).
    """
    batch = _to(batch, regions.device)
    n_img, n_cap = len(regions), len(batch["captions"])
    node_ptr = batch["caption_node_ptr"]
    root = batch["caption_root"]
    phrase = batch.get("phrase_node", torch.zeros(0, dtype=torch.long, device=regions.device))
    phrase_caption = torch.searchsorted(node_ptr, phrase, right=True) - 1
    phrase_local = phrase - node_ptr[phrase_caption]
    # float32 like the scores (Composer.score): under bf16 autocast the regions are bfloat16, whose steps would tie
    sentence = regions.new_full((n_img, n_cap), float("-inf"), dtype=torch.float32)
    phrases = regions.new_full((n_img, len(phrase)), float("-inf"), dtype=torch.float32)
    if rerank_top_k is None or rerank_top_k >= n_img:
        images = torch.arange(n_img, device=regions.device)
        for start in range(0, n_img, image_chunk):
            img = images[start:start + image_chunk]
            pair_image, pair_caption = img.repeat(n_cap), torch.arange(n_cap, device=img.device).repeat_interleave(len(img))
            s, ptr = _node_scores(net, batch, regions, region_mask, pair_image, pair_caption)
            sentence[pair_image, pair_caption] = s[ptr[:-1] + root[pair_caption]]
            sel = pair_caption[:, None] == phrase_caption[None, :]  # pairs of each phrase's caption
            p, q = torch.nonzero(sel, as_tuple=True)
            phrases[pair_image[p], q] = s[ptr[p] + phrase_local[q]]
        return sentence, phrases
    if first is None:  # first stage: mean primitive score of every (image, caption)
        first = primitive_first_stage(net, batch, regions, region_mask, image_chunk)
    pair_image, pair_caption = rerank_pairs(first, rerank_top_k)  # each caption's top K images
    offset = first.max() - first.min() + 1
    sentence = first - 2 * offset  # below every reranked score
    phrases = first[:, phrase_caption] - 2 * offset
    for start in range(0, len(pair_image), image_chunk * n_cap):
        pi, pc = pair_image[start:start + image_chunk * n_cap], pair_caption[start:start + image_chunk * n_cap]
        s, ptr = _node_scores(net, batch, regions, region_mask, pi, pc)
        sentence[pi, pc] = s[ptr[:-1] + root[pc]]
        sel = pc[:, None] == phrase_caption[None, :]
        p, q = torch.nonzero(sel, as_tuple=True)
        phrases[pi[p], q] = s[ptr[p] + phrase_local[q]]
    return sentence, phrases


def _node_scores(net, batch, regions, region_mask, pair_image, pair_caption, max_height=None):
    table, ptr = net.compose(batch, regions, region_mask, pair_image, pair_caption, max_height=max_height)
    return net.node_scores(table, ptr, regions, region_mask, pair_image), ptr


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
