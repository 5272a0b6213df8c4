"""The "Composer CRG training" stage: ℓ_match + λ₁ ℓ_MVSA + λ₂ ℓ_order over the batch's captions
(§3.3), evaluated by exhaustive (or reranked) composition of every caption with every image.

Negatives of each positive (x_i, y_i), as in ViLBERT's retrieval fine-tuning: (x_i, a random other
caption), (a random other image, y_i), and (x_i, a hard caption): ``hard_negatives: pool`` (the paper's)
a caption of one of x_i's ``hard_negative_pool.pool_size`` (100) nearest training images, which the
DataModule adds to the batch (:mod:`grounding.composer.hard_negatives`); ``batch`` the caption of the
batch image most similar to x_i by mean region feature (an in-batch approximation); ``random`` another
random batch caption.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback

from grounding import distributed as gdist
from grounding.host_sync import host_numpy
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import check_choices
from grounding.paths import resolve_path
from grounding.retrieval_metrics import RetrievalScores, load_first_stage, retrieval_metrics

from .batch import pair_schedule, ragged_arange, same_height_partners
from .diagnostics import train_recall
from .evaluation import composer_metrics, phrase_hits, primitive_first_stage, score_captions
from .hard_negatives import HARD_NEGATIVE_MODES
from .model import Composer
from .objectives import MVSA_LOSSES, REDUCTIONS, match_nll, mvsa_loss, order_loss

HARD_NEGATIVES = HARD_NEGATIVE_MODES  # batch | random | pool


class RegionRetrievalModule(GroundingModule):
    """What COMPOSER and its baselines (:mod:`grounding.composer.vse_vilbert`) share on a
    :class:`grounding.composer.data.ComposerDataModule`: the DataModule checks, region tokens from the network's
    ``embed_regions`` (grid / boxes / detector files, the frozen backbone for the feature cache), and the
    evaluation over the two eval loaders (the split's images, then caption batches scored against every image
    by :meth:`score_caption_batch`) with :func:`composer_metrics`. The network must expose ``backbone``,
    ``region_source``, ``placeholder_base`` and ``embed_regions``.

    ``first_stage_scores`` (test only): another model's scores of the same test split
    (:func:`grounding.retrieval_metrics.save_first_stage`; the leaderboard writes them for a row's ``first_stage``); a
    cross-encoder with ``rerank_top_k`` then scores only each caption's top-K images by it, and the first stage's
    recall@K, the rerank's ceiling, is logged as ``test/first_stage/t2i_r{K}``.
    """

    monitor = "val/rsum"
    monitor_mode = "max"
    # a checkpoint of any of them tests under another's config (grounding.cli.checkpoint_compatible)
    checkpoint_family = "composer-region-retrieval"

    def __init__(self, optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None,
                 new_layer_lr_scale: float = 1.0, train_recall_images: int | None = None,
                 first_stage_scores: str | None = None):
        super().__init__(optimizer, lr_scheduler)
        if not new_layer_lr_scale > 0:
            raise ValueError(f"new_layer_lr_scale must be > 0; got {new_layer_lr_scale}")
        if train_recall_images is not None and train_recall_images < 2:
            raise ValueError(f"train_recall_images must be at least 2 (or null: off); got {train_recall_images}")
        self.new_layer_lr_scale = new_layer_lr_scale
        self.train_recall_images = train_recall_images
        self.first_stage_scores = first_stage_scores
        self._eval: dict[str, dict[str, list]] = {}
        self.first_stage_batches: list[torch.Tensor] = []  # a reranking model's first-stage scores (C_batch, I)
        self.scored: dict[str, RetrievalScores] = {}  # the last test's score matrix (the leaderboard reads it)

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        base = getattr(dm, "placeholder_base", None)
        if base is not None and base != self.net.placeholder_base:
            raise ValueError(f"the DataModule's tokenizer has {base} word pieces but the network's text encoder "
                             f"{self.net.placeholder_base}: give both the same text_encoder")
        if dm is not None and hasattr(dm, "region_boxes"):
            gives = "files" if dm.region_files else "boxes" if dm.region_boxes else "grid"
            if gives != self.net.region_source:
                fix = {"files": "set data.init_args.region_inputs.region_files (detector features)",
                       "boxes": "set data.init_args.region_inputs.region_boxes (a Visual Genome objects.json)",
                       "grid": "unset data.init_args.region_inputs.region_files and region_boxes"}[self.net.region_source]
                raise ValueError(f"the network's region_source is {self.net.region_source!r} but the DataModule's "
                                 f"regions are {gives!r}: {fix}")

    def frozen_backbone(self):
        return self.net.backbone

    def configure_callbacks(self):
        callbacks = super().configure_callbacks()
        if self.train_recall_images:  # before EpochSummary, so the epoch's line shows this epoch's value
            callbacks.insert(0, TrainRecall(self.train_recall_images))
        return callbacks

    def trainable_parameters(self):
        """Two groups: the pretrained text encoder's weights (``net.pretrained_modules()``) at the optimizer's lr,
        every new layer at ``new_layer_lr_scale`` times it (1: one lr for all, the paper's)."""
        params = [p for p in self.parameters() if p.requires_grad]
        if self.new_layer_lr_scale == 1.0:
            return params
        pretrained = {id(p) for m in self.net.pretrained_modules() for p in m.parameters()}
        return [{"params": [p for p in params if id(p) in pretrained]},
                {"params": [p for p in params if id(p) not in pretrained], "lr_scale": self.new_layer_lr_scale}]

    def regions(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Region tokens of a batch's images (pixels / cached maps, with object boxes for ``boxes``) or of its
        detector regions (``files``)."""
        return self.net.embed_regions(batch.get("images"), batch.get("region_features"), batch.get("region_boxes"),
                                      batch.get("region_mask"))

    # ---------------------------------------------------------------- evaluation
    def score_caption_batch(self, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor, split: str = "test",
                            first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sentence scores (I, C), phrase scores (I, Q) or None) of one caption batch against all I images of
        ``split`` (val / test); ``first`` (I, C): a first stage's scores of these pairs (``first_stage_scores``),
        for a reranker."""
        raise NotImplementedError

    def _eval_step(self, batch, dataloader_idx: int, split: str):
        store = self._eval.setdefault(split, {"regions": [], "mask": [], "image_index": [], "captions": []})
        if dataloader_idx == 0:  # the split's images: region tokens
            regions, mask = self.regions(batch)
            store["regions"].append(regions.detach())
            store["mask"].append(mask)
            store["image_index"].append(batch["image_index"])
        else:  # caption batches, composed with every image at the epoch's end
            store["captions"].append({k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()})

    def external_first_stage(self, image_index: torch.Tensor) -> torch.Tensor:
        """``first_stage_scores`` checked against the test split and cut to the images evaluated here (I, N)."""
        dataset = self.trainer.datamodule.test_dataset
        texts = [c for caps in dataset.captions for c in caps]
        return load_first_stage(resolve_path(self.first_stage_scores), len(dataset), texts)[image_index.cpu()]

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, dataloader_idx, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, dataloader_idx, "test")

    def on_validation_epoch_end(self):
        self._eval_epoch_end("val")

    def on_test_epoch_end(self):
        self._eval_epoch_end("test")

    def _eval_epoch_end(self, split: str):
        store = self._eval.pop(split, None)
        if not store or not store["regions"] or not store["captions"]:
            return
        regions, mask = torch.cat(store["regions"]), torch.cat(store["mask"])
        image_index = torch.cat(store["image_index"])
        # captions are sharded over ranks, images gathered: each rank scores its captions against all images
        regions, mask, image_index = (gdist.gather_no_grad(t) for t in (regions, mask, image_index))
        image_index, first = _unique_first(image_index)
        regions, mask = regions[first], mask[first]
        sentence, caption_ids, caption_image, compositional = [], [], [], []
        hit_batches = []
        self.first_stage_batches = []
        external = self.external_first_stage(image_index) if split == "test" and self.first_stage_scores else None
        for batch in store["captions"]:
            first_stage = external[:, batch["captions"].long()].to(regions.device) if external is not None else None
            s, p = self.score_caption_batch(batch, regions, mask, split, first=first_stage)
            sentence.append(s.T)
            caption_ids.append(batch["captions"].to(s.device))
            caption_image.append(batch["caption_image_index"].to(s.device))
            compositional.append(batch["compositional"].to(s.device))
            if "phrase_node" in batch and p is not None:
                top = image_index[p.argmax(0)].cpu() if p.shape[1] else torch.zeros(0, dtype=torch.long)
                hit_batches.append(phrase_hits(top, batch["phrase_denotation_ptr"], batch["phrase_denotation"]))
        sentence = gdist.gather_no_grad(torch.cat(sentence))  # (C, I)
        caption_ids = gdist.gather_no_grad(torch.cat(caption_ids))
        caption_image = gdist.gather_no_grad(torch.cat(caption_image))
        compositional = gdist.gather_no_grad(torch.cat(compositional))
        hits = gdist.gather_no_grad(torch.cat(hit_batches).to(sentence.device).float()) if hit_batches else None
        _, keep = _unique_first(caption_ids)
        # with limit_*_batches only some images were embedded: score the captions of those images
        keep = keep[torch.isin(caption_image[keep], image_index.to(caption_image.device))]
        rows = torch.searchsorted(image_index.to(caption_image.device), caption_image[keep])
        scores = sentence[keep].T.float().cpu()
        if split == "test":  # kept for the leaderboard (test only: a validation matrix would sit in memory all fit)
            self.scored[split] = RetrievalScores(scores, rows.cpu(), caption_ids[keep].cpu())
        metrics = composer_metrics(scores, rows.cpu(), compositional[keep].bool().cpu(),
                                   phrase_r1=100.0 * hits.mean().item() if hits is not None and len(hits) else None)
        k = getattr(self, "rerank_top_k", None)
        if self.first_stage_batches and len(self.first_stage_batches) == len(store["captions"]):
            # the rerank's ceiling: how often the first stage puts the caption's image in its top K
            first = gdist.gather_no_grad(torch.cat(self.first_stage_batches))[keep].T.float().cpu()
            metrics[f"first_stage/t2i_r{k}"] = retrieval_metrics(first, rows.cpu(), ks=(k,))[f"t2i_r{k}"]
        for key, value in metrics.items():
            self.log(f"{split}/{key}", value, prog_bar=key == "rsum", rank_zero_only=False, sync_dist=False)


class TrainRecall(Callback):
    """``train_recall_images: N``: how well the model fits its training data, every epoch: the captions of the first
    N training images against those images, scored by the module's evaluation (``train/t2i_r1``, ``train/t2i_r5``,
    ``train/i2t_r1``, ``train/rsum``; rank 0's own computation, not gathered)."""

    def __init__(self, n_images: int):
        self.n_images = n_images

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        dm = getattr(trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "graphs"):
            return
        metrics = train_recall(pl_module, dm, self.n_images)
        for key in ("t2i_r1", "t2i_r5", "i2t_r1", "rsum"):
            pl_module.log(f"train/{key}", metrics[key], rank_zero_only=True, sync_dist=False)


@dataclass(frozen=True)
class ComposerLosses:
    """COMPOSER's objective beyond ℓ_match (§3.3): ℓ_MVSA and ℓ_order, their weights and reduction.

    ``mvsa_loss``: ``hinge`` (paper, margin ``mvsa_margin`` α = 0.8) | ``nll`` | null (off; Table 5).
    ``mvsa_weight`` / ``order_weight``: λ₁, λ₂ (paper 1, 1; 0 turns a term off), ``order_margin`` β = 0.2.
    ``concept_reduction``: ``sum`` over a caption's concepts and edges (paper) or ``mean`` (see losses).
    ``aux_ramp_steps``: λ₁ and λ₂ rise linearly from 0 over the first N optimizer steps (0: the paper's constant
    weights)."""

    mvsa_loss: str | None = "hinge"
    mvsa_margin: float = 0.8
    mvsa_weight: float = 1.0
    order_margin: float = 0.2
    order_weight: float = 1.0
    concept_reduction: str = "sum"
    aux_ramp_steps: int = 0

    def __post_init__(self):
        check_choices(self, "losses.", mvsa_loss=(*MVSA_LOSSES, None), concept_reduction=REDUCTIONS)
        if self.aux_ramp_steps < 0:
            raise ValueError(f"losses.aux_ramp_steps must be >= 0; got {self.aux_ramp_steps}")


class ComposerTraining(RegionRetrievalModule):
    """COMPOSER on a :class:`grounding.composer.data.ComposerDataModule`.

    ``losses``: ℓ_MVSA and ℓ_order, their weights, reduction and warm-up (:class:`ComposerLosses`; a config writes
    it as a mapping: ``losses: {mvsa_loss: null}``).
    ``hard_negatives``: ``pool`` (paper: the batch's ``hard_caption`` rows, a caption of one of x_i's nearest
    training images; the DataModule's ``hard_negatives`` must be ``pool`` too, linked in grounding/cli.py),
    ``batch`` (the in-batch image nearest by mean region feature) or ``random``.
    ``rerank_top_k``: evaluate by composing only the top-K images of the primitive-score first stage.
    ``new_layer_lr_scale``: every layer but the pretrained Predicate Transformer at this multiple of the
    learning rate (1: the paper's single rate). ``train_recall_images``: log train recall on that many training
    images every epoch (:class:`RegionRetrievalModule`).
    """

    def __init__(self, net: Composer, losses: ComposerLosses = ComposerLosses(), hard_negatives: str = "batch",
                 new_layer_lr_scale: float = 1.0, train_recall_images: int | None = None,
                 rerank_top_k: int | None = None, first_stage_scores: str | None = None, eval_image_chunk: int = 64,
                 feature_cache: bool = True, feature_cache_dir: str | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler, new_layer_lr_scale, train_recall_images, first_stage_scores)
        if hard_negatives not in HARD_NEGATIVES:
            raise ValueError(f"hard_negatives must be one of {HARD_NEGATIVES}; got {hard_negatives!r}")
        # Evaluation knobs stay out of the checkpoint: LightningCLI re-applies a checkpoint's hyperparameters
        # over the command line, and `test --ckpt_path ... --model.init_args.rerank_top_k K` must take effect.
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler", "rerank_top_k", "first_stage_scores",
                                          "eval_image_chunk"])
        self.net = self.adopt_net(net)
        self.losses = losses
        self.mvsa_loss, self.mvsa_margin, self.mvsa_weight = losses.mvsa_loss, losses.mvsa_margin, losses.mvsa_weight
        self.order_margin, self.order_weight = losses.order_margin, losses.order_weight
        self.concept_reduction = losses.concept_reduction
        self.hard_negatives = hard_negatives
        self.aux_ramp_steps = losses.aux_ramp_steps
        self.steps_taken: int | None = None  # set by loops without a Trainer (diagnostics.fit_small)
        self.rerank_top_k, self.eval_image_chunk = rerank_top_k, eval_image_chunk
        # detector regions from files have no frozen CNN to cache
        self.feature_cache = feature_cache and self.net.backbone is not None
        self.feature_cache_dir = feature_cache_dir

    # ---------------------------------------------------------------- training
    def negatives(self, regions: torch.Tensor, region_mask: torch.Tensor, batch: dict | None = None) -> "FourWayNegatives":
        """ℓ_match's three negatives of every positive row (:func:`four_way_negatives`)."""
        return four_way_negatives(regions, region_mask, self.hard_negatives, hard_caption_rows(batch or {}))

    def aux_weight(self) -> float:
        """The factor on λ₁ and λ₂ now: step / ``aux_ramp_steps`` while ramping, then 1."""
        if not self.aux_ramp_steps:
            return 1.0
        step = self.steps_taken if self.steps_taken is not None else self.global_step
        return min(1.0, step / self.aux_ramp_steps)

    def compute_losses(self, batch: dict) -> dict[str, torch.Tensor]:
        """ℓ_match + λ₁ ℓ_MVSA + λ₂ ℓ_order of one batch. Every index is built on the host from the batch's
        :class:`~grounding.composer.batch.CaptionIndex` and the negatives drawn there (a hard caption chosen on the
        device composes as an open pair): the step never waits for the device (tests/test_host_sync.py)."""
        regions, region_mask = self.regions(batch)
        dev = regions.device
        ramp = self.aux_weight()
        b = len(regions)
        index = batch["host"]
        neg = self.negatives(regions, region_mask, batch)
        rows = np.arange(b)
        hard = neg.hard if neg.hard is not None else np.full(b, -1)
        schedule = pair_schedule(index, np.concatenate([rows, neg.random_caption, rows, hard]),
                                 np.concatenate([rows, rows, neg.random_image, rows]), open_candidates=rows)
        ptr = schedule.pair_ptr  # host
        # ℓ_MVSA and ℓ_order run over the B positive captions (a pool batch has B hard captions after them)
        mvsa_on = self.mvsa_loss is not None and self.mvsa_weight
        if mvsa_on:
            # every non-sentence concept of y_i: against c⁻ of the random caption (pair b+i) and against x⁻ (pair 2b+i)
            node_ptr = index.node_ptr[:b + 1]
            owner, k = ragged_arange(np.diff(node_ptr))
            keep = k != index.caption_root[owner]
            owner, k = owner[keep], k[keep]
            partner = same_height_partners(node_ptr, index.node_height[:node_ptr[b]], neg.random_caption)[node_ptr[owner] + k]
            schedule.attach(mvsa_rows=np.stack([ptr[owner] + k, ptr[b + owner] + partner, ptr[2 * b + owner] + k]),
                            mvsa_owner=owner)
        if self.order_weight:
            row, slot = np.nonzero((index.app_args >= 0) & (index.app_caption < b)[:, None])
            cap = index.app_caption[row]
            schedule.attach(order_rows=np.stack([ptr[cap] + index.app_local[row], ptr[cap] + index.app_args[row, slot]]),
                            order_owner=cap)
        sched = schedule.to(dev)
        pair_caption = sched.pair_caption if neg.hard is not None else torch.cat([sched.pair_caption[:3 * b], neg.hard_device])
        table, ptr = self.net.compose(batch, regions, region_mask, None, pair_caption, schedule=sched)
        s = self.net.node_scores(table, ptr, regions, region_mask, sched.pair_image)
        root = batch["caption_root"]
        scores = s[ptr[:-1] + root[pair_caption]].view(4, b).T  # (B, 4): positive, then the 3 negatives
        losses = {"match": match_nll(scores)}
        loss = losses["match"]
        if mvsa_on:
            positive, negative_concept, negative_image = sched.mvsa_rows
            losses["mvsa"] = mvsa_loss(s[positive], s[negative_concept], s[negative_image], sched.mvsa_owner, b, self.mvsa_margin,
                                       self.mvsa_loss, self.concept_reduction)
            loss = loss + ramp * self.mvsa_weight * losses["mvsa"]
        if self.order_weight:
            parent, child = s[sched.order_rows[0]], s[sched.order_rows[1]]
            losses["order"] = order_loss(parent, child, sched.order_owner, b, self.order_margin, self.concept_reduction)
            loss = loss + ramp * self.order_weight * losses["order"]
        losses["loss"] = loss
        losses["accuracy"] = (scores.argmax(1) == 0).float().mean()
        return losses

    def training_step(self, batch, batch_idx):
        losses = self.compute_losses(batch)
        b = len(batch["image_index"])
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=b)
        for name in ("match", "mvsa", "order", "accuracy"):
            if name in losses:
                self.log(f"train/{name}", losses[name], batch_size=b)
        return losses["loss"]

    def score_caption_batch(self, batch, regions, region_mask, split="test", first=None):
        """Every caption composed with every image (or the first stage's top-K, ``rerank_top_k``: ``first``, another
        model's scores, else the mean primitive score; the first stage's scores are kept for its recall@K, the
        rerank's ceiling)."""
        if self.rerank_top_k is not None and self.rerank_top_k < len(regions):
            if first is None:
                first = primitive_first_stage(self.net, batch, regions, region_mask, self.eval_image_chunk)
            self.first_stage_batches.append(first.T)
        return score_captions(self.net, batch, regions, region_mask, self.eval_image_chunk, self.rerank_top_k, first)


def hard_caption_rows(batch: dict) -> np.ndarray | None:
    """A pool batch's hard-caption rows on the host: the collate's copy, or a host tensor given with the batch."""
    rows = getattr(batch.get("host"), "hard_caption", None)
    if rows is None and batch.get("hard_caption") is not None:
        rows = host_numpy(batch["hard_caption"])
    return rows


@dataclass
class FourWayNegatives:
    """ℓ_match's negatives of each positive row i: (x_i, a random other caption), (a random other image, y_i) and
    (x_i, a hard caption). The random draws are host arrays; ``hard`` is one too unless the device chose it
    (``hard_negatives: batch``), and ``hard_device`` is always the hard caption on the regions' device."""

    random_caption: np.ndarray
    random_image: np.ndarray
    hard: np.ndarray | None
    hard_device: torch.Tensor


def four_way_negatives(regions: torch.Tensor, region_mask: torch.Tensor, mode: str = "batch",
                       hard_caption: np.ndarray | None = None) -> FourWayNegatives:
    """(random caption, random image, hard caption) rows for every positive row of a batch, ViLBERT's retrieval
    negatives (the 4-way NLL of COMPOSER and the ViLBERT-style baseline). ``mode`` ``pool``: ``hard_caption``, the
    batch's pool rows; ``batch``: the caption of the batch image nearest by mean region token, other than the
    random one (chosen on the device); ``random``: another random batch caption. The random rows are drawn on the
    host by torch's generator (a CPU run draws the same stream as before they moved to the host)."""
    b = len(regions)
    if b < 3:
        raise ValueError(f"the 4-way retrieval loss needs at least 3 pairs a batch; got {b} (raise batch_size)")
    rows = torch.arange(b)
    random_caption = (rows + torch.randint(1, b, (b,))) % b
    random_image = (rows + torch.randint(1, b, (b,))) % b
    dev = regions.device
    hard = hard_device = None
    if mode == "pool":
        if hard_caption is None:
            raise ValueError("hard_negatives: pool needs batches with hard captions: set the DataModule's "
                             "hard_negatives to pool as well (the CLI links it from the model's)")
        hard = np.asarray(hard_caption, dtype=np.int64)
    elif mode == "batch":
        with torch.no_grad():
            m = region_mask.unsqueeze(-1).to(regions.dtype)
            pooled = F.normalize((regions * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)
            sim = pooled @ pooled.T
            sim.fill_diagonal_(float("-inf"))
            sim[torch.arange(b, device=dev), random_caption.to(dev)] = float("-inf")  # other than the random one
            hard_device = sim.argmax(1)
    else:
        other = (random_caption + torch.randint(1, b - 1, (b,))) % b
        hard = host_numpy(torch.where(other == rows, (other + 1) % b, other))
    if hard_device is None:
        hard_device = torch.from_numpy(hard).to(dev)
    return FourWayNegatives(host_numpy(random_caption), host_numpy(random_image), hard, hard_device)


def _unique_first(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted unique ids and the first position of each (drops the distributed sampler's repeats)."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((len(uniq),), len(ids), dtype=torch.long, device=ids.device).scatter_reduce(
        0, inverse, torch.arange(len(ids), device=ids.device), "amin")
    return uniq, first
