"""VG-BERT stage 0: the visual stream pretrained for object classification (paper §3.3, App. A.1).

:class:`VisualStreamClassifier` (plain nn.Module) = stage 1's :class:`~grounding.vgbert.streams.VisualStream`
(frozen CNN -> linear embedder -> learnable 2D positional encoding -> one self-attention layer) + the official
code's classification head (``VGG16_Attention_classification`` in ``models/ImageModels.py``: 2x2 max-pool,
adaptive average pool to 7x7, flatten, FC 4096 - ReLU - dropout - FC 4096 - ReLU - dropout - FC classes).
``use_attention: false`` is App. A.1's baseline (Table 1's "VGG16": the embedder and the head, no positional
encoding or self-attention), the other model of the occlusion experiment (Figs. 1-2).

:class:`VisualPretrain` (LightningModule) trains it with cross-entropy and reports top-1 / top-5 accuracy.
Checkpoint layout: ``model.visual.*`` is the visual stream, under the same names as stage 1's, so stage 1
(``GroundingPretrain(visual_init_from=...)``) loads the embedder, positional encoding and self-attention from it;
``model.head.*`` is the classifier, dropped there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import RecordedNet
from grounding.vgbert.streams import VisualStream


class ClassificationHead(nn.Sequential):
    """The official head: max-pool (``maxpool`` x ``maxpool``, stride ``maxpool``; 1 = none), adaptive average pool
    to ``pool`` x ``pool``, flatten, then FC ``hidden`` - ReLU - dropout twice and FC ``num_classes``
    (``hidden`` 0: one FC layer). Input: visual tokens (B, h, w, d)."""

    def __init__(self, width: int, num_classes: int, maxpool: int = 2, pool: int = 7, hidden: int = 4096,
                 dropout: float = 0.5):
        layers: list[nn.Module] = [nn.MaxPool2d(maxpool, maxpool)] if maxpool > 1 else []
        layers += [nn.AdaptiveAvgPool2d(pool), nn.Flatten(1)]
        features = width * pool * pool
        for _ in range(2 if hidden else 0):
            layers += [nn.Linear(features, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
            features = hidden
        layers.append(nn.Linear(features, num_classes))
        super().__init__(*layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens.permute(0, 3, 1, 2))


class VisualStreamClassifier(RecordedNet):
    """The visual stream + a classification head (App. A.1).

    Args (paper values in brackets): num_classes [1000; linked from the DataModule's classes], width d [768:
    BERT-base's; MiniLM 384: the stage-1 language stream's width], backbone [vgg16], backbone_weights, visual_heads
    [12], dropout [0.1: the official ``SpatialSelfAttention`` default], visual_attention_dropout /
    visual_ffn_dropout [0: the official layout; null = dropout], image_size [224], use_attention [True; False:
    App. A.1's baseline without positional encoding and self-attention], head_maxpool / head_pool / head_hidden /
    head_dropout [2 / 7 / 4096 / 0.5: torchvision's VGG classifier, as the official code].
    """

    def __init__(self, num_classes: int, width: int = 768, backbone: str = "vgg16",
                 backbone_weights: str | None = "default", visual_heads: int = 12, dropout: float = 0.1,
                 visual_attention_dropout: float | None = None, visual_ffn_dropout: float | None = None,
                 image_size: int = 224, use_attention: bool = True, head_maxpool: int = 2, head_pool: int = 7,
                 head_hidden: int = 4096, head_dropout: float = 0.5):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"VisualStreamClassifier needs at least 2 classes; got num_classes={num_classes}.")
        self.visual = VisualStream(width, backbone, backbone_weights, visual_heads, dropout, image_size,
                                   attention_dropout=visual_attention_dropout, ffn_dropout=visual_ffn_dropout)
        self.use_attention = use_attention
        if not use_attention:  # the baseline never uses them: no gradients, no optimizer state
            self.visual.attention.requires_grad_(False)
            self.visual.position.requires_grad_(False)
        self.head = ClassificationHead(width, num_classes, head_maxpool, head_pool, head_hidden, head_dropout)

    def backbone_maps(self, images: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, H, W) -> the frozen CNN's maps; cached maps (B, C, h, w) pass through."""
        return self.visual.backbone_features(images) if images.shape[1] == 3 else images

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Pixels or cached backbone maps -> visual tokens (B, h, w, d) (the self-attention's output)."""
        maps = self.backbone_maps(images)
        return self.visual(features=maps) if self.use_attention else self.visual.embed(maps)  # baseline: no PE / attention

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, H, W) or cached backbone maps (B, C, h, w) -> class logits (B, num_classes)."""
        return self.head(self.tokens(images))

    def attention_weights(self, images: torch.Tensor) -> torch.Tensor:
        """The self-attention layer's weights (B, heads, h*w, h*w) (query location -> key location), as
        ``VisualStream.forward`` computes them (its layer is post-norm: attention over its input)."""
        if not self.use_attention:
            raise ValueError("this classifier was trained without self-attention (use_attention: false).")
        x = self.visual.attention_input(self.backbone_maps(images))
        _, weights = self.visual.attention.self_attn(x, x, x, need_weights=True, average_attn_weights=False)
        return weights


class VisualPretrain(GroundingModule):
    """VG-BERT stage 0 (App. A.1): object classification with the visual stream; monitors ``val/top1`` (max).

    ``net``: the built :class:`VisualStreamClassifier` (its ``num_classes`` and this module's ``class_names`` come
    from the DataModule, linked by the CLI). Training options: top_k [(1, 5): the accuracies reported],
    label_smoothing [0], feature_cache [True: the frozen CNN runs once per image; the official code trains VGG16 too
    and augments every epoch, see docs/vgbert.md], optimizer / lr_scheduler [official: SGD lr 0.01, momentum 0.9,
    weight decay 1e-4, halved every 20 epochs].
    """

    monitor = "val/top1"
    monitor_mode = "max"

    def __init__(self, net: VisualStreamClassifier, class_names: list[str] | None = None,
                 top_k: tuple[int, ...] = (1, 5), label_smoothing: float = 0.0, feature_cache: bool = True,
                 feature_cache_dir: str | None = None, optimizer: OptimizerCallable = default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.model = self.adopt_net(net)
        num_classes = self.model.init_args["num_classes"]
        if class_names is not None:
            self.hparams.class_names = list(class_names)
            if len(class_names) != num_classes:
                raise ValueError(f"The network scores {num_classes} classes but {len(class_names)} class names were "
                                 "given; the CLI links both from the DataModule.")
        self.feature_cache, self.feature_cache_dir = feature_cache, feature_cache_dir
        self.metrics = nn.ModuleDict({f"{split}_top{k}": MulticlassAccuracy(num_classes, top_k=min(int(k), num_classes),
                                                                            average="micro")
                                      for split in ("train", "val", "test") for k in top_k})

    def frozen_backbone(self) -> nn.Module:
        """The frozen CNN whose maps the feature-cache callback stores."""
        return self.model.visual.backbone

    def _step(self, batch, split: str):
        logits = self.model(batch["images"])
        labels = batch["labels"]
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        b = labels.shape[0]
        self.log(f"{split}/loss", loss, prog_bar=split == "train", batch_size=b, sync_dist=split != "train")
        for k in self.hparams.top_k:
            metric = self.metrics[f"{split}_top{k}"]
            metric.update(logits.detach(), labels)
            self.log(f"{split}/top{k}", metric, prog_bar=k == 1 and split != "train", batch_size=b, on_step=False,
                     on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """Class probabilities (B, num_classes)."""
        return self.model(batch["images"]).softmax(-1)


__all__ = ["ClassificationHead", "VisualStreamClassifier", "VisualPretrain"]
