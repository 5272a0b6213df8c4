"""COMPOSER's retrieval baselines (§5.2, App. C), trained and evaluated on the same data, regions and metrics.

VSE (Kiros et al., 2014, re-implemented as the paper did): the caption y is the mean of the text encoder's
last-layer word-piece embeddings (paper: 12-layer bert-base-uncased), the image x the mean over its regions
of a residual MLP that maps each region feature into the joint space; s(x, y) = cos(x, y), trained with
VSE++'s hinge ranking loss over the batch's hardest negatives (Faghri et al., 2018;
:func:`grounding.losses.vse_hinge_loss`). The regions are COMPOSER's (:meth:`Composer.embed_regions`'s
sources: the frozen backbone's grid, RoI-aligned boxes or detector files), so the feature cache,
:class:`grounding.composer.data.ComposerDataModule` and :func:`composer_metrics` serve both unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from grounding.encoders import load_text_encoder
from grounding.lightning import LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.losses import vse_hinge_loss
from grounding.nets import RecordedNet
from grounding.precision import dot_similarity

from .model import region_backbone, region_features
from .training import RegionRetrievalModule


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` (B,N,d) over the positions where ``mask`` (B,N) is True."""
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


class ResidualBlock(nn.Module):
    """x + W₂ ReLU(W₁ LN(x)): one block of VSE's image MLP (App. C: "an MLP model with the residual
    connection"; the paper gives no depth, width or norm: pre-LN, the joint width, ``image_layers`` blocks)."""

    def __init__(self, dim: int, dropout: float = 0.1):
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class VSE(RecordedNet):
    """VSE as COMPOSER's paper re-implements it (App. C): text = mean of ``text_encoder``'s last layer over the
    caption's word pieces (its first ``text_layers`` layers; paper 12 of bert-base-uncased), image = masked
    mean over the regions of a linear map to the joint width plus ``image_layers`` residual MLP blocks;
    both L2-normalised. ``dim``: the joint width (null: the text width, the paper's; otherwise the text mean
    is projected by a linear layer). Regions as :class:`grounding.composer.model.Composer`'s (``region_source``
    ``grid`` | ``files`` | ``boxes``); region boxes only place RoIs (the paper's VSE uses the features alone).
    """

    def __init__(self, text_encoder: str = "minilm", text_layers: int | None = None, region_source: str = "grid",
                 backbone: str = "efficientnet_lite0", backbone_weights: str | None = "default", region_dim: int | None = None,
                 image_size: int = 224, image_layers: int = 2, dim: int | None = None, dropout: float = 0.1):
        super().__init__()
        if image_layers < 0:
            raise ValueError(f"image_layers must be >= 0 residual blocks; got {image_layers}")
        self.region_source = region_source
        self.image_size = image_size
        overrides = {} if text_layers is None else {"num_hidden_layers": text_layers}
        self.text_encoder = load_text_encoder(text_encoder, **overrides)
        # the DataModule's tokenizer size, checked at setup (VSE adds no placeholder word pieces)
        self.placeholder_base = self.text_encoder.config.vocab_size
        width = self.text_encoder.config.hidden_size
        self.dim = dim or width
        self.text_proj = nn.Identity() if self.dim == width else nn.Linear(width, self.dim)
        self.backbone, region_dim = region_backbone(region_source, backbone, backbone_weights, region_dim)
        self.region_proj = nn.Linear(region_dim, self.dim)
        self.image_mlp = nn.Sequential(*(ResidualBlock(self.dim, dropout) for _ in range(image_layers)))

    # -------------------------------------------------------------------- image side
    def embed_regions(self, images: torch.Tensor | None = None, features: torch.Tensor | None = None,
                      boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """Every region in the joint space (B,N,d) and the mask (B,N), from the same inputs as
        :meth:`Composer.embed_regions` (pixels or cached maps; detector ``features``; ``boxes`` over the maps)."""
        features, _, mask = region_features(self.region_source, self.backbone, self.region_proj.weight.dtype,
                                            images, features, boxes, mask)
        return self.image_mlp(self.region_proj(features)), mask

    def encode_images(self, regions: torch.Tensor, region_mask: torch.Tensor) -> torch.Tensor:
        """x: the L2-normalised mean of the embedded regions (B,d)."""
        return F.normalize(masked_mean(regions, region_mask), dim=-1)

    # -------------------------------------------------------------------- text side
    def encode_texts(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """y: the L2-normalised mean of the last layer over the word pieces ([CLS] and [SEP] included) (C,d)."""
        hidden = self.text_encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return F.normalize(self.text_proj(masked_mean(hidden, mask)), dim=-1)

    def forward(self, regions: torch.Tensor, region_mask: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                ) -> torch.Tensor:
        """s(x, y) = cos(x, y) of every (image, caption): (B_images, B_captions)."""
        return dot_similarity(self.encode_images(regions, region_mask), self.encode_texts(ids, mask))


class VSETraining(RegionRetrievalModule):
    """VSE on a :class:`grounding.composer.data.ComposerDataModule` batch: the hinge ranking loss of the B positive
    (image, caption) pairs over the in-batch negatives (``hardest_negatives``: VSE++'s hardest one per positive and
    direction; false: VSE0's sum over all), ``margin`` α (VSE++: 0.2). The DataModule's hard-negative captions
    (``hard_negatives: pool``) are not used. ``sum_negatives_epochs``: train with VSE0's sum for the first N epochs,
    then with the hardest negatives (a warm-up the paper does not mention; 0 = VSE++ from the start). Evaluation
    is COMPOSER's (same loaders, :func:`composer_metrics`), with Table 5's phrase R@1 scoring each phrase query's
    own text against every image.
    """

    def __init__(self, net: VSE, margin: float = 0.2, hardest_negatives: bool = True, sum_negatives_epochs: int = 0,
                 feature_cache: bool = True,
                 feature_cache_dir: str | None = None, optimizer: OptimizerCallable = default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.net = self.adopt_net(net)
        self.margin, self.hardest_negatives, self.sum_negatives_epochs = margin, hardest_negatives, sum_negatives_epochs
        self.feature_cache = feature_cache and self.net.backbone is not None
        self.feature_cache_dir = feature_cache_dir

    def compute_losses(self, batch: dict) -> dict[str, torch.Tensor]:
        if "caption_ids" not in batch:
            raise ValueError("VSE needs the batch's caption word pieces (caption_ids): build the TokenTables with the "
                             "split's caption texts (ComposerDataModule does)")
        regions, region_mask = self.regions(batch)
        b = len(regions)  # a pool batch carries B hard captions after the B positives: in-batch negatives only
        similarity = self.net(regions, region_mask, batch["caption_ids"][:b], batch["caption_mask"][:b])
        hardest = self.hardest_negatives and self.current_epoch >= self.sum_negatives_epochs
        loss = vse_hinge_loss(similarity, self.margin, hardest)
        rows = torch.arange(b, device=similarity.device)
        return {"loss": loss, "accuracy": (similarity.argmax(1) == rows).float().mean()}

    def training_step(self, batch, batch_idx):
        losses = self.compute_losses(batch)
        b = len(batch["image_index"])
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=b)
        self.log("train/accuracy", losses["accuracy"], batch_size=b)
        return losses["loss"]

    @torch.no_grad()
    def score_caption_batch(self, batch, regions, region_mask):
        """cos(x, y) of every image and caption of the batch, and of every image and phrase query."""
        images = self.net.encode_images(regions, region_mask)
        dev = regions.device
        sentence = dot_similarity(images, self.net.encode_texts(batch["caption_ids"].to(dev), batch["caption_mask"].to(dev)))
        phrases = None
        if "phrase_ids" in batch:
            ids, mask = batch["phrase_ids"].to(dev), batch["phrase_mask"].to(dev)
            phrases = dot_similarity(images, self.net.encode_texts(ids, mask)) if len(ids) else images.new_zeros(len(images), 0)
        return sentence, phrases
