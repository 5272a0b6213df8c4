"""COMPOSER's retrieval baselines (§5.2, App. C, Table 5), trained and evaluated on the same data, regions and metrics.

VSE (Kiros et al., 2014, re-implemented as the paper did): the caption y is the mean of the text encoder's
last-layer word-piece embeddings (paper: 12-layer bert-base-uncased), the image x the mean over its regions
of a residual MLP that maps each region feature into the joint space; s(x, y) = cos(x, y), trained with
VSE++'s hinge ranking loss over the batch's hardest negatives (Faghri et al., 2018;
:func:`grounding.contrastive.vse_hinge_loss`). The regions are COMPOSER's (:meth:`Composer.embed_regions`'s
sources: the frozen backbone's grid, RoI-aligned boxes or detector files), so the feature cache,
:class:`grounding.composer.data.ComposerDataModule` and :func:`composer_metrics` serve both unchanged.

ViLBERT-style cross-encoder (Lu et al., 2019, as App. C configures it, without multimodal pre-training): the text
encoder's layers as the text stream, ``image_layers`` transformer layers over the regions and a [V-CLS] token,
``coattention_layers`` co-attention blocks (COMPOSER's :class:`CoAttentionBlock`) interleaved with the top text
layers as ViLBERT's code schedules them; s(x, y) = θᵀ(pool_t([CLS]) ⊙ pool_v([V-CLS])). Trained like COMPOSER
(ℓ_match, the 4-way NLL with its hard negatives); Table 5's "+ MVSA" adds the multi-level hinge over the caption's
CRG concepts, each concept's text run through the cross-encoder with the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from grounding.contrastive import vse_hinge_loss
from grounding.encoders import bert_hidden_states, check_packed_tokens, load_text_encoder, padded_bert_forward, real_token_positions
from grounding.host_sync import host_numpy
from grounding.lightning import LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import RecordedNet, check_choices
from grounding.precision import dot_similarity, full_precision
from grounding.retrieval_metrics import place_reranked, rerank_pairs

from .batch import ragged_arange, same_height_partners
from .hard_negatives import HARD_NEGATIVE_MODES
from .model import AttentionBlock, CoAttentionBlock, RegionEmbedding, masked_mean, region_backbone, region_features
from .objectives import MVSA_LOSSES, REDUCTIONS, match_nll, mvsa_loss
from .training import RegionRetrievalModule, four_way_negatives, hard_caption_rows


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
        self.text_encoder.train()  # from_pretrained gives eval mode, which Lightning keeps: dropout would never act
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
        hidden = padded_bert_forward(self.text_encoder, ids, mask.long())
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
    def score_caption_batch(self, batch, regions, region_mask, split="test", first=None):
        """cos(x, y) of every image and caption of the batch, and of every image and phrase query (exhaustive: a
        first stage is not used)."""
        images = self.net.encode_images(regions, region_mask)
        dev = regions.device
        sentence = dot_similarity(images, self.net.encode_texts(batch["caption_ids"].to(dev), batch["caption_mask"].to(dev)))
        phrases = None
        if "phrase_ids" in batch:
            ids, mask = batch["phrase_ids"].to(dev), batch["phrase_mask"].to(dev)
            phrases = dot_similarity(images, self.net.encode_texts(ids, mask)) if len(ids) else images.new_zeros(len(images), 0)
        return sentence, phrases


# ------------------------------------------------------------------------------------------ ViLBERT-style
TEXT_POOLINGS = ("cls", "mean")
# the fewest (text, image) pairs a length group of ViLBERT.cross holds (smaller groups cost more calls than they save)
LENGTH_GROUP_MIN_PAIRS = 16
EVAL_PHRASES = ("test", "always", "never")


@dataclass(frozen=True)
class ViLBERTSizes:
    """The widths and depths of :class:`ViLBERT` (paper values: App. C). ``text_layers``: the text stream is the text
    encoder's first ``text_layers`` layers (paper 12 of bert-base-uncased; null: all); ``image_layers``: the image
    stream's transformer layers (paper 6); ``coattention_layers``: the co-attention blocks between the streams (paper
    6); ``image_dim`` / ``image_heads`` / ``image_ffn_dim``: the image stream's width, heads and FFN (1024, 8, 1024);
    ``co_dim`` / ``co_heads``: the co-attention's (1024, 8); ``norm_first``: pre-LN image layers and co-attention
    blocks (paper: post-LN, as BERT); ``dropout``."""

    text_layers: int | None = None
    image_layers: int = 6
    coattention_layers: int = 6
    image_dim: int = 1024
    image_heads: int = 8
    image_ffn_dim: int = 1024
    co_dim: int = 1024
    co_heads: int = 8
    norm_first: bool = False
    dropout: float = 0.1


class ViLBERT(RecordedNet):
    """ViLBERT as COMPOSER's paper configures it (App. C): a text stream of ``text_layers`` layers of ``text_encoder``
    (paper 12 of bert-base-uncased; null: all), an image stream of ``image_layers`` transformer layers (paper 6) over
    the regions, and ``coattention_layers`` co-attention blocks (paper 6) between the streams; the layer counts and
    widths are the option group ``sizes`` (:class:`ViLBERTSizes`; a config writes it as a mapping:
    ``sizes: {coattention_layers: 2}``).

    The schedule is ViLBERT's code's (``t_biattention_id`` = the top K text layers, ``v_biattention_id`` = image
    layers 0..K-1): the lower T−K text layers run as the pretrained encoder; then co-attention block i follows text
    layer T−K+i−1 and image layer i−1 (none before the first); the last text layer and image layers K−1.. close
    the streams. The top K text layers are the encoder's own, with their pretrained weights
    (:meth:`AttentionBlock.from_bert_layer`). The image stream starts with [V-CLS], ViLBERT's IMG token: the
    mean region feature at the whole-image box. Score: θᵀ(ReLU(W_t h_[CLS]) ⊙ ReLU(W_v h_[V-CLS])), ViLBERT's
    poolers into the co-attention width and its retrieval head. Widths as ViLBERT's: ``image_dim`` 1024,
    ``image_heads`` 8, ``image_ffn_dim`` 1024, ``co_dim`` 1024, ``co_heads`` 8 (the text side keeps the encoder's).
    Regions as :class:`grounding.composer.model.Composer`'s (``grid`` | ``files`` | ``boxes``). ``norm_first``: pre-LN
    image layers and co-attention blocks (paper: post-LN, as BERT; the pretrained text layers stay post-LN).
    ``text_pooling``: ``cls`` (ViLBERT's h_[CLS]) or ``mean`` over the text tokens, for a text encoder whose [CLS] was
    never trained (a sentence-transformers model such as the offline MiniLM, trained with mean pooling: its [CLS]
    output hardly varies between captions, and a world run with ``cls`` stayed at chance). ``packed_tokens``: the
    lower text layers on the real tokens only, as COMPOSER's Predicate Transformer
    (:func:`grounding.encoders.bert_hidden_states`). ``length_groups``: :meth:`cross` runs its pairs in up to this many
    groups of similar text length (at least 16 pairs a group), each cut past its longest text. Padding is masked, so
    the scores and gradients are the same for less work: ℓ_MVSA's concept texts are 75 % padding in a Flickr8k
    batch, and with 8 groups ViLBERT + MVSA's losses take 0.51x the time, its training step 0.52x
    (docs/results/speed.md#vilbert--mvsas-training-cost). 1 (the default): the pairs as given, padded as the batch, which replays
    recorded runs' dropout draws.
    """

    def __init__(self, text_encoder: str = "minilm", region_source: str = "grid", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", region_dim: int | None = None, image_size: int = 224,
                 sizes: ViLBERTSizes = ViLBERTSizes(), text_pooling: str = "cls",
                 packed_tokens: bool | Literal["auto"] = False, length_groups: int = 1):
        super().__init__()
        z = sizes
        text_layers, image_layers, coattention_layers = z.text_layers, z.image_layers, z.coattention_layers
        image_dim, image_heads, image_ffn_dim, dropout = z.image_dim, z.image_heads, z.image_ffn_dim, z.dropout
        co_dim, co_heads, norm_first = z.co_dim, z.co_heads, z.norm_first
        self.packed_tokens = check_packed_tokens(packed_tokens)
        if length_groups < 1:
            raise ValueError(f"length_groups must be >= 1; got {length_groups}")
        self.length_groups = length_groups
        if text_pooling not in TEXT_POOLINGS:
            raise ValueError(f"text_pooling must be one of {TEXT_POOLINGS}; got {text_pooling!r}")
        self.region_source = region_source
        self.image_size = image_size
        self.text_pooling = text_pooling
        overrides = {} if text_layers is None else {"num_hidden_layers": text_layers}
        bert = load_text_encoder(text_encoder, **overrides)
        bert.train()  # from_pretrained gives eval mode, which Lightning keeps: dropout would never act
        config = bert.config
        n_text, k = config.num_hidden_layers, coattention_layers
        if not 1 <= k <= n_text:
            raise ValueError(f"coattention_layers must lie in [1, {n_text}] (the text stream's layers); got {k}")
        if image_layers < k - 1:
            raise ValueError(f"image_layers ({image_layers}) must be at least coattention_layers - 1 ({k - 1}): "
                             "co-attention block i follows image layer i-1")
        # the DataModule's tokenizer size, checked at setup (no placeholder word pieces)
        self.placeholder_base = config.vocab_size
        # the top K text layers interleave with co-attention: taken out of the encoder, weights kept
        self.text_layers = nn.ModuleList(AttentionBlock.from_bert_layer(layer, config) for layer in bert.encoder.layer[n_text - k:])
        bert.encoder.layer = bert.encoder.layer[:n_text - k]
        config.num_hidden_layers = n_text - k
        self.text_encoder = bert
        text_dim = config.hidden_size
        self.backbone, region_dim = region_backbone(region_source, backbone, backbone_weights, region_dim)
        self.regions = RegionEmbedding(region_dim, image_dim, dropout)
        self.image_layers = nn.ModuleList(AttentionBlock(image_dim, image_heads, image_ffn_dim, dropout,
                                                         norm_first=norm_first) for _ in range(image_layers))
        self.co_attention = nn.ModuleList(
            CoAttentionBlock(text_dim, image_dim, co_dim, co_heads, config.intermediate_size, image_ffn_dim, dropout,
                             norm_first, text_eps=config.layer_norm_eps) for _ in range(k))
        self.text_pool = nn.Sequential(nn.Linear(text_dim, co_dim), nn.ReLU())
        self.image_pool = nn.Sequential(nn.Linear(image_dim, co_dim), nn.ReLU())
        self.theta = nn.Linear(co_dim, 1)

    def embed_regions(self, images: torch.Tensor | None = None, features: torch.Tensor | None = None,
                      boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """The image stream's input (B, 1+N, image_dim): [V-CLS], then every region; mask (B, 1+N)."""
        features, boxes, mask = region_features(self.region_source, self.backbone, self.regions.feature.weight.dtype,
                                                images, features, boxes, mask)
        whole_image = boxes.new_tensor([0.0, 0.0, 1.0, 1.0]).expand(len(boxes), 1, 4)
        tokens = self.regions(torch.cat([masked_mean(features, mask).unsqueeze(1), features], 1),
                              torch.cat([whole_image, boxes], 1))
        return tokens, F.pad(mask, (1, 0), value=True)

    def pretrained_modules(self) -> list[nn.Module]:
        """The text stream (the encoder's lower layers and its top layers' copies): the rest is new."""
        return [self.text_encoder, self.text_layers]

    def encode_texts(self, ids: torch.Tensor, mask: torch.Tensor, lengths: np.ndarray | None = None) -> torch.Tensor:
        """The lower text layers (image-independent: once per text, reused by every image). ``lengths``: each
        text's real word pieces, known on the host (the packed forward then finds them without reading the mask)."""
        real = None
        if lengths is not None and self.packed_tokens is not False:
            real = torch.from_numpy(real_token_positions(lengths, ids.shape[1])).to(ids.device)
        return bert_hidden_states(self.text_encoder, ids, mask.long(), self.packed_tokens, real)

    def cross(self, text: torch.Tensor, text_mask: torch.Tensor, image: torch.Tensor, image_mask: torch.Tensor,
              extent: np.ndarray | None = None) -> torch.Tensor:
        """s(x, y) of P aligned (text, image) rows: text (P,L,d_t) from :meth:`encode_texts`, image (P,1+N,d_v); the
        rows in ``length_groups`` groups of similar text length, each cut past its last real word piece. ``extent``:
        each row's length (one past its last real word piece, at most) known on the host; without it the lengths are
        read from ``text_mask`` (a host synchronisation on a GPU: a training step passes them)."""
        groups = min(self.length_groups, len(text) // LENGTH_GROUP_MIN_PAIRS)
        if groups <= 1:
            return self.cross_pairs(text, text_mask, image, image_mask)
        if extent is None:  # one past each row's last real word piece (whichever side the padding is on)
            positions = torch.arange(1, text_mask.shape[1] + 1, device=text_mask.device)
            extent = (text_mask * positions).amax(1).cpu().numpy()
        order = np.argsort(extent, kind="stable")
        scores = []
        for rows in np.array_split(order, groups):
            width = max(int(extent[rows].max()), 1)
            rows = torch.from_numpy(rows).to(text.device)
            scores.append(self.cross_pairs(text[rows, :width], text_mask[rows, :width], image[rows], image_mask[rows]))
        return torch.cat(scores)[torch.from_numpy(np.argsort(order)).to(text.device)]

    def cross_pairs(self, text: torch.Tensor, text_mask: torch.Tensor, image: torch.Tensor, image_mask: torch.Tensor,
                    ) -> torch.Tensor:
        """The co-attention streams and the score of P aligned rows, as given (:meth:`cross` groups them)."""
        last = len(self.co_attention) - 1
        for i, co in enumerate(self.co_attention):
            if i:
                text = self.text_layers[i - 1](text, None, text_mask)
                image = self.image_layers[i - 1](image, None, image_mask)
            text, image = co(text, text_mask, image, image_mask)
        text = self.text_layers[last](text, None, text_mask)
        for layer in self.image_layers[last:]:
            image = layer(image, None, image_mask)
        pooled = text[:, 0] if self.text_pooling == "cls" else masked_mean(text, text_mask)
        return self.alignment_score(pooled, image[:, 0])

    @full_precision
    def alignment_score(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """θᵀ(pool_t(text) ⊙ pool_v(image)) in float32 (under bf16 autocast, scores 4 apart would tie at 0.03)."""
        return self.theta(self.text_pool(text) * self.image_pool(image)).squeeze(-1)

    def forward(self, regions, region_mask, ids, mask, pair_image, pair_caption) -> torch.Tensor:
        """s(x, y) of the pairs (``pair_image[p]``, ``pair_caption[p]``) of images and texts."""
        text = self.encode_texts(ids, mask)
        return self.cross(text[pair_caption], mask[pair_caption], regions[pair_image], region_mask[pair_image])


@dataclass(frozen=True)
class ViLBERTLosses:
    """ViLBERT-style training's ℓ_MVSA (Table 5's "ViLBERT + MVSA"; off by default). ``mvsa_loss`` ``hinge`` (margin
    ``mvsa_margin`` α 0.8, weight ``mvsa_weight`` λ₁) | ``nll`` | null (off: ℓ_match alone) adds ℓ_MVSA over every
    non-sentence CRG concept c of the positive captions: s(x, c) against s(x, c⁻) (c⁻ the same-height concept of the
    random negative caption, as for COMPOSER) and s(x⁻, c), each s a cross-encoder run on the concept's own text;
    ``mvsa_max_concepts`` samples at most that many concepts a caption (null: all, the paper's sum);
    ``concept_reduction`` as COMPOSER's (:class:`grounding.composer.training.ComposerLosses`)."""

    mvsa_loss: str | None = None
    mvsa_margin: float = 0.8
    mvsa_weight: float = 1.0
    mvsa_max_concepts: int | None = None
    concept_reduction: str = "sum"

    def __post_init__(self):
        check_choices(self, "losses.", mvsa_loss=(*MVSA_LOSSES, None), concept_reduction=REDUCTIONS)


class ViLBERTTraining(RegionRetrievalModule):
    """The ViLBERT-style baseline on a :class:`grounding.composer.data.ComposerDataModule`, trained as COMPOSER's paper
    trains it: ℓ_match, the 4-way NLL over (x, y), (x, random y'), (random x', y), (x, hard y'') with COMPOSER's
    ``hard_negatives`` (``pool``: the paper's, linked to the DataModule; ``batch``; ``random``).

    Table 5's "ViLBERT + MVSA": ``losses`` (:class:`ViLBERTLosses`) with ``mvsa_loss: hinge`` adds ℓ_MVSA over every
    non-sentence CRG concept c of the positive captions. Evaluation: every (image, caption) pair cross-encoded, and
    every phrase query's text against every image (Table 5's phrase R@1; ``eval_phrases``: ``test`` only, the
    default, since phrases multiply a validation's cross-encoder pairs up to 6x; ``always``; ``never``),
    ``eval_pair_chunk`` pairs at a time. ``rerank_top_k`` with ``first_stage_scores`` (test only): only each
    caption's top-K images by that first stage are cross-encoded (:class:`RegionRetrievalModule`); phrase queries
    are then not scored.
    """

    def __init__(self, net: ViLBERT, hard_negatives: str = "batch", losses: ViLBERTLosses = ViLBERTLosses(),
                 eval_pair_chunk: int = 2048, eval_phrases: str = "test", new_layer_lr_scale: float = 1.0,
                 train_recall_images: int | None = None, rerank_top_k: int | None = None,
                 first_stage_scores: str | None = None, feature_cache: bool = True, feature_cache_dir: str | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler, new_layer_lr_scale, train_recall_images, first_stage_scores)
        if rerank_top_k is not None and rerank_top_k < 1:
            raise ValueError(f"rerank_top_k must be >= 1 (or null: every pair); got {rerank_top_k}")
        if hard_negatives not in HARD_NEGATIVE_MODES:
            raise ValueError(f"hard_negatives must be one of {HARD_NEGATIVE_MODES}; got {hard_negatives!r}")
        if eval_phrases not in EVAL_PHRASES:
            raise ValueError(f"eval_phrases must be one of {EVAL_PHRASES}; got {eval_phrases!r}")
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler", "eval_pair_chunk", "eval_phrases",
                                          "rerank_top_k", "first_stage_scores"])
        self.rerank_top_k = rerank_top_k
        self.net = self.adopt_net(net)
        self.hard_negatives = hard_negatives
        self.losses = losses
        self.mvsa_loss, self.mvsa_margin, self.mvsa_weight = losses.mvsa_loss, losses.mvsa_margin, losses.mvsa_weight
        self.mvsa_max_concepts, self.concept_reduction = losses.mvsa_max_concepts, losses.concept_reduction
        self.eval_pair_chunk, self.eval_phrases = eval_pair_chunk, eval_phrases
        self.feature_cache = feature_cache and self.net.backbone is not None
        self.feature_cache_dir = feature_cache_dir

    def compute_losses(self, batch: dict) -> dict[str, torch.Tensor]:
        """ℓ_match (+ λ₁ ℓ_MVSA) of one batch, every index built on the host (the step never waits for the device)."""
        if "caption_ids" not in batch:
            raise ValueError("ViLBERT needs the batch's caption word pieces (caption_ids): build the TokenTables with "
                             "the split's caption texts (ComposerDataModule does)")
        regions, region_mask = self.regions(batch)
        dev = regions.device
        b = len(regions)
        index = batch["host"]
        neg = four_way_negatives(regions, region_mask, self.hard_negatives, hard_caption_rows(batch))
        rows = np.arange(b)
        pairs = torch.from_numpy(np.concatenate([rows, rows, neg.random_image, rows, rows, neg.random_caption, rows])).to(dev)
        pair_image, pair_caption = pairs[:4 * b], torch.cat([pairs[4 * b:], neg.hard_device])
        length = index.caption_length
        hard_length = length[neg.hard] if neg.hard is not None else np.full(b, length[:b].max())  # chosen on the device
        extent = np.concatenate([length[rows], length[neg.random_caption], length[rows], hard_length])
        ids, mask = batch["caption_ids"], batch["caption_mask"]
        text = self.net.encode_texts(ids, mask, length)
        scores = self.net.cross(text[pair_caption], mask[pair_caption], regions[pair_image], region_mask[pair_image],
                                extent).view(4, b).T  # (B, 4): positive, then the 3 negatives
        losses = {"match": match_nll(scores)}
        loss = losses["match"]
        if self.mvsa_loss is not None and self.mvsa_weight:
            losses["mvsa"] = self.concept_alignment_loss(batch, regions, region_mask, neg.random_caption, neg.random_image)
            loss = loss + self.mvsa_weight * losses["mvsa"]
        losses["loss"] = loss
        losses["accuracy"] = (scores.argmax(1) == 0).float().mean()
        return losses

    def concept_alignment_loss(self, batch: dict, regions, region_mask, random_caption: np.ndarray,
                               random_image: np.ndarray) -> torch.Tensor:
        """ℓ_MVSA over the positive captions' non-sentence concepts, scored by the cross-encoder on their texts (the
        concepts, their partners and the sample are chosen on the host)."""
        if "concept_ids" not in batch:
            raise ValueError("ViLBERT + MVSA needs the batch's concept word pieces (concept_ids): build the TokenTables "
                             "with the split's caption texts (ComposerDataModule does)")
        b = len(regions)
        index = batch["host"]
        node_ptr = index.node_ptr
        owner, k = ragged_arange(np.diff(node_ptr[:b + 1]))
        partner = same_height_partners(node_ptr[:b + 1], index.node_height[:node_ptr[b]], random_caption)
        concept_row = index.node_concept_row
        row = concept_row[node_ptr[owner] + k]
        row_negative = concept_row[node_ptr[random_caption[owner]] + partner]
        keep = (k != index.caption_root[owner]) & (row >= 0) & (row_negative >= 0)
        if self.mvsa_max_concepts is not None:  # a random subset of at most M concepts per caption
            keep &= _random_rank_within(owner, keep) < self.mvsa_max_concepts
        owner, row, row_negative = owner[keep], row[keep], row_negative[keep]
        if not len(owner):
            return regions.new_zeros(())
        needed, inverse = np.unique(np.concatenate([row, row_negative]), return_inverse=True)
        m = len(owner)
        concept, negative_concept = inverse[:m], inverse[m:]
        dev = regions.device
        host = np.concatenate([needed, concept, negative_concept, concept, owner, owner, random_image[owner], owner])
        needed_d, pair_text, pair_image, owner_d = torch.from_numpy(host).to(dev).split(
            [len(needed), 3 * m, 3 * m, m])
        ids, mask = batch["concept_ids"][needed_d], batch["concept_mask"][needed_d]
        lengths = index.concept_length[needed]
        text = self.net.encode_texts(ids, mask, lengths)
        extent = lengths[np.concatenate([concept, negative_concept, concept])]
        s = self.net.cross(text[pair_text], mask[pair_text], regions[pair_image], region_mask[pair_image], extent).view(3, m)
        return mvsa_loss(s[0], s[1], s[2], owner_d, b, self.mvsa_margin, self.mvsa_loss, self.concept_reduction)

    def training_step(self, batch, batch_idx):
        losses = self.compute_losses(batch)
        b = len(batch["image_index"])
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=b)
        for name in ("match", "mvsa", "accuracy"):
            if name in losses:
                self.log(f"train/{name}", losses[name], batch_size=b)
        return losses["loss"]

    @torch.no_grad()
    def reranked_scores(self, ids, mask, regions, region_mask, first: torch.Tensor) -> torch.Tensor:
        """(I, C): each caption cross-encoded with its top-``rerank_top_k`` images by ``first`` (I, C), which rank
        above the others (:func:`grounding.retrieval_metrics.place_reranked`); ``eval_pair_chunk`` pairs at a time."""
        pair_image, pair_caption = rerank_pairs(first, self.rerank_top_k)
        text = self.net.encode_texts(ids, mask)
        out = regions.new_empty(len(pair_image), dtype=torch.float32)  # float32 like the scores, under bf16 autocast too
        for start in range(0, len(out), self.eval_pair_chunk):
            pi, pc = pair_image[start:start + self.eval_pair_chunk], pair_caption[start:start + self.eval_pair_chunk]
            out[start:start + len(pi)] = self.net.cross(text[pc], mask[pc], regions[pi], region_mask[pi]).to(out.dtype)
        return place_reranked(first.to(out.dtype), pair_image, pair_caption, out)

    @torch.no_grad()
    def all_pair_scores(self, ids, mask, regions, region_mask) -> torch.Tensor:
        """s(x, y) of every image and text (I, T), ``eval_pair_chunk`` cross-encoder pairs at a time."""
        n_img, n_text = len(regions), len(ids)
        out = regions.new_empty(n_img * n_text, dtype=torch.float32)  # float32 like the scores (alignment_score)
        if not n_text:
            return out.view(n_img, 0)
        text = self.net.encode_texts(ids, mask)
        pair_image = torch.arange(n_img, device=regions.device).repeat_interleave(n_text)
        pair_text = torch.arange(n_text, device=regions.device).repeat(n_img)
        for start in range(0, len(out), self.eval_pair_chunk):
            pi, pt = pair_image[start:start + self.eval_pair_chunk], pair_text[start:start + self.eval_pair_chunk]
            out[start:start + len(pi)] = self.net.cross(text[pt], mask[pt], regions[pi], region_mask[pi]).to(out.dtype)
        return out.view(n_img, n_text)

    def score_caption_batch(self, batch, regions, region_mask, split="test", first=None):
        """Every caption, and every phrase query (``eval_phrases``), cross-encoded with every image; with a first stage
        and ``rerank_top_k``, each caption with its top-K images only."""
        dev = regions.device
        if first is not None and self.rerank_top_k is not None and self.rerank_top_k < len(regions):
            self.first_stage_batches.append(first.T)
            return self.reranked_scores(batch["caption_ids"].to(dev), batch["caption_mask"].to(dev), regions,
                                        region_mask, first), None
        sentence = self.all_pair_scores(batch["caption_ids"].to(dev), batch["caption_mask"].to(dev), regions, region_mask)
        wanted = self.eval_phrases == "always" or self.eval_phrases == "test" and split == "test"
        phrases = None
        if "phrase_ids" in batch and wanted:
            phrases = self.all_pair_scores(batch["phrase_ids"].to(dev), batch["phrase_mask"].to(dev), regions, region_mask)
        return sentence, phrases


def _random_rank_within(owner: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """A uniformly random rank of every kept item among its owner's kept items (dropped items rank last); drawn by
    torch's generator on the host, ranked in NumPy."""
    key = host_numpy(torch.rand(len(owner))) + (~keep).astype(np.float32)  # dropped items sort after kept
    order = np.argsort(owner.astype(np.float64) * 4 + key.astype(np.float64), kind="stable")
    rank = np.empty_like(owner)
    sorted_owner = owner[order]
    rank[order] = np.arange(len(owner)) - np.searchsorted(sorted_owner, sorted_owner)
    return rank
