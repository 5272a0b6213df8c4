"""CLIP-style dual-encoder baseline for stage 1: the same two streams, global pooling, dot product.

Each modality is pooled to one vector (visual: mean over locations; text: mean over real words or
the [CLS] token), linearly projected, L2-normalised and compared by a dot product; the loss is the
symmetric InfoNCE from :func:`grounding.contrastive.cross_modal_contrastive_loss` (the same code as the
match-map model, ``combine="mean"``) with a fixed or learnable temperature.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from grounding.contrastive import cross_modal_contrastive_loss
from grounding.lightning import LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import RecordedNet
from grounding.precision import dot_similarity
from grounding.retrieval_training import CaptionRetrievalModule
from grounding.vgbert.streams import LanguageStream, VisualStream


class DualEncoder(RecordedNet):
    """Two streams -> global pooling -> linear heads -> unit vectors (``packed_tokens``: see LanguageStream)."""

    def __init__(self, text_encoder: str = "minilm", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", trainable_layers: int = 8, freeze_query_key: bool = True,
                 dropout: float = 0.3, visual_heads: int = 12, projection_dim: int | None = None,
                 image_size: int = 224, text_pooling: str = "mean", attention_dropout: float | None = None,
                 packed_tokens: bool | Literal["auto"] = False, backbone_unlocked: int = 0):
        super().__init__()
        if text_pooling not in ("mean", "cls"):
            raise ValueError(f"text_pooling must be 'mean' or 'cls'; got {text_pooling!r}")
        # attention-probability dropout follows ``dropout`` unless given, as in stage 1 (MatchMapGrounding)
        self.language = LanguageStream(text_encoder, trainable_layers, freeze_query_key, hidden_dropout=dropout,
                                       attention_dropout=dropout if attention_dropout is None else attention_dropout,
                                       packed_tokens=packed_tokens)
        d = self.language.width
        self.visual = VisualStream(d, backbone, backbone_weights, visual_heads, dropout, image_size,
                                   backbone_unlocked=backbone_unlocked)
        p = projection_dim or d
        self.visual_head, self.language_head = nn.Linear(d, p), nn.Linear(d, p)
        self.text_pooling = text_pooling

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        v = self.visual(images=images) if images.shape[1] == 3 else self.visual(features=images)
        return nn.functional.normalize(self.visual_head(v.mean(dim=(1, 2))), dim=-1)

    def encode_texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.language(input_ids, attention_mask)
        if self.text_pooling == "cls":
            pooled = h[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
        return nn.functional.normalize(self.language_head(pooled), dim=-1)


class DualEncoderBaseline(CaptionRetrievalModule):
    """CLIP-style baseline LightningModule (monitors ``val/rsum``, max) over an injected :class:`DualEncoder`.

    ``temperature``: the initial (``learnable_temperature=True``, CLIP's log-parametrised scale,
    clamped to >= 0.01) or fixed softmax temperature.
    """

    def __init__(self, net: DualEncoder, temperature: float = 0.07, learnable_temperature: bool = True,
                 feature_cache: bool = True, feature_cache_dir: str | None = None, eval_fold_size: int | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler, feature_cache, feature_cache_dir, eval_fold_size)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.model = self.adopt_net(net)
        log_tau = torch.tensor(math.log(temperature))
        if learnable_temperature:
            self.log_temperature = nn.Parameter(log_tau)
        else:
            self.register_buffer("log_temperature", log_tau)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp().clamp(min=0.01)

    def encode_images(self, images):
        return self.model.encode_images(images)

    def encode_texts(self, input_ids, attention_mask):
        return self.model.encode_texts(input_ids, attention_mask), attention_mask.bool()

    def batch_similarity(self, img, txt, mask):
        return dot_similarity(img, txt)

    def compute_loss(self, similarity):
        self.log("train/temperature", self.temperature.detach())
        return cross_modal_contrastive_loss(similarity, self.temperature, combine="mean")

    def eval_scores(self, img, txt, mask):
        # (I,p) x (N,p): one matmul per image block keeps the 5K x 25K case bounded.
        out = torch.empty(img.shape[0], txt.shape[0])
        t = txt[:].to(self.device, torch.float32)
        for a in range(0, img.shape[0], 1024):
            out[a:a + 1024] = (img[a:a + 1024].to(self.device, torch.float32) @ t.t()).cpu()
        return out
