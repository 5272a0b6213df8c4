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
from .crg_extraction import CONCEPT_TAGS, PRIMITIVE_TAGS

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


def _argument_nodes(graph: ConceptGraph, app: np.ndarray, app_caption: np.ndarray, node_caption: np.ndarray,
                    node_concept: np.ndarray, node_ptr: np.ndarray) -> np.ndarray:
    """(applications, max arity): each application's argument concepts as local nodes of its own caption (-1 pads),
    found by one sorted search of the nodes' (caption, concept) keys."""
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
    return app_args


def _caption_height_ptr(app_caption: np.ndarray, app_height: np.ndarray, n_app: np.ndarray, n_cap: int) -> np.ndarray:
    """(captions, top height + 2): per caption, where each height's applications start (apps are caption-major,
    height-sorted within a caption): a pair whose caption the device chooses (a hard negative) finds its height-h
    applications here."""
    top = int(app_height.max()) if len(app_height) else 0
    caption_height_ptr = np.zeros((n_cap, top + 2), dtype=np.int64)
    np.add.at(caption_height_ptr, (app_caption, app_height + 1), 1)
    caption_height_ptr[:, 0] = np.concatenate([[0], np.cumsum(n_app)[:-1]]) if n_cap else 0
    return np.cumsum(caption_height_ptr, axis=1)


def _concept_rows(tables: TokenTables, node_concept: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each node's row among the batch's distinct concepts (-1: a fallback node, no concept), and those concepts'
    word pieces with their mask: a concept's text is embedded once however many nodes hold it."""
    has_text = node_concept >= 0
    concepts, row = np.unique(node_concept[has_text], return_inverse=True)
    node_row = np.full(len(node_concept), -1, dtype=np.int64)
    node_row[has_text] = row.reshape(-1)
    concept_ids, concept_mask = _pad(tables.concept_ids, tables.concept_indptr, concepts)
    return torch.from_numpy(node_row), concept_ids, concept_mask


def _host_copies(out: dict) -> dict[str, np.ndarray]:
    """The host's own copies of the batch's optional index arrays: a DataLoader worker moves the batch's tensors to
    shared memory, freeing what a view of them would read."""
    owned = {k: out[k].numpy().copy() for k in ("node_concept_row", "phrase_node") if k in out}
    for k, mask in (("concept_length", "concept_mask"), ("caption_length", "caption_mask")):
        if mask in out:
            owned[k] = out[mask].sum(1).numpy().copy()
    return owned


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

    app_args = _argument_nodes(graph, app, app_caption, node_caption, node_concept, node_ptr)

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

    caption_height_ptr = _caption_height_ptr(app_caption, app_height, n_app, n_cap)
    prim_ptr = np.zeros(n_cap + 1, dtype=np.int64)
    np.cumsum(n_prim, out=prim_ptr[1:])

    t = torch.from_numpy
    out = {
        "captions": t(captions), "caption_node_ptr": t(node_ptr), "caption_root": t(root_local),
        "node_concept": t(node_concept), "node_height": t(node_height),
        "prim_caption": t(prim_caption), "prim_local": t(prim_local), "prim_unique": t(prim_unique.reshape(-1)),
        "primitive_ids": primitive_ids, "primitive_mask": primitive_mask,
        "app_caption": t(app_caption), "app_height": t(app_height), "app_local": t(app_local),
        "app_pred": t(app_pred.reshape(-1)), "app_args": t(app_args),
        "template_ids": template_ids, "template_mask": template_mask, "placeholder_pos": placeholder_pos,
        "caption_prim_ptr": t(prim_ptr), "caption_height_ptr": t(caption_height_ptr),
    }
    if tables.caption_ids is not None:  # the whole captions' word pieces (the VSE baseline's text side)
        out["caption_ids"], out["caption_mask"] = _pad(tables.caption_ids, tables.caption_indptr, captions)
    if tables.concept_ids is not None:  # every node's concept text, once per distinct concept (ViLBERT + MVSA)
        out["node_concept_row"], out["concept_ids"], out["concept_mask"] = _concept_rows(tables, node_concept)
    if phrase_seed is not None:
        out.update(_phrase_queries(graph, node_concept, node_caption, node_ptr, captions, is_root, phrase_seed))
        if tables.concept_ids is not None:  # the phrase queries' own word pieces (VSE's phrase retrieval)
            phrase_concepts = node_concept[out["phrase_node"].numpy()]
            out["phrase_ids"], out["phrase_mask"] = _pad(tables.concept_ids, tables.concept_indptr, phrase_concepts)
    owned = _host_copies(out)
    out["host"] = CaptionIndex(
        node_ptr=node_ptr, node_height=node_height, caption_root=root_local, prim_ptr=prim_ptr, prim_local=prim_local,
        prim_unique=prim_unique.reshape(-1), n_primitives=len(primitives), app_caption=app_caption, app_local=app_local,
        app_pred=app_pred.reshape(-1), app_args=app_args, caption_height_ptr=caption_height_ptr,
        placeholder_pos=placeholder_pos.numpy().copy(), template_length=template_mask.sum(1).numpy().copy(),
        primitive_length=primitive_mask.sum(1).numpy().copy(), node_concept_row=owned.get("node_concept_row"),
        concept_length=owned.get("concept_length"), caption_length=owned.get("caption_length"),
        phrase_node=owned.get("phrase_node"))
    return out


class CaptionIndex:
    """NumPy copies of a composition batch's index arrays, on the host for good.

    Lightning moves a batch's tensors to the accelerator but leaves this object (it has no ``.to``) where it is, so a
    step builds every index and size of its recursion (:func:`pair_schedule`) and of its losses from these arrays
    without reading the device (docs/benchmarks.md, "Host synchronisations"). Fields are those of
    :func:`composition_batch` of the same names, plus ``prim_ptr`` (each caption's primitive rows),
    ``caption_height_ptr`` (n_cap, H+2: caption c's applications of height h are rows ``[ptr[c, h], ptr[c, h+1])``),
    ``n_primitives`` (distinct primitive rows) and ``template_length`` / ``primitive_length`` / ``concept_length`` /
    ``caption_length`` (real word pieces of each row).
    """

    def __init__(self, **arrays):
        self.__dict__.update(arrays)

    @property
    def n_captions(self) -> int:
        return len(self.node_ptr) - 1

    def __repr__(self) -> str:
        return f"CaptionIndex({self.n_captions} captions, {len(self.app_local)} applications)"


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


# ------------------------------------------------------------------------------------------ pair schedules
def ragged_arange(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, index within owner) of ``counts[i]`` items of every owner i, owners in order (NumPy)."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    return owner, np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)


class PairSchedule:
    """Every index and size :meth:`grounding.composer.model.Composer.compose` needs to compose the captions of P (image,
    caption) pairs, built on the host by :func:`pair_schedule` and moved to the device in one copy (:meth:`to`), so
    the recursion never reads the device to size or index anything.

    A pair's concepts are rows ``pair_ptr[p] + local node`` of one flat table. *Fixed* pairs (caption known on the
    host) get exactly their caption's rows; *open* pairs (the caption chosen on the device, a hard negative) get the
    most rows of any candidate caption plus a spare last row, and every height the most applications of any
    candidate: their rows past the chosen caption's are computed and written to the spare row, never read by a kept
    value. ``heights`` holds one :class:`dict` of index tensors per tree height; the other attributes are tensors
    of the primitive step, or Python ints (the static sizes)."""

    def __init__(self, tensors: dict[str, np.ndarray], heights: list[dict[str, np.ndarray]], sizes: dict[str, int]):
        self._host = tensors, heights
        self.__dict__.update(sizes)
        self.device = None  # on the host, as NumPy
        self._bind(tensors, heights)

    def attach(self, **arrays: np.ndarray) -> "PairSchedule":
        """More host index arrays (a loss's rows of the table) to travel in the same copy; returns self."""
        if self.device is not None:
            raise ValueError("attach arrays before moving the schedule to a device")
        self._host[0].update({k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
        self.__dict__.update(arrays)
        return self

    def _bind(self, tensors, heights):
        self.__dict__.update(tensors)
        self.heights = heights

    def to(self, device) -> "PairSchedule":
        """The same schedule on ``device``: every array packed into one int64 buffer, copied once (pinned and
        non-blocking from a CUDA host), viewed back."""
        device = torch.device(device)
        if self.device == device:
            return self
        tensors, heights = self._host
        arrays = list(tensors.values()) + [a for h in heights for a in h.values() if isinstance(a, np.ndarray)]
        arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in arrays]
        if device.type == "cpu":  # the arrays themselves (no copy, no operator)
            views = [torch.from_numpy(a) for a in arrays]
        else:
            flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.int64))
            if device.type == "cuda":
                flat = flat.pin_memory()
            flat = flat.to(device, non_blocking=True)
            views, start = [], 0
            for a in arrays:
                views.append(flat[start:start + a.size].view(a.shape))
                start += a.size
        out = object.__new__(PairSchedule)
        out.__dict__.update({k: v for k, v in self.__dict__.items() if k not in tensors and k != "heights"})
        it = iter(views)
        dev_tensors = {k: next(it) for k in tensors}
        dev_heights = [{k: (next(it) if isinstance(a, np.ndarray) else a) for k, a in h.items()} for h in heights]
        out._bind(dev_tensors, dev_heights)
        out.device = device
        return out


def pair_schedule(index: CaptionIndex, pair_caption, pair_image=None, open_candidates=None,
                  max_height: int | None = None) -> PairSchedule:
    """The :class:`PairSchedule` of composing caption ``pair_caption[p]`` with image ``pair_image[p]`` (host arrays).

    ``pair_caption[p] < 0``: the caption is chosen on the device, one of ``open_candidates`` (default: every
    caption of the batch); the device's choice is passed to ``compose`` with the pairs. ``pair_image`` None: the
    images are chosen on the device (a reranker's top-K), so no (image, primitive) is shared between pairs; given,
    each distinct (image, primitive) of the fixed pairs is encoded once. ``max_height``: compose up to that height
    (0: the primitives only)."""
    caption = np.asarray(pair_caption, dtype=np.int64).reshape(-1)
    n_pairs = len(caption)
    is_open = caption < 0
    fixed, opened = np.flatnonzero(~is_open), np.flatnonzero(is_open)
    n_node = np.diff(index.node_ptr)
    n_prim = np.diff(index.prim_ptr)
    height_ptr = index.caption_height_ptr
    candidates = np.arange(index.n_captions) if open_candidates is None else np.asarray(open_candidates, dtype=np.int64)
    if len(opened) and not len(candidates):
        raise ValueError("open pairs need at least one candidate caption")
    width = np.zeros(n_pairs, dtype=np.int64)
    width[fixed] = n_node[caption[fixed]]
    if len(opened):
        width[opened] = n_node[candidates].max() + 1  # + the spare row
    pair_ptr = np.zeros(n_pairs + 1, dtype=np.int64)
    np.cumsum(width, out=pair_ptr[1:])

    # primitives: fixed pairs exactly, each distinct (image, primitive) once when the images are known
    owner, k = ragged_arange(n_prim[caption[fixed]])
    pair = fixed[owner]
    prim = index.prim_ptr[caption[pair]] + k
    target = pair_ptr[pair] + index.prim_local[prim]
    unique = index.prim_unique[prim]
    if pair_image is not None:
        image = np.asarray(pair_image, dtype=np.int64).reshape(-1)
        tensors_image = {"pair_image": image}
        keys, first, inverse = np.unique(image[pair] * max(index.n_primitives, 1) + unique, return_index=True,
                                         return_inverse=True)
        query, query_pair = unique[first], pair[first]  # sorted by (image, primitive)
    else:
        query, query_pair, inverse = unique, pair, np.arange(len(pair))
        tensors_image = {}
    tensors = {"pair_ptr": pair_ptr, "pair_caption": caption, "prim_query": query, "prim_query_pair": query_pair,
               "prim_inverse": inverse.reshape(-1), "prim_target": target, **tensors_image}
    if len(opened):
        slots = int(n_prim[candidates].max())
        tensors["open_prim_pair"] = np.repeat(opened, slots)
        tensors["open_prim_slot"] = np.tile(np.arange(slots), len(opened))

    # applications, one step per height: the fixed pairs' rows in pair order, then the open pairs' padded rows
    heights = []
    top = height_ptr.shape[1] - 2
    if max_height is not None:
        top = min(top, max_height)
    arity = index.app_args.shape[1] if index.app_args.ndim == 2 else 0
    for h in range(1, top + 1):
        counts = height_ptr[caption[fixed], h + 1] - height_ptr[caption[fixed], h]
        owner, j = ragged_arange(counts)
        pair = fixed[owner]
        app = height_ptr[caption[pair], h] + j
        open_rows = int((height_ptr[candidates, h + 1] - height_ptr[candidates, h]).max()) if len(opened) else 0
        if not len(app) and not open_rows:
            continue
        args = index.app_args[app]
        row, slot = np.nonzero(args >= 0)  # row-major: each application's arguments in slot order
        pos = index.placeholder_pos[index.app_pred[app[row]], slot]
        step = {"height": h, "app": app, "pair": pair, "target": pair_ptr[pair] + index.app_local[app],
                "bind_row": row, "bind_pos": pos, "bind_child": pair_ptr[pair[row]] + args[row, slot],
                "rows": len(app), "open_rows": open_rows * len(opened)}
        if open_rows:
            step["open_pair"] = np.repeat(opened, open_rows)
            step["open_slot"] = np.tile(np.arange(open_rows), len(opened))
            # every open row's every argument slot, the device keeps the real ones
            step["open_bind_open"] = np.repeat(np.arange(open_rows * len(opened)), arity)  # the open row of each
            step["open_bind_row"] = len(app) + step["open_bind_open"]
            step["open_bind_slot"] = np.tile(np.arange(arity), open_rows * len(opened))
        heights.append(step)
    sizes = {"n_pairs": n_pairs, "n_rows": int(pair_ptr[-1]), "n_open": len(opened), "n_apps": len(index.app_local)}
    return PairSchedule(tensors, heights, sizes)


def same_height_partners(node_ptr: np.ndarray, node_height: np.ndarray, partner_caption: np.ndarray) -> np.ndarray:
    """For every node (c of caption j, height h): the local node c⁻ of caption ``partner_caption[j]`` that
    ℓ_MVSA contrasts it with — the r-th node of height min(h, partner's root height), r = c's rank among
    j's nodes of height h, cycling when the partner has fewer. (The paper derives c⁻ from the negative
    caption without saying how; the same height keeps the pair at one granularity.) Host arrays in and out."""
    node_ptr, node_height = np.asarray(node_ptr, dtype=np.int64), np.asarray(node_height, dtype=np.int64)
    partner_caption = np.asarray(partner_caption, dtype=np.int64)
    n_cap = len(node_ptr) - 1
    caption, local = ragged_arange(np.diff(node_ptr))
    top = int(node_height.max()) + 1 if len(node_height) else 1
    per_height = np.zeros((n_cap, top), dtype=np.int64)
    np.add.at(per_height, (caption, node_height), 1)
    first = np.cumsum(per_height, 1) - per_height  # local index of each height's first node
    rank = local - first[caption, node_height]
    partner = partner_caption[caption]
    height = np.minimum(node_height, (per_height[partner] > 0).sum(1) - 1)
    return first[partner, height] + rank % per_height[partner, height]
