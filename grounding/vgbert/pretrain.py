"""VG-BERT stage 1: visual grounding of language by cross-modal contrastive learning (§3.1, App. A.2).

:class:`MatchMapGrounding` (plain nn.Module) = the two streams + separate linear projection heads;
its similarity is the match map of Eq. 1. :class:`GroundingPretrain` (LightningModule) wires it to
the caption DataModules (contracts B), the contrastive loss of Eq. 2 over the global (all-rank)
batch, the frozen-backbone feature cache and chunked retrieval evaluation.

Checkpoint layout (used by the relational finetune): ``model.visual.*`` and ``model.language.*``
hold the streams, ``model.visual_head`` / ``model.language_head`` the projection heads.

``visual_init_from``: the visual stream's embedder, positional encoding and self-attention start from a stage-0
checkpoint (``VisualPretrain``, App. A.1: ImageNet classification), as the official code starts stage 1; unset,
they start from random (the suite's recorded runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from grounding.checkpoints import CheckpointError, load_submodules, read_checkpoint
from grounding.contrastive import cross_modal_contrastive_loss
from grounding.lightning import LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import RecordedNet, net_hparams
from grounding.retrieval_training import CaptionRetrievalModule
from grounding.vgbert.match_map import REDUCTIONS, chunked_match_scores, match_map_scores
from grounding.vgbert.streams import LanguageStream, VisualStream, special_token_ids, word_mask


class MatchMapGrounding(RecordedNet):
    """Visual + language streams with separate linear projection heads into a common space."""

    def __init__(self, text_encoder: str = "minilm", backbone: str = "efficientnet_lite0",
                 backbone_weights: str | None = "default", trainable_layers: int = 8, freeze_query_key: bool = True,
                 dropout: float = 0.3, attention_dropout: float | None = None, visual_heads: int = 12,
                 projection_dim: int | None = None, image_size: int = 224, count_special_tokens: bool = False,
                 normalize: bool = False, visual_attention_dropout: float | None = None,
                 visual_ffn_dropout: float | None = None, packed_tokens: bool | Literal["auto"] = False):
        super().__init__()
        # BERT's attention-probability dropout follows ``dropout`` unless given: the official code sets
        # hidden_dropout_prob and attention_probs_dropout_prob to the one rate (0.3, models/LanguageModels.py)
        self.language = LanguageStream(text_encoder, trainable_layers, freeze_query_key, hidden_dropout=dropout,
                                       attention_dropout=dropout if attention_dropout is None else attention_dropout,
                                       packed_tokens=packed_tokens)
        d = self.language.width
        self.visual = VisualStream(d, backbone, backbone_weights, visual_heads, dropout, image_size,
                                   attention_dropout=visual_attention_dropout, ffn_dropout=visual_ffn_dropout)
        p = projection_dim or d
        self.visual_head = nn.Linear(d, p)
        self.language_head = nn.Linear(d, p)
        self.normalize = normalize
        self.special_ids = special_token_ids(text_encoder, count_special_tokens)

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


# Evaluation blocks (images x captions) by device when not configured: small blocks keep a CPU's memory low
# at full speed, a GPU needs larger ones to approach its GEMM rate (make bench, "match-map scoring").
EVAL_BLOCKS = {"cpu": (64, 256), "cuda": (128, 512)}

LOSS_TERMS = {"both": (True, True), "l": (True, False), "v": (False, True)}

# What stage 1 takes from a stage-0 checkpoint (App. A.1): the visual stream without its frozen CNN (the CNN keeps
# its ImageNet weights, stage 0 does not train it) and without stage 0's classifier.
STAGE0_MODULES = ("embedder", "embed_norm", "attention")
STAGE0_PREFIXES = ("model.visual.embedder.", "model.visual.attention.", "model.visual.position", "model.head.")


class GroundingPretrain(CaptionRetrievalModule):
    """VG-BERT stage 1 (§3.1/§3.3, App. A.2) as a LightningModule; monitors ``val/rsum`` (max).

    ``net``: the built :class:`MatchMapGrounding` (its architecture: text_encoder
    [bert-base-uncased; offline default minilm], backbone [vgg16], trainable_layers k [8],
    freeze_query_key [True], dropout [0.3], attention_dropout [null: as dropout, as the official code],
    visual_heads [12; must divide the text width], projection_dim [text width], count_special_tokens
    ([CLS]/[SEP] count as words: the official code's nwords includes them; default False), normalize
    (L2-normalise projected tokens; off in the paper), visual_attention_dropout / visual_ffn_dropout (the visual
    self-attention layer's dropout on attention probabilities / inside its FFN; null = dropout, the layout of
    the suite's recorded runs; the official code has none: 0 in stage1_paper.yaml), packed_tokens (BERT's
    token-wise steps on real tokens only: same values, faster; on in the paper configs)). Training options (paper defaults in
    brackets): temperature tau [0.1], use_loss_l / use_loss_v [both] (or loss_terms "both" | "l" |
    "v"), word_reduction over words in Eq. 1 ["sum" (the paper's Eq. 1 as written); "mean" averages over
    the valid tokens, as the official code does (stage1_paper.yaml)],
    feature_cache [True], max_match_elements (memory cap of the training match maps built at once),
    eval_image_chunk / eval_text_chunk (evaluation blocks; null = by device: 64 x 256 on a CPU, 196 MiB of fp32
    match maps at 14x14 / T=16, ~90 % of the GEMM rate; 128 x 512 on a GPU, 65 % on an H100; make bench),
    eval_fold_size (COCO-1K folds; automatic
    at >= 5K images), visual_init_from [a stage-0 checkpoint (``VisualPretrain``): the visual stream's embedder
    (with its layer norm), positional encoding and self-attention start from it, as the official code does
    (stage1_paper.yaml); null = random, the tiny / Flickr8k configs and the recorded runs].
    """

    # checked by `python -m grounding` before any model is built (grounding/cli.py: checkpoint_options)
    init_from_checkpoint = {"visual_init_from": ("stage-0", STAGE0_PREFIXES)}

    def __init__(self, net: MatchMapGrounding, temperature: float = 0.1, use_loss_l: bool = True,
                 use_loss_v: bool = True, loss_terms: str | None = None, word_reduction: str = "sum",
                 feature_cache: bool = True, feature_cache_dir: str | None = None, max_match_elements: int = 1 << 28,
                 eval_image_chunk: int | None = None, eval_text_chunk: int | None = None, eval_fold_size: int | None = None,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None,
                 visual_init_from: str | None = None):
        super().__init__(optimizer, lr_scheduler, feature_cache, feature_cache_dir, eval_fold_size)
        if loss_terms is not None:  # one switch for sweeps: "both" | "l" | "v" (App. A.2 Table 2)
            if loss_terms not in LOSS_TERMS:
                raise ValueError(f"loss_terms must be one of {sorted(LOSS_TERMS)}; got {loss_terms!r}")
            use_loss_l, use_loss_v = LOSS_TERMS[loss_terms]
        if word_reduction not in REDUCTIONS:
            raise ValueError(f"word_reduction must be one of {REDUCTIONS}; got {word_reduction!r}")
        if not (use_loss_l or use_loss_v):
            raise ValueError("use_loss_l and use_loss_v are both False: enable at least one loss term (Eq. 2).")
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.hparams.use_loss_l, self.hparams.use_loss_v = use_loss_l, use_loss_v
        self.model = self.adopt_net(net)
        self._visual_loaded = False

    def setup(self, stage: str) -> None:
        # not when resuming (--ckpt_path): the run's own weights are restored
        if stage == "fit" and self.hparams.visual_init_from and not self._visual_loaded and not self.trainer.ckpt_path:
            self.load_stage0(self.hparams.visual_init_from)

    def load_stage0(self, path: str | Path) -> None:
        """The visual stream's embedder (+ layer norm), positional encoding and self-attention from a stage-0
        (``VisualPretrain``) checkpoint; the CNN, the language stream and the projection heads stay as they are."""
        ckpt = read_checkpoint(path, "stage-0")
        visual = self.model.visual
        if net_hparams(ckpt["hyper_parameters"]).get("use_attention") is False:
            raise CheckpointError(f"stage-0 checkpoint {path} is App. A.1's baseline without self-attention "
                                  "(use_attention: false): its positional encoding and self-attention were never "
                                  "trained. Give a stage-0 checkpoint trained with use_attention: true.")
        width = net_hparams(ckpt["hyper_parameters"]).get("width")
        if width is not None and width != visual.width:
            raise CheckpointError(f"stage-0 checkpoint {path} has a visual stream of width {width}, but this model's "
                                  f"text encoder ({self.model.init_args['text_encoder']}) has width {visual.width}; "
                                  f"train stage 0 with width {visual.width}.")
        arch = self.model.init_args
        load_submodules(self.model, ckpt, {f"model.visual.{m}.": f"visual.{m}" for m in STAGE0_MODULES}, path,
                        "stage-0", {k: arch[k] for k in ("backbone", "visual_heads", "image_size")})
        position = ckpt["state_dict"].get("model.visual.position")
        if position is None or tuple(position.shape) != tuple(visual.position.shape):
            found = "none" if position is None else tuple(position.shape)
            raise CheckpointError(f"stage-0 checkpoint {path}: positional encoding {found}, this model's is "
                                  f"{tuple(visual.position.shape)}; use the same backbone / image_size as stage 0.")
        with torch.no_grad():
            visual.position.copy_(position)
        self._visual_loaded = True

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
        image_chunk, text_chunk = EVAL_BLOCKS["cuda" if self.device.type == "cuda" else "cpu"]
        return chunked_match_scores(img, txt, mask, h.word_reduction, h.eval_image_chunk or image_chunk,
                                    h.eval_text_chunk or text_chunk, device=self.device)
