"""COMPOSER's network (Hu et al., EMNLP 2021, §3.1–3.3 and App. C): primitive encoder, Predicate
Transformer, modulator, Composition Transformer and the alignment regressor θ, composing every concept
of a caption bottom-up for every (image, caption) pair, one batched call per tree height.

Shapes: P pairs, N regions, d the text width, L template length. A pair's concept vectors live in one
flat table, rows ``pair_node_ptr[p] + local node`` (node order of :mod:`grounding.composer.batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from grounding.encoders import bert_hidden_states, check_packed_tokens, load_text_encoder, load_visual_backbone, real_token_positions
from grounding.nets import RecordedNet, check_choices
from grounding.precision import full_precision

from .batch import PLACEHOLDER_TYPES, PairSchedule, pair_schedule

MODULATORS = ("film", "replace", "mlp")
READOUTS = ("cls", "mean")
PLACEHOLDER_INITS = ("distinct", "mean")
PRIMITIVE_QUERIES = ("embeddings", "encoder")
REGION_SOURCES = ("grid", "files", "boxes")
SCORE_HEADS = ("linear", "image_gated")


# ------------------------------------------------------------------------------------------ regions
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` (B,N,d) over the positions where ``mask`` (B,N) is True."""
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def grid_regions(maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backbone maps (B,C,h,w) as regions: features (B,h·w,C), cell boxes (B,h·w,4) in [0,1], mask."""
    b, c, h, w = maps.shape
    ys, xs = torch.meshgrid(torch.arange(h, device=maps.device), torch.arange(w, device=maps.device), indexing="ij")
    boxes = torch.stack([xs / w, ys / h, (xs + 1) / w, (ys + 1) / h], -1).reshape(1, h * w, 4).expand(b, -1, -1)
    features = maps.flatten(2).transpose(1, 2)
    return features, boxes.to(maps.dtype), torch.ones(b, h * w, dtype=torch.bool, device=maps.device)


def box_regions(maps: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """RoI features (B,N,C): each normalised box (B,N,4: x1,y1,x2,y2 in [0,1]) average-pooled from the
    backbone maps (B,C,h,w) by ``roi_align`` (one output bin, pixel-centre aligned)."""
    b, n = boxes.shape[:2]
    scale = torch.tensor([maps.shape[3], maps.shape[2]] * 2, dtype=maps.dtype, device=maps.device)
    rois = torch.cat([torch.arange(b, device=maps.device).repeat_interleave(n)[:, None].to(maps.dtype),
                      boxes.reshape(-1, 4) * scale], 1)
    return roi_align(maps, rois, output_size=1, aligned=True).reshape(b, n, -1)


def region_backbone(region_source: str, backbone: str, backbone_weights: str | None,
                    region_dim: int | None) -> tuple[nn.Module | None, int]:
    """The frozen CNN a region source needs (none for detector ``files``) and the regions' feature width."""
    if region_source not in REGION_SOURCES:
        raise ValueError(f"region_source must be one of {REGION_SOURCES}; got {region_source!r}")
    if region_source == "files":
        if region_dim is None:
            raise ValueError("region_source 'files' needs region_dim (the detector feature width, 2048 for Bottom-Up Attention)")
        return None, region_dim
    net = load_visual_backbone(backbone, backbone_weights, freeze=True)
    return net, net.out_channels


def region_features(region_source: str, backbone: nn.Module | None, dtype: torch.dtype, images=None, features=None,
                    boxes=None, mask=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features (B,N,C), boxes (B,N,4), mask (B,N)) of a batch's regions: the grid cells of the backbone maps
    (``grid``; pixels or cached maps), the RoI features of given ``boxes`` over them (``boxes``), or detector
    ``features`` as read (``files``). Cached maps are float16: everything comes back in ``dtype``."""
    if region_source != "files":
        maps = (images if images.shape[1] != 3 else backbone(images)).to(dtype)
        if region_source == "grid":
            features, boxes, mask = grid_regions(maps)
        else:
            features = box_regions(maps, boxes.to(dtype))
    return features.to(dtype), boxes.to(dtype), mask


class RegionEmbedding(nn.Module):
    """ViLBERT's image embedding: a region feature and its 5-d location (x1/W, y1/H, x2/W, y2/H, area)."""

    def __init__(self, feature_dim: int, dim: int, dropout: float = 0.1):
        super().__init__()
        self.feature = nn.Linear(feature_dim, dim)
        self.location = nn.Linear(5, dim)
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        location = torch.cat([boxes, area.unsqueeze(-1)], -1)
        return self.dropout(self.norm(self.feature(features) + self.location(location)))


# ------------------------------------------------------------------------------------------ blocks
class AttentionBlock(nn.Module):
    """A post-LN transformer layer whose queries attend to a (possibly other) sequence: self-attention
    (keys = queries), the primitive encoder's CrossAtt, or one direction of ViLBERT co-attention
    (``inner_dim``/``heads`` of the co-attention, keys from the other stream)."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float = 0.1, kv_dim: int | None = None,
                 inner_dim: int | None = None, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm_first = norm_first
        inner = inner_dim or dim
        if inner % heads:
            raise ValueError(f"attention width {inner} is not divisible by {heads} heads")
        self.heads = heads
        self.query = nn.Linear(dim, inner)
        self.key = nn.Linear(kv_dim or dim, inner)
        self.value = nn.Linear(kv_dim or dim, inner)
        self.out = nn.Linear(inner, dim)
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(), nn.Linear(ffn_dim, dim))
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_bert_layer(cls, layer: nn.Module, config) -> "AttentionBlock":
        """The same post-LN layer as a BERT-architecture ``transformers`` layer (``BertLayer``: self-attention,
        then GELU FFN, each with a residual and LayerNorm), with its weights: a pretrained text layer that can
        run between co-attention blocks without the library's private attention-mask plumbing."""
        if config.hidden_act != "gelu":
            raise ValueError(f"a BERT layer with hidden_act {config.hidden_act!r} cannot become an AttentionBlock "
                             "(exact GELU only)")
        block = cls(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                    config.hidden_dropout_prob, eps=config.layer_norm_eps)
        attention, output = layer.attention, layer.output
        pairs = [(block.query, attention.self.query), (block.key, attention.self.key), (block.value, attention.self.value),
                 (block.out, attention.output.dense), (block.norm1, attention.output.LayerNorm),
                 (block.ffn[0], layer.intermediate.dense), (block.ffn[2], output.dense), (block.norm2, output.LayerNorm)]
        with torch.no_grad():
            for mine, theirs in pairs:
                mine.weight.copy_(theirs.weight)
                mine.bias.copy_(theirs.bias)
        return block

    def _split(self, x):
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def keys_values(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values (R,heads,Lk,dh) a cross-attention takes from ``context``: computed once for contexts
        that many query rows share (the Composition Transformer's images, ``image_stream_once``)."""
        return self._split(self.key(context)), self._split(self.value(context))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None,
                keys_values: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` (R,Lq,dim) attends to ``context`` (R,Lk,kv_dim; default x) where ``context_mask`` (R,Lk) is True;
        ``keys_values``: the context's :meth:`keys_values`, precomputed (cross-attention only)."""
        self_attention = context is None and keys_values is None
        context = x if self_attention else context
        mask = None if context_mask is None else context_mask[:, None, None, :]
        if self.norm_first:  # pre-LN: normalise the queries (and self-attention's keys) before attending
            q_in = self.norm1(x)
            context = q_in if self_attention else context
        else:
            q_in = x
        key, value = self.keys_values(context) if keys_values is None else keys_values
        a = F.scaled_dot_product_attention(self._split(self.query(q_in)), key, value, attn_mask=mask,
                                           dropout_p=self.dropout.p if self.training else 0.0)
        h = x + self.dropout(self.out(a.transpose(1, 2).flatten(2)))
        if self.norm_first:
            return h + self.dropout(self.ffn(self.norm2(h)))
        h = self.norm1(h)
        return self.norm2(h + self.dropout(self.ffn(h)))


class PrimitiveEncoder(nn.Module):
    """§3.1 / App. C: one CrossAtt layer; queries = the primitive's word pieces, keys/values = those word
    pieces and the regions; û = mean over word pieces. Without cross-attention (Table 3) the keys are
    the word pieces alone."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float = 0.1, cross_attention: bool = True,
                 norm_first: bool = False):
        super().__init__()
        self.cross_attention = cross_attention
        self.layer = AttentionBlock(dim, heads, ffn_dim, dropout, norm_first=norm_first)
        # pre-LN stacks end in a LayerNorm (as GPT-2 / ViT): the residual stream is otherwise read unnormalised
        self.final_norm = nn.LayerNorm(dim) if norm_first else nn.Identity()

    def forward(self, words, word_mask, regions=None, region_mask=None) -> torch.Tensor:
        if self.cross_attention:
            context, mask = torch.cat([words, regions], 1), torch.cat([word_mask, region_mask], 1)
        else:
            context, mask = words, word_mask
        return masked_mean(self.final_norm(self.layer(words, context, mask)), word_mask)


class Modulator(nn.Module):
    """§3.2 / App. C: binds argument concept c_k to its placeholder's PT output ê_k.
    ``film``: a = MLP_a(ê), b = MLP_b(ê), MLP_proj(a ⊙ c + b); ``replace``: c; ``mlp``: MLP([ê; c]) (Table 4).

    ``identity_init`` (FiLM): a = 1 + Δa(ê) and b = Δb(ê) with the last layers of Δa and Δb zero, so at
    initialisation a ⊙ c + b = c and the child concept reaches the composition whole. The paper states the
    modulation, not its initialisation; with a default-initialised MLP_a, a ≈ 0.07 at the start and a ⊙ c erases
    the child (its spread across nouns fell from 2.75 to 0.04). ``false`` keeps that plain parametrisation.

    ``skip`` (beyond the paper, default off): the projection as a residual MLP, z + MLP_proj(z) with its last
    layer zero (``film`` and ``mlp``; the latter adds c), so the child passes to the parent's sequence at its own
    scale; a default-initialised MLP_proj shrinks the child's spread across nouns about fivefold."""

    def __init__(self, dim: int, hidden: int, kind: str = "film", identity_init: bool = True, skip: bool = False):
        super().__init__()
        if kind not in MODULATORS:
            raise ValueError(f"modulator must be one of {MODULATORS}; got {kind!r}")
        self.kind = kind
        self.identity_init = identity_init and kind == "film"
        self.skip = skip and kind != "replace"

        def mlp(inp):
            return nn.Sequential(nn.Linear(inp, hidden), nn.GELU(), nn.Linear(hidden, dim))

        if kind == "film":
            self.scale, self.shift, self.proj = mlp(dim), mlp(dim), mlp(dim)
            # a = scale_offset + MLP_a(ê); saved with the weights, so a checkpoint keeps the parametrisation it
            # was trained with (one written before this buffer existed loads with offset 0: see below)
            self.register_buffer("scale_offset", torch.tensor(1.0 if self.identity_init else 0.0))
            if self.identity_init:
                for net in (self.scale, self.shift):
                    nn.init.zeros_(net[-1].weight)
                    nn.init.zeros_(net[-1].bias)
        elif kind == "mlp":
            self.proj = mlp(2 * dim)
        if self.skip:
            nn.init.zeros_(self.proj[-1].weight)
            nn.init.zeros_(self.proj[-1].bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.kind == "film" and f"{prefix}scale.0.weight" in state_dict:
            state_dict.setdefault(f"{prefix}scale_offset", torch.tensor(0.0))  # trained as a = MLP_a(ê)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, placeholder: torch.Tensor, concept: torch.Tensor) -> torch.Tensor:
        if self.kind == "film":
            a = self.scale(placeholder) + self.scale_offset.to(placeholder.dtype)
            z = a * concept + self.shift(placeholder)
            return z + self.proj(z) if self.skip else self.proj(z)
        if self.kind == "mlp":
            out = self.proj(torch.cat([placeholder, concept], -1))
            return concept + out if self.skip else out
        return concept


class CoAttentionBlock(nn.Module):
    """ViLBERT's co-attention (Lu et al., 2019, Fig. 2b): each stream's queries attend to the other stream
    (``co_dim`` wide, ``co_heads`` heads), both from the streams as they enter the block, then each stream's
    own FFN. Shared by COMPOSER's Composition Transformer and the ViLBERT-style baseline. ``image_side: false``
    builds the text direction only (a last block whose image output nothing reads); the image comes back as it
    entered."""

    def __init__(self, text_dim: int, image_dim: int, co_dim: int, co_heads: int, text_ffn_dim: int,
                 image_ffn_dim: int, dropout: float = 0.1, norm_first: bool = False, text_eps: float = 1e-5,
                 image_side: bool = True):
        super().__init__()
        self.text_from_image = AttentionBlock(text_dim, co_heads, text_ffn_dim, dropout, kv_dim=image_dim,
                                              inner_dim=co_dim, norm_first=norm_first, eps=text_eps)
        self.image_from_text = (AttentionBlock(image_dim, co_heads, image_ffn_dim, dropout, kv_dim=text_dim,
                                               inner_dim=co_dim, norm_first=norm_first) if image_side else None)

    def forward(self, text, text_mask, image, image_mask, image_keys_values=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Both streams through the block; ``image_keys_values``: the text direction's keys and values of ``image``,
        precomputed (:meth:`AttentionBlock.keys_values`)."""
        text_out = self.text_from_image(text, image, image_mask, image_keys_values)
        if self.image_from_text is None:
            return text_out, image
        return text_out, self.image_from_text(image, text, text_mask)


class CompositionTransformer(nn.Module):
    """App. C, Fig. 6 (ViLBERT-style): ``layers`` = 2k+1 — k times (self-attention in both streams, then
    co-attention in both directions), ending with a text self-attention layer. The parent concept is that
    layer's output at [CLS] (``readout: cls``, as ViLBERT reads its text stream) or its masked mean over the
    template's tokens (``mean``: for a text encoder whose [CLS] was never trained for pooling, such as the
    offline sentence-transformers MiniLM; the mean also carries the modulated children directly). The last
    co-attention block computes the text direction only: the image stream is not read after it."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, layers: int = 5, co_dim: int = 1024, co_heads: int = 8,
                 dropout: float = 0.1, norm_first: bool = False, readout: str = "cls"):
        super().__init__()
        if layers < 1 or layers % 2 == 0:
            raise ValueError(f"ct_layers must be odd (self/co-attention pairs plus a final text layer); got {layers}")
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}; got {readout!r}")
        self.readout = readout
        k = layers // 2

        def block():
            return AttentionBlock(dim, heads, ffn_dim, dropout, norm_first=norm_first)

        self.text_self = nn.ModuleList(block() for _ in range(k + 1))
        self.final_norm = nn.LayerNorm(dim) if norm_first else nn.Identity()  # pre-LN: normalise what is read
        self.image_self = nn.ModuleList(block() for _ in range(k))
        self.co_attention = nn.ModuleList(CoAttentionBlock(dim, dim, co_dim, co_heads, ffn_dim, ffn_dim, dropout, norm_first,
                                                           image_side=i < k - 1)
                                          for i in range(k))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before the co-attention became one CoAttentionBlock per layer pair
        for key in [k for k in state_dict if k.startswith((f"{prefix}text_from_image.", f"{prefix}image_from_text."))]:
            direction, index, rest = key[len(prefix):].split(".", 2)
            state_dict[f"{prefix}co_attention.{index}.{direction}.{rest}"] = state_dict.pop(key)
        # ... and before the last block lost its image direction (computed, never read: no gradient)
        last = f"{prefix}co_attention.{len(self.co_attention) - 1}.image_from_text."
        for key in [k for k in state_dict if k.startswith(last)]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def image_stream(self, image: torch.Tensor, image_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The part of the image stream no text reaches, once per image: the first image self-attention layer and the
        first co-attention's keys and values of its output (with 3 layers, all the image stream does)."""
        image = self.image_self[0](image, None, image_mask)
        key, value = self.co_attention[0].text_from_image.keys_values(image)
        return {"image": image, "key": key, "value": value}

    def forward(self, text, text_mask, image, image_mask, stream: dict[str, torch.Tensor] | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """The readout of each text row composed with its image row. ``stream``: :meth:`image_stream` of the batch's
        images and ``rows`` each text row's image (``image`` is then unused): the same function, the text-independent
        image layers run once per image instead of once per row (dropout drawn per image)."""
        for i, (ts, vs, co) in enumerate(zip(self.text_self, self.image_self, self.co_attention)):
            text = ts(text, None, text_mask)
            if i == 0 and stream is not None:
                image = stream["image"][rows] if co.image_from_text is not None else None
                text, image = co(text, text_mask, image, image_mask, (stream["key"][rows], stream["value"][rows]))
            else:
                image = vs(image, None, image_mask)
                text, image = co(text, text_mask, image, image_mask)
        out = self.final_norm(self.text_self[-1](text, None, text_mask))
        return out[:, 0] if self.readout == "cls" else masked_mean(out, text_mask)


# ------------------------------------------------------------------------------------------ the network
@dataclass(frozen=True)
class ComposerSizes:
    """The widths and depths of :class:`Composer`. ``pt_layers``: the Predicate Transformer is the text encoder's
    first ``pt_layers`` layers (paper: 6 of bert-base-uncased). ``ct_layers``: the Composition Transformer's layers,
    odd (paper 5). ``heads``/``ffn_dim``: self-attention (paper 12 heads at 768; null: the text encoder's FFN, or
    4·dim below the text width); ``co_dim``/``co_heads``: the co-attention (paper 1024, 8 heads). ``dim``: a
    composition width below the text width (paper: null; a CPU-scale switch of the tiny configs).
    ``modulator_hidden``: the modulator MLPs' width (null: dim). ``norm_first``: pre-LN layers (paper: post-LN, as
    BERT/ViLBERT)."""

    pt_layers: int = 6
    ct_layers: int = 5
    heads: int = 12
    co_dim: int = 1024
    co_heads: int = 8
    ffn_dim: int | None = None
    dim: int | None = None
    modulator_hidden: int | None = None
    norm_first: bool = False
    dropout: float = 0.1


@dataclass(frozen=True)
class CompositionOptions:
    """How :class:`Composer` composes and scores; each switch names the paper's reading and the suite's others.

    ``primitive_cross_attention``: the primitive encoder attends to the image (paper). ``primitive_queries``: its
    queries, the word pieces' input embeddings (``embeddings``, paper: "the primitive word embedding") or the
    Predicate Transformer's output over them (``encoder``, beyond the paper: a pretrained sentence encoder places
    synonyms near each other, its input embeddings need not). ``placeholder_init``: each placeholder word piece its
    own random direction at the vocabulary's mean norm (``distinct``) or ``transformers``' resize default, the mean
    of the vocabulary (``mean``: every placeholder the same short vector, so [NP] and [S] start indistinguishable);
    the paper names neither. ``modulator``, ``film_identity_init``, ``modulator_skip``: see :class:`Modulator`.
    ``readout``: the parent concept at the CT's [CLS] (``cls``, paper) or the mean over its tokens (``mean``; see
    :class:`CompositionTransformer`). ``child_skip`` (beyond the paper): a parent concept is the CT's readout plus
    the mean of its modulated children, a residual path along the tree; without it a leaf's content reaches the
    root only through every level's CT, diluted among each template's tokens (a noun is one of ~7 tokens at each
    level). ``composition_scale`` (beyond the paper, with ``child_skip``; null: off): a learned scalar γ on the
    CT's readout, initialised at this value (LayerScale, Touvron et al., 2021), so a parent starts as γ·CT + the
    mean of its children and the children's content dominates the root at initialisation (16-image world:
    same-image gap +0.61σ at 0.3 against +0.34σ without; docs/composer.md). ``score_head``: the alignment
    regressor, s(x, c) = θᵀv(x, c) (``linear``, the paper's §3.3) or θᵀ(v(x, c) ⊙ g(x)) with g(x) = ReLU(W·mean
    of x's region tokens) (``image_gated``, beyond the paper): the image side of ViLBERT's alignment head (Lu et
    al., 2019; the suite's ViLBERT-style scores θᵀ(pool_t ⊙ pool_v)), so a concept's score is a product of text
    and image features from the first step, not only a function of v, whose image dependence the attention layers
    must first learn (docs/composer.md: 16 images, 30 steps, train text→image R@1 54.5 ± 10.1 against 31.9 ± 8.9
    over seeds 0–7; trained on the world, level with ``linear`` over 4 seeds). ``image_stream_once`` (an
    implementation choice, not the model's): the Composition Transformer's text-independent image computations (its
    first image self-attention layer and the first co-attention's keys and values; with ``ct_layers: 3`` the whole
    image stream) run once per image of the batch instead of once per (pair, application) row at every tree height.
    The same function, its dropout drawn per image; false replays recorded runs (docs/benchmarks.md)."""

    primitive_cross_attention: bool = True
    primitive_queries: Literal["embeddings", "encoder"] = "embeddings"
    placeholder_init: Literal["distinct", "mean"] = "distinct"
    modulator: Literal["film", "replace", "mlp"] = "film"
    film_identity_init: bool = True
    modulator_skip: bool = False
    readout: Literal["cls", "mean"] = "cls"
    child_skip: bool = False
    composition_scale: float | None = None
    score_head: Literal["linear", "image_gated"] = "linear"
    image_stream_once: bool = False

    def __post_init__(self):
        check_choices(self, primitive_queries=PRIMITIVE_QUERIES, placeholder_init=PLACEHOLDER_INITS,
                      modulator=MODULATORS, readout=READOUTS, score_head=SCORE_HEADS)


class Composer(RecordedNet):
    """COMPOSER: v(x, y) composed recursively over y's Concept & Relation Graph, s(x, c) = θᵀ v(x, c).

    ``text_encoder``: the Predicate Transformer's weights and the primitives' word pieces. ``sizes``: widths and
    depths (:class:`ComposerSizes`); ``composition``: the paper's switches and the suite's others
    (:class:`CompositionOptions`); a config writes each as a mapping (``composition: {child_skip: true}``).
    ``packed_tokens``: the Predicate Transformer's token-wise steps on the real word pieces only
    (:func:`grounding.encoders.bert_hidden_states`; same values; a batch's templates are about half padding on
    Flickr8k); ``auto`` packs unless lower-precision autocast is on. ``region_source``: ``grid`` (the frozen
    ``backbone``'s map, one region per cell; the offline default), ``files`` (detector features of ``region_dim``
    read by the DataModule) or ``boxes`` (RoI-aligned backbone features over given boxes).
    """

    def __init__(self, text_encoder: str = "minilm", region_source: str = "grid", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", region_dim: int | None = None, image_size: int = 224,
                 sizes: ComposerSizes = ComposerSizes(), composition: CompositionOptions = CompositionOptions(),
                 packed_tokens: bool | Literal["auto"] = False):
        super().__init__()
        self.packed_tokens = check_packed_tokens(packed_tokens)
        if region_source not in REGION_SOURCES:
            raise ValueError(f"region_source must be one of {REGION_SOURCES}; got {region_source!r}")
        c = composition
        self.primitive_queries = c.primitive_queries
        self.child_skip = c.child_skip
        self.image_stream_once = c.image_stream_once
        self.region_source = region_source
        self.image_size = image_size
        z = sizes
        bert = load_text_encoder(text_encoder, num_hidden_layers=z.pt_layers)
        bert.train()  # from_pretrained gives eval mode, which Lightning keeps: the PT's dropout would never act
        self.placeholder_base = bert.config.vocab_size
        bert.resize_token_embeddings(bert.config.vocab_size + len(PLACEHOLDER_TYPES))
        if c.placeholder_init == "distinct":
            init_placeholders(bert.get_input_embeddings().weight, self.placeholder_base)
        self.predicate_transformer = bert
        width = bert.config.hidden_size
        # The paper composes at the text width (768); ``dim`` projects the PT's outputs and the word pieces to
        # a narrower composition width (a CPU-scale switch of the tiny configs).
        dim = z.dim or width
        self.text_proj = nn.Identity() if dim == width else nn.Linear(width, dim)
        ffn_dim = z.ffn_dim or (bert.config.intermediate_size if dim == width else 4 * dim)
        self.dim = dim
        self.backbone, region_dim = region_backbone(region_source, backbone, backbone_weights, region_dim)
        self.regions = RegionEmbedding(region_dim, dim, z.dropout)
        self.primitive_encoder = PrimitiveEncoder(dim, z.heads, ffn_dim, z.dropout, c.primitive_cross_attention,
                                                  z.norm_first)
        self.modulator = Modulator(dim, z.modulator_hidden or dim, c.modulator, c.film_identity_init, c.modulator_skip)
        self.composition = CompositionTransformer(dim, z.heads, ffn_dim, z.ct_layers, z.co_dim, z.co_heads, z.dropout,
                                                  z.norm_first, c.readout)
        self.theta = nn.Linear(dim, 1)
        self.image_gate = nn.Sequential(nn.Linear(dim, dim), nn.ReLU()) if c.score_head == "image_gated" else None
        self.composition_gain = (None if c.composition_scale is None
                                 else nn.Parameter(torch.tensor(float(c.composition_scale))))

    def pretrained_modules(self) -> list[nn.Module]:
        """The modules initialised from the pretrained text encoder (the rest is new: ``new_layer_lr_scale``)."""
        return [self.predicate_transformer]

    # -------------------------------------------------------------------- inputs
    def embed_regions(self, images: torch.Tensor | None = None, features: torch.Tensor | None = None,
                      boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """Region tokens (B,N,d) and mask (B,N): from pixels or cached backbone maps (``grid``), or from
        region ``features``/``boxes``/``mask`` (``files``; ``boxes``: RoI-aligned from ``images``)."""
        features, boxes, mask = region_features(self.region_source, self.backbone, self.regions.feature.weight.dtype,
                                                images, features, boxes, mask)
        return self.regions(features, boxes), mask

    def _real_tokens(self, lengths, ids: torch.Tensor) -> torch.Tensor | None:
        """Host-built positions of the real word pieces, for the packed forward (None: not packing, or unknown)."""
        if lengths is None or self.packed_tokens is False:
            return None
        return torch.from_numpy(real_token_positions(lengths, ids.shape[1])).to(ids.device)

    def word_pieces(self, ids: torch.Tensor, mask: torch.Tensor | None = None, lengths=None) -> torch.Tensor:
        """The primitives' queries: the text encoder's word-piece embeddings (word + position + LayerNorm; the
        paper's ``primitive_queries: embeddings``) or the Predicate Transformer's output over the primitive's word
        pieces (``encoder``; ``lengths``: each row's real word pieces, known on the host)."""
        if self.primitive_queries == "encoder":
            mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
            return self.text_proj(bert_hidden_states(self.predicate_transformer, ids, mask.long(), self.packed_tokens,
                                                     self._real_tokens(lengths, ids)))
        return self.text_proj(self.predicate_transformer.embeddings(input_ids=ids))

    def encode_predicates(self, template_ids: torch.Tensor, template_mask: torch.Tensor, lengths=None) -> torch.Tensor:
        """ê for every template of the batch (image-independent: once per predicate, reused by every pair);
        ``lengths``: each template's real word pieces, known on the host."""
        out = bert_hidden_states(self.predicate_transformer, template_ids, template_mask.long(), self.packed_tokens,
                                 self._real_tokens(lengths, template_ids))
        return self.text_proj(out)

    @full_precision
    def score(self, v: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """s(x, c) = θᵀ v(x, c) (§3.3), or θᵀ(v ⊙ g(x)) with ``score_head: image_gated`` (``gate``: g(x) of each
        row, :meth:`image_gates`), in float32 (under bf16 autocast close scores would tie)."""
        if self.image_gate is None:
            return self.theta(v).squeeze(-1)
        if gate is None:
            raise ValueError("score_head image_gated scores a concept against an image: pass its gate g(x)")
        return self.theta(v * gate).squeeze(-1)

    def image_gates(self, regions: torch.Tensor, region_mask: torch.Tensor) -> torch.Tensor | None:
        """g(x) = ReLU(W·mean of x's region tokens) of every image (``score_head: image_gated``; else None)."""
        return None if self.image_gate is None else self.image_gate(masked_mean(regions, region_mask))

    def node_scores(self, table: torch.Tensor, pair_ptr: torch.Tensor, regions: torch.Tensor, region_mask: torch.Tensor,
                    pair_image: torch.Tensor) -> torch.Tensor:
        """s of every row of a :meth:`compose` table, each concept scored against its pair's image."""
        gates = self.image_gates(regions, region_mask)  # once per image, not per pair
        if gates is not None:
            gates = torch.repeat_interleave(gates[pair_image], pair_ptr[1:] - pair_ptr[:-1], dim=0, output_size=len(table))
        return self.score(table, gates)

    # -------------------------------------------------------------------- recursion
    def compose(self, batch: dict, regions: torch.Tensor, region_mask: torch.Tensor, pair_image: torch.Tensor | None,
                pair_caption: torch.Tensor | None, max_height: int | None = None,
                schedule: PairSchedule | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Concept vectors of every node of caption ``pair_caption[p]`` grounded in image ``pair_image[p]``
        (up to ``max_height``: 0 = primitives only, the rerank first stage).

        Returns (table (rows, d), pair_node_ptr (P+1,)). One primitive-encoder call, one PT call, then per
        height one modulator and one Composition Transformer call over all (pair, application) of that height.
        Every index and size comes from ``schedule`` (:func:`grounding.composer.batch.pair_schedule`, built on the
        host from the batch's :class:`~grounding.composer.batch.CaptionIndex`); without one it is built here from the
        pairs, read on the host (a device-to-host copy when they live on an accelerator: a training step passes its
        schedule). With a schedule, ``pair_image`` / ``pair_caption`` None take the schedule's; ``pair_caption`` on
        the device holds the chosen caption of each open pair.
        """
        dev = regions.device
        if schedule is None:
            schedule = pair_schedule(batch["host"], _host(pair_caption), _host(pair_image), max_height=max_height)
        sched = schedule.to(dev)
        pair_image = sched.pair_image if pair_image is None else pair_image.to(dev)
        pair_caption = sched.pair_caption if pair_caption is None else pair_caption.to(dev)
        pair_ptr = sched.pair_ptr
        table = regions.new_zeros(sched.n_rows, self.dim)
        spare = pair_ptr[1:] - 1  # an open pair's last row: where its padding rows write

        # primitives: every (pair, primitive node of its caption), each distinct (image, primitive) of fixed pairs once
        ids, mask = batch["primitive_ids"].to(dev), batch["primitive_mask"].to(dev)
        query, query_pair, target = sched.prim_query, sched.prim_query_pair, sched.prim_target
        if sched.n_open:  # open pairs: every primitive slot of the longest candidate, the chosen caption's kept
            p, slot = sched.open_prim_pair, sched.open_prim_slot
            prim_ptr = batch["caption_prim_ptr"].to(dev)
            c = pair_caption[p]
            first, count = prim_ptr[c], prim_ptr[c + 1] - prim_ptr[c]  # every caption has a primitive node
            prim = first + torch.minimum(slot, count - 1)
            query = torch.cat([query, batch["prim_unique"].to(dev)[prim]])
            query_pair = torch.cat([query_pair, p])
            target = torch.cat([target, torch.where(slot < count, pair_ptr[p] + batch["prim_local"].to(dev)[prim], spare[p])])
        index = batch["host"]
        queries = self.word_pieces(ids, mask, index.primitive_length)  # once per distinct primitive of the batch
        img = pair_image[query_pair]
        u_hat = self.primitive_encoder(queries[query], mask[query], regions[img], region_mask[img])
        values = u_hat[sched.prim_inverse]
        if sched.n_open:
            values = torch.cat([values, u_hat[len(sched.prim_query):]])
        table = table.index_put((target,), values)

        # applications, bottom-up
        if not sched.heights or max_height == 0:
            return table, pair_ptr
        e_hat = self.encode_predicates(batch["template_ids"].to(dev), batch["template_mask"].to(dev), index.template_length)
        template_mask, placeholder_pos = batch["template_mask"].to(dev), batch["placeholder_pos"].to(dev)
        app_pred, app_args, app_local = batch["app_pred"].to(dev), batch["app_args"].to(dev), batch["app_local"].to(dev)
        height_ptr = batch["caption_height_ptr"].to(dev) if sched.n_open else None
        stream = self.composition.image_stream(regions, region_mask) if self.image_stream_once else None
        for step in sched.heights:
            app, pair, target = step["app"], step["pair"], step["target"]
            row, pos, child = step["bind_row"], step["bind_pos"], step["bind_child"]
            valid = None
            if step["open_rows"]:
                app, pair, target, row, pos, child, valid = self._open_rows(step, app, pair, target, row, pos, child,
                                                                            pair_caption, height_ptr, app_pred, app_args,
                                                                            app_local, placeholder_pos, pair_ptr, spare)
            pred = app_pred[app]
            text = e_hat[pred]
            # bind each argument's concept (a lower height: already in the table) to its placeholder
            modulated = self.modulator(text[row, pos], table[child])
            if valid is None:
                text = text.index_put((row, pos), modulated)
            else:  # padded bindings leave their row's text as it is
                modulated = modulated * valid.unsqueeze(1).to(modulated.dtype)
                text = _bind_where(text, row, pos, modulated, valid)
            img = pair_image[pair]
            v = self.compose_parent(text, template_mask[pred], regions, region_mask[img], stream, img)
            if self.child_skip:  # + the mean of the application's modulated children
                ones = torch.ones_like(row, dtype=v.dtype) if valid is None else valid.to(v.dtype)
                n_arg = torch.zeros(len(v), dtype=v.dtype, device=dev).index_add_(0, row, ones).clamp(min=1).unsqueeze(1)
                v = v + torch.zeros_like(v).index_add_(0, row, modulated.to(v.dtype)) / n_arg
            table = table.index_put((target,), v)
        return table, pair_ptr

    @staticmethod
    def _open_rows(step, app, pair, target, row, pos, child, pair_caption, height_ptr, app_pred, app_args, app_local,
                   placeholder_pos, pair_ptr, spare):
        """One height's rows of the open pairs appended to the fixed ones: each open pair's caption (chosen on the
        device) gives its applications of this height, padded to the longest candidate; a padding row composes some
        application and writes to the pair's spare row; a padding binding is marked invalid."""
        h, p, j = step["height"], step["open_pair"], step["open_slot"]
        c = pair_caption[p]
        first, count = height_ptr[c, h], height_ptr[c, h + 1] - height_ptr[c, h]
        real = j < count
        open_app = (first + j).clamp(max=len(app_pred) - 1)
        app = torch.cat([app, open_app])
        pair = torch.cat([pair, p])
        target = torch.cat([target, torch.where(real, pair_ptr[p] + app_local[open_app], spare[p])])
        r, o, slot = step["open_bind_row"], step["open_bind_open"], step["open_bind_slot"]
        arg = app_args[open_app[o], slot]
        keep = (arg >= 0) & real[o]
        open_pos = torch.where(keep, placeholder_pos[app_pred[open_app[o]], slot], 0)
        open_child = torch.where(keep, pair_ptr[p[o]] + arg, spare[p[o]])
        valid = torch.cat([torch.ones_like(row, dtype=torch.bool), keep])
        return (app, pair, target, torch.cat([row, r]), torch.cat([pos, open_pos]), torch.cat([child, open_child]), valid)

    def compose_parent(self, text, text_mask, regions, region_mask, stream=None, rows=None) -> torch.Tensor:
        """The CT's readout of modulated templates, times γ with ``composition_scale``. ``rows``: each template's row
        of ``regions`` (its image; None: ``regions`` are aligned with the templates); ``stream``: the images'
        precomputed :meth:`CompositionTransformer.image_stream`."""
        image = None if stream is not None else regions if rows is None else regions[rows]
        v = self.composition(text, text_mask, image, region_mask, stream, rows)
        return v if self.composition_gain is None else v * self.composition_gain.to(v.dtype)

    def forward(self, batch: dict, regions, region_mask, pair_image, pair_caption) -> torch.Tensor:
        """s(x, y) of each pair: the score of its caption's root concept."""
        table, pair_ptr = self.compose(batch, regions, region_mask, pair_image, pair_caption)
        root = pair_ptr[:-1] + batch["caption_root"].to(regions.device)[pair_caption]
        gates = self.image_gates(regions, region_mask)
        return self.score(table[root], None if gates is None else gates[pair_image])


@torch.no_grad()
def init_placeholders(embeddings: torch.Tensor, base: int) -> None:
    """Rows ``base:`` of a word-embedding table (the placeholder word pieces) as random directions, each at the mean
    norm of the vocabulary's rows: distinct from each other and as long as a word."""
    n = len(embeddings) - base
    norm = embeddings[:base].float().norm(dim=1).mean()
    direction = F.normalize(torch.randn(n, embeddings.shape[1]), dim=1)
    embeddings[base:] = (direction * norm).to(embeddings.dtype)


def _bind_where(text: torch.Tensor, row: torch.Tensor, pos: torch.Tensor, modulated: torch.Tensor,
                valid: torch.Tensor) -> torch.Tensor:
    """``text`` (R,L,d) with ``modulated`` at (row, pos) where ``valid`` (the other bindings, at position 0, change
    nothing): a sum into zeros and a count, so repeated padding positions neither overwrite nor double a gradient."""
    r, length, d = text.shape
    flat = row * length + pos
    placed = text.new_zeros(r * length, d).index_add_(0, flat, modulated.to(text.dtype))
    hit = text.new_zeros(r * length).index_add_(0, flat, valid.to(text.dtype)) > 0
    return torch.where(hit.view(r, length, 1), placed.view(r, length, d), text)


def _host(t) -> np.ndarray | None:
    """A pair index on the host (a copy from the device when it lives on an accelerator: outside training steps)."""
    if t is None:
        return None
    return t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)


def compose_node_by_node(net: Composer, batch: dict, regions, region_mask, pair_image, pair_caption) -> torch.Tensor:
    """The recursion as the paper states it, one (pair, node) at a time: the reference the level-batched
    :meth:`Composer.compose` is tested and benchmarked against. Returns the same flat table."""
    node_ptr = batch["caption_node_ptr"]
    n_node = node_ptr[1:] - node_ptr[:-1]
    pair_ptr = F.pad(torch.cumsum(n_node[pair_caption], 0), (1, 0))
    table = [None] * int(pair_ptr[-1])
    e_hat = (net.encode_predicates(batch["template_ids"], batch["template_mask"])
             if batch["app_caption"].numel() else None)
    for p in range(len(pair_caption)):
        c, i = int(pair_caption[p]), int(pair_image[p])
        reg, rmask = regions[i:i + 1], region_mask[i:i + 1]
        for q in torch.nonzero(batch["prim_caption"] == c).squeeze(1).tolist():
            u = int(batch["prim_unique"][q])
            ids, mask = batch["primitive_ids"][u:u + 1], batch["primitive_mask"][u:u + 1]
            table[int(pair_ptr[p]) + int(batch["prim_local"][q])] = net.primitive_encoder(net.word_pieces(ids, mask), mask, reg,
                                                                                          rmask)[0]
        for a in torch.nonzero(batch["app_caption"] == c).squeeze(1).tolist():  # height order
            pred = int(batch["app_pred"][a])
            text = e_hat[pred].clone()
            children = []
            for slot, arg in enumerate(batch["app_args"][a].tolist()):
                if arg >= 0:
                    pos = int(batch["placeholder_pos"][pred, slot])
                    text[pos] = net.modulator(text[pos], table[int(pair_ptr[p]) + arg])
                    children.append(text[pos])
            v = net.compose_parent(text[None], batch["template_mask"][pred:pred + 1], reg, rmask)[0]
            if net.child_skip and children:
                v = v + torch.stack(children).mean(0)
            table[int(pair_ptr[p]) + int(batch["app_local"][a])] = v
    return torch.stack(table)
