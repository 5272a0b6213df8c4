"""VG-BERT multimodal image search (§4.5, App. B.5): heads F_V and F_L on the joint attention space.

F_V is applied to every location of the image key Key_V and F_L to every word of the language
query Query_L of the stage-2 cross-modal attention (heads concatenated, width d = 768 in the
paper): Linear - ReLU - Linear per token, mean-pooled (Eqs. 15-16), L2-normalised (Eq. 17). With
the stage-2 model frozen, only the heads are trained, contrastively on image-caption pairs.
A search query blends both: Q_search = (1 - alpha) Q_I + alpha Q_W (Eq. 18), ranked by cosine.

:class:`SearchHeads` (LightningModule) starts from a stage-2 checkpoint (``init_from``); its
architecture (``stage2``: text_encoder, backbone, widths, label lists) is read from that checkpoint
and stored in its own hyperparameters, so a search checkpoint is self-contained.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from grounding import distributed as gdist
from grounding.checkpoints import CheckpointError, load_submodules, read_checkpoint
from grounding.contrastive import cross_modal_contrastive_loss
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import constructor_args, flat_args, net_hparams
from grounding.precision import dot_similarity
from grounding.retrieval_metrics import RetrievalScores, retrieval_metrics
from grounding.retrieval_training import drop_sampler_repeats, flat_caption_order
from grounding.vgbert.relational import VGBertRelational

# Stage-2 hyperparameters that define the frozen model's architecture.
STAGE2_ARCH_KEYS = ("text_encoder", "backbone", "trainable_layers", "freeze_query_key", "dropout",
                    "attention_dropout", "visual_heads", "image_size", "num_heads", "relation_dim", "query_pooling",
                    "classifier_hidden", "relation_labels", "object_classes", "key_position", "spatial_centroid",
                    "spatial_scale", "shared_object_transform", "relation_dropout", "classifier_dropout",
                    "cross_attention_dropout", "query_key_bias", "count_special_tokens", "visual_attention_dropout",
                    "visual_ffn_dropout")


class SearchHead(nn.Module):
    """F(X) = mean_k (ReLU(X_k W1 + b1) W2 + b2), L2-normalised (App. B.5 Eqs. 15-17); ``dropout`` > 0
    puts a dropout between ReLU and W2, as the official heads (``nn.Dropout()``, p = 0.5)."""

    def __init__(self, width: int, hidden: int | None = None, out_dim: int | None = None, dropout: float = 0.0):
        super().__init__()
        middle = [nn.Dropout(dropout)] if dropout > 0 else []  # only when used: plain heads keep their indices
        self.mlp = nn.Sequential(nn.Linear(width, hidden or width), nn.ReLU(), *middle,
                                 nn.Linear(hidden or width, out_dim or width))

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens (N, L, D) [+ mask (N, L) of the tokens to average] -> unit vectors (N, out)."""
        y = self.mlp(tokens)
        if mask is None:
            pooled = y.mean(1)
        else:
            w = mask.to(y.dtype)
            pooled = (y * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(1.0)
        return F.normalize(pooled, dim=-1)


def multimodal_query(q_image: torch.Tensor | None, q_text: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """Q_search = (1 - alpha) Q_I + alpha Q_W (Eq. 18); one side alone when the other is None."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1]; got {alpha}")
    if q_image is None and q_text is None:
        raise ValueError("A search needs an image query, a text query, or both.")
    if q_text is None:
        return q_image
    if q_image is None:
        return q_text
    return (1.0 - alpha) * q_image + alpha * q_text


def rank_images(index: torch.Tensor, query: torch.Tensor, top_k: int, exclude: torch.Tensor | None = None):
    """Cosine similarity of query (D,) or (Q, D) against an index of unit vectors (M, D): top-k (scores, ids)."""
    q = F.normalize(query.float(), dim=-1)
    scores = q @ index.float().t()
    if exclude is not None:
        scores = scores.index_fill(-1, exclude, float("-inf"))
    return scores.topk(min(top_k, index.shape[0]), dim=-1)


class MultimodalSearch(nn.Module):
    """A frozen :class:`VGBertRelational` (``grounding``) with the two trainable heads F_V and F_L."""

    def __init__(self, grounding: VGBertRelational, hidden: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.grounding = grounding
        self.grounding.requires_grad_(False)
        width = grounding.language.width
        self.image_head = SearchHead(width, hidden, dropout=dropout)  # F_V
        self.text_head = SearchHead(width, hidden, dropout=dropout)   # F_L

    def train(self, mode: bool = True):
        super().train(mode)
        self.grounding.eval()  # frozen: no dropout in the features the heads learn from
        return self

    def image_keys(self, images: torch.Tensor) -> torch.Tensor:
        """Key_V (B, h*w, D) of pixels or cached backbone maps."""
        with torch.no_grad():
            return self.grounding.relational.attention.keys(self.grounding.encode_images(images))

    def text_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Query_L (N, T, D) and the mask of the caption's words (the K words of Eq. 16)."""
        with torch.no_grad():
            words, mask = self.grounding.encode_words(input_ids, attention_mask)
            return self.grounding.relational.attention.queries(words), mask

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return self.image_head(self.image_keys(images))  # Q_I (Eq. 15, 17)

    def encode_texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q, mask = self.text_queries(input_ids, attention_mask)
        return self.text_head(q, mask)  # Q_W (Eq. 16, 17)


def resolve_stage2(init_from: str | None, stage2: dict | None) -> dict:
    """The frozen model's architecture: from the stage-2 checkpoint, checked against ``stage2``."""
    given = flat_args(VGBertRelational, stage2 or {})  # a stage-2 net's option groups, written flat here
    if "relation_labels" in given and "object_classes" in given:
        return given  # already resolved (a search checkpoint's own hyperparameters)
    if init_from is None:
        # No stage-2 model (tests / smoke runs): the heads then sit on untrained cross-attention.
        given.setdefault("relation_labels", ["related"])
        given.setdefault("object_classes", ["object"])
        return given
    hp = read_checkpoint(init_from, "stage-2")["hyper_parameters"]
    if not hp.get("relation_labels") or not hp.get("object_classes"):
        raise CheckpointError(f"{init_from} has no relation_labels/object_classes hyperparameters: is it a "
                              "RelationalFinetune (stage-2) checkpoint?")
    arch = {**flat_args(VGBertRelational, net_hparams(hp)), "relation_labels": hp["relation_labels"],
            "object_classes": hp["object_classes"]}
    resolved = {k: arch[k] for k in STAGE2_ARCH_KEYS if k in arch}
    for k, v in given.items():
        if k in resolved and resolved[k] != v:
            raise CheckpointError(f"stage2.{k}={v!r} in the config contradicts the stage-2 checkpoint {init_from} "
                                  f"({resolved[k]!r}); drop it from the config (the checkpoint defines it).")
        resolved.setdefault(k, v)
    return resolved


class SearchHeads(GroundingModule):
    """Train F_V / F_L (App. B.5) on caption batches with the symmetric InfoNCE loss; monitors ``val/rsum``.

    Args: init_from (stage-2 checkpoint), text_encoder / backbone / backbone_weights / visual_heads /
    image_size and stage2 (further VGBertRelational args): the frozen model's architecture, read from
    init_from when given (then only checked against it),
    head_hidden (hidden width of F_V / F_L; default d), head_dropout (between the heads' two layers;
    official 0.5, search_paper.yaml; default 0), temperature [0.1, as every VG-BERT
    contrastive loss], feature_cache [True], eval_fold_size (COCO-1K folds).
    """

    monitor = "val/rsum"
    monitor_mode = "max"
    # what init_from must be (checked by `python -m grounding` before any model is built)
    init_from_checkpoint = ("stage-2", ("model.relational.", "model.visual.", "model.language."))

    def __init__(self, init_from: str | None = None, text_encoder: str | None = None, backbone: str | None = None,
                 backbone_weights: str | None = "default", visual_heads: int | None = None,
                 image_size: int | None = None, stage2: dict | None = None, head_hidden: int | None = None,
                 head_dropout: float = 0.0, temperature: float = 0.1, feature_cache: bool = True, feature_cache_dir: str | None = None,
                 eval_fold_size: int | None = None, optimizer: OptimizerCallable = default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        # Architecture: read from the stage-2 checkpoint; the explicit args (None = "as the checkpoint
        # says") are checked against it, and define the frozen model when there is no checkpoint.
        given = dict(stage2 or {})
        for key, value in (("text_encoder", text_encoder), ("backbone", backbone), ("visual_heads", visual_heads),
                           ("image_size", image_size)):
            if value is not None:
                given.setdefault(key, value)
        if init_from is None and "relation_labels" not in given:
            given.setdefault("backbone_weights", backbone_weights)
        stage2 = resolve_stage2(init_from, given)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.hparams["stage2"] = stage2
        s = dict(stage2)
        rel, obj = s.pop("relation_labels"), s.pop("object_classes")
        if init_from:  # the stage-2 weights (CNN included) come from init_from: no ImageNet file is read
            s["backbone_weights"] = self.hparams["stage2"]["backbone_weights"] = None
        net = VGBertRelational(len(rel), len(obj), **constructor_args(VGBertRelational, s))
        self.search = MultimodalSearch(net, head_hidden, head_dropout)
        self.feature_cache, self.feature_cache_dir = feature_cache, feature_cache_dir
        self._init_loaded = False
        self._eval: dict[str, list] = {}
        self.scored: dict[str, RetrievalScores] = {}  # the last test's score matrix (the leaderboard reads it)

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.hparams.init_from and not self._init_loaded and not self.trainer.ckpt_path:
            self.load_stage2(self.hparams.init_from)

    def frozen_backbone(self) -> nn.Module:
        """The frozen CNN whose maps the feature-cache callback stores."""
        return self.search.grounding.visual.backbone

    def load_stage2(self, path: str | Path) -> None:
        load_submodules(self.search, read_checkpoint(path, "stage-2"), {"model.": "grounding"}, path, "stage-2")
        self._init_loaded = True

    def encode_images(self, images):
        return self.search.encode_images(images)

    def encode_texts(self, input_ids, attention_mask):
        return self.search.encode_texts(input_ids, attention_mask)

    def training_step(self, batch, batch_idx):
        q_i = gdist.gather_with_grad(self.encode_images(batch["images"]))
        q_w = gdist.gather_with_grad(self.encode_texts(batch["input_ids"], batch["attention_mask"]))
        losses = cross_modal_contrastive_loss(dot_similarity(q_i, q_w), self.hparams.temperature, combine="mean")
        b = q_i.shape[0]
        for k, v in losses.items():
            self.log(f"train/{k}", v, prog_bar=k == "loss", batch_size=b)
        return losses["loss"]

    def _eval_step(self, batch, split):
        self._eval.setdefault(split, []).append(
            (self.encode_images(batch["images"]).float().cpu(), batch["image_index"].cpu(),
             self.encode_texts(batch["input_ids"], batch["attention_mask"]).float().cpu(),
             batch["caption_image_index"].cpu()))

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def on_test_epoch_end(self):
        self._eval_end("test")

    def _eval_end(self, split):
        store = self._eval.pop(split, [])
        if not store:
            return
        q_i, image_index, q_w, cap_index = (torch.cat(x) for x in zip(*store))
        if gdist.is_distributed():  # every rank scores the whole split; drop the sampler's repeats
            q_i, image_index, q_w, cap_index = (gdist.gather_no_grad(t.to(self.device)).cpu()
                                                for t in (q_i, image_index, q_w, cap_index))
            q_i, image_index, q_w, _, cap_index = drop_sampler_repeats(q_i, image_index, q_w, q_w, cap_index)
        order = torch.argsort(image_index)
        q_i, image_index = q_i[order], image_index[order]
        rows = torch.searchsorted(image_index, cap_index)
        scores = dot_similarity(q_i, q_w)
        if split == "test":  # kept for the leaderboard, columns in the split's flat caption order
            self.scored[split] = flat_caption_order(scores, rows)
        metrics = retrieval_metrics(scores, rows, fold_size=self.hparams.eval_fold_size)
        for k, v in metrics.items():
            self.log(f"{split}/{k}", v, prog_bar=k == "rsum", sync_dist=False)


__all__ = ["SearchHead", "MultimodalSearch", "SearchHeads", "multimodal_query", "rank_images", "resolve_stage2"]
