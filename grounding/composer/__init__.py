"""COMPOSER (Hu et al., EMNLP 2021) data side: Concept & Relation Graph and MCD splits.

* :mod:`.parsing`  — captions -> Penn-style constituency trees (spaCy / Link Grammar / benepar), cached.
* :mod:`.crg`      — App. A extraction of concepts and predicates from one tree; parse degradation (Table 7).
* :mod:`.concept_graph` — the graph database (denotations, predicates, bottom-up caption trees).
* :mod:`.mcd`      — compound divergence and maximum-compound-divergence splits (§5.1, App. B).
"""

from .captions import CaptionFileError, CaptionSet, read_captions, read_coco_captions, read_flickr_tokens, read_karpathy_json
from .concept_graph import ConceptGraph, LevelBatch, StringTable, format_stats
from .crg_extraction import CONCEPT_TAGS, PRIMITIVE_TAGS, CaptionCRG, Predicate, degrade_tree, extract_crg
from .graph_build import BuildReport, build_concept_graph, extract_all
from .mcd import (
                  ATOM_ALPHA,
                  COMPOUND_ALPHA,
                  atom_divergence,
                  chernoff_coefficient,
                  compound_divergence,
                  divergence,
                  make_mcd_splits,
                  removal_deltas,
                  write_karpathy_split,
)
from .parsing import (
                  BACKENDS,
                  DEFAULT_BACKEND,
                  CaptionParser,
                  ParserUnavailableError,
                  backend_available,
                  dependency_to_constituency,
                  get_parser,
                  parse_captions,
)

__all__ = [
    "ATOM_ALPHA", "BACKENDS", "COMPOUND_ALPHA", "CONCEPT_TAGS", "DEFAULT_BACKEND", "PRIMITIVE_TAGS", "BuildReport",
    "CaptionCRG", "CaptionFileError", "CaptionParser", "CaptionSet", "ConceptGraph", "LevelBatch", "ParserUnavailableError",
    "Predicate", "StringTable", "atom_divergence", "backend_available", "build_concept_graph", "chernoff_coefficient",
    "compound_divergence", "degrade_tree", "dependency_to_constituency", "divergence", "extract_all", "extract_crg",
    "format_stats", "get_parser", "make_mcd_splits", "parse_captions", "read_captions", "read_coco_captions",
    "read_flickr_tokens", "read_karpathy_json", "removal_deltas", "write_karpathy_split",
]
