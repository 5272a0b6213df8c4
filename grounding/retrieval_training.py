"""The shared wiring of caption-retrieval training stages (VG-BERT stage 1, the dual-encoder baseline,
and any later dual or match-map retrieval model): gathered in-batch negatives, evaluation outputs
accumulated over the split and scored by :func:`grounding.retrieval_metrics.retrieval_metrics` once per epoch,
repeats of the distributed sampler removed, and the frozen CNN named for the feature-cache callback.
"""

from __future__ import annotations

import torch
from torch import nn

from grounding import distributed as gdist
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.retrieval_metrics import RetrievalScores, retrieval_metrics


class CaptionRetrievalModule(GroundingModule):
    """Shared wiring of caption-retrieval training stages: feature cache, eval accumulation, metrics.

    Subclasses provide ``encode_images(images)``, ``encode_texts(ids, mask) -> (feats, mask)``,
    ``batch_similarity(img, txt, mask) -> (B,B)`` and ``eval_scores(img, txt, mask) -> (I,N)``; the latter reads
    its inputs (tensors or :class:`RowPieces`) by row slices (``img[a:b]``; ``txt[:]`` for all rows).
    """

    monitor = "val/rsum"
    monitor_mode = "max"

    def __init__(self, optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None,
                 feature_cache: bool = True, feature_cache_dir: str | None = None, eval_fold_size: int | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.feature_cache = feature_cache
        self.feature_cache_dir = feature_cache_dir
        self.eval_fold_size = eval_fold_size
        self._eval: dict[str, list] = {}
        self.scored: dict[str, RetrievalScores] = {}  # the last test's score matrix (the leaderboard reads it)

    def frozen_backbone(self) -> nn.Module:
        """The frozen CNN whose maps the feature-cache callback stores (``model.visual.backbone``)."""
        return self.model.visual.backbone

    # ---------------------------------------------------------------- training
    def training_step(self, batch, batch_idx):
        img = self.encode_images(batch["images"])
        txt, mask = self.encode_texts(batch["input_ids"], batch["attention_mask"])
        # Negatives span the global batch (Eq. 2 over all B): gather with autograd across ranks.
        img, txt = gdist.gather_with_grad(img), gdist.gather_with_grad(txt)
        mask = gdist.gather_no_grad(mask)
        losses = self.compute_loss(self.batch_similarity(img, txt, mask))
        b = img.shape[0]
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=b)
        self.log("train/loss_l", losses["loss_l"], batch_size=b)
        self.log("train/loss_v", losses["loss_v"], batch_size=b)
        return losses["loss"]

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, batch, split: str):
        store = self._eval.setdefault(split, [])
        img = self.encode_images(batch["images"])
        txt, mask = self.encode_texts(batch["input_ids"], batch["attention_mask"])
        store.append(dict(img=img.detach().to(torch.float16).cpu(), image_index=batch["image_index"].cpu(),
                          txt=txt.detach().to(torch.float16).cpu(), mask=mask.cpu(),
                          caption_image_index=batch["caption_image_index"].cpu()))

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        # The joint-space representations, e.g. for search or for visualising match maps.
        img = self.encode_images(batch["images"])
        txt, mask = self.encode_texts(batch["input_ids"], batch["attention_mask"])
        return {"image_index": batch["image_index"], "image_features": img, "caption_features": txt,
                "word_mask": mask, "caption_image_index": batch.get("caption_image_index")}

    def on_validation_epoch_end(self):
        self._eval_epoch_end("val")

    def on_test_epoch_end(self):
        self._eval_epoch_end("test")

    def _eval_epoch_end(self, split: str):
        store = self._eval.pop(split, [])
        if not store:
            return
        # The batches' features are scored where they are (no concatenated copy in one process; DDP gathers full
        # copies): at COCO 5K x 25K the fp16 features are ~2 GB, held once; blocks are assembled as the scorer goes.
        img, image_index, txt, mask, cap_index = collect_eval_outputs(store)
        del store
        if gdist.is_distributed():  # every rank scores the whole split (identical logged values)
            dev = self.device
            img, txt, mask = img[:], txt[:], mask[:]
            img, image_index, txt, mask, cap_index = (gdist.gather_no_grad(t.to(dev)).cpu()
                                                      for t in (img, image_index, txt, mask, cap_index))
            img, image_index, txt, mask, cap_index = drop_sampler_repeats(img, image_index, txt, mask, cap_index)
            order = torch.argsort(image_index)
            img, image_index = img[order], image_index[order]
        rows = torch.searchsorted(image_index, cap_index)  # split image index -> score-matrix row
        with torch.no_grad():
            scores = self.eval_scores(img, txt, mask)
        del img, txt, mask  # ranking reads the scores only
        metrics = retrieval_metrics(scores, rows, fold_size=self.eval_fold_size)
        if split == "test":  # kept for the leaderboard, columns in the split's flat caption order
            self.scored[split] = flat_caption_order(scores, rows)
        for k, v in metrics.items():
            self.log(f"{split}/{k}", v, prog_bar=k == "rsum", rank_zero_only=False, sync_dist=False)

    def compute_loss(self, similarity):  # pragma: no cover - abstract
        raise NotImplementedError


def flat_caption_order(scores: torch.Tensor, rows: torch.Tensor) -> RetrievalScores:
    """A score matrix (I, N) with its columns in the split's flat caption order (image by image, each image's
    captions in file order): a stable sort by image undoes the distributed sampler's interleaving, since each
    image's captions arrive together, in order, in one eval item. Already in order (one process), the matrix
    is kept as it is, not copied."""
    order = torch.argsort(rows, stable=True)
    if torch.equal(order, torch.arange(len(order))):
        return RetrievalScores(scores.float().cpu(), rows.cpu(), torch.arange(len(rows)))
    return RetrievalScores(scores[:, order].float().cpu(), rows[order].cpu(), torch.arange(len(rows)))


class RowPieces:
    """Several batches' tensors read as one (N, L, ...) tensor whose dim 1 is zero-padded to the longest, in an
    optional row order, without concatenating them: ``rows[a:b]`` assembles just those rows. The evaluation
    scorers slice their blocks from it, so in one process a split's features exist once (COCO 5K x 25K: ~2 GB
    of fp16), never twice while a concatenated or reordered copy is built."""

    def __init__(self, pieces: list[torch.Tensor], order: torch.Tensor | None = None):
        self.pieces = pieces
        sizes = torch.tensor([len(p) for p in pieces])
        self._ends = sizes.cumsum(0)
        self._starts = self._ends - sizes
        self.order = order  # row r of the whole = source row order[r] (arrival order when None)
        first = pieces[0]
        trailing = ((max(p.shape[1] for p in pieces),) + tuple(first.shape[2:])) if first.dim() > 1 else ()
        self.shape = torch.Size((int(sizes.sum()),) + trailing)
        self.dtype, self.device = first.dtype, first.device

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> torch.Tensor:
        if not isinstance(rows, slice):
            raise TypeError(f"RowPieces is read by row slices; got {type(rows).__name__}")
        start, stop, step = rows.indices(len(self))
        if self.order is None and step == 1:  # consecutive rows: slices of the pieces they span, padded, joined
            first = int(torch.searchsorted(self._ends, start, right=True))
            parts = []
            for p in range(first, len(self.pieces)):
                if self._starts[p] >= stop:
                    break
                part = self.pieces[p][max(start - int(self._starts[p]), 0):stop - int(self._starts[p])]
                pad = [0, 0] * (part.dim() - 2) + [0, self.shape[1] - part.shape[1]] if part.dim() > 1 else []
                parts.append(nn.functional.pad(part, pad) if any(pad) else part)
            return torch.cat(parts) if parts else torch.zeros((0,) + tuple(self.shape[1:]), dtype=self.dtype)
        source = (torch.arange(len(self))[rows] if self.order is None else self.order[rows]).contiguous()
        piece = torch.searchsorted(self._ends, source, right=True)
        out = torch.zeros((len(source),) + tuple(self.shape[1:]), dtype=self.dtype)
        for p in piece.unique().tolist():  # the few batches a block touches
            at = (piece == p).nonzero().squeeze(1)
            part = self.pieces[p][source[at] - self._starts[p]]
            if part.dim() > 1:
                out[at, :part.shape[1]] = part
            else:
                out[at] = part
        return out


def collect_eval_outputs(store: list[dict]):
    """The evaluation outputs of every batch, as stored: images (:class:`RowPieces` in split image order, the score
    matrix's row order) and their sorted split indices, captions and word masks (:class:`RowPieces`, arrival
    order) and each caption's split image index."""
    image_index = torch.cat([s["image_index"] for s in store])
    order = torch.argsort(image_index)
    images = RowPieces([s["img"] for s in store], order)
    captions = RowPieces([s["txt"] for s in store])
    masks = RowPieces([s["mask"] for s in store])
    cap_index = torch.cat([s["caption_image_index"] for s in store])
    return images, image_index[order], captions, masks, cap_index


def drop_sampler_repeats(img, image_index, txt, mask, cap_index):
    """Drop images the distributed sampler repeated to even out ranks, and their repeated captions."""
    uniq, inverse = torch.unique(image_index, return_inverse=True)
    first = torch.full((len(uniq),), len(image_index), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(image_index)), "amin")
    copies = torch.bincount(image_index)  # how often each image was evaluated
    # Each copy brought the same captions: keep the first n_captions / copies of every image.
    order = torch.argsort(cap_index, stable=True)
    sorted_idx = cap_index[order]
    rank_in_image = torch.empty_like(cap_index)
    rank_in_image[order] = torch.arange(len(order)) - torch.searchsorted(sorted_idx, sorted_idx)
    n_caps = torch.bincount(cap_index, minlength=len(copies))
    cap_keep = rank_in_image < (n_caps // copies.clamp(min=1))[cap_index]
    return img[first], image_index[first], txt[cap_keep], mask[cap_keep], cap_index[cap_keep]
