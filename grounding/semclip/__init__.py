"""SemCLIP (semantic memory-aligned VLM): similarity lists, the STE and its evaluation.

Importing this package exposes its LightningModules (selectable by class name in the CLI) and the
DataModule-independent pieces: the similarity-list builder/reader, the Eq. 3 loss and the
exported-embedding reader.
"""

from grounding.semclip.losses import multi_positive_contrastive_loss
from grounding.semclip.similarity_lists import (SimilarityListConfig, SimilarityLists, WordNetNounGraph,
                                                build_similarity_lists, load_or_build, parse_lemma_key,
                                                read_curated_lists, subtree_synsets, write_curated_lists)
from grounding.semclip.ste import STEEmbedding, STEEncoder, SemanticTextEmbedding, export_ste

__all__ = [
    "SimilarityListConfig", "SimilarityLists", "WordNetNounGraph", "build_similarity_lists", "load_or_build",
    "parse_lemma_key", "read_curated_lists", "subtree_synsets", "write_curated_lists",
    "multi_positive_contrastive_loss", "STEEmbedding", "STEEncoder", "SemanticTextEmbedding", "export_ste",
]
