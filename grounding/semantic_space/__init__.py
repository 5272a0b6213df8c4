"""The VG-BERT semantic-space evaluation (§4.1-4.4, App. B): embeddings of words from any
language stream, the concreteness axis, property-norm read-out, category clustering and
compositional queries, compared across models in one report (``python -m grounding.semantic_space``).
"""

from grounding.semantic_space.clustering import category_silhouettes, modified_silhouette
from grounding.semantic_space.composition import neighbours, query_ranks
from grounding.semantic_space.concreteness import concreteness_analysis, orient_pc1
from grounding.semantic_space.embeddings import LanguageStream, WordEmbedder, detect_bert_prefix, load_language_stream
from grounding.semantic_space.property_norms import fit_feature, lambda_grid
from grounding.semantic_space.report import run_report

__all__ = [
    "LanguageStream", "WordEmbedder", "load_language_stream", "detect_bert_prefix", "concreteness_analysis",
    "orient_pc1", "fit_feature", "lambda_grid", "modified_silhouette", "category_silhouettes", "query_ranks",
    "neighbours", "run_report",
]
