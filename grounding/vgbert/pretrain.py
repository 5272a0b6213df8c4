"""VG-BERT stage 1: visual grounding of language by cross-modal contrastive learning (§3.1, App. A.2).

:class:`MatchMapGrounding` (plain nn.Module) = the two streams + separate linear projection heads;
its similarity is the match map of Eq. 1. :class:`GroundingPretrain` (LightningModule) wires it to
the caption DataModules (contracts B), the contrastive loss of Eq. 2 over the global (all-rank)
batch, the frozen-backbone feature cache and chunked retrieval evaluation.

Checkpoint layout (used by the relational finetune): ``model.visual.*`` and ``model.language.*``
hold the streams, ``model.visual_head`` / ``model.language_head`` the projection heads.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from grounding import distributed as gdist
from grounding import feature_cache as fcache
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.losses import cross_modal_contrastive_loss
from grounding.retrieval import retrieval_metrics
from grounding.vgbert.match_map import REDUCTIONS, chunked_match_scores, match_map_scores
from grounding.vgbert.streams import LanguageStream, VisualStream, word_mask


class MatchMapGrounding(nn.Module):
    """Visual + language streams with separate linear projection heads into a common space."""

    def __init__(self, text_encoder: str = "minilm", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", trainable_layers: int = 8, freeze_query_key: bool = True,
                 dropout: float = 0.3, attention_dropout: float | None = None, visual_heads: int = 12,
                 projection_dim: int | None = None, image_size: int = 224, count_special_tokens: bool = False,
                 normalize: bool = False):
        super().__init__()
        self.language = LanguageStream(text_encoder, trainable_layers, freeze_query_key,
                                       hidden_dropout=dropout, attention_dropout=attention_dropout)
        d = self.language.width
        self.visual = VisualStream(d, backbone, backbone_weights, visual_heads, dropout, image_size)
        p = projection_dim or d
        self.visual_head = nn.Linear(d, p)
        self.language_head = nn.Linear(d, p)
        self.normalize = normalize
        self.special_ids: tuple[int, ...] = ()
        if not count_special_tokens:
            from grounding.encoders import load_tokenizer

            tok = load_tokenizer(text_encoder)
            self.special_ids = tuple(t for t in (tok.cls_token_id, tok.sep_token_id) if t is not None)

    def _norm(self, x):
        return nn.functional.normalize(x, dim=-1) if self.normalize else x

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Pixels (B,3,H,W) or cached backbone maps (B,C,h,w) -> projected visual tokens (B,h,w,p)."""
        if images.shape[1] == 3:
            v = self.visual(images=images)
        else:
            v = self.visual(features=images)
        return self._norm(self.visual_head(v))

    def encode_texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids (N,T) -> projected word tokens (N,T,p) and the mask of words counted in Eq. 1."""
        words = self._norm(self.language_head(self.language(input_ids, attention_mask)))
        return words, word_mask(input_ids, attention_mask, self.special_ids)


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

    # ---------------------------------------------------------------- feature cache
    def _backbone(self):
        return self.model.visual.backbone

    def setup(self, stage: str) -> None:
        # The DataModule is set up before the LightningModule: swap each split dataset's pixel
        # loader for cached backbone features (rank 0 builds, other ranks wait and load).
        if not self.feature_cache or self._trainer is None or self.trainer.datamodule is None:
            return
        datasets = _find_image_datasets(self.trainer.datamodule)
        if not datasets:
            warnings.warn("feature_cache: the DataModule exposes no dataset with image_paths/load_image; "
                          "running the frozen backbone on every batch instead.", stacklevel=2)
            return
        device = self.trainer.strategy.root_device
        workers = int(getattr(self.trainer.datamodule, "num_workers", 0) or 0)
        for name, ds in datasets:
            if self.trainer.is_global_zero:
                loader = fcache.build_or_load(self._backbone(), ds, self.feature_cache_dir, device=device,
                                              num_workers=workers)
            self.trainer.strategy.barrier("feature_cache")
            if not self.trainer.is_global_zero:
                loader = fcache.build_or_load(self._backbone(), ds, self.feature_cache_dir, build=False)
            fcache.attach(ds, loader)

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
        img, image_index, txt, mask, cap_index = _collect(store)
        if gdist.is_distributed():  # every rank scores the whole split (identical logged values)
            dev = self.device
            img, image_index, txt, mask, cap_index = (gdist.gather_no_grad(t.to(dev)).cpu()
                                                      for t in (img, image_index, txt, mask, cap_index))
            img, image_index, txt, mask, cap_index = _dedupe(img, image_index, txt, mask, cap_index)
        order = torch.argsort(image_index)
        img, image_index = img[order], image_index[order]
        rows = torch.searchsorted(image_index, cap_index)  # split image index -> score-matrix row
        with torch.no_grad():
            scores = self.eval_scores(img, txt, mask)
        metrics = retrieval_metrics(scores, rows, fold_size=self.eval_fold_size)
        for k, v in metrics.items():
            self.log(f"{split}/{k}", v, prog_bar=k == "rsum", rank_zero_only=False, sync_dist=False)

    def compute_loss(self, similarity):  # pragma: no cover - abstract
        raise NotImplementedError


def _find_image_datasets(datamodule) -> list[tuple[str, object]]:
    """Every dataset attribute of the DataModule that loads images by index (contracts B)."""
    found, seen = [], set()
    for name, value in vars(datamodule).items():
        cands = value.items() if isinstance(value, dict) else [(name, value)]
        for sub, ds in cands:
            if hasattr(ds, "image_paths") and hasattr(ds, "load_image") and id(ds) not in seen:
                seen.add(id(ds))
                found.append((str(sub), ds))
    return found


def _pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0, zero-padding dim 1 (caption length differs between batches)."""
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    t_max = max(t.shape[1] for t in tensors)
    return torch.cat([nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, t_max - t.shape[1]]) for t in tensors])


def _collect(store):
    img = torch.cat([s["img"] for s in store])
    image_index = torch.cat([s["image_index"] for s in store])
    txt = _pad_cat([s["txt"] for s in store])
    mask = _pad_cat([s["mask"] for s in store])
    cap_index = torch.cat([s["caption_image_index"] for s in store])
    return img, image_index, txt, mask, cap_index


def _dedupe(img, image_index, txt, mask, cap_index):
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


LOSS_TERMS = {"both": (True, True), "l": (True, False), "v": (False, True)}


class GroundingPretrain(CaptionRetrievalModule):
    """VG-BERT stage 1 (§3.1/§3.3, App. A.2) as a LightningModule; monitors ``val/rsum`` (max).

    Args (paper defaults in brackets): text_encoder [bert-base-uncased; offline default minilm],
    backbone [vgg16], trainable_layers k [8], freeze_query_key [True], dropout [0.3],
    temperature tau [0.1], use_loss_l / use_loss_v [both] (or loss_terms "both" | "l" | "v"), word_reduction over words in Eq. 1
    ["sum"; "mean" averages over valid words], count_special_tokens ([CLS]/[SEP] are not words:
    False), visual_heads [12; must divide the text width], projection_dim [text width],
    normalize (L2-normalise projected tokens; off in the paper), feature_cache [True],
    max_match_elements (memory cap of the training match-map einsum), eval_image_chunk /
    eval_text_chunk (evaluation blocks), eval_fold_size (COCO-1K folds; automatic at >= 5K images).
    """

    def __init__(self, text_encoder: str = "minilm", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", trainable_layers: int = 8, freeze_query_key: bool = True,
                 dropout: float = 0.3, attention_dropout: float | None = None, visual_heads: int = 12,
                 projection_dim: int | None = None, image_size: int = 224, temperature: float = 0.1,
                 use_loss_l: bool = True, use_loss_v: bool = True, loss_terms: str | None = None,
                 word_reduction: str = "sum",
                 count_special_tokens: bool = False, normalize: bool = False, feature_cache: bool = True,
                 feature_cache_dir: str | None = None, max_match_elements: int = 1 << 28,
                 eval_image_chunk: int = 128, eval_text_chunk: int = 512, eval_fold_size: int | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler, feature_cache, feature_cache_dir, eval_fold_size)
        if loss_terms is not None:  # one switch for sweeps: "both" | "l" | "v" (App. A.2 Table 2)
            if loss_terms not in LOSS_TERMS:
                raise ValueError(f"loss_terms must be one of {sorted(LOSS_TERMS)}; got {loss_terms!r}")
            use_loss_l, use_loss_v = LOSS_TERMS[loss_terms]
        if word_reduction not in REDUCTIONS:
            raise ValueError(f"word_reduction must be one of {REDUCTIONS}; got {word_reduction!r}")
        if not (use_loss_l or use_loss_v):
            raise ValueError("use_loss_l and use_loss_v are both False: enable at least one loss term (Eq. 2).")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.hparams.use_loss_l, self.hparams.use_loss_v = use_loss_l, use_loss_v
        self.model = MatchMapGrounding(text_encoder, backbone, backbone_weights, trainable_layers, freeze_query_key,
                                       dropout, attention_dropout, visual_heads, projection_dim, image_size,
                                       count_special_tokens, normalize)

    def encode_images(self, images):
        return self.model.encode_images(images).flatten(1, 2)  # (B, h*w, p)

    def encode_texts(self, input_ids, attention_mask):
        return self.model.encode_texts(input_ids, attention_mask)

    def batch_similarity(self, img, txt, mask):
        return match_map_scores(img, txt, mask, self.hparams.word_reduction, self.hparams.max_match_elements)

    def compute_loss(self, similarity):
        h = self.hparams
        return cross_modal_contrastive_loss(similarity, h.temperature, h.use_loss_l, h.use_loss_v)

    def eval_scores(self, img, txt, mask):
        h = self.hparams
        return chunked_match_scores(img, txt, mask, h.word_reduction, h.eval_image_chunk, h.eval_text_chunk,
                                    device=self.device)
