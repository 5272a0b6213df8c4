"""Similarity lists (SemCLIP §3): for every WordNet noun lemma, its semantically similar lemmas.

A vocabulary item is a fully specified lemma, the 4-tuple ⟨word, pos, sense, lemma⟩ of Eq. 2,
written as NLTK's lemma key ``"<word>.<pos>.<sense>.<lemma>"`` (e.g. ``basket.n.01.basket``).
The list of an anchor is gathered by a constrained traversal of the noun hierarchy:

* synonyms: the other lemmas of the anchor's synset (Wu–Palmer score 1);
* hypernym / hyponym neighbours: synsets reached along hypernym (up) and hyponym (down) edges,
  at most ``max_depth_diff`` edges away (the paper's depth differential of 2), optionally the
  co-hyponyms (siblings) under the anchor's direct hypernyms, kept when their Wu–Palmer
  similarity (Eq. 1) is at least ``wup_threshold``; all their lemmas join with that score.

The lists are stored as one ``.npz`` (vocabulary + CSR arrays + metadata) written atomically.
Externally curated lists (e.g. the paper's released linguist-curated lists) are read by
:func:`read_curated_lists` into the same :class:`SimilarityLists` structure.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import deque
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from grounding.errors import MissingInputError
from grounding.lexicon import wordnet
from grounding.utils.io import atomic_path, atomic_write_text, sha1_of_json

LEMMA_KEY = re.compile(r"^(?P<word>.+?)\.(?P<pos>[nvasr])\.(?P<sense>\d+)\.(?P<lemma>.+)$")
FORMAT_VERSION = 1


def parse_lemma_key(key: str) -> tuple[str, str, int, str]:
    """``"basket.n.01.basket"`` -> ``("basket", "n", 1, "basket")`` (Eq. 2's ⟨w, p, s, l⟩)."""
    m = LEMMA_KEY.match(key)
    if m is None:
        raise ValueError(f"{key!r} is not a WordNet lemma key '<word>.<pos>.<sense>.<lemma>' such as 'basket.n.01.basket'")
    return m["word"], m["pos"], int(m["sense"]), m["lemma"]


def lemma_surface(key: str) -> str:
    """The written form of a lemma key, lower-cased, underscores as spaces: ``'hot_dog'`` -> ``'hot dog'``."""
    m = LEMMA_KEY.match(key)
    name = m["lemma"] if m else key
    return name.replace("_", " ").lower()


@dataclasses.dataclass(frozen=True)
class SimilarityListConfig:
    """How the WordNet traversal builds the lists (all fields go into the dataset's cache key)."""

    max_depth_diff: int = 2        # the paper's depth differential
    wup_threshold: float = 0.8     # "a reasonably high threshold" on Eq. 1
    include_siblings: bool = False  # co-hyponyms under a direct hypernym (depth differential 0)
    max_list_size: int | None = 64  # keep the best-scored neighbours (synonyms always kept); None = no cap
    pos: str = "n"


@dataclasses.dataclass
class SimilarityLists:
    """Anchor -> [(lemma, score)] in CSR form over one vocabulary of lemma keys."""

    vocab: list[str]
    indptr: np.ndarray    # (n_anchors + 1,) int64
    indices: np.ndarray   # (n_pairs,) int64 into vocab
    scores: np.ndarray    # (n_pairs,) float32, Wu–Palmer (or curated) scores
    anchors: np.ndarray   # (n_anchors,) int64 into vocab
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self._index = None

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.vocab)}
        return self._index

    def __len__(self) -> int:
        return len(self.anchors)

    def list_of(self, anchor: str) -> list[tuple[str, float]]:
        """The similarity list of one anchor key (empty when it is not an anchor)."""
        row = self._anchor_row().get(self.index.get(anchor, -1))
        if row is None:
            return []
        lo, hi = self.indptr[row], self.indptr[row + 1]
        return [(self.vocab[j], float(s)) for j, s in zip(self.indices[lo:hi], self.scores[lo:hi])]

    def _anchor_row(self) -> dict[int, int]:
        if not hasattr(self, "_rows"):
            self._rows = {int(a): r for r, a in enumerate(self.anchors)}
        return self._rows

    def synonym_mask(self) -> np.ndarray:
        """(n_pairs,) bool: the list member is a synonym of its anchor, i.e. a lemma of the anchor's
        own synset (same ``word.pos.sense`` prefix of the lemma key); every other member is a
        hypernym / hyponym (or sibling) neighbour. Keys that are not lemma keys (curated lists of
        plain words) fall back on the score: a synonym scores 1 (Wu–Palmer of a synset with itself)."""
        names = np.array([f"{m['word']}.{m['pos']}.{m['sense']}" if (m := LEMMA_KEY.match(k)) else "" for k in self.vocab],
                         dtype=str)
        synset = np.where(names == "", -1, np.unique(names, return_inverse=True)[1].reshape(-1))  # -1: not a lemma key
        a, m = synset[np.repeat(self.anchors, np.diff(self.indptr))], synset[self.indices]
        return np.where((a >= 0) & (m >= 0), a == m, self.scores >= 1.0)

    def statistics(self) -> dict:
        sizes = np.diff(self.indptr)
        return {
            "anchors": int(len(self.anchors)),
            "vocabulary": int(len(self.vocab)),
            "pairs": int(len(self.indices)),
            "average_list_size": float(sizes.mean()) if len(sizes) else 0.0,
            "median_list_size": float(np.median(sizes)) if len(sizes) else 0.0,
            "max_list_size": int(sizes.max()) if len(sizes) else 0,
            "empty_lists": int((sizes == 0).sum()),
            "synonym_pairs": int((self.scores >= 1.0).sum()),
        }

    # ------------------------------------------------------------------------------------ io
    def save(self, path: str | Path) -> Path:
        """Write one ``.npz`` atomically (vocabulary, CSR arrays, metadata with statistics)."""
        path = Path(path)
        meta = dict(self.metadata, statistics=self.statistics(), format_version=FORMAT_VERSION)
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, vocab=np.array(self.vocab, dtype=object).astype(str), indptr=self.indptr,
                         indices=self.indices, scores=self.scores, anchors=self.anchors,
                         metadata=np.array(json.dumps(meta)))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SimilarityLists":
        path = Path(path)
        if not path.is_file():
            raise MissingInputError(f"Similarity-lists file {path} does not exist. Build it with "
                                    "`python -m grounding.semclip build-lists --out PATH`.")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["metadata"]))
                lists = cls(vocab=z["vocab"].tolist(), indptr=z["indptr"].astype(np.int64),
                            indices=z["indices"].astype(np.int64), scores=z["scores"].astype(np.float32),
                            anchors=z["anchors"].astype(np.int64), metadata=meta)
        except (KeyError, ValueError, OSError) as e:
            raise ValueError(f"{path} is not a similarity-lists file (expected an .npz with vocab, indptr, "
                             f"indices, scores, anchors, metadata written by SimilarityLists.save): {e}. "
                             "Delete it and rebuild with `python -m grounding.semclip build-lists`.") from e
        return lists

    @classmethod
    def from_mapping(cls, mapping: dict[str, Sequence[tuple[str, float]]], metadata: dict | None = None,
                     vocab: Iterable[str] | None = None) -> "SimilarityLists":
        """Build from ``{anchor: [(lemma, score), ...]}``; the vocabulary is ``vocab`` (if given)
        extended by every anchor and listed lemma, in first-seen order."""
        index: dict[str, int] = {}
        for k in vocab or ():
            index.setdefault(k, len(index))
        for a, items in mapping.items():
            index.setdefault(a, len(index))
            for lemma, _ in items:
                index.setdefault(lemma, len(index))
        anchors, indptr, indices, scores = [], [0], [], []
        for a, items in mapping.items():
            anchors.append(index[a])
            for lemma, s in items:
                if lemma == a:
                    continue  # an anchor is never its own positive
                indices.append(index[lemma])
                scores.append(float(s))
            indptr.append(len(indices))
        return cls(vocab=list(index), indptr=np.asarray(indptr, np.int64), indices=np.asarray(indices, np.int64),
                   scores=np.asarray(scores, np.float32), anchors=np.asarray(anchors, np.int64),
                   metadata=dict(metadata or {}))


# ------------------------------------------------------------------------------------------
# WordNet graph with an exact, cached Wu–Palmer similarity
# ------------------------------------------------------------------------------------------
class WordNetNounGraph:
    """WordNet's noun hierarchy as integer arrays, with per-synset ancestor distances cached so
    that Wu–Palmer similarity equals ``Synset.wup_similarity`` (NLTK's conventions: LCS chosen by
    the deepest *min* depth, ties by name; depth = LCS max depth + 1; shortest path lengths) at a
    small fraction of NLTK's per-call cost."""

    def __init__(self, wn=None, pos: str = "n", around: Sequence[str] | None = None, hops: int = 2):
        """``around``: build only the part of the hierarchy that the lists of these synsets need
        (their neighbours within ``hops`` edges, siblings, and every ancestor of those), which is
        enough for exact depths and Wu–Palmer scores and far quicker than the whole noun graph."""
        if wn is None:
            wn = wordnet()
        self.wn = wn
        self.synsets = list(wn.all_synsets(pos)) if around is None else self._closure(wn, around, hops)
        self.names = [s.name() for s in self.synsets]
        idx = {s: i for i, s in enumerate(self.synsets)}
        self.hypernyms = [[idx[h] for h in s.hypernyms() + s.instance_hypernyms() if h in idx] for s in self.synsets]
        self.hyponyms: list[list[int]] = [[] for _ in self.synsets]
        for i, hs in enumerate(self.hypernyms):
            for h in hs:
                self.hyponyms[h].append(i)
        self.lemmas = [[lem.name() for lem in s.lemmas()] for s in self.synsets]
        n = len(self.synsets)
        order = self._topological_order()
        self.min_depth = np.zeros(n, np.int64)
        self.max_depth = np.zeros(n, np.int64)
        for i in order:  # parents before children
            if self.hypernyms[i]:
                self.min_depth[i] = 1 + min(self.min_depth[h] for h in self.hypernyms[i])
                self.max_depth[i] = 1 + max(self.max_depth[h] for h in self.hypernyms[i])
        self._ancestors: dict[int, dict[int, int]] = {}

    @staticmethod
    def _closure(wn, around: Sequence[str], hops: int) -> list:
        up = lambda s: s.hypernyms() + s.instance_hypernyms()
        down = lambda s: s.hyponyms() + s.instance_hyponyms()
        nodes = {wn.synset(n) for n in around}
        for step in (up, down):
            frontier = set(nodes)
            for _ in range(hops):
                frontier = {m for f in frontier for m in step(f)}
                nodes |= frontier
        nodes |= {c for s in list(nodes) for h in up(s) for c in down(h)}  # siblings
        todo = list(nodes)
        while todo:  # every ancestor: depths and Wu–Palmer need whole paths to the root
            for h in up(todo.pop()):
                if h not in nodes:
                    nodes.add(h)
                    todo.append(h)
        return sorted(nodes, key=lambda s: s.name())

    def _topological_order(self) -> list[int]:
        indeg = [len(h) for h in self.hypernyms]
        queue = deque(i for i, d in enumerate(indeg) if d == 0)
        order = []
        while queue:
            i = queue.popleft()
            order.append(i)
            for c in self.hyponyms[i]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    queue.append(c)
        return order

    def ancestors(self, i: int) -> dict[int, int]:
        """{ancestor: shortest number of hypernym edges}, self included at 0 (NLTK's BFS)."""
        got = self._ancestors.get(i)
        if got is None:
            got = {i: 0}
            for h in self.hypernyms[i]:
                for a, d in self.ancestors(h).items():
                    if d + 1 < got.get(a, 1 << 30):
                        got[a] = d + 1
            self._ancestors[i] = got
        return got

    def _path_distance(self, a: int, b: int) -> int | None:
        if a == b:
            return 0
        da, db = self.ancestors(a), self.ancestors(b)
        if len(db) < len(da):
            da, db = db, da
        best = min((d + db[s] for s, d in da.items() if s in db), default=None)
        return best

    def wup(self, a: int, b: int) -> float | None:
        """Eq. 1, identical to NLTK's ``wup_similarity`` for nouns."""
        da, db = self.ancestors(a), self.ancestors(b)
        common = [s for s in da if s in db]
        if not common:
            return None
        top = max(self.min_depth[s] for s in common)
        cands = [s for s in common if self.min_depth[s] == top]
        subsumer = a if a in cands else min(cands, key=lambda s: self.names[s])
        depth = self.max_depth[subsumer] + 1
        len1, len2 = self._path_distance(a, subsumer), self._path_distance(b, subsumer)
        if len1 is None or len2 is None:
            return None
        return float(2.0 * depth / (len1 + depth + len2 + depth))

    def neighbours(self, i: int, max_depth_diff: int, include_siblings: bool) -> set[int]:
        """Synsets within ``max_depth_diff`` hypernym edges up or hyponym edges down (plus siblings)."""
        found: set[int] = set()
        for edges in (self.hypernyms, self.hyponyms):
            frontier = [i]
            for _ in range(max_depth_diff):
                frontier = [n for f in frontier for n in edges[f]]
                found.update(frontier)
        if include_siblings:
            for h in self.hypernyms[i]:
                found.update(self.hyponyms[h])
        found.discard(i)
        return found


def build_similarity_lists(config: SimilarityListConfig = SimilarityListConfig(), graph: WordNetNounGraph | None = None,
                           synsets: Sequence[str] | None = None, progress: bool = False) -> SimilarityLists:
    """Traverse WordNet and build the similarity list of every noun lemma (or of the lemmas of
    ``synsets`` only, for tests). Scores are Eq. 1; synonyms score 1."""
    if config.pos != "n":
        raise ValueError("Only nouns are supported (SimilarityListConfig.pos='n'), as in the paper.")
    t0 = time.perf_counter()
    graph = graph or WordNetNounGraph(around=synsets, hops=config.max_depth_diff)
    name_to_idx = {n: i for i, n in enumerate(graph.names)}
    if synsets is None:
        rows = range(len(graph.synsets))
    else:
        missing = [s for s in synsets if s not in name_to_idx]
        if missing:
            raise KeyError(f"Not WordNet noun synsets: {missing}")
        rows = [name_to_idx[s] for s in synsets]
    vocab = [f"{graph.names[i]}.{lem}" for i in range(len(graph.synsets)) for lem in graph.lemmas[i]]
    first_key = np.zeros(len(graph.synsets) + 1, np.int64)
    np.cumsum([len(ls) for ls in graph.lemmas], out=first_key[1:])

    anchors, indptr, indices, scores = [], [0], [], []
    for step, i in enumerate(rows):
        neigh = []
        for j in graph.neighbours(i, config.max_depth_diff, config.include_siblings):
            if abs(int(graph.max_depth[j]) - int(graph.max_depth[i])) > config.max_depth_diff:
                continue  # the depth-differential constraint, also across multiple-inheritance paths
            s = graph.wup(i, j)
            if s is not None and s >= config.wup_threshold:
                neigh.append((s, graph.names[j], j))
        neigh.sort(key=lambda t: (-t[0], t[1]))
        synset_items = [(int(first_key[j] + k), s) for s, _, j in neigh for k in range(len(graph.lemmas[j]))]
        lemma_keys = range(first_key[i], first_key[i + 1])
        for key in lemma_keys:
            synonyms = [(int(k), 1.0) for k in lemma_keys if k != key]
            items = synonyms + synset_items
            if config.max_list_size is not None:
                items = items[:max(config.max_list_size, len(synonyms))]
            anchors.append(int(key))
            indices.extend(k for k, _ in items)
            scores.extend(s for _, s in items)
            indptr.append(len(indices))
        if progress and step % 10000 == 0:
            print(f"  similarity lists: {step}/{len(rows)} synsets, {time.perf_counter() - t0:.0f}s", flush=True)
    meta = {"source": "wordnet", "wordnet_version": graph.wn.get_version(), "config": dataclasses.asdict(config),
            "build_seconds": round(time.perf_counter() - t0, 2), "synsets": None if synsets is None else list(synsets)}
    lists = SimilarityLists(vocab=vocab, indptr=np.asarray(indptr, np.int64), indices=np.asarray(indices, np.int64),
                            scores=np.asarray(scores, np.float32), anchors=np.asarray(anchors, np.int64), metadata=meta)
    if synsets is not None:  # keep only the vocabulary the lists use
        lists = SimilarityLists.from_mapping({lists.vocab[a]: lists.list_of(lists.vocab[a]) for a in lists.anchors},
                                             metadata=meta)
    return lists


def config_key(config: SimilarityListConfig) -> str:
    return sha1_of_json({"config": dataclasses.asdict(config), "format": FORMAT_VERSION})[:12]


def load_or_build(path: str | Path, config: SimilarityListConfig = SimilarityListConfig(),
                  progress: bool = True) -> SimilarityLists:
    """Load the lists at ``path``; build (and write atomically) when the file is absent."""
    path = Path(path)
    if path.is_file():
        return SimilarityLists.load(path)
    lists = build_similarity_lists(config, progress=progress)
    lists.save(path)
    return lists


# ------------------------------------------------------------------------------------------
# Externally curated lists
# ------------------------------------------------------------------------------------------
def read_curated_lists(path: str | Path) -> SimilarityLists:
    """Read externally curated similarity lists (e.g. the paper's linguist-curated release).

    Accepted layouts, chosen by suffix:
      * ``.json``  ``{"anchor": [["lemma", score], ...], ...}`` (or ``[{"anchor":..., "similar": [...]}]``)
      * ``.jsonl`` one ``{"anchor": "...", "similar": [["lemma", score], ...]}`` per line
      * ``.tsv`` / ``.txt`` one pair per line ``anchor<TAB>lemma<TAB>score`` (score optional, default 1)
    Anchors and lemmas are any strings (normally lemma keys ``word.n.01.lemma``).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"Curated similarity lists {path} not found.")
    mapping: dict[str, list[tuple[str, float]]] = {}
    suffix = path.suffix.lower()

    def bad(where: str, why: str):
        return ValueError(f"{path}{where}: {why}. Expected .json {{anchor: [[lemma, score], ...]}}, .jsonl lines "
                          '{"anchor": ..., "similar": [[lemma, score], ...]} or .tsv lines anchor<TAB>lemma<TAB>score.')

    def add(anchor, items, where):
        if not isinstance(anchor, str) or not isinstance(items, list):
            raise bad(where, "anchor must be a string and its list a list")
        lst = mapping.setdefault(anchor, [])
        for it in items:
            if isinstance(it, str):
                lst.append((it, 1.0))
            elif isinstance(it, (list, tuple)) and len(it) == 2 and isinstance(it[0], str):
                lst.append((it[0], float(it[1])))
            else:
                raise bad(where, f"list item {it!r} is not [lemma, score]")

    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise bad("", f"invalid JSON ({e})") from e
        if isinstance(data, dict):
            for a, items in data.items():
                add(a, items, f" (anchor {a!r})")
        elif isinstance(data, list):
            for n, rec in enumerate(data):
                if not isinstance(rec, dict) or "anchor" not in rec or "similar" not in rec:
                    raise bad(f" item {n}", "expected an object with 'anchor' and 'similar'")
                add(rec["anchor"], rec["similar"], f" item {n}")
        else:
            raise bad("", "top level must be an object or a list")
    elif suffix == ".jsonl":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise bad(f":{n}", f"invalid JSON ({e})") from e
            if not isinstance(rec, dict) or "anchor" not in rec or "similar" not in rec:
                raise bad(f":{n}", "expected an object with 'anchor' and 'similar'")
            add(rec["anchor"], rec["similar"], f":{n}")
    elif suffix in (".tsv", ".txt"):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) not in (2, 3):
                raise bad(f":{n}", f"expected 2 or 3 tab-separated fields, got {len(parts)}")
            try:
                score = float(parts[2]) if len(parts) == 3 else 1.0
            except ValueError as e:
                raise bad(f":{n}", f"score {parts[2]!r} is not a number") from e
            mapping.setdefault(parts[0], []).append((parts[1], score))
    else:
        raise bad("", f"unknown suffix {suffix!r}")
    return SimilarityLists.from_mapping(mapping, metadata={"source": "curated", "path": str(path)})


def write_curated_lists(lists: SimilarityLists, path: str | Path) -> Path:
    """Write lists in the ``.jsonl`` curated layout (round-trips through :func:`read_curated_lists`)."""

    lines = [json.dumps({"anchor": lists.vocab[a], "similar": [[k, round(s, 6)] for k, s in lists.list_of(lists.vocab[a])]})
             for a in lists.anchors]
    return atomic_write_text(path, "\n".join(lines) + "\n")


def subtree_synsets(roots: Sequence[str], wn=None) -> list[str]:
    """Names of the given noun synsets and all their hyponyms (a small, self-contained vocabulary
    for demos and tests, e.g. ``["basket.n.01", "dog.n.01"]``)."""
    if wn is None:
        wn = wordnet()
    out: dict[str, None] = {}
    for r in roots:
        try:
            root = wn.synset(r)
        except Exception as e:  # nltk raises WordNetError / ValueError for unknown names
            raise KeyError(f"{r!r} is not a WordNet synset name such as 'basket.n.01'") from e
        for s in [root, *root.closure(lambda s: s.hyponyms() + s.instance_hyponyms())]:
            out.setdefault(s.name(), None)
    return list(out)
