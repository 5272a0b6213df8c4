"""VG-BERT's two stand-alone streams (paper §3.1, App. A.2).

* :class:`VisualStream`: frozen CNN feature map -> 1x1 linear embedder to the text width (layer-
  normalised) -> learnable 2D positional encoding on a comparable scale -> one transformer
  self-attention layer. It accepts images or precomputed backbone feature maps (the
  frozen-backbone feature cache feeds the latter).
* :class:`LanguageStream`: a BERT whose top ``trainable_layers`` layers are refined, optionally with
  the query/key projections of every layer frozen (App. A.2: keep the pretrained syntactic
  attention, refine the value path that carries word meaning).

Both return token grids in the text width ``d``: visual ``(B, h, w, d)`` (the paper's V_ij),
language ``(B, T, d)`` (L_k). Later stages (relational finetune) build on these same classes and
find them in a stage-1 checkpoint under the ``visual.`` and ``language.`` state-dict prefixes.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from grounding.encoders import (
    bert_hidden_states,
    check_packed_tokens,
    load_text_encoder,
    load_tokenizer,
    load_visual_backbone,
    split_backbone,
)


def check_heads(width: int, num_heads: int, where: str) -> None:
    """Multi-head attention splits the width evenly: fail early with the usable head counts."""
    if num_heads < 1 or width % num_heads != 0:
        divisors = [h for h in range(1, min(width, 32) + 1) if width % h == 0]
        raise ValueError(
            f"{where}: num_heads={num_heads} does not divide the width d={width}. "
            f"Choose one of {divisors} (12 for BERT-base/MiniLM widths 768/384; 2 or 4 for tiny-random d=32)."
        )


class VisualStream(nn.Module):
    """Frozen CNN -> linear embedder -> 2D positional encoding -> one self-attention layer.

    Args:
        width: output width d (the language stream's hidden size).
        backbone: ``vgg16`` (14x14x512, the paper), ``efficientnet_lite0`` (7x7x1280, offline
            pretrained), ``tiny_cnn`` or ``timm:<name>`` (see grounding.encoders).
        backbone_weights: "default", a state-dict path, or None (random init).
        num_heads: attention heads; must divide ``width``.
        dropout: dropout of the self-attention layer's two residual branches (after the attention's output
            projection and after the FFN), as the official ``SpatialSelfAttention``.
        attention_dropout / ffn_dropout: dropout on the attention probabilities / between the FFN's two layers;
            None = ``dropout`` (``nn.TransformerEncoderLayer``'s layout, the suite's recorded runs), 0 = none (the
            official code). On a CPU, dropout on the (B, heads, N, N) probabilities makes the attention ~10x
            slower at 14x14 locations (``make bench``, feature cache).
        image_size: the input crop size; with the backbone stride it sets the positional grid
            (a map of another size interpolates the encoding bilinearly).
        position_std: initial std of the positional encoding, relative to the layer-normalised
            content (unit scale per dimension).
        backbone_unlocked: how many of the backbone's last layer groups train with the stream
            (:func:`grounding.encoders.split_backbone`; 0, the papers' frozen CNN, in every recorded run). The
            feature cache then stores the frozen trunk's maps and the trained tail runs at every step.
    """

    def __init__(self, width: int = 768, backbone: str = "vgg16", backbone_weights: str | None = "default",
                 num_heads: int = 12, dropout: float = 0.1, image_size: int = 224, position_std: float = 0.5,
                 attention_dropout: float | None = None, ffn_dropout: float | None = None,
                 backbone_unlocked: int = 0):
        super().__init__()
        check_heads(width, num_heads, "VisualStream")
        whole = load_visual_backbone(backbone, weights=backbone_weights, freeze=True)
        # backbone: what runs frozen (and what the feature cache stores); backbone_tail: its trained last groups
        self.backbone, self.backbone_tail = split_backbone(whole, backbone_unlocked)
        self.backbone_name = backbone
        self.width = width
        side = max(1, -(-image_size // whole.stride))  # ceil: conv padding keeps partial cells
        self.grid_size = (side, side)
        # A 1x1 convolution is a per-location linear map: the paper's "linear transformation as an embedder".
        self.embedder = nn.Linear(whole.out_channels, width)
        # Content and position on comparable scales (BERT: token and position embeddings alike): the embedded
        # features are layer-normalised (per-dimension unit scale, whatever the backbone's magnitude)
        # and the learnable PE(x, y) (App. A.1) starts at half that (std 0.5). With std 0.02 the encoding
        # was ~20x smaller than the content (norm 0.4 vs 9 with EfficientNet-Lite0), a short run could
        # not grow it, and grounded objects carried no location: stage-2 spatial relations stayed at
        # the majority class (README, stage 2).
        self.embed_norm = nn.LayerNorm(width)
        self.position = nn.Parameter(torch.zeros(side, side, width))
        nn.init.trunc_normal_(self.position, std=position_std, a=-2 * position_std, b=2 * position_std)
        # One Transformer encoder layer [Vaswani et al.]: 12 heads, FFN 4d (ReLU), post-norm.
        self.attention = nn.TransformerEncoderLayer(width, num_heads, dim_feedforward=4 * width, dropout=dropout,
                                                    batch_first=True)
        self.attention.self_attn.dropout = dropout if attention_dropout is None else attention_dropout
        self.attention.dropout.p = dropout if ffn_dropout is None else ffn_dropout

    @property
    def in_channels(self) -> int:
        return self.backbone.out_channels

    def backbone_features(self, images: torch.Tensor) -> torch.Tensor:
        """The frozen CNN's feature map (B, C, h, w) — what the feature cache stores (the trunk's, with a tail)."""
        return self.backbone(images)

    def positional_encoding(self, h: int, w: int) -> torch.Tensor:
        if (h, w) == tuple(self.position.shape[:2]):
            return self.position
        grid = self.position.permute(2, 0, 1).unsqueeze(0)
        return F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False)[0].permute(1, 2, 0)

    def forward(self, images: torch.Tensor | None = None, features: torch.Tensor | None = None) -> torch.Tensor:
        """Images (B,3,H,W) or backbone feature maps (B,C,h,w) -> visual tokens V (B,h,w,d)."""
        if (images is None) == (features is None):
            raise ValueError("VisualStream.forward takes exactly one of images= or features=.")
        if features is None:
            features = self.backbone_features(images)
        if features.dim() != 4 or features.shape[1] != self.in_channels:
            raise ValueError(f"VisualStream ({self.backbone_name}) expects feature maps (B,{self.in_channels},h,w); "
                             f"got shape {tuple(features.shape)}. Was the feature cache built with another backbone?")
        tokens = self.embed(features)
        b, h, w, _ = tokens.shape  # the tail's map (a strided tail makes it smaller than the trunk's)
        return self.attention(self.positioned(tokens)).reshape(b, h, w, self.width)

    def embed(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone maps (B,C,h,w) -> embedded, layer-normalised tokens (B,h,w,d), before the position code."""
        if self.backbone_tail is not None:
            features = self.backbone_tail(features)
        return self.embed_norm(self.embedder(features.to(self.embedder.weight.dtype).permute(0, 2, 3, 1)))

    def attention_input(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone maps (B,C,h,w) -> the self-attention layer's input (B,h*w,d): embedded tokens + PE(x, y)."""
        return self.positioned(self.embed(features))

    def positioned(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedded tokens (B,h,w,d) + PE(x, y), flattened to (B,h*w,d)."""
        b, h, w, _ = tokens.shape
        return (tokens + self.positional_encoding(h, w)).reshape(b, h * w, self.width)


def _bert_layers(bert: nn.Module) -> nn.ModuleList:
    try:
        return bert.encoder.layer
    except AttributeError as e:
        raise TypeError(f"LanguageStream needs a BERT-architecture encoder (encoder.layer[i]); got {type(bert).__name__}") from e


class LanguageStream(nn.Module):
    """BERT with only the top ``trainable_layers`` layers learnable (paper §3.3, default k=8).

    Args:
        text_encoder: a name for grounding.encoders.load_text_encoder (minilm, tiny-random,
            bert-base-uncased, a local directory).
        trainable_layers: k; 0 freezes the whole stream (Fig. 3's "Bert"), -1 trains every layer.
            k larger than the encoder's depth is clamped with a warning (MiniLM has 6 layers).
        freeze_query_key: freeze the query and key projections in every layer (App. A.2).
        hidden_dropout / attention_dropout: BERT's hidden_dropout_prob / attention_probs_dropout_prob
            (None keeps the pretrained config's value).
        encoder: an already built BERT (tests, or reuse); overrides ``text_encoder``.
        packed_tokens: run BERT's token-wise steps on the real tokens only
            (:func:`grounding.encoders.packed_bert_forward`; same values). Measured (benchmarks/bench_text_stream.py,
            Flickr8k caption lengths, about half padding): fp32 fwd+bwd 1.7x faster on a CPU, 1.35-1.74x on an H100,
            but 0.71-0.88x under bf16 autocast on the H100, where the step is launch-bound. ``"auto"`` (the paper
            configs) packs unless autocast to a lower precision is on. False by default so recorded runs replay
            their dropout draws.
    """

    def __init__(self, text_encoder: str = "minilm", trainable_layers: int = 8, freeze_query_key: bool = True,
                 hidden_dropout: float | None = None, attention_dropout: float | None = None,
                 encoder: nn.Module | None = None, packed_tokens: bool | Literal["auto"] = False):
        super().__init__()
        overrides = {}
        if hidden_dropout is not None:
            overrides["hidden_dropout_prob"] = hidden_dropout
        if attention_dropout is not None:
            overrides["attention_probs_dropout_prob"] = attention_dropout
        self.bert = encoder if encoder is not None else load_text_encoder(text_encoder, **overrides)
        # from_pretrained returns eval mode and Lightning keeps each module's mode: without this the
        # configured dropout (App. A: 0.3 / 0.1) would never act during training.
        self.bert.train()
        self.text_encoder = text_encoder
        layers = _bert_layers(self.bert)
        n = len(layers)
        if trainable_layers < 0:
            trainable_layers = n
        if trainable_layers > n:
            warnings.warn(f"LanguageStream: trainable_layers={trainable_layers} exceeds the {n} layers of "
                          f"{text_encoder!r}; training all {n}.", stacklevel=2)
            trainable_layers = n
        self.trainable_layers = trainable_layers
        self.freeze_query_key = freeze_query_key
        self.packed_tokens = check_packed_tokens(packed_tokens)
        self.bert.requires_grad_(False)
        for layer in layers[n - trainable_layers:] if trainable_layers else []:
            layer.requires_grad_(True)
            if freeze_query_key:
                layer.attention.self.query.requires_grad_(False)
                layer.attention.self.key.requires_grad_(False)

    @property
    def width(self) -> int:
        return self.bert.config.hidden_size

    @property
    def num_layers(self) -> int:
        return len(_bert_layers(self.bert))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids (B,T) + mask -> contextual word representations L (B,T,d)."""
        return bert_hidden_states(self.bert, input_ids, attention_mask, self.packed_tokens)


def word_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: tuple[int, ...] = ()) -> torch.Tensor:
    """The tokens that count as words k in Eq. 1: real (unpadded) tokens minus ``special_ids``.

    VG-BERT sums over the words of a caption; by default ([CLS]/[SEP] excluded) only WordPiece
    tokens of the caption itself match image locations.
    """
    mask = attention_mask.bool()
    for t in special_ids:
        mask = mask & (input_ids != t)
    return mask


def special_token_ids(text_encoder: str, count_special_tokens: bool) -> tuple[int, ...]:
    """The ids :func:`word_mask` leaves out: the tokenizer's [CLS] / [SEP], or none when they count
    (the official VG-BERT averages over every unpadded token, both stages)."""
    if count_special_tokens:
        return ()
    tok = load_tokenizer(text_encoder)
    return tuple(t for t in (tok.cls_token_id, tok.sep_token_id) if t is not None)


__all__ = ["VisualStream", "LanguageStream", "word_mask", "special_token_ids", "check_heads"]
