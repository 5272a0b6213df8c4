"""Visual Genome: per image, its objects (names, synsets, boxes, attributes) and its
(subject, predicate, object) triplets, for VG-BERT's relational grounding (Sec. 3.2, App. A.3).

The JSON files are parsed once into flat numpy arrays (objects and relationships of all images
back to back, with per-image offsets), so a 100k-image dataset costs a few hundred MB and
DataLoader workers share it copy-on-write. Labels come from a pluggable :class:`LabelMapping`:
by default one built from the training split's own object synsets and predicates; VG-BERT's
cleaning (55 object classes, 114 relations, images with >= 5 triplets) plugs in as another one.
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Literal, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from grounding.nets import check_choices
from grounding.paths import cache_dir, resolve_path
from grounding.training_images import image_keys, overlapping
from grounding.utils.io import atomic_path, sha1_of_json

from .base import GroundingDataModule
from .collate import tokenize
from .file_checks import (
    WORLD_HINT,
    MalformedDataError,
    check_images_exist,
    expect_keys,
    iter_json_array,
    malformed,
    read_json,
    require_file,
    require_root,
    resolve,
)
from .images import ImageDataset
from .options import ImageTransform, LoaderOptions
from .vg_cleaning import CleanedVGLabelMapping

log = logging.getLogger(__name__)

VG_LAYOUT = """\
  <root>/image_data.json      [{"image_id": int, "url": ".../VG_100K/<id>.jpg", "width", "height", ...}]
  <root>/objects.json         [{"image_id": int, "objects": [{"object_id", "x", "y", "w", "h", "names": [str],
                                "synsets": [str]}]}]
  <root>/relationships.json   [{"image_id": int, "relationships": [{"relationship_id", "predicate": str,
                                "synsets": [str], "subject": {object}, "object": {object}}]}]
  <root>/attributes.json      optional: [{"image_id": int, "attributes": [{"object_id", ..., "attributes": [str]}]}]
  <root>/VG_100K/<image_id>.jpg and <root>/VG_100K_2/<image_id>.jpg   (or <root>/images/, or image_dir)"""
VG_HINT = ("point root at your Visual Genome folder (v1.4 JSON files and the VG_100K / VG_100K_2 image folders), "
           f"or {WORLD_HINT} (root: data/world/visual_genome)")
IMAGE_DIR_CANDIDATES = ("VG_100K", "VG_100K_2", "images")
VG_FILES = ("image_data", "objects", "relationships", "attributes")
PARSER_VERSION = 2  # 2: image_data.json's coco_id / flickr_id kept (VGIndex.coco_ids / flickr_ids)
CACHE_MIN_BYTES = 32 << 20


# --------------------------------------------------------------------------------------------
# Label mappings
# --------------------------------------------------------------------------------------------
@runtime_checkable
class LabelMapping(Protocol):
    """Object class and relation label ids; -1 means unmapped (dropped when ``drop_unmapped``)."""

    object_classes: list[str]
    relation_labels: list[str]

    def object_label(self, names: Sequence[str], synsets: Sequence[str]) -> int: ...

    def relation_label(self, predicate: str, synsets: Sequence[str]) -> int: ...


def normalize_phrase(text: str) -> str:
    return " ".join(str(text).lower().split())


class VocabularyLabelMapping:
    """One class per object synset (the object's name when it has none), one label per predicate."""

    def __init__(self, object_classes: list[str], relation_labels: list[str]):
        self.object_classes = list(object_classes)
        self.relation_labels = list(relation_labels)
        self._objects = {c: i for i, c in enumerate(self.object_classes)}
        self._relations = {r: i for i, r in enumerate(self.relation_labels)}

    @staticmethod
    def object_key(names: Sequence[str], synsets: Sequence[str]) -> str:
        return synsets[0] if synsets else normalize_phrase(names[0]) if names else ""

    def object_label(self, names: Sequence[str], synsets: Sequence[str]) -> int:
        for s in synsets:
            if s in self._objects:
                return self._objects[s]
        for n in names:
            if normalize_phrase(n) in self._objects:
                return self._objects[normalize_phrase(n)]
        return -1

    def relation_label(self, predicate: str, synsets: Sequence[str]) -> int:
        return self._relations.get(normalize_phrase(predicate), -1)

    @classmethod
    def from_counts(cls, object_counts: Counter, relation_counts: Counter, min_object_count: int = 1,
                    min_relation_count: int = 1) -> "VocabularyLabelMapping":
        objects = sorted(k for k, c in object_counts.items() if k and c >= min_object_count)
        relations = sorted(k for k, c in relation_counts.items() if k and c >= min_relation_count)
        return cls(objects, relations)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------
class VGIndex:
    """All images' objects and relationships as flat arrays with per-image offsets.

    Objects of image row i are ``obj_offsets[i]:obj_offsets[i+1]``; ``rel_subject`` / ``rel_object``
    index objects within their image. Strings live once in small tables (``object_keys`` =
    (names, synsets) pairs, ``descriptions``, ``predicate_keys`` = (predicate, synsets) pairs).
    ``coco_ids`` / ``flickr_ids``: image_data.json's ``coco_id`` / ``flickr_id`` of each image (0 = none).
    """

    def __init__(self, image_ids, image_urls, obj_offsets, obj_key, obj_desc, obj_box, rel_offsets, rel_subject,
                 rel_object, rel_key, object_keys, descriptions, predicate_keys, coco_ids=None, flickr_ids=None):
        self.image_ids = np.asarray(image_ids, dtype=np.int64)
        self.coco_ids = np.zeros(len(self.image_ids), np.int64) if coco_ids is None else np.asarray(coco_ids, np.int64)
        self.flickr_ids = (np.zeros(len(self.image_ids), np.int64) if flickr_ids is None
                           else np.asarray(flickr_ids, np.int64))
        self.image_urls = image_urls
        self.obj_offsets = np.asarray(obj_offsets, dtype=np.int64)
        self.obj_key = np.asarray(obj_key, dtype=np.int32)
        self.obj_desc = np.asarray(obj_desc, dtype=np.int32)
        self.obj_box = np.asarray(obj_box, dtype=np.float32).reshape(-1, 4)
        self.rel_offsets = np.asarray(rel_offsets, dtype=np.int64)
        self.rel_subject = np.asarray(rel_subject, dtype=np.int32)
        self.rel_object = np.asarray(rel_object, dtype=np.int32)
        self.rel_key = np.asarray(rel_key, dtype=np.int32)
        self.object_keys = object_keys
        self.descriptions = descriptions
        self.predicate_keys = predicate_keys

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def num_triplets(self) -> np.ndarray:
        return np.diff(self.rel_offsets)

    @property
    def rel_image(self) -> np.ndarray:
        return np.repeat(np.arange(len(self)), self.num_triplets)

    @property
    def obj_image(self) -> np.ndarray:
        return np.repeat(np.arange(len(self)), np.diff(self.obj_offsets))


    # -- on-disk cache: parsing the real JSON (~1.5 GB) takes minutes; the arrays load in seconds --
    _ARRAYS = ("image_ids", "obj_offsets", "obj_key", "obj_desc", "obj_box", "rel_offsets", "rel_subject",
               "rel_object", "rel_key", "coco_ids", "flickr_ids")

    def save(self, path: Path) -> None:
        tables = {"image_urls": self.image_urls, "object_keys": self.object_keys, "descriptions": self.descriptions,
                  "predicate_keys": self.predicate_keys}
        blob = np.frombuffer(json.dumps(tables).encode("utf-8"), dtype=np.uint8)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, tables=blob, **{k: getattr(self, k) for k in self._ARRAYS})

    @classmethod
    def load(cls, path: Path) -> "VGIndex":
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in cls._ARRAYS}
            tables = json.loads(z["tables"].tobytes().decode("utf-8"))
        return cls(image_urls=tables["image_urls"], descriptions=tables["descriptions"],
                   object_keys=[(tuple(n), tuple(s)) for n, s in tables["object_keys"]],
                   predicate_keys=[(p, tuple(s)) for p, s in tables["predicate_keys"]], **arrays)


class _Interner:
    def __init__(self):
        self.table: list = []
        self.ids: dict = {}

    def __call__(self, value) -> int:
        i = self.ids.get(value)
        if i is None:
            i = self.ids[value] = len(self.table)
            self.table.append(value)
        return i


def _image_id(entry: dict, where: str, path: Path) -> int:
    if not isinstance(entry, dict) or ("image_id" not in entry and "id" not in entry):
        raise malformed(path, "Visual Genome", f'lacks "image_id" at {where}', VG_LAYOUT, VG_HINT)
    return int(entry["image_id"] if "image_id" in entry else entry["id"])


def _linked_id(value) -> int:
    """image_data.json's ``coco_id`` / ``flickr_id``: a positive int, else 0 (null or absent)."""
    try:
        return max(int(value), 0) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _entries(path: Path, key: str | None) -> Iterator[dict]:
    """Per-image entries of a VG file, streamed (one entry in memory at a time) and checked."""
    for i, entry in enumerate(iter_json_array(path, "Visual Genome", VG_LAYOUT, VG_HINT)):
        if key is not None:
            expect_keys(entry, [key], f"[{i}]", path, "Visual Genome", VG_LAYOUT, VG_HINT)
            if not isinstance(entry[key], list):
                raise malformed(path, "Visual Genome", f'has a non-list "{key}" at [{i}]', VG_LAYOUT, VG_HINT)
        yield entry


def _names(obj: dict) -> tuple[str, ...]:
    # v1.4 writes "names" in objects.json but sometimes "name" in relationship subjects/objects.
    names = obj.get("names")
    if names is None:
        names = [obj["name"]] if obj.get("name") is not None else []
    elif isinstance(names, str):
        names = [names]
    return tuple(n for n in (normalize_phrase(x) for x in names) if n)


def _image_urls_and_links(path: Path) -> tuple[dict[int, str], dict[int, tuple[int, int]]]:
    """image_data.json: image id -> its URL, and image id -> (coco_id, flickr_id), 0 = none."""
    urls: dict[int, str] = {}
    links: dict[int, tuple[int, int]] = {}
    for i, entry in enumerate(_entries(path, None)):
        image_id = _image_id(entry, f"[{i}]", path)
        urls[image_id] = str(entry.get("url") or "")
        links[image_id] = (_linked_id(entry.get("coco_id")), _linked_id(entry.get("flickr_id")))
    return urls, links


def _object_attributes(path: Path, max_attributes: int) -> dict[int, tuple[str, ...]]:
    """attributes.json (optional: {} when absent): object id -> its first ``max_attributes`` distinct normalised
    attribute phrases, objects without any left out."""
    attrs: dict[int, tuple[str, ...]] = {}
    shared: dict[tuple[str, ...], tuple[str, ...]] = {}
    if path.is_file():
        for i, entry in enumerate(_entries(path, "attributes")):
            for j, obj in enumerate(entry["attributes"]):
                expect_keys(obj, ["object_id"], f"[{i}].attributes[{j}]", path, "Visual Genome", VG_LAYOUT, VG_HINT)
                values = [normalize_phrase(a) for a in (obj.get("attributes") or [])]
                values = list(dict.fromkeys(a for a in values if a))[:max_attributes]
                if values:
                    values = tuple(values)
                    attrs[int(obj["object_id"])] = shared.setdefault(values, values)  # one copy per phrase set
    return attrs


def parse_visual_genome(root: Path, max_attributes: int = 2) -> VGIndex:
    """Read image_data / objects / relationships (/ attributes) JSON once into a :class:`VGIndex`.

    Files are streamed entry by entry into compact rows, so peak memory stays near the size of the
    result rather than of the parsed JSON.
    """
    files = {name: require_file(root / f"{name}.json", "Visual Genome", VG_LAYOUT, VG_HINT)
             for name in ("image_data", "objects", "relationships")}

    urls, links = _image_urls_and_links(files["image_data"])
    attrs = _object_attributes(root / "attributes.json", max_attributes)

    object_keys, descriptions, predicate_keys = _Interner(), _Interner(), _Interner()
    # image_id -> (object rows (key, desc, x, y, w, h) back to back, object_id -> local index,
    # relation rows (subject, object, predicate key) back to back); flat arrays, not tuples, to stay small
    per_image: dict[int, tuple[array, dict, array]] = {}

    def new_image() -> tuple[array, dict, array]:
        return array("d"), {}, array("q")

    def add_object(image: tuple[array, dict, array], obj: dict) -> int | None:
        oid = int(obj["object_id"])
        local = image[1].get(oid)
        if local is not None:
            return local
        names = _names(obj)
        if not names:
            return None
        synsets = tuple(str(s) for s in (obj.get("synsets") or []))
        desc = " ".join(a for a in attrs.get(oid, ()) if a != names[0])
        desc = f"{desc} {names[0]}" if desc else names[0]
        local = len(image[0]) // 6
        image[0].extend((object_keys((names, synsets)), descriptions(desc),
                         float(obj.get("x", 0)), float(obj.get("y", 0)), float(obj.get("w", 0)), float(obj.get("h", 0))))
        image[1][oid] = local
        return local

    unknown = 0

    def annotated_images(name: str):
        """(entry index, file, image rows, the entry's annotations) of each entry of ``name``.json whose image is known."""
        nonlocal unknown
        path = files[name]
        for i, entry in enumerate(_entries(path, name)):
            image_id = _image_id(entry, f"[{i}]", path)
            if image_id not in urls:
                unknown += 1
                continue
            yield i, path, per_image.get(image_id) or per_image.setdefault(image_id, new_image()), entry[name]

    for i, path, image, objects in annotated_images("objects"):
        for j, obj in enumerate(objects):
            expect_keys(obj, ["object_id"], f"[{i}].objects[{j}]", path, "Visual Genome", VG_LAYOUT, VG_HINT)
            add_object(image, obj)

    for i, path, image, relationships in annotated_images("relationships"):
        for j, rel in enumerate(relationships):
            where = f"[{i}].relationships[{j}]"
            expect_keys(rel, ["predicate", "subject", "object"], where, path, "Visual Genome", VG_LAYOUT, VG_HINT)
            expect_keys(rel["subject"], ["object_id"], where + ".subject", path, "Visual Genome", VG_LAYOUT, VG_HINT)
            expect_keys(rel["object"], ["object_id"], where + ".object", path, "Visual Genome", VG_LAYOUT, VG_HINT)
            s, o = add_object(image, rel["subject"]), add_object(image, rel["object"])
            predicate = normalize_phrase(rel["predicate"])
            if s is None or o is None or not predicate:
                continue
            synsets = tuple(str(x) for x in (rel.get("synsets") or []))
            image[2].extend((s, o, predicate_keys((predicate, synsets))))
    if unknown:
        log.warning("Visual Genome: %d annotation entries name images absent from image_data.json (skipped)", unknown)

    image_ids = sorted(per_image)
    obj_counts = [len(per_image[iid][0]) // 6 for iid in image_ids]
    rel_counts = [len(per_image[iid][2]) // 3 for iid in image_ids]
    objs = np.concatenate([np.frombuffer(per_image[iid][0], dtype=np.float64) for iid in image_ids]
                          or [np.zeros(0)]).reshape(-1, 6)
    rels = np.concatenate([np.frombuffer(per_image[iid][2], dtype=np.int64) for iid in image_ids]
                          or [np.zeros(0, dtype=np.int64)]).reshape(-1, 3)
    per_image.clear()  # the rows are copied into the arrays above: free them before building the index
    return VGIndex(
        image_ids=image_ids, image_urls=[urls[i] for i in image_ids],
        coco_ids=[links[i][0] for i in image_ids], flickr_ids=[links[i][1] for i in image_ids],
        obj_offsets=np.concatenate([[0], np.cumsum(obj_counts)]), obj_key=objs[:, 0], obj_desc=objs[:, 1],
        obj_box=objs[:, 2:6], rel_offsets=np.concatenate([[0], np.cumsum(rel_counts)]),
        rel_subject=rels[:, 0], rel_object=rels[:, 1], rel_key=rels[:, 2], object_keys=object_keys.table,
        descriptions=descriptions.table, predicate_keys=predicate_keys.table)


def index_cache_path(root: Path, max_attributes: int) -> Path | None:
    """Cache file of the parsed index, keyed by the JSON files' paths, sizes and mtimes; None when
    the files are small enough (under CACHE_MIN_BYTES) that parsing is as quick as loading."""

    stamps, total = [], 0
    for name in VG_FILES:
        p = root / f"{name}.json"
        if p.is_file():
            st = p.stat()
            stamps.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
            total += st.st_size
    if total < CACHE_MIN_BYTES:
        return None
    key = sha1_of_json({"parser": PARSER_VERSION, "files": stamps, "max_attributes": max_attributes})
    return cache_dir() / "visual_genome" / f"index-{key[:20]}.npz"


def load_index(root: Path, max_attributes: int = 2, cache: bool = True) -> VGIndex:
    """The parsed index of ``root``: from the cache when valid, else parsed (and cached)."""
    path = index_cache_path(root, max_attributes) if cache else None
    if path is not None and path.is_file():
        try:
            return VGIndex.load(path)
        except (OSError, ValueError, KeyError) as e:  # a damaged cache is rebuilt, never trusted
            log.warning("Visual Genome: ignoring unreadable index cache %s (%s)", path, e)
    index = parse_visual_genome(root, max_attributes)
    if path is not None:
        index.save(path)
        log.info("Visual Genome: parsed index cached at %s", path)
    return index


# --------------------------------------------------------------------------------------------
# Dataset and collate
# --------------------------------------------------------------------------------------------
class VisualGenomeDataset(ImageDataset):
    """One split: image rows of a :class:`VGIndex` with object / relation labels precomputed.

    An item holds the image, its objects (at most ``max_objects``, objects in triplets first; with
    ``drop_unmapped`` an unmapped object is kept only when a kept triplet uses it) and its kept
    triplets among them (no self-relations or repeats; with ``drop_unmapped`` only mapped predicates).
    """

    def __init__(self, index: VGIndex, rows: np.ndarray, image_paths: Sequence[Path], object_labels: np.ndarray,
                 predicate_labels: np.ndarray, triplet_kept: np.ndarray, transform: Callable,
                 max_objects: int | None = None, drop_unmapped: bool = True):
        super().__init__(image_paths, transform)
        self.index = index
        self.rows = np.asarray(rows, dtype=np.int64)
        self.image_ids = index.image_ids[self.rows]
        self.object_labels = object_labels  # per object of the index
        self.predicate_labels = predicate_labels  # per relationship of the index
        self.triplet_kept = triplet_kept  # per relationship: served (see kept_triplets)
        self.max_objects = max_objects
        self.drop_unmapped = drop_unmapped

    def annotations(self, i: int) -> dict:
        ix, row = self.index, self.rows[i]
        o0, o1 = ix.obj_offsets[row], ix.obj_offsets[row + 1]
        r0, r1 = ix.rel_offsets[row], ix.rel_offsets[row + 1]
        labels = self.object_labels[o0:o1]
        subj, obj = ix.rel_subject[r0:r1].astype(np.int64), ix.rel_object[r0:r1].astype(np.int64)
        pred = self.predicate_labels[r0:r1]
        rel_keep = self.triplet_kept[r0:r1].copy()
        in_rel = np.zeros(len(labels), dtype=bool)
        in_rel[subj[rel_keep]] = in_rel[obj[rel_keep]] = True
        # an unmapped object stays when a kept triplet uses it (its description still grounds the relation)
        keep = (labels >= 0) | in_rel if self.drop_unmapped else np.ones(len(labels), dtype=bool)
        if self.max_objects is not None and keep.sum() > self.max_objects:
            candidates = np.flatnonzero(keep)
            order = candidates[np.argsort(~in_rel[candidates], kind="stable")][: self.max_objects]
            keep = np.zeros(len(labels), dtype=bool)
            keep[order] = True
            rel_keep &= keep[subj] & keep[obj]
        new_index = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)
        rels = np.flatnonzero(rel_keep)
        keys = ix.obj_key[o0:o1][kept]
        return {
            "object_descriptions": [ix.descriptions[d] for d in ix.obj_desc[o0:o1][kept]],
            "object_names": [ix.object_keys[k][0][0] for k in keys],
            "object_labels": torch.from_numpy(labels[kept].astype(np.int64)),
            "object_boxes": torch.from_numpy(ix.obj_box[o0:o1][kept]),
            "triplets": torch.from_numpy(np.stack([new_index[subj[rels]], new_index[obj[rels]],
                                                   pred[rels].astype(np.int64)], axis=1).reshape(-1, 3)),
            "predicates": [ix.predicate_keys[k][0] for k in ix.rel_key[r0:r1][rels]],
        }

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        return {"image": self.load_image(i), "image_index": i, **self.annotations(i)}


class VisualGenomeCollate:
    """Items -> the Visual Genome batch of contract B (objects and triplets flattened over the batch)."""

    def __init__(self, tokenizer, max_length: int = 32):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, items: list[dict]) -> dict:
        counts = torch.tensor([len(it["object_labels"]) for it in items], dtype=torch.long)
        rel_counts = torch.tensor([len(it["triplets"]) for it in items], dtype=torch.long)
        offsets = torch.cumsum(counts, 0) - counts  # first flattened object of each image
        triplets = torch.cat([it["triplets"] for it in items]) if items else torch.zeros(0, 3, dtype=torch.long)
        shift = torch.repeat_interleave(offsets, rel_counts)
        descriptions = [d for it in items for d in it["object_descriptions"]]
        ids, mask = tokenize(self.tokenizer, descriptions, self.max_length)
        return {
            "images": torch.stack([it["image"] for it in items]),
            "image_index": torch.tensor([it["image_index"] for it in items], dtype=torch.long),
            "object_input_ids": ids, "object_attention_mask": mask,
            "object_image_index": torch.repeat_interleave(torch.arange(len(items)), counts),
            "object_labels": torch.cat([it["object_labels"] for it in items]),
            "object_boxes": torch.cat([it["object_boxes"] for it in items]),
            "triplet_subject": triplets[:, 0] + shift, "triplet_object": triplets[:, 1] + shift,
            "triplet_predicate": triplets[:, 2],
            "object_names": [n for it in items for n in it["object_names"]],
            "object_descriptions": descriptions,
            "predicates": [p for it in items for p in it["predicates"]],
        }


# --------------------------------------------------------------------------------------------
# DataModule
# --------------------------------------------------------------------------------------------
VALIDATION = ("carve", "test")


def _split_count(value: float | int, n: int, name: str) -> int:
    if isinstance(value, float) and 0 < value < 1:
        return max(1, int(round(value * n)))
    count = int(value)
    if count < 0 or count > n:
        raise ValueError(f"VisualGenomeDataModule: {name}={value} but only {n} images qualify")
    return count


@dataclass(frozen=True)
class VGSplit:
    """How :class:`VisualGenomeDataModule` splits its images. ``split_file``: JSON ``{"train": [image ids], "val":
    [...], "test": [...]}`` (default ``<root>/splits.json`` when present, as in the generated world), else a seeded
    split with ``val_size`` / ``test_size`` (a float in (0, 1) is a fraction, otherwise a count; 0 means that split
    reuses the other: VG-BERT has train/test only, ``val_size: 0, test_size: 5000``). ``validation``: ``carve``
    (default): a split file without validation images of its own (none, or the test images again, as VG-BERT's
    train/test split) gets ``val_size`` images carved from its training images (seeded; 0 = the test images);
    ``test``: validate on the test images, as the official VG-BERT code selects its checkpoint (reported beside the
    carved choice, docs/vgbert.md)."""

    split_file: str | None = None
    val_size: float | int = 0.05
    test_size: float | int = 0.05
    validation: Literal["carve", "test"] = "carve"

    def __post_init__(self):
        check_choices(self, "VisualGenomeDataModule: ", validation=VALIDATION)


@dataclass(frozen=True)
class VGFilters:
    """Which images, objects and triplets :class:`VisualGenomeDataModule` serves. ``min_triplets``: images with fewer
    labelled triplets are dropped (VG-BERT: 5); ``max_objects`` per image (objects in triplets first);
    ``max_attributes`` in an object description ("large black elephant"); ``drop_unmapped``: drop triplets with an
    unmapped predicate, and unmapped objects that no kept triplet uses (the others are served with label -1);
    ``min_object_count`` / ``min_relation_count``: without a ``label_mapping``, the synsets / predicates seen at
    least this often in the training split are the labels."""

    min_triplets: int = 1
    max_objects: int | None = 50
    max_attributes: int = 2
    drop_unmapped: bool = True
    min_object_count: int = 1
    min_relation_count: int = 1


class VisualGenomeDataModule(GroundingDataModule):
    """Visual Genome objects and triplets (batch layout: contract B / :class:`VisualGenomeCollate`).

    Args beyond the shared ones: ``image_dir`` (default: VG_100K + VG_100K_2, else images/); ``split`` (a
    :class:`VGSplit`: split file, or seeded sizes, and where validation images come from); ``filters`` (a
    :class:`VGFilters`: triplets per image, objects, attributes, unmapped labels); ``exclude_eval_images``
    (checkpoints or image lists, as the caption DataModules): their images leave val and test, and are never carved
    for validation — a Visual Genome image is also the COCO / Flickr image its image_data.json names, so
    ``[<stage-1 checkpoint>]`` keeps stage 2's evaluation off stage 1's COCO images; ``label_mapping`` (a
    :class:`LabelMapping`, or the path of a ``python -m data_modules.vg_cleaning`` output file for VG-BERT's 55
    classes / 114 relations; default built from the training split, see :class:`VGFilters`); ``cache`` (keep the
    parsed index of large JSON files under ``grounding.paths.cache_dir()/visual_genome``).
    """

    dataset_name = "Visual Genome"

    def __init__(self, root: str = "data/world/visual_genome", image_dir: str | None = None,
                 split: VGSplit = VGSplit(), filters: VGFilters = VGFilters(),
                 exclude_eval_images: list[str] | str | None = None, label_mapping: LabelMapping | str | None = None,
                 cache: bool = True, text_encoder: str = "minilm", max_length: int = 32,
                 batch_size: int = 32, eval_batch_size: int | None = None,
                 transform: ImageTransform = ImageTransform(resize_size=224), loader: LoaderOptions = LoaderOptions(),
                 seed: int = 0):
        super().__init__(root, text_encoder, max_length, batch_size, eval_batch_size, transform, loader, seed)
        if label_mapping is not None and not isinstance(label_mapping, (str, LabelMapping)):
            raise TypeError(f"label_mapping must implement data_modules.visual_genome.LabelMapping "
                            f"(object_classes, relation_labels, object_label, relation_label); got {label_mapping!r}")
        self.image_dir = image_dir
        self.split_file = split.split_file
        self.val_size, self.test_size = split.val_size, split.test_size
        self.validation = split.validation
        self.set_excluded_eval_images(exclude_eval_images)
        self._excluded: np.ndarray | None = None
        self.label_mapping = label_mapping
        self.min_triplets = filters.min_triplets
        self.max_objects = filters.max_objects
        self.max_attributes = filters.max_attributes
        self.drop_unmapped = filters.drop_unmapped
        self.min_object_count, self.min_relation_count = filters.min_object_count, filters.min_relation_count
        self.cache = cache
        self.index: VGIndex | None = None

    # -- labels --------------------------------------------------------------------------------
    def _resolve_mapping(self) -> LabelMapping | None:
        if not isinstance(self.label_mapping, str):
            return self.label_mapping
        return CleanedVGLabelMapping.from_file(resolve_path(self.label_mapping))

    def _labels(self, mapping: LabelMapping) -> tuple[np.ndarray, np.ndarray]:
        ix = self.index
        by_key = np.array([mapping.object_label(n, s) for n, s in ix.object_keys] or [0], dtype=np.int64)
        by_pred = np.array([mapping.relation_label(p, s) for p, s in ix.predicate_keys] or [0], dtype=np.int64)
        return by_key[ix.obj_key], by_pred[ix.rel_key]

    def _kept_triplets(self, predicate_labels: np.ndarray) -> np.ndarray:
        """Per relationship: served or not. Dropped: self-relations, repeats of a (subject, object,
        label) already kept in the image, and (with drop_unmapped) unmapped predicates."""
        ix = self.index
        valid = ix.rel_subject != ix.rel_object
        if self.drop_unmapped:
            valid &= predicate_labels >= 0
        label_key = np.where(predicate_labels >= 0, predicate_labels, -1 - ix.rel_key.astype(np.int64))
        triplets = np.stack([ix.rel_image, ix.rel_subject, ix.rel_object, label_key], axis=1)
        candidates = np.flatnonzero(valid)
        _, first = np.unique(triplets[candidates], axis=0, return_index=True)
        kept = np.zeros(len(valid), dtype=bool)
        kept[candidates[first]] = True
        return kept

    def _default_mapping(self, train_rows: np.ndarray) -> VocabularyLabelMapping:
        ix = self.index
        in_train = np.zeros(len(ix), dtype=bool)
        in_train[train_rows] = True
        key_counts = np.bincount(ix.obj_key[in_train[ix.obj_image]], minlength=len(ix.object_keys))
        pred_counts = np.bincount(ix.rel_key[in_train[ix.rel_image]], minlength=len(ix.predicate_keys))
        objects: Counter = Counter()
        for (names, synsets), c in zip(ix.object_keys, key_counts.tolist()):
            objects[VocabularyLabelMapping.object_key(names, synsets)] += c
        relations: Counter = Counter()
        for (predicate, _), c in zip(ix.predicate_keys, pred_counts.tolist()):
            relations[predicate] += c
        return VocabularyLabelMapping.from_counts(objects, relations, self.min_object_count, self.min_relation_count)

    # -- splits --------------------------------------------------------------------------------
    def _split_rows(self, candidates: np.ndarray, root: Path, mapping: LabelMapping | None = None
                    ) -> dict[str, np.ndarray]:
        """Rows per split: ``split_file``, else the generated world's ``splits.json``, else the split
        a mapping carries (``data_modules.vg_cleaning`` splits after cleaning, as the paper), else seeded."""
        ix = self.index
        split_file = self.split_file
        if split_file is None and (root / "splits.json").is_file():
            split_file = "splits.json"  # the generated world's split (held-out pairs stay out of train)
        schema = '{"train": [image_id, ...], "val": [...], "test": [...]}'
        data, path = None, None
        if split_file is not None:
            path = require_file(resolve(root, split_file), "Visual Genome", VG_LAYOUT,
                                "set split.split_file to a JSON file {\"train\": [image ids], \"val\": [...], \"test\": [...]}")
            data = read_json(path, "Visual Genome split file", schema, "write the split file again")
            expect_keys(data, ["train", "val", "test"], "the top level", path, "Visual Genome split file", schema,
                        "write the split file again")
        elif isinstance(getattr(mapping, "split", None), dict) and mapping.split.get("train"):
            data = dict(mapping.split)
            path = Path(str(getattr(mapping, "source", None) or type(mapping).__name__))
            data.setdefault("val", [])
            data.setdefault("test", [])
        if data is not None:
            if not data["test"]:
                data["test"] = data["val"]
            lists = isinstance(data["val"], list) and isinstance(data["test"], list)  # else reported below
            own_val = lists and bool(data["val"]) and sorted(map(int, data["val"])) != sorted(map(int, data["test"]))
            carve = not own_val and self.validation == "carve" and self.val_size != 0
            if not own_val or self.validation == "test":
                data["val"] = data["test"]  # the official VG-BERT selects its checkpoint on the test images
            row_of = {int(iid): r for r, iid in enumerate(ix.image_ids.tolist())}
            ok = np.zeros(len(ix), dtype=bool)
            ok[candidates] = True
            out = {}
            for split in ("train", "val", "test"):
                ids = data[split]
                if not isinstance(ids, list):
                    raise malformed(path, "Visual Genome split file", f"has a non-list {split!r}", schema,
                                    "write the split file again")
                unknown = [i for i in ids if int(i) not in row_of]
                if unknown:
                    raise malformed(path, "Visual Genome split file",
                                    f"lists {len(unknown)} image id(s) of split {split!r} that have no annotations in "
                                    f"{root} (e.g. {unknown[:5]})", schema, "regenerate it for this dataset")
                rows = np.array([row_of[int(i)] for i in ids], dtype=np.int64)
                out[split] = np.unique(rows[ok[rows]])  # image-id order, whatever the file order
            if carve:  # train/test only (VG-BERT's split): validation images come out of training
                out["train"], out["val"] = self._carve_validation(out["train"])
            return out
        rng = np.random.default_rng(self.seed)
        order = candidates[rng.permutation(len(candidates))]
        listed = self._excluded_rows(order)  # exclude_eval_images' images go to train: val/test draw from the others
        order = np.concatenate([order[~listed], order[listed]])
        n_test = _split_count(self.test_size, len(order), "test_size")
        n_val = 0 if self.validation == "test" else _split_count(self.val_size, len(order) - n_test, "val_size")
        if n_test + n_val == 0 or n_test + n_val >= len(order):
            raise ValueError(f"VisualGenomeDataModule: val_size={self.val_size}, test_size={self.test_size} leave "
                             f"no evaluation or no training images out of {len(order)}")
        test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
        return {"train": np.sort(train), "val": np.sort(val if n_val else test), "test": np.sort(test if n_test else val)}

    def _carve_validation(self, train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) rows: ``val_size`` of the training rows, seeded, set aside for validation (only rows
        that ``exclude_eval_images`` allows)."""
        eligible = train[~self._excluded_rows(train)]
        n_val = _split_count(self.val_size, len(train), "val_size")
        if n_val >= len(train) or n_val > len(eligible):
            raise MalformedDataError(f"VisualGenomeDataModule: val_size={self.val_size} asks for {n_val} validation images of "
                             f"{len(train)} training images ({len(eligible)} not excluded by exclude_eval_images); "
                             "lower it, or set validation: test.")
        val = np.random.default_rng(self.seed).permutation(eligible)[:n_val]
        return np.setdiff1d(train, val), np.sort(val)

    def _row_keys(self, rows: np.ndarray) -> np.ndarray:
        """(N, 3) image keys of index rows: vg, coco and flickr (0 where image_data.json names none)."""
        ix = self.index
        return np.stack([image_keys("vg", ix.image_ids[rows]), image_keys("coco", ix.coco_ids[rows]),
                         image_keys("flickr", ix.flickr_ids[rows])], axis=1)

    def _excluded_rows(self, rows: np.ndarray) -> np.ndarray:
        """Per row: whether ``exclude_eval_images`` names the image (under any of its keys)."""
        if self._excluded is None:
            self._excluded = self.excluded_eval_keys()
        if not len(self._excluded) or not len(rows):
            return np.zeros(len(rows), dtype=bool)
        return overlapping(self._row_keys(rows), self._excluded)[0]

    def _drop_excluded(self, rows: dict[str, np.ndarray], root: Path) -> dict[str, np.ndarray]:
        """Val and test without the images ``exclude_eval_images`` names (said in one log line each)."""
        for split in ("val", "test"):
            hit = self._excluded_rows(rows[split])
            if hit.any():
                self.check_not_all_excluded(hit, split, root)
                log.info("VisualGenomeDataModule %s: %d image(s) left out (exclude_eval_images)", split, int(hit.sum()))
                rows[split] = rows[split][~hit]
        return rows

    def _require_images(self, rows: np.ndarray, what: str, root: Path) -> None:
        if len(rows) == 0:
            raise MalformedDataError(
                f"Visual Genome at {root}: no image of {what} has >= {self.min_triplets} labelled triplet(s) "
                f"(of {len(self.index)} annotated images).\nFix: lower min_triplets, check the label mapping, "
                f"or {VG_HINT}.")

    def _image_paths(self, root: Path, rows: np.ndarray) -> list[Path]:
        """Each image in the folder its URL names (VG_100K / VG_100K_2), else wherever it is found."""
        if self.image_dir is not None:
            dirs = [resolve(root, self.image_dir)]
        else:
            dirs = [root / d for d in IMAGE_DIR_CANDIDATES if (root / d).is_dir()] or [root / "VG_100K"]
        listings = {d: set(os.listdir(d)) if d.is_dir() else set() for d in dirs}
        paths = []
        for row in rows.tolist():
            url = self.index.image_urls[row]
            name = url.rsplit("/", 1)[-1] if url else f"{self.index.image_ids[row]}.jpg"
            named = url.rsplit("/", 2)[-2] if url.count("/") >= 1 else ""
            preferred = [d for d in dirs if d.name == named] + dirs
            path = next((d / name for d in preferred if name in listings[d]), preferred[0] / name)
            paths.append(path)
        return paths

    def check_inputs(self) -> None:
        """The root exists (``python -m grounding`` asks before building any model; the annotation files are
        checked as they are read, or come from the index cache)."""
        require_root(self.root_path, "Visual Genome", VG_LAYOUT, VG_HINT)

    def _build_datasets(self) -> dict[str, VisualGenomeDataset]:
        root = require_root(self.root_path, "Visual Genome", VG_LAYOUT, VG_HINT)
        if self.index is None:
            self.index = load_index(root, self.max_attributes, self.cache)
        ix = self.index
        candidates = np.flatnonzero(ix.num_triplets >= self.min_triplets)  # mapping can only lower the count
        mapping = self._resolve_mapping()
        if mapping is not None:  # VG-BERT: clean first, then split the cleaned images
            obj_labels, pred_labels = self._labels(mapping)
            kept = self._kept_triplets(pred_labels)
            counts = np.bincount(ix.rel_image[kept], minlength=len(ix))
            candidates = candidates[counts[candidates] >= self.min_triplets]
            self._require_images(candidates, "the dataset", root)
            rows = self._split_rows(candidates, root, mapping)
        else:
            self._require_images(candidates, "the dataset", root)
            rows = self._split_rows(candidates, root)
            mapping = self._default_mapping(rows["train"])
            obj_labels, pred_labels = self._labels(mapping)
            kept = self._kept_triplets(pred_labels)
            counts = np.bincount(ix.rel_image[kept], minlength=len(ix))
            rows = {s: r[counts[r] >= self.min_triplets] for s, r in rows.items()}
        self.label_mapping_in_use = mapping
        rows = self._drop_excluded(rows, root)
        for split, r in rows.items():
            self._require_images(r, f"the {split!r} split", root)
        paths = {s: self._image_paths(root, r) for s, r in rows.items()}
        check_images_exist((p for s in ("train", "val", "test") for p in paths[s]), "Visual Genome",
                           f"put the images in {root}/VG_100K and VG_100K_2 (or set image_dir)")
        transform = self.transform
        return {s: VisualGenomeDataset(ix, rows[s], paths[s], obj_labels, pred_labels, kept, transform,
                                       self.max_objects, self.drop_unmapped) for s in ("train", "val", "test")}

    def image_keys(self, split: str) -> np.ndarray:
        """(N, 3) keys of the split's images: ``vg:<image_id>``, ``coco:<coco_id>``, ``flickr:<flickr_id>`` (0 where
        image_data.json gives none): a Visual Genome image is the COCO / Flickr image it names
        (grounding.training_images)."""
        return self._row_keys(self._dataset(split).rows)

    @property
    def object_classes(self) -> list[str]:
        self.setup()
        return self.label_mapping_in_use.object_classes

    @property
    def relation_labels(self) -> list[str]:
        self.setup()
        return self.label_mapping_in_use.relation_labels

    def _collate(self, train: bool) -> VisualGenomeCollate:
        return VisualGenomeCollate(self.tokenizer, self.max_length)
