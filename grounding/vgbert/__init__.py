"""VG-BERT (Explainable semantic space by grounding language to vision, Zhang et al.).

Stage 0: the visual stream pretrained for object classification (App. A.1) — :class:`VisualPretrain`.
Stage 1: cross-modal contrastive grounding of BERT on image captions with the match-map
similarity (§3.1) — :class:`GroundingPretrain`, and the CLIP-style :class:`DualEncoderBaseline`.
Stage 2: relational finetune on Visual Genome (§3.2) — :class:`RelationalFinetune`; multimodal
search heads (§4.5) — :class:`SearchHeads`.
GLUE probe of a language stream (App. B.6, Table 12): :class:`GlueProbe`.
"""

from grounding.vgbert.streams import LanguageStream, VisualStream  # noqa: I001  (first: stage 2 builds on it)
from grounding.vgbert.dual_encoder import DualEncoderBaseline
from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding
from grounding.vgbert.relational import (BilinearRelation, CrossModalAttention, ObjectClassifier,
                                         VGBertRelational)
from grounding.vgbert.finetune import RelationalFinetune
from grounding.vgbert.search_heads import MultimodalSearch, SearchHead, SearchHeads
from grounding.vgbert.visual_pretrain import VisualPretrain, VisualStreamClassifier
from grounding.vgbert.glue_probe import GlueProbe, GlueProbeNet

__all__ = ["VisualStream", "LanguageStream", "GroundingPretrain", "MatchMapGrounding", "DualEncoderBaseline",
           "RelationalFinetune", "VGBertRelational", "CrossModalAttention", "BilinearRelation", "ObjectClassifier",
           "SearchHeads", "SearchHead", "MultimodalSearch", "VisualPretrain", "VisualStreamClassifier",
           "GlueProbe", "GlueProbeNet"]
