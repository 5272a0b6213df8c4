"""Caption set -> parses -> (optionally degraded) trees -> per-caption CRGs -> ConceptGraph."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .batch import TokenTables, composition_batch
from .captions import CaptionSet
from .concept_graph import ConceptGraph
from .crg_extraction import CaptionCRG, degrade_tree, extract_crg
from .parsing import DEFAULT_BACKEND, parse_captions

log = logging.getLogger(__name__)


@dataclass
class BuildReport:
    captions: int
    parse_failed: int
    extraction_failed: int
    parse_seconds: float
    extract_seconds: float
    graph_seconds: float
    parse_cache: str
    parse_from_cache: bool
    failed_examples: list[str] = field(default_factory=list)


def extract_all(trees, degrade_prob: float = 0.0, seed: int = 0) -> tuple[list[CaptionCRG | None], int]:
    """Per-caption CRGs; a caption whose tree breaks extraction is counted, not fatal.
    Degradation (Table 7) uses one seeded generator walked in caption order (reproducible)."""
    rng = np.random.default_rng(seed)
    out: list[CaptionCRG | None] = []
    failed = 0
    for t in trees:
        if t is None:
            out.append(None)
            continue
        try:
            if degrade_prob > 0:
                t = degrade_tree(t, degrade_prob, rng)
            out.append(extract_crg(t))
        except Exception:  # malformed tree from a backend
            failed += 1
            out.append(None)
    return out, failed


def build_concept_graph(captions: CaptionSet, backend: str = DEFAULT_BACKEND, workers: int = 1,
                        degrade_prob: float = 0.0, seed: int = 0, cache: bool | str | Path = True,
                        file_captions: list[str] | None = None) -> tuple[ConceptGraph, BuildReport]:
    """Parse, extract and intern. With ``file_captions`` (every caption of the file ``captions``
    was selected from) the whole file is parsed, so one cached parse per caption file serves
    every split or image subset taken from it (``captions.rows`` index into it)."""
    t0 = time.perf_counter()
    if file_captions is not None:
        parsed = parse_captions(file_captions, backend=backend, workers=workers, cache=cache)
        parsed.trees = [parsed.trees[r] for r in captions.rows]
        parsed.failed = sum(t is None for t in parsed.trees)
    else:
        parsed = parse_captions(captions.captions, backend=backend, workers=workers, cache=cache)
    t1 = time.perf_counter()
    crgs, extraction_failed = extract_all(parsed.trees, degrade_prob, seed)
    t2 = time.perf_counter()
    graph = ConceptGraph.build(crgs, captions.caption_image, captions.image_names)
    t3 = time.perf_counter()
    failed_examples = [captions.captions[j] for j, t in enumerate(parsed.trees) if t is None][:5]
    if parsed.failed or extraction_failed:
        log.warning("%d captions could not be parsed and %d could not be decomposed (e.g. %r)",
                    parsed.failed, extraction_failed, failed_examples[:2])
    return graph, BuildReport(len(captions), parsed.failed, extraction_failed, t1 - t0, t2 - t1, t3 - t2,
                              str(parsed.cache_file), parsed.from_cache, failed_examples)


def texts_batch(texts: list[str], tokenizer, backend: str = DEFAULT_BACKEND, max_length: int = 32,
                cache: bool = False) -> tuple[dict, ConceptGraph]:
    """The composition batch of free texts (a query, a few captions) and their CRG, parsed by the suite's parser:
    a text without a decomposition keeps its whole text as one fallback primitive, as in evaluation. No parse cache
    is written unless ``cache``."""
    captions = CaptionSet([f"text{i}" for i in range(len(texts))], list(texts), np.arange(len(texts), dtype=np.int64),
                          source="free texts")
    graph, _ = build_concept_graph(captions, backend=backend, workers=1, cache=cache)
    return composition_batch(graph, TokenTables(graph, tokenizer, list(texts), max_length), np.arange(len(texts))), graph
