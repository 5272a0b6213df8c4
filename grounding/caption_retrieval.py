"""The shared wiring of caption-retrieval training stages (VG-BERT stage 1, the dual-encoder baseline,
and any later dual or match-map retrieval model): gathered in-batch negatives, evaluation outputs
accumulated over the split and scored by :func:`grounding.retrieval.retrieval_metrics` once per epoch,
repeats of the distributed sampler removed, and the frozen CNN named for the feature-cache callback.
"""

from __future__ import annotations

import torch
from torch import nn

from grounding import distributed as gdist
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.retrieval import RetrievalScores, retrieval_metrics


class CaptionRetrievalModule(GroundingModule):
    """Shared wiring of caption-retrieval training stages: feature cache, eval accumulation, metrics.

    Subclasses provide ``encode_images(images)``, ``encode_texts(ids, mask) -> (feats, mask)``,
    ``batch_similarity(img, txt, mask) -> (B,B)`` and ``eval_scores(img, txt, mask) -> (I,N)``.
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
        img, image_index, txt, mask, cap_index = collect_eval_outputs(store)
        if gdist.is_distributed():  # every rank scores the whole split (identical logged values)
            dev = self.device
            img, image_index, txt, mask, cap_index = (gdist.gather_no_grad(t.to(dev)).cpu()
                                                      for t in (img, image_index, txt, mask, cap_index))
            img, image_index, txt, mask, cap_index = drop_sampler_repeats(img, image_index, txt, mask, cap_index)
        order = torch.argsort(image_index)
        img, image_index = img[order], image_index[order]
        rows = torch.searchsorted(image_index, cap_index)  # split image index -> score-matrix row
        with torch.no_grad():
            scores = self.eval_scores(img, txt, mask)
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
    image's captions arrive together, in order, in one eval item."""
    order = torch.argsort(rows, stable=True)
    return RetrievalScores(scores[:, order].float().cpu(), rows[order].cpu(), torch.arange(len(rows)))


def pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0, zero-padding dim 1 (caption length differs between batches)."""
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    t_max = max(t.shape[1] for t in tensors)
    return torch.cat([nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, t_max - t.shape[1]]) for t in tensors])


def collect_eval_outputs(store):
    img = torch.cat([s["img"] for s in store])
    image_index = torch.cat([s["image_index"] for s in store])
    txt = pad_cat([s["txt"] for s in store])
    mask = pad_cat([s["mask"] for s in store])
    cap_index = torch.cat([s["caption_image_index"] for s in store])
    return img, image_index, txt, mask, cap_index


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
