"""A batch of captions as COMPOSER composes it: the nodes of every caption's concept tree, the predicate
applications by height, the word pieces of templates and primitives (paper §3.1–3.2).

Everything is tokenized once per graph (:class:`TokenTables`) and a batch is assembled by array
indexing (:func:`composition_batch`), so the collate function does no per-caption Python work.

Node order inside a caption: its primitives first (height 0), then its applications in height order
(the result concept of each), so a caption's root is its last application (or its one primitive when
the caption is a single noun). A caption the parser could not decompose is one primitive node holding
its whole text (the fallback keeps it retrievable; see docs/composer.md).
"""

from __future__ import annotations

import copy
import re

import numpy as np
import torch

from .concept_graph import OK, ConceptGraph
from .crg import CONCEPT_TAGS, PRIMITIVE_TAGS

# The syntactic placeholders of templates ("[NP] running on [NP]"), one new word piece each, appended
# after the text encoder's vocabulary in this order. An argument is a primitive or a concept-tagged
# phrase, but a one-word phrase over a primitive keeps its phrase label (a verb tagged NN under VP
# gives "[VP]"): such rarer labels share the last placeholder, "[X]".
PLACEHOLDER_TYPES = (*sorted(PRIMITIVE_TAGS | CONCEPT_TAGS), "X")
PLACEHOLDER = re.compile(r"\[([A-Z]+)\]")
PHRASES_PER_CAPTION = 5  # Table 5: 5 sampled non-sentence concepts per test caption


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    indptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    flat = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(indptr[-1]))
    return flat, indptr


def _ragged_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions into the flat array, column within the row) of ``rows`` of a CSR, rows in order."""
    starts, counts = indptr[rows], indptr[rows + 1] - indptr[rows]
    col = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + col, col


def _pad(flat: np.ndarray, indptr: np.ndarray, rows: np.ndarray, fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a CSR as a right-padded (len(rows), longest) LongTensor and its bool mask."""
    pos, col = _ragged_rows(indptr, rows)
    counts = indptr[rows + 1] - indptr[rows]
    width = int(counts.max()) if len(rows) else 0
    out = np.full((len(rows), width), fill, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    row = np.repeat(np.arange(len(rows)), counts)
    out[row, col] = flat[pos]
    mask[row, col] = True
    return torch.from_numpy(out), torch.from_numpy(mask)


class TokenTables:
    """Word pieces of every predicate template and primitive of a :class:`ConceptGraph`.

    Templates read ``[CLS] <words and placeholders> [SEP]``; placeholder ``[T]`` becomes id
    ``placeholder_base + PLACEHOLDER_TYPES.index(T)`` (the Predicate Transformer's embedding table is
    grown by ``len(PLACEHOLDER_TYPES)`` rows). Primitives are their word pieces alone (the queries of
    the primitive encoder); captions without a CRG get their whole text as a fallback primitive.
    """

    def __init__(self, graph: ConceptGraph, tokenizer, captions: list[str] | None = None, max_length: int = 32):
        self.placeholder_base = len(tokenizer)
        marked = copy.deepcopy(tokenizer)  # the shared cached tokenizer stays unchanged
        marked.add_special_tokens({"additional_special_tokens": [f"[{t}]" for t in PLACEHOLDER_TYPES]})
        remap = {marked.convert_tokens_to_ids(f"[{t}]"): self.placeholder_base + i for i, t in enumerate(PLACEHOLDER_TYPES)}
        known = set(PLACEHOLDER_TYPES)
        templates = [PLACEHOLDER.sub(lambda m: m.group(0) if m.group(1) in known else "[X]", t)
                     for t in graph.predicate_template.tolist()]
        ids = marked(templates, add_special_tokens=True)["input_ids"] if templates else []
        ids = [[remap.get(t, t) for t in row] for row in ids]
        self.template_ids, self.template_indptr = _csr(ids)
        positions = [[k for k, t in enumerate(row) if t >= self.placeholder_base] for row in ids]
        self.placeholder_pos, self.placeholder_indptr = _csr(positions)
        arity = np.diff(self.placeholder_indptr)
        if len(arity) and not np.array_equal(arity, graph.predicate_arity):
            bad = int(np.flatnonzero(arity != graph.predicate_arity)[0])
            raise ValueError(f"template {templates[bad]!r} tokenized to {arity[bad]} placeholders, expected "
                             f"{graph.predicate_arity[bad]}")
        # Primitive rows: the graph's level-0 concepts, then one fallback row per undecomposed caption.
        prims = np.flatnonzero(graph.concept_is_primitive)
        failed = np.flatnonzero(graph.caption_status != OK) if captions is not None else np.zeros(0, dtype=np.int64)
        texts = [graph.concept_text[int(c)] for c in prims] + [captions[int(j)] for j in failed]
        prim_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        prim_ids = [row or [tokenizer.unk_token_id] for row in prim_ids]
        self.primitive_ids, self.primitive_indptr = _csr(prim_ids)
        self.concept_primitive = np.full(graph.n_concepts, -1, dtype=np.int64)
        self.concept_primitive[prims] = np.arange(len(prims))
        self.caption_fallback = np.full(graph.n_captions, -1, dtype=np.int64)
        self.caption_fallback[failed] = len(prims) + np.arange(len(failed))
        # Whole captions and concepts as "[CLS] text [SEP]" (up to ``max_length`` word pieces): the queries of
        # the single-vector baselines (VSE, §5.2), which embed a caption or a phrase without its CRG.
        self.caption_ids = self.concept_ids = None
        if captions is not None and len(captions) == graph.n_captions:
            tokenize = dict(add_special_tokens=True, truncation=True, max_length=max_length)
            self.caption_ids, self.caption_indptr = _csr(tokenizer(list(captions), **tokenize)["input_ids"] if captions else [])
            concepts = graph.concept_text.tolist()
            self.concept_ids, self.concept_indptr = _csr(tokenizer(concepts, **tokenize)["input_ids"] if concepts else [])


def composition_batch(graph: ConceptGraph, tables: TokenTables, captions, phrase_seed: int | None = None) -> dict:
    """Everything COMPOSER needs to compose ``captions`` (graph caption ids) with any images.

    Node arrays are flat over the batch's captions (``caption_node_ptr`` delimits them); local node
    indices count from each caption's first node. With ``phrase_seed``, up to 5 non-sentence concepts
    per caption are drawn (seeded by caption id, so any batching draws the same) as phrase queries,
    with their denotations (graph image ids) for Table 5's phrase retrieval.
    """
    captions = np.asarray(captions, dtype=np.int64)
    n_cap = len(captions)
    ok = graph.caption_status[captions] == OK
    n_prim = np.where(ok, graph.caption_prim_indptr[captions + 1] - graph.caption_prim_indptr[captions], 1)
    n_app = np.where(ok, graph.caption_app_indptr[captions + 1] - graph.caption_app_indptr[captions], 0)
    n_node = n_prim + n_app
    node_ptr = np.zeros(n_cap + 1, dtype=np.int64)
    np.cumsum(n_node, out=node_ptr[1:])

    # primitive nodes (a failed caption: its fallback row)
    prim_pos, _ = _ragged_rows(graph.caption_prim_indptr, captions[ok])
    prim_concept = np.empty(int(n_prim.sum()), dtype=np.int64)
    prim_caption = np.repeat(np.arange(n_cap), n_prim)
    prim_is_ok = ok[prim_caption]
    prim_concept[prim_is_ok] = graph.caption_prims[prim_pos]
    prim_concept[~prim_is_ok] = -1
    prim_row = np.where(prim_is_ok, tables.concept_primitive[np.maximum(prim_concept, 0)],
                        tables.caption_fallback[captions[prim_caption]])
    prim_local = np.arange(len(prim_caption)) - np.repeat(np.cumsum(n_prim) - n_prim, n_prim)

    # applications, height-sorted within each caption
    app_pos, app_col = _ragged_rows(graph.caption_app_indptr, captions)
    app_pos, app_col = app_pos[np.repeat(ok, n_app)], app_col[np.repeat(ok, n_app)]
    app = graph.caption_apps[app_pos].astype(np.int64)
    app_caption = np.repeat(np.arange(n_cap), n_app)
    app_height = graph.caption_app_height[app_pos].astype(np.int64)
    app_local = n_prim[app_caption] + app_col
    app_concept = graph.app_result[app].astype(np.int64)

    # node tables (caption order, primitives then applications)
    node_concept = np.empty(int(node_ptr[-1]), dtype=np.int64)
    node_height = np.zeros(int(node_ptr[-1]), dtype=np.int64)
    node_concept[node_ptr[prim_caption] + prim_local] = prim_concept
    node_concept[node_ptr[app_caption] + app_local] = app_concept
    node_height[node_ptr[app_caption] + app_local] = app_height
    node_caption = np.repeat(np.arange(n_cap), n_node)

    # argument concepts -> local node of the same caption
    arg_pos, arg_col = _ragged_rows(graph.app_args_indptr, app)
    arity = graph.app_args_indptr[app + 1] - graph.app_args_indptr[app]
    arg_app = np.repeat(np.arange(len(app)), arity)
    key_base = graph.n_concepts + 1
    node_key = node_caption * key_base + (node_concept + 1)
    order = np.argsort(node_key, kind="stable")
    arg_key = app_caption[arg_app] * key_base + (graph.app_args[arg_pos].astype(np.int64) + 1)
    found = order[np.searchsorted(node_key, arg_key, sorter=order)]
    max_arity = int(arity.max()) if len(app) else 0
    app_args = np.full((len(app), max_arity), -1, dtype=np.int64)
    app_args[arg_app, arg_col] = found - node_ptr[app_caption[arg_app]]

    # predicates of the batch, each tokenized once (the PT is image-independent)
    predicates, app_pred = np.unique(graph.app_predicate[app].astype(np.int64), return_inverse=True)
    template_ids, template_mask = _pad(tables.template_ids, tables.template_indptr, predicates)
    placeholder_pos, _ = _pad(tables.placeholder_pos, tables.placeholder_indptr, predicates, fill=-1)
    primitives, prim_unique = np.unique(prim_row, return_inverse=True)
    primitive_ids, primitive_mask = _pad(tables.primitive_ids, tables.primitive_indptr, primitives)

    roots = np.where(ok, graph.caption_root[captions], -1).astype(np.int64)
    is_root = node_concept == roots[node_caption]
    is_root[node_ptr[:-1][~ok]] = True
    root_local = np.flatnonzero(is_root) - node_ptr[node_caption[is_root]]

    t = torch.from_numpy
    out = {
        "captions": t(captions), "caption_node_ptr": t(node_ptr), "caption_root": t(root_local),
        "node_concept": t(node_concept), "node_height": t(node_height),
        "prim_caption": t(prim_caption), "prim_local": t(prim_local), "prim_unique": t(prim_unique.reshape(-1)),
        "primitive_ids": primitive_ids, "primitive_mask": primitive_mask,
        "app_caption": t(app_caption), "app_height": t(app_height), "app_local": t(app_local),
        "app_pred": t(app_pred.reshape(-1)), "app_args": t(app_args),
        "template_ids": template_ids, "template_mask": template_mask, "placeholder_pos": placeholder_pos,
    }
    if tables.caption_ids is not None:  # the whole captions' word pieces (the VSE baseline's text side)
        out["caption_ids"], out["caption_mask"] = _pad(tables.caption_ids, tables.caption_indptr, captions)
    if tables.concept_ids is not None:  # every node's concept text, once per distinct concept (ViLBERT + MVSA)
        has_text = node_concept >= 0
        concepts, row = np.unique(node_concept[has_text], return_inverse=True)
        node_row = np.full(len(node_concept), -1, dtype=np.int64)
        node_row[has_text] = row.reshape(-1)
        out["node_concept_row"] = t(node_row)
        out["concept_ids"], out["concept_mask"] = _pad(tables.concept_ids, tables.concept_indptr, concepts)
    if phrase_seed is not None:
        out.update(_phrase_queries(graph, node_concept, node_caption, node_ptr, captions, is_root, phrase_seed))
        if tables.concept_ids is not None:  # the phrase queries' own word pieces (VSE's phrase retrieval)
            phrase_concepts = node_concept[out["phrase_node"].numpy()]
            out["phrase_ids"], out["phrase_mask"] = _pad(tables.concept_ids, tables.concept_indptr, phrase_concepts)
    return out


def _phrase_queries(graph, node_concept, node_caption, node_ptr, captions, is_root, seed: int) -> dict:
    """Up to 5 non-sentence concepts a caption (a seeded hash of (caption id, concept) orders them)."""
    cand = np.flatnonzero(~is_root & (node_concept >= 0))
    key = (captions[node_caption[cand]] * 1_000_003 + node_concept[cand] * 7919 + seed) * 2654435761 % (1 << 32)
    order = np.lexsort((key, node_caption[cand]))
    cand = cand[order]
    cap = node_caption[cand]
    first = np.searchsorted(cap, cap)
    cand = cand[np.arange(len(cand)) - first < PHRASES_PER_CAPTION]
    concepts = node_concept[cand]
    den_pos, _ = _ragged_rows(graph.den_indptr, concepts)
    den_count = graph.den_indptr[concepts + 1] - graph.den_indptr[concepts]
    den_ptr = np.zeros(len(cand) + 1, dtype=np.int64)
    np.cumsum(den_count, out=den_ptr[1:])
    return {"phrase_node": torch.from_numpy(cand), "phrase_denotation_ptr": torch.from_numpy(den_ptr),
            "phrase_denotation": torch.from_numpy(graph.den_images[den_pos].astype(np.int64))}
