"""SemCLIP (semantic memory-aligned VLM): the STE, the alignment transform and its evaluation.

Its configs name classes by full path (``grounding.semclip.alignment_training.SemCLIPAlignment``,
``grounding.semclip.alignment_data.AlignmentPairsDataModule``: the pairs need a VLM to embed captions,
so that DataModule lives here rather than in ``data_modules``). The WordNet similarity lists
the STE trains on are data: ``data_modules.wordnet_lists`` and ``data_modules.SimilarityListsDataModule``.
"""

from grounding.semclip.ste import SemanticTextEmbedding, STEEmbedding, STEEncoder, export_ste
from grounding.semclip.ste_loss import multi_positive_contrastive_loss

__all__ = ["multi_positive_contrastive_loss", "STEEmbedding", "STEEncoder", "SemanticTextEmbedding", "export_ste"]
