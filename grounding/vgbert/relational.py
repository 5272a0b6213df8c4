"""VG-BERT relational grounding (§3.2, App. A.3.1): cross-modal attention, bilinear relations, losses.

* :class:`CrossModalAttention` (App. A.3.1 Eqs. 1-3): object-description tokens from the language
  stream are the queries (Query_L), every location of the visual stream's map gives keys and values
  (Key_V, Value_V); h = 8 heads, concatenated, no output projection (Eq. 3). Each WordPiece token of a
  description ("large black elephant") queries the image on its own and the grounded object
  representation is the mean of its word tokens' outputs ([CLS]/[SEP] excluded): every word can
  retrieve its own evidence (the colour, the animal) before they are combined. ``query_pooling=
  "mean"`` instead averages the token embeddings into one query per object.
* :class:`BilinearRelation` (Eq. 3 / App. Eqs. 4-5): subject and object maps to d = 32 and one
  bilinear ``relation_operator`` R_p per relation with ||R_p||_F = 1; S = r_s R_p r_oᵀ. With
  ``shared_transform`` one ``object_transform`` maps subject and object into the same d = 32 space
  (the official ``CrossAttention.object_transform``; App. A.3.1's composition argument needs one
  space), and ``operator_dropout`` drops entries of the normalised R_p in training (official: 0.1).
* Engineering additions (off by default, i.e. the paper): ``key_position`` adds a fixed 2D sinusoidal
  encoding of each visual location to the keys ("keys") or keys and values ("keys_values") of the
  cross-modal attention (DETR-style), and ``spatial_centroid`` appends each object's attention
  centroid (the attention-weighted mean (x, y) of the grid cells, :func:`attention_centroid`) to the
  subject/object representation before the d = 32 maps. On the toy world, whose relations are purely
  positional, the pooled grounded vector alone kept too little location (README, stage 2).
* :class:`ObjectClassifier`: the auxiliary two-layer head (FC-ReLU-FC; official: 768 -> 256 -> ReLU
  -> Dropout 0.1 -> classes).
* :func:`relation_loss` (Eq. 4) and :func:`object_pair_loss` (Eq. 5), vectorised over triplets;
  :func:`relational_losses` averages them per triplet or, as the official code, sums them per image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from grounding.nets import RecordedNet, check_choices
from grounding.precision import full_precision
from grounding.vgbert.streams import LanguageStream, VisualStream, special_token_ids, word_mask

QUERY_POOLING = ("tokens", "mean")
KEY_POSITION = ("none", "keys", "keys_values")
LOSS_NORMALISATION = ("triplet", "image")


def grid_coordinates(h: int, w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(h*w, 2) cell centres (x, y) in [-1, 1], row-major like a flattened (h, w) map."""
    ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h * 2 - 1
    xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w * 2 - 1
    return torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(h * w, 2)


def sinusoidal_grid_encoding(h: int, w: int, width: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(h*w, width) fixed 2D sine/cosine encoding (DETR): half the channels encode x, half y."""
    if width % 4:
        raise ValueError(f"sinusoidal_grid_encoding needs a width divisible by 4; got {width}.")
    xy = grid_coordinates(h, w, device, dtype)  # (L, 2) in [-1, 1]
    # Geometric frequencies from pi/2 (one half-period over the map) to pi * max(h, w) / 2 (cell scale).
    freqs = math.pi / 2 * torch.logspace(0, math.log10(max(h, w, 2)), width // 4, device=device, dtype=dtype)
    ang = xy.unsqueeze(-1) * freqs  # L, 2, width/4
    return torch.cat([ang.sin(), ang.cos()], -1).reshape(h * w, width)


def attention_centroid(attention: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(N, h*w) attention maps -> (N, 2) attention-weighted mean cell centre (x, y) in [-1, 1]."""
    coords = grid_coordinates(h, w, attention.device, attention.dtype)
    return attention @ coords / attention.sum(-1, keepdim=True).clamp_min(1e-12)


def group_slots(group: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, int]:
    """Position of every element within its group (stable), and the largest group size.

    Objects are flattened over the batch with their image row in ``group``; the slot lets them be
    scattered into a padded (B, M, ...) tensor so each image's objects attend to that image only.
    """
    if group.numel() == 0:
        return group.new_zeros(0), 0
    counts = torch.bincount(group, minlength=num_groups)
    order = torch.argsort(group, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(group)
    slot[order] = torch.arange(group.numel(), device=group.device) - starts[group[order]]
    return slot, int(counts.max())


class CrossModalAttention(nn.Module):
    """Multi-head attention from object-description tokens (queries) to visual locations (keys/values).

    Args:
        width: model width D of both streams (BERT hidden size; 768 in the paper).
        num_heads: h (8); must divide ``width``. Per-head dimension d = D / h scales Eq. 2.
        dropout: dropout on the attention weights.
        query_pooling: "tokens" (each token attends, outputs averaged over words) or "mean".
        key_position: "none" (the paper), "keys" or "keys_values": add a fixed 2D sinusoidal
            encoding of the location (:func:`sinusoidal_grid_encoding`) to the visual tokens before
            the key (and value) projections, so attention and grounded vector know where they look.
        query_key_bias: biases on W_Q / W_K (the paper's Eq. 1 has none and the official
            ``CrossAttention`` leaves them out; the value projection keeps its bias in both).
    """

    def __init__(self, width: int, num_heads: int = 8, dropout: float = 0.0, query_pooling: str = "tokens",
                 key_position: str = "none", query_key_bias: bool = True):
        super().__init__()
        if num_heads < 1 or width % num_heads:
            divisors = [h for h in range(1, min(width, 32) + 1) if width % h == 0]
            raise ValueError(f"CrossModalAttention: num_heads={num_heads} must divide the width {width}; "
                             f"choose one of {divisors} (the paper uses 8 with BERT-base's 768).")
        if query_pooling not in QUERY_POOLING:
            raise ValueError(f"query_pooling must be one of {QUERY_POOLING}; got {query_pooling!r}")
        if key_position not in KEY_POSITION:
            raise ValueError(f"key_position must be one of {KEY_POSITION}; got {key_position!r}")
        if key_position != "none" and width % 4:
            raise ValueError(f"key_position={key_position!r} needs a width divisible by 4; got {width}.")
        self.key_position = key_position
        self.width, self.num_heads, self.head_dim = width, num_heads, width // num_heads
        self.dropout = dropout
        self.query_pooling = query_pooling
        # W_Q^i, W_K^i, W_V^i of all heads side by side (App. A.3.1 Eq. 1).
        self.query = nn.Linear(width, width, bias=query_key_bias)
        self.key = nn.Linear(width, width, bias=query_key_bias)
        self.value = nn.Linear(width, width)

    def keys(self, visual: torch.Tensor) -> torch.Tensor:
        """Key_V (B, L, D) of visual tokens (B, L, D) or (B, h, w, D), heads concatenated (with the
        location code added first when ``key_position`` is on, as in :meth:`forward`)."""
        if self.key_position != "none":
            gh, gw = self.grid_shape(visual)
            visual = visual.flatten(1, -2) + sinusoidal_grid_encoding(gh, gw, self.width, visual.device, visual.dtype)
        return self.key(visual.flatten(1, -2))

    def queries(self, words: torch.Tensor) -> torch.Tensor:
        """Query_L (N, T, D) of language tokens, heads concatenated."""
        return self.query(words)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # (..., L, D) -> (..., heads, L, d)
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    @staticmethod
    def grid_shape(visual: torch.Tensor) -> tuple[int, int]:
        """(h, w) of visual tokens (B, h, w, D), or of a square flattened map (B, L, D)."""
        if visual.dim() == 4:
            return int(visual.shape[1]), int(visual.shape[2])
        side = math.isqrt(int(visual.shape[1]))
        if side * side != visual.shape[1]:
            raise ValueError(f"CrossModalAttention: flattened visual tokens (B, L={visual.shape[1]}, D) are not a "
                             "square grid; pass them as (B, h, w, D) so locations have coordinates.")
        return side, side

    def forward(self, visual: torch.Tensor, words: torch.Tensor, word_mask: torch.Tensor,
                object_image_index: torch.Tensor, return_attention: bool = False,
                return_centroid: bool = False) -> dict[str, torch.Tensor]:
        """Ground every object description in its own image.

        Args:
            visual: visual tokens V (B, h, w, D) or (B, L, D).
            words: language tokens of the object descriptions L (N, T, D).
            word_mask: (N, T) bool, the tokens that are words of the description.
            object_image_index: (N,) batch row of each object's image.
        Returns ``grounded`` (N, D) = pooled O of Eq. 3, ``tokens`` (N, T, D) per-token outputs and,
        with ``return_attention``, ``attention`` (N, L): the pooled, head-averaged attention map and,
        with ``return_centroid``, ``centroid`` (N, 2): that map's :func:`attention_centroid`.
        """
        need_grid = return_centroid or self.key_position != "none"
        gh, gw = self.grid_shape(visual) if need_grid else (0, 0)
        visual = visual.flatten(1, -2)
        b, n_loc, _ = visual.shape
        n, t, _ = words.shape
        mask = word_mask.bool()
        # A description without word tokens (empty after truncation) falls back to all its tokens.
        mask = torch.where(mask.any(1, keepdim=True), mask, torch.ones_like(mask))
        q_in = words
        if self.query_pooling == "mean":
            q_in = (words * mask.unsqueeze(-1)).sum(1, keepdim=True) / mask.sum(1, keepdim=True).unsqueeze(-1)
            mask, t = mask[:, :1], 1
        keyed = valued = visual
        if self.key_position != "none":  # DETR-style location-aware keys (and values)
            pos = sinusoidal_grid_encoding(gh, gw, self.width, visual.device, visual.dtype)
            keyed = visual + pos
            valued = keyed if self.key_position == "keys_values" else visual
        k = self._split(self.key(keyed))       # B, h, L, d
        v = self._split(self.value(valued))    # B, h, L, d
        q = self.query(q_in)                   # N, T, D
        # Pack objects per image: (B, M*T, D) queries attend to their image's L keys in one batched call.
        slot, m = group_slots(object_image_index, b)
        packed = q.new_zeros(b, max(m, 1), t, self.width)
        packed[object_image_index, slot] = q
        qh = self._split(packed.reshape(b, -1, self.width))  # B, h, M*T, d
        explicit = return_attention or return_centroid
        if explicit:
            attn = torch.softmax(qh @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1)  # Eq. 2
            out = F.dropout(attn, self.dropout, self.training) @ v
        else:
            out = F.scaled_dot_product_attention(qh, k, v, dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(b, -1, t, self.width)  # heads concatenated (Eq. 3)
        tokens = out[object_image_index, slot]  # N, T, D
        weights = mask.to(tokens.dtype) / mask.sum(1, keepdim=True).to(tokens.dtype)
        result = {"grounded": torch.einsum("ntd,nt->nd", tokens, weights), "tokens": tokens}
        if explicit:
            a = attn.mean(1).reshape(b, -1, t, n_loc)[object_image_index, slot]  # N, T, L
            pooled = torch.einsum("ntl,nt->nl", a, weights)
            if return_attention:
                result["attention"] = pooled
            if return_centroid:
                result["centroid"] = attention_centroid(pooled, gh, gw)
        return result


class BilinearRelation(nn.Module):
    """Subject/object maps to R^d and one Frobenius-normalised bilinear operator R_p per relation.

    ``relation_operator`` (P, d, d) = W_p / ||W_p||_F: the norm constraint of App. A.3.1 Eq. 5 as a
    reparameterisation, so every R_p stays on the unit sphere under any optimiser.

    ``spatial`` > 0 (an engineering addition, not in the paper) takes a (N, spatial) descriptor per
    object (the attention centroid) as extra input columns of the subject / object maps. Those
    columns are their own ``Linear(spatial, d)`` so they start at their fan-in's init scale (a
    2-number input inside a 386-wide map would start ~14x smaller and Adam could not grow it
    within a short run).

    ``shared_transform``: one ``object_transform`` (width -> d) for subject and object, as the
    official code; otherwise separate ``subject_map`` / ``object_map``. ``operator_dropout``:
    dropout on the entries of the normalised R_p while training (official: the model's 0.1).
    """

    def __init__(self, width: int, num_relations: int, dim: int = 32, spatial: int = 0,
                 shared_transform: bool = False, operator_dropout: float = 0.0):
        super().__init__()
        if num_relations < 1:
            raise ValueError(f"BilinearRelation needs at least one relation label; got num_relations={num_relations}.")
        self.dim = dim
        self.shared_transform = shared_transform
        self.operator_dropout = operator_dropout
        if shared_transform:
            self.object_transform = nn.Linear(width, dim)
        else:
            self.subject_map = nn.Linear(width, dim)
            self.object_map = nn.Linear(width, dim)
        # Any scale: R_p is Frobenius-normalised before use.
        self.relation_weight = nn.Parameter(torch.randn(num_relations, dim, dim) / dim)
        self.spatial = spatial
        if spatial:
            self.subject_spatial = nn.Linear(spatial, dim, bias=False)
            self.object_spatial = nn.Linear(spatial, dim, bias=False)

    @property
    def num_relations(self) -> int:
        return self.relation_weight.shape[0]

    @property
    def relation_operator(self) -> torch.Tensor:
        norm = torch.linalg.matrix_norm(self.relation_weight, ord="fro", keepdim=True)
        return self.relation_weight / norm.clamp_min(1e-12)

    def project(self, grounded: torch.Tensor, subject: torch.Tensor, object: torch.Tensor,
                spatial: torch.Tensor | None = None):
        """r_s (N_rel, d) and r_o (N_rel, d) of the triplets' subject / object rows of ``grounded``
        (plus the maps of their ``spatial`` descriptors when the module has ``spatial`` > 0)."""
        if self.shared_transform:
            r_s, r_o = self.object_transform(grounded[subject]), self.object_transform(grounded[object])
        else:
            r_s, r_o = self.subject_map(grounded[subject]), self.object_map(grounded[object])
        if self.spatial:
            if spatial is None or spatial.shape[-1] != self.spatial:
                raise ValueError(f"BilinearRelation(spatial={self.spatial}) needs a (N, {self.spatial}) spatial "
                                 f"descriptor per object; got {None if spatial is None else tuple(spatial.shape)}.")
            r_s = r_s + self.subject_spatial(spatial[subject])
            r_o = r_o + self.object_spatial(spatial[object])
        return r_s, r_o

    def forward(self, r_s: torch.Tensor, r_o: torch.Tensor) -> torch.Tensor:
        """S[n, p] = r_s[n] R_p r_o[n]ᵀ for every triplet n and every relation p (Eq. 3)."""
        operators = F.dropout(self.relation_operator, self.operator_dropout, self.training)
        return bilinear_scores(r_s, r_o, operators)


@full_precision
def bilinear_scores(r_s: torch.Tensor, r_o: torch.Tensor, operators: torch.Tensor) -> torch.Tensor:
    """(N, d) x (P, d, d) x (N, d) -> (N, P): S[n, p] = r_s[n] · R_p · r_o[n]ᵀ."""
    return torch.einsum("nd,pde,ne->np", r_s, operators, r_o)


class ObjectClassifier(nn.Sequential):
    """Auxiliary object classification head on the grounded representation: FC - ReLU - FC (§3.2);
    with ``dropout`` > 0, FC - ReLU - Dropout - FC (the official head: 768 -> 256, dropout 0.1)."""

    def __init__(self, width: int, num_classes: int, hidden: int | None = None, dropout: float = 0.0):
        hidden = hidden or width
        # The dropout layer only when used: checkpoints of the plain head keep their layer indices.
        middle = [nn.Dropout(dropout)] if dropout > 0 else []
        super().__init__(nn.Linear(width, hidden), nn.ReLU(), *middle, nn.Linear(hidden, num_classes))


# ---------------------------------------------------------------------------------------------
# Losses (Eq. 4, Eq. 5)
# ---------------------------------------------------------------------------------------------
def pair_relation_mask(subject: torch.Tensor, object: torch.Tensor, predicate: torch.Tensor, num_relations: int,
                       same_pair: bool = True) -> torch.Tensor:
    """(N, P) bool: relation p holds for triplet n's (subject, object) pair somewhere in the batch.

    With ``same_pair`` a pair annotated with several predicates (VG's "man wearing shirt" and
    "man has shirt") holds all of them; without it only the triplet's own predicate.
    """
    n = predicate.numel()
    holds = torch.zeros(n, num_relations, dtype=torch.bool, device=predicate.device)
    if not same_pair or n == 0:
        holds[torch.arange(n, device=predicate.device), predicate] = True
        return holds
    _, pair = torch.unique(torch.stack([subject, object], 1), dim=0, return_inverse=True)
    per_pair = torch.zeros(int(pair.max()) + 1, num_relations, dtype=torch.bool, device=predicate.device)
    per_pair[pair, predicate] = True
    return per_pair[pair]


@full_precision
def relation_loss(scores: torch.Tensor, predicate: torch.Tensor, temperature: float = 1.0,
                  holds: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """Loss_rel (Eq. 4): anchor = a subject-object pair, positive = R of its relation, negatives =
    every other relation. ``holds`` (N, P) removes the pair's other true relations from the
    negatives (multi-labelled pairs); None keeps the paper's plain softmax over all relations.
    ``reduction``: "mean" or "sum" over triplets.
    """
    logits = scores / temperature
    if holds is not None:
        other_true = holds.clone()
        other_true[torch.arange(len(predicate), device=predicate.device), predicate] = False
        logits = logits.masked_fill(other_true, float("-inf"))
    return F.cross_entropy(logits, predicate, reduction=reduction)


@full_precision
def object_pair_loss(scores: torch.Tensor, predicate: torch.Tensor, temperature: float = 1.0,
                     holds: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """Loss_obj (Eq. 5): anchor = relation p_n of triplet n, positive = pair n, negatives = the
    batch's other subject-object pairs *in a different relation*.

    ``scores[m, p]`` already holds S(r_s^m, r_o^m; R_p), so the candidates of anchor n are column
    p_n. Pairs m != n that also hold p_n (same predicate, or per ``holds`` the same pair under
    another label) are not negatives and leave the denominator. ``reduction``: "mean" or "sum".
    """
    n = predicate.numel()
    logits = scores[:, predicate].t() / temperature  # [anchor n, candidate m] = S(m; R_{p_n})
    holds = holds if holds is not None else F.one_hot(predicate, scores.shape[1]).bool()
    not_negative = holds[:, predicate].t()  # [n, m]: pair m holds relation p_n
    eye = torch.eye(n, dtype=torch.bool, device=scores.device)
    logits = logits.masked_fill(not_negative & ~eye, float("-inf"))
    return F.cross_entropy(logits, torch.arange(n, device=scores.device), reduction=reduction)


class RelationalGrounding(nn.Module):
    """Cross-modal attention + bilinear relations + auxiliary classifier on top of the two streams.

    ``forward`` takes visual tokens and object-description tokens (already encoded by the streams)
    and the batch's triplet indices; it returns the grounded objects, ``relation_scores`` (N_rel, P)
    and ``object_logits`` (N_obj, C).
    """

    def __init__(self, width: int, num_relations: int, num_object_classes: int, num_heads: int = 8,
                 relation_dim: int = 32, attention_dropout: float = 0.0, query_pooling: str = "tokens",
                 classifier_hidden: int | None = None, key_position: str = "none", spatial_centroid: bool = False,
                 spatial_scale: float = 1.0, shared_object_transform: bool = False, relation_dropout: float = 0.0,
                 classifier_dropout: float = 0.0, query_key_bias: bool = True):
        super().__init__()
        self.spatial_scale = spatial_scale  # centroid in [-s, s]: with Adam, s x the effective step of its maps
        self.attention = CrossModalAttention(width, num_heads, attention_dropout, query_pooling, key_position,
                                             query_key_bias)
        self.spatial_centroid = spatial_centroid
        self.relation = BilinearRelation(width, num_relations, relation_dim, spatial=2 if spatial_centroid else 0,
                                         shared_transform=shared_object_transform, operator_dropout=relation_dropout)
        self.classifier = ObjectClassifier(width, num_object_classes, classifier_hidden, classifier_dropout)

    def forward(self, visual, words, word_mask, object_image_index, triplet_subject, triplet_object,
                return_attention: bool = False) -> dict[str, torch.Tensor]:
        out = self.attention(visual, words, word_mask, object_image_index, return_attention, self.spatial_centroid)
        spatial = out["centroid"] * self.spatial_scale if self.spatial_centroid else None
        r_s, r_o = self.relation.project(out["grounded"], triplet_subject, triplet_object, spatial)
        out["relation_scores"] = self.relation(r_s, r_o)
        out["object_logits"] = self.classifier(out["grounded"])
        return out


def relational_losses(relation_scores: torch.Tensor, object_logits: torch.Tensor, triplet_subject: torch.Tensor,
                      triplet_object: torch.Tensor, triplet_predicate: torch.Tensor, object_labels: torch.Tensor,
                      temperature: float = 1.0, use_loss_rel: bool = True, use_loss_obj: bool = True,
                      use_object_loss: bool = True, mask_same_pair: bool = True, normalisation: str = "triplet",
                      num_images: int | None = None) -> dict[str, torch.Tensor]:
    """Loss_rel + Loss_obj + object cross-entropy; each switchable (Table 5). Unlabelled (-1)
    triplets and objects are ignored. All terms are always returned (for logging).

    ``normalisation``: "triplet" averages each term over its triplets (objects); "image" sums them
    and divides by ``num_images``, the batch's images (the official ``relation_contrastive_loss`` and
    object loss: an image with more annotated triplets weighs more).
    """
    if normalisation not in LOSS_NORMALISATION:
        raise ValueError(f"normalisation must be one of {LOSS_NORMALISATION}; got {normalisation!r}")
    per_image = normalisation == "image"
    if per_image and not num_images:
        raise ValueError("normalisation='image' needs num_images, the batch's image count.")
    reduction = "sum" if per_image else "mean"
    scale = 1.0 / num_images if per_image else 1.0
    valid = triplet_predicate >= 0
    scores, pred = relation_scores[valid], triplet_predicate[valid]
    zero = relation_scores.sum() * 0.0 + object_logits.sum() * 0.0  # keeps the graph when a batch has nothing
    if pred.numel():
        holds = pair_relation_mask(triplet_subject[valid], triplet_object[valid], pred, scores.shape[1],
                                   same_pair=mask_same_pair)
        loss_rel = relation_loss(scores, pred, temperature, holds if mask_same_pair else None, reduction) * scale
        loss_obj = object_pair_loss(scores, pred, temperature, holds, reduction) * scale
    else:
        loss_rel = loss_obj = zero
    labelled = object_labels >= 0
    loss_cls = (F.cross_entropy(object_logits[labelled], object_labels[labelled], reduction=reduction) * scale
                if labelled.any() else zero)
    loss = zero
    for use, term in ((use_loss_rel, loss_rel), (use_loss_obj, loss_obj), (use_object_loss, loss_cls)):
        if use:
            loss = loss + term
    return {"loss": loss, "loss_rel": loss_rel, "loss_obj": loss_obj, "loss_cls": loss_cls}


@dataclass(frozen=True)
class RelationHeadOptions:
    """The relational head of :class:`VGBertRelational` (:class:`RelationalGrounding`). ``num_heads`` / ``relation_dim``:
    the cross-modal attention's heads and the width d of the relation maps (paper 8, 32). ``query_pooling``: one query
    per description token (``tokens``) or their mean (``mean``, official ``Bert_object`` + ``CrossAttention``).
    ``classifier_hidden``: the object classifier's hidden width (official 256; null: linear). ``key_position`` /
    ``spatial_centroid`` / ``spatial_scale`` (beyond the paper): a 2D sinusoidal location code on the attention's keys
    (and values), each object's attention centroid fed to the relation maps, and its scale.
    ``shared_object_transform``: one d = 32 map for subject and object (official). ``query_key_bias``: bias on the
    cross-attention's query/key projections (official False)."""

    num_heads: int = 8
    relation_dim: int = 32
    query_pooling: Literal["tokens", "mean"] = "tokens"
    classifier_hidden: int | None = None
    key_position: Literal["none", "keys", "keys_values"] = "none"
    spatial_centroid: bool = False
    spatial_scale: float = 1.0
    shared_object_transform: bool = False
    query_key_bias: bool = True

    def __post_init__(self):
        check_choices(self, query_pooling=QUERY_POOLING, key_position=KEY_POSITION)


@dataclass(frozen=True)
class RelationalDropouts:
    """Where :class:`VGBertRelational` drops out. ``dropout``: BERT's hidden states and the visual stream;
    ``attention_dropout``: BERT's attention probabilities (null: ``dropout``); ``cross_attention_dropout``: the
    cross-modal attention weights (null: ``attention_dropout``, else ``dropout``; official 0); ``relation_dropout``:
    the normalised relation operators R_p; ``classifier_dropout``: inside the object classifier (official 0.1);
    ``visual_attention_dropout`` / ``visual_ffn_dropout``: the visual self-attention's layout, as stage 1 (null:
    ``dropout``; official 0)."""

    dropout: float = 0.1
    attention_dropout: float | None = None
    cross_attention_dropout: float | None = None
    relation_dropout: float = 0.0
    classifier_dropout: float = 0.0
    visual_attention_dropout: float | None = None
    visual_ffn_dropout: float | None = None


class VGBertRelational(RecordedNet):
    """The stage-2 model (Fig. 2): visual + language streams (stage-1 layout: ``visual.*``,
    ``language.*``; the stage-1 projection heads are gone) and :class:`RelationalGrounding`.

    The defaults keep the recorded world runs; ``stage2_paper.yaml`` sets the official code's choices
    (models/CrossModalityModels.py, FullModels.py). ``relation``: the relational head (:class:`RelationHeadOptions`);
    ``dropouts``: where it drops out (:class:`RelationalDropouts`); a config writes each as a mapping.
    ``count_special_tokens``: a description's [CLS]/[SEP] count among its tokens, as the official ``Bert_object``
    mean. ``train_visual_attention``: false freezes the visual stream. ``packed_tokens``: see :class:`LanguageStream`.
    """

    def __init__(self, num_relations: int, num_object_classes: int, text_encoder: str = "minilm",
                 backbone: str = "vgg16", backbone_weights: str | None = "default", image_size: int = 224,
                 trainable_layers: int = 2, freeze_query_key: bool = True, visual_heads: int = 12,
                 train_visual_attention: bool = True, count_special_tokens: bool = False,
                 relation: RelationHeadOptions = RelationHeadOptions(), dropouts: RelationalDropouts = RelationalDropouts(),
                 packed_tokens: bool | Literal["auto"] = False):
        super().__init__()
        r, p = relation, dropouts
        self.language = LanguageStream(text_encoder, trainable_layers, freeze_query_key, hidden_dropout=p.dropout,
                                       attention_dropout=p.attention_dropout, packed_tokens=packed_tokens)
        d = self.language.width
        self.visual = VisualStream(d, backbone, backbone_weights, visual_heads, p.dropout, image_size,
                                   attention_dropout=p.visual_attention_dropout, ffn_dropout=p.visual_ffn_dropout)
        if not train_visual_attention:
            self.visual.requires_grad_(False)
        cross_attention_dropout = p.cross_attention_dropout
        if cross_attention_dropout is None:
            cross_attention_dropout = p.dropout if p.attention_dropout is None else p.attention_dropout
        self.relational = RelationalGrounding(d, num_relations, num_object_classes, r.num_heads, r.relation_dim,
                                              cross_attention_dropout, r.query_pooling, r.classifier_hidden,
                                              r.key_position, r.spatial_centroid, r.spatial_scale,
                                              r.shared_object_transform, p.relation_dropout, p.classifier_dropout,
                                              r.query_key_bias)
        self.special_ids = special_token_ids(text_encoder, count_special_tokens)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Pixels (B,3,H,W) or cached backbone maps (B,C,h,w) -> visual tokens V (B,h,w,D)."""
        return self.visual(images=images) if images.shape[1] == 3 else self.visual(features=images)

    def encode_words(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Token ids (N,T) -> language tokens L (N,T,D) and the mask of word tokens."""

        # Descriptions repeat within a batch ("man", "shirt"): encode each distinct one once.
        uniq, inverse = torch.unique(torch.cat([input_ids, attention_mask.to(input_ids.dtype)], 1), dim=0,
                                     return_inverse=True)
        t = input_ids.shape[1]
        words = self.language(uniq[:, :t], uniq[:, t:])[inverse]
        return words, word_mask(input_ids, attention_mask, self.special_ids)

    def forward(self, batch: dict, return_attention: bool = False) -> dict[str, torch.Tensor]:
        """A Visual Genome batch (contracts B) -> grounded objects, relation scores, object logits."""
        visual = self.encode_images(batch["images"])
        words, mask = self.encode_words(batch["object_input_ids"], batch["object_attention_mask"])
        return self.relational(visual, words, mask, batch["object_image_index"], batch["triplet_subject"],
                               batch["triplet_object"], return_attention)


__all__ = ["LOSS_NORMALISATION",
           "VGBertRelational", "RelationHeadOptions", "RelationalDropouts", "CrossModalAttention", "BilinearRelation",
           "ObjectClassifier", "RelationalGrounding", "bilinear_scores",
           "relation_loss", "object_pair_loss", "pair_relation_mask", "relational_losses", "group_slots",
           "attention_centroid", "grid_coordinates", "sinusoidal_grid_encoding"]
