"""The Concept & Relation Graph as a database (paper §2, Fig. 1, Table 1).

Nodes are concepts (text, level, denotation = ids of the images whose captions contain the
concept; primitives are the level-0 concepts) and predicates (lexical template, arity,
argument types). Every predicate *application* links a predicate to its argument concepts and
its result concept. Each caption keeps its applications in bottom-up (height) order, ready for
level-batched composition. Everything is stored as flat numpy arrays (CSR index pointers, UTF-8
string tables) in one ``.npz`` so a Flickr30K-scale graph loads in well under a second.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from grounding.errors import MissingInputError, UserInputError
from grounding.utils.io import atomic_path

from .crg_extraction import CaptionCRG

FORMAT_VERSION = 1
# caption_status values
OK, PARSE_FAILED, NO_CONCEPT = 0, 1, 2


class StringTable:
    """Immutable list of strings stored as one UTF-8 byte array plus offsets."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    @classmethod
    def from_list(cls, strings: Sequence[str]) -> "StringTable":
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes().decode("utf-8")

    def tolist(self) -> list[str]:
        raw = self.data.tobytes()
        o = self.offsets.tolist()
        return [raw[o[i]:o[i + 1]].decode("utf-8") for i in range(len(o) - 1)]


def _csr(rows: np.ndarray, cols: np.ndarray, n_rows: int, unique: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, indices) from (row, col) pairs; rows sorted, optionally deduplicated."""
    if unique and len(rows):
        key = np.unique(rows.astype(np.int64) * (int(cols.max()) + 1) + cols)
        width = int(cols.max()) + 1
        rows, cols = key // width, key % width
    else:
        order = np.argsort(rows, kind="stable")
        rows, cols = rows[order], cols[order]
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return indptr, cols.astype(np.int32)


@dataclass
class LevelBatch:
    """All applications at one height across a batch of captions (one composition step)."""

    height: int
    caption: np.ndarray        # (A,) row in the requested caption batch
    application: np.ndarray    # (A,) application ids
    predicate: np.ndarray      # (A,) predicate ids
    result: np.ndarray         # (A,) concept ids
    args_indptr: np.ndarray    # (A+1,) CSR into ``args``
    args: np.ndarray           # argument concept ids in template order


class GraphFileError(UserInputError, ValueError):
    """A concept graph file (``crg.npz``) that is a folder, truncated, not an ``.npz`` or of another format."""


class ConceptGraph:
    """Concept & Relation Graph. Build with :meth:`build`, persist with :meth:`save`/:meth:`load`."""

    ARRAYS = ("concept_level", "concept_is_primitive", "den_indptr", "den_images", "predicate_arity",
              "app_predicate", "app_result", "app_args_indptr", "app_args", "caption_image", "caption_root",
              "caption_status", "caption_app_indptr", "caption_apps", "caption_app_height",
              "caption_prim_indptr", "caption_prims")
    TABLES = ("concept_text", "predicate_template", "predicate_arg_types", "image_names")

    def __init__(self, **arrays):
        for k, v in arrays.items():
            setattr(self, k, v)
        self._children = self._parents = self._concept_index = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, crgs: Sequence[CaptionCRG | None], caption_image: Sequence[int] | np.ndarray,
              image_names: Sequence[str], parse_failed: Sequence[bool] | None = None) -> "ConceptGraph":
        """Intern the per-caption CRGs into one graph. ``crgs[j] is None`` = caption j failed to parse."""
        caption_image = np.asarray(caption_image, dtype=np.int32)
        concept_id: dict[str, int] = {}
        predicate_id: dict[str, int] = {}
        app_id: dict[tuple, int] = {}
        arg_types: list[str] = []
        c_level: list[int] = []
        app_pred, app_res, app_args, app_nargs = [], [], [], []
        cap_root = np.full(len(crgs), -1, dtype=np.int64)
        cap_status = np.zeros(len(crgs), dtype=np.int8)
        cap_apps, cap_heights, cap_app_count, cap_prims, cap_prim_count = [], [], [], [], []
        den_concept, den_caption = [], []

        def intern(text: str, level: int) -> int:
            i = concept_id.get(text)
            if i is None:
                i = concept_id[text] = len(c_level)
                c_level.append(level)
            elif level > c_level[i]:
                c_level[i] = level
            return i

        for j, crg in enumerate(crgs):
            if crg is None or crg.root is None:
                cap_status[j] = PARSE_FAILED if crg is None else NO_CONCEPT
                cap_app_count.append(0)
                cap_prim_count.append(0)
                continue
            levels = crg.levels
            ids = {c: intern(c, lv) for c, lv in levels.items()}
            cap_root[j] = ids[crg.root]
            den_concept.extend(ids.values())
            den_caption.extend([j] * len(ids))
            prims = [ids[p] for p in crg.primitives]
            cap_prims.extend(prims)
            cap_prim_count.append(len(prims))
            rows = []
            for p in crg.predicates:
                pid = predicate_id.get(p.template)
                if pid is None:
                    pid = predicate_id[p.template] = len(arg_types)
                    arg_types.append("|".join(p.arg_types))
                args = tuple(ids[a] for a in p.args)
                key = (pid, ids[p.result], args)
                a = app_id.get(key)
                if a is None:
                    a = app_id[key] = len(app_pred)
                    app_pred.append(pid)
                    app_res.append(ids[p.result])
                    app_args.extend(args)
                    app_nargs.append(len(args))
                rows.append((levels[p.result], a))
            rows.sort()
            cap_apps.extend(a for _, a in rows)
            cap_heights.extend(h for h, _ in rows)
            cap_app_count.append(len(rows))

        n_concepts = len(c_level)
        concept_text = list(concept_id)
        levels_arr = np.asarray(c_level, dtype=np.int16)
        # Denotation: the set of images whose captions contain the concept (§2).
        den_indptr, den_images = _csr(np.asarray(den_concept, dtype=np.int64),
                                      caption_image[np.asarray(den_caption, dtype=np.int64)].astype(np.int64),
                                      n_concepts, unique=True)

        def indptr(counts):
            out = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=out[1:])
            return out

        is_prim = np.zeros(n_concepts, dtype=bool)
        is_prim[np.asarray(cap_prims, dtype=np.int64)] = True
        return cls(
            concept_text=StringTable.from_list(concept_text), concept_level=levels_arr, concept_is_primitive=is_prim,
            den_indptr=den_indptr, den_images=den_images,
            predicate_template=StringTable.from_list(list(predicate_id)),
            predicate_arg_types=StringTable.from_list(arg_types),
            predicate_arity=np.asarray([len(t.split("|")) if t else 0 for t in arg_types], dtype=np.int16),
            app_predicate=np.asarray(app_pred, dtype=np.int32), app_result=np.asarray(app_res, dtype=np.int32),
            app_args_indptr=indptr(app_nargs), app_args=np.asarray(app_args, dtype=np.int32),
            caption_image=caption_image, caption_root=cap_root.astype(np.int32), caption_status=cap_status,
            caption_app_indptr=indptr(cap_app_count), caption_apps=np.asarray(cap_apps, dtype=np.int32),
            caption_app_height=np.asarray(cap_heights, dtype=np.int16),
            caption_prim_indptr=indptr(cap_prim_count), caption_prims=np.asarray(cap_prims, dtype=np.int32),
            image_names=StringTable.from_list(list(image_names)),
        )

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """One ``.npz`` (written atomically): numeric arrays and UTF-8 string tables."""
        payload = {k: getattr(self, k) for k in self.ARRAYS}
        for t in self.TABLES:
            payload[f"{t}__data"] = getattr(self, t).data
            payload[f"{t}__offsets"] = getattr(self, t).offsets
        payload["format_version"] = np.asarray(FORMAT_VERSION)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, **payload)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ConceptGraph":
        path = Path(path)
        if path.is_dir():
            inside = f" (it holds {path / 'crg.npz'}: give that)" if (path / "crg.npz").is_file() else ""
            raise GraphFileError(f"concept graph {path} is a folder, not a crg.npz file{inside}; build one with "
                                 "`python -m grounding.composer crg --captions FILE --out DIR`")
        if not path.is_file():
            raise MissingInputError(f"concept graph {path} does not exist; build it with `python -m grounding.composer crg`")
        try:
            with np.load(path, allow_pickle=False) as z:
                if "format_version" not in z or int(z["format_version"]) != FORMAT_VERSION:
                    raise GraphFileError(f"{path} is not a concept graph of format {FORMAT_VERSION}; rebuild it with "
                                         "`python -m grounding.composer crg`")
                arrays = {k: z[k] for k in cls.ARRAYS}
                for t in cls.TABLES:
                    arrays[t] = StringTable(z[f"{t}__data"], z[f"{t}__offsets"])
        except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError, ValueError) as e:
            if isinstance(e, GraphFileError):
                raise
            # np.load reads a file that is no zip (or a truncated one, a missing array) as one of these
            why = (f"it lacks the array {e}" if isinstance(e, KeyError)
                   else f"not a whole .npz archive: truncated, or another kind of file; {type(e).__name__}")
            raise GraphFileError(f"concept graph {path} cannot be read ({why}): expected the crg.npz that "
                                 "`python -m grounding.composer crg` writes, whole; rebuild it with that command") from None
        return cls(**arrays)

    # ------------------------------------------------------------------ queries
    @property
    def n_concepts(self) -> int:
        return len(self.concept_level)

    @property
    def n_predicates(self) -> int:
        return len(self.predicate_arity)

    @property
    def n_captions(self) -> int:
        return len(self.caption_image)

    def concept(self, text: str) -> int:
        """Concept id of a text (lower-cased, single-spaced as extracted); KeyError if absent."""
        if self._concept_index is None:
            self._concept_index = {t: i for i, t in enumerate(self.concept_text.tolist())}
        return self._concept_index[" ".join(text.lower().split())]

    def denotation(self, concept: int | str) -> np.ndarray:
        """Sorted image ids whose captions contain the concept."""
        c = self.concept(concept) if isinstance(concept, str) else concept
        return self.den_images[self.den_indptr[c]:self.den_indptr[c + 1]]

    def _edges(self):
        if self._children is None:
            n_args = np.diff(self.app_args_indptr)
            res = np.repeat(self.app_result.astype(np.int64), n_args)
            args = self.app_args.astype(np.int64)
            self._children = _csr(res, args, self.n_concepts, unique=True)
            self._parents = _csr(args, res, self.n_concepts, unique=True)
        return self._children, self._parents

    def children(self, concept: int | str) -> np.ndarray:
        """Concepts that some predicate composes into this one (its arguments), sorted ids."""
        c = self.concept(concept) if isinstance(concept, str) else concept
        indptr, idx = self._edges()[0]
        return idx[indptr[c]:indptr[c + 1]]

    def parents(self, concept: int | str) -> np.ndarray:
        """Concepts composed from this one by some predicate, sorted ids."""
        c = self.concept(concept) if isinstance(concept, str) else concept
        indptr, idx = self._edges()[1]
        return idx[indptr[c]:indptr[c + 1]]

    def applications_of(self, caption: int) -> tuple[np.ndarray, np.ndarray]:
        """(application ids, their heights) of one caption, in bottom-up order."""
        s, e = self.caption_app_indptr[caption], self.caption_app_indptr[caption + 1]
        return self.caption_apps[s:e], self.caption_app_height[s:e]

    def caption_tree(self, caption: int) -> dict:
        """One caption's concept tree bottom-up: primitives, then predicate applications by height."""
        apps, heights = self.applications_of(caption)
        s, e = self.caption_prim_indptr[caption], self.caption_prim_indptr[caption + 1]
        levels = []
        for h in np.unique(heights):
            sel = apps[heights == h]
            levels.append([{"application": int(a), "predicate": self.predicate_template[int(self.app_predicate[a])],
                            "args": [self.concept_text[int(x)] for x in self.app_args[self.app_args_indptr[a]:self.app_args_indptr[a + 1]]],
                            "result": self.concept_text[int(self.app_result[a])]} for a in sel])
        return {"caption": caption, "image": int(self.caption_image[caption]),
                "root": self.concept_text[int(self.caption_root[caption])] if self.caption_root[caption] >= 0 else None,
                "primitives": [self.concept_text[int(p)] for p in self.caption_prims[s:e]], "levels": levels}

    def composition_schedule(self, captions: Sequence[int] | np.ndarray) -> list[LevelBatch]:
        """Level-batched composition plan for a batch of captions: for h = 1..H, every
        application of height h across the batch (its arguments are all of lower height)."""
        captions = np.asarray(captions, dtype=np.int64)
        starts, ends = self.caption_app_indptr[captions], self.caption_app_indptr[captions + 1]
        counts = ends - starts
        row = np.repeat(np.arange(len(captions)), counts)
        pos = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(starts, counts)
        apps, heights = self.caption_apps[pos].astype(np.int64), self.caption_app_height[pos]
        out = []
        for h in np.unique(heights):
            m = heights == h
            a = apps[m]
            n_args = self.app_args_indptr[a + 1] - self.app_args_indptr[a]
            arg_pos = np.arange(n_args.sum()) - np.repeat(np.cumsum(n_args) - n_args, n_args) + np.repeat(self.app_args_indptr[a], n_args)
            indptr = np.zeros(len(a) + 1, dtype=np.int64)
            np.cumsum(n_args, out=indptr[1:])
            out.append(LevelBatch(int(h), row[m], a, self.app_predicate[a], self.app_result[a], indptr, self.app_args[arg_pos]))
        return out

    # ------------------------------------------------------------------ count matrices for MCD
    def image_compound_counts(self, n_images: int | None = None):
        """scipy CSR (images x predicates): how often each predicate is applied in an image's captions."""
        import scipy.sparse as sp

        n_images = n_images or len(self.image_names)
        n_apps = np.diff(self.caption_app_indptr)
        img = np.repeat(self.caption_image.astype(np.int64), n_apps)
        pred = self.app_predicate[self.caption_apps].astype(np.int64)
        return sp.csr_matrix((np.ones(len(img)), (img, pred)), shape=(n_images, self.n_predicates))

    def image_atom_counts(self, n_images: int | None = None):
        """scipy CSR (images x concepts): primitive occurrences in an image's captions."""
        import scipy.sparse as sp

        n_images = n_images or len(self.image_names)
        n = np.diff(self.caption_prim_indptr)
        img = np.repeat(self.caption_image.astype(np.int64), n)
        return sp.csr_matrix((np.ones(len(img)), (img, self.caption_prims.astype(np.int64))), shape=(n_images, self.n_concepts))

    # ------------------------------------------------------------------ statistics (Table 1)
    def stats(self) -> dict:
        """Table 1 columns. # concepts counts composed (non-primitive) concepts — primitives are not
        in C (§3 notation) — and average height is over parsed captions, primitives at height 0."""
        ok = self.caption_status == OK
        heights = self.caption_heights()[ok]
        return {
            "captions": int(self.n_captions),
            "images": int(len(np.unique(self.caption_image))),
            "concepts": int((~self.concept_is_primitive).sum()),
            "predicates": int(self.n_predicates),
            "primitives": int(self.concept_is_primitive.sum()),
            "avg_height": float(heights.mean()) if ok.any() else 0.0,
            "applications": int(len(self.app_predicate)),
            "parse_failed": int((self.caption_status == PARSE_FAILED).sum()),
            "no_concept": int((self.caption_status == NO_CONCEPT).sum()),
            "max_height": int(heights.max()) if ok.any() else 0,
        }

    def caption_heights(self) -> np.ndarray:
        """Height of each caption's own tree (its highest application; 0 when unparsed)."""
        n = np.diff(self.caption_app_indptr)
        out = np.zeros(self.n_captions, dtype=np.int64)
        has = n > 0
        out[has] = np.maximum.reduceat(self.caption_app_height.astype(np.int64), self.caption_app_indptr[:-1][has])
        return out


def format_stats(stats: dict, name: str = "") -> str:
    head = f"{'dataset':<16}{'# concepts':>12}{'# predicates':>14}{'# primitives':>14}{'avg height':>12}"
    row = f"{name[:16]:<16}{stats['concepts']:>12,}{stats['predicates']:>14,}{stats['primitives']:>14,}{stats['avg_height']:>12.2f}"
    extra = (f"captions {stats['captions']:,} (images {stats['images']:,}); applications {stats['applications']:,}; "
             f"parse failures {stats['parse_failed']:,}; captions without a concept {stats['no_concept']:,}; "
             f"max height {stats['max_height']}")
    return "\n".join([head, row, extra])


# Table 1's record (``crg --record NAME``): the columns format_stats prints, headers as it prints them; each row also
# holds the rest of stats() under its own keys (labelled as the extra line names them)
STATS_LABELS = {"dataset": "dataset", "concepts": "# concepts", "predicates": "# predicates", "primitives": "# primitives",
                "avg_height": "avg height", "captions": "captions", "images": "images", "applications": "applications",
                "parse_failed": "parse failures", "no_concept": "captions without a concept", "max_height": "max height"}
STATS_COLUMNS = ("dataset", "concepts", "predicates", "primitives", "avg_height")


def stats_record_row(stats: dict, name: str = "", **settings) -> dict:
    """One record row of :meth:`ConceptGraph.stats` (``stats.json``'s keys and values) named ``name`` (the
    ``dataset`` column, not cut to format_stats' 16 characters), then ``settings`` (backend, degrade, seed)."""
    return {"dataset": name, **stats, **settings}
