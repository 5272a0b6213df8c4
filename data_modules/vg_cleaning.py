"""Visual Genome cleaning for VG-BERT's relational finetune (Zhang et al., App. A.3.2).

``python -m data_modules.vg_cleaning --root VG_DIR --out FILE [--min-predicate-count 250]
[--min-triplets 5] [--test-size 5000] [--val-size 0] [--seed 0]`` reads ``VG_DIR/relationships.json``
and writes one JSON file holding

* ``object_classes``: the 55 WordNet classes of Table 3 (``resources/vg_object_classes.txt``); an
  object's synset (VG's ``synsets`` field, else the first noun synset of its name) takes the most
  specific class along its hypernym paths;
* ``relation_labels``: predicates seen more than ``--min-predicate-count`` times (after
  normalisation: lowercase, no leading "is"/"are", no articles) merged into the labels of Table 4
  by ``resources/vg_relation_merge.tsv``, ordered by frequency;
* ``images``: per kept image its objects (with class ids) and kept triplets, images with fewer
  than ``--min-triplets`` kept triplets dropped;
* ``split``: a seeded train / (val) / test split of the kept image ids (``--test-size`` 5000 at full
  scale; a number below 1 is a fraction, for small data).

A small ``FILE.split.json`` ({"train": [...], "val": [...], "test": [...]} image ids; ``val`` = ``test``
when ``--val-size`` is 0, the paper's setting) is written beside it for the Visual Genome DataModule
(``split_file``, relative to its root, and ``label_mapping: FILE``). Both are written atomically; a rerun whose inputs (file hashes,
resource tables, parameters) match the existing output reuses it. :class:`CleanedVGLabelMapping`
implements the DataModule's LabelMapping protocol on top of the file.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import random
import sys
from pathlib import Path
from typing import Iterable, Sequence

from grounding.errors import UserInputError
from grounding.lexicon import wordnet
from grounding.utils.io import atomic_write_json, sha1_of_file, sha1_of_json

RESOURCES = Path(__file__).resolve().parent / "resources"
OBJECT_CLASSES_FILE = RESOURCES / "vg_object_classes.txt"
RELATION_MERGE_FILE = RESOURCES / "vg_relation_merge.tsv"
FORMAT_VERSION = 1
_ARTICLES = frozenset({"a", "an", "the"})


class VGCleaningError(UserInputError, ValueError):
    """Bad Visual Genome input or resource file (the message names the file and the fix)."""


# ---------------------------------------------------------------------------------------------
# Resource tables
# ---------------------------------------------------------------------------------------------
def normalize_predicate(predicate: str) -> str:
    """Lowercase, single spaces, drop a leading "is"/"are" and articles ("on a" -> "on").

    A predicate made only of such words stays as it is: Table 4 keeps "a" and "be" as labels.
    """
    tokens = str(predicate).lower().replace("\t", " ").split()
    while len(tokens) > 1 and tokens[0] in ("is", "are"):
        tokens = tokens[1:]
    kept = [t for t in tokens if t not in _ARTICLES]
    return " ".join(kept or tokens)


def load_object_classes(path: str | Path = OBJECT_CLASSES_FILE) -> list[str]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise VGCleaningError(f"Cannot read the object class list {path}: {e}") from e
    classes = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if len(set(classes)) != len(classes):
        raise VGCleaningError(f"{path}: duplicate synsets in the object class list; list each class once.")
    return classes


def load_relation_merge(path: str | Path = RELATION_MERGE_FILE) -> dict[str, str]:
    """The merge table as {normalised raw predicate: relation label}."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise VGCleaningError(f"Cannot read the relation merge table {path}: {e}") from e
    table: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#") or line == "raw\tlabel":
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise VGCleaningError(f"{path}:{number}: expected 'raw predicate<TAB>label', got {line!r}.")
        raw, label = normalize_predicate(parts[0]), parts[1].strip()
        if table.get(raw, label) != label:
            raise VGCleaningError(f"{path}:{number}: {parts[0]!r} normalises to {raw!r}, already mapped to "
                                  f"{table[raw]!r}; map it to one label only.")
        table[raw] = label
    return table


# ---------------------------------------------------------------------------------------------
# Object names -> synsets -> the 55 classes
# ---------------------------------------------------------------------------------------------
class SynsetClassifier:
    """Maps WordNet synsets (or bare names) to the most specific class of a fixed class list."""

    def __init__(self, classes: Sequence[str]):
        self.wn = wordnet()
        self.classes = list(classes)
        self.class_index = {c: i for i, c in enumerate(self.classes)}
        for c in self.classes:
            try:
                self.wn.synset(c)
            except Exception as e:  # nltk raises WordNetError / ValueError
                raise VGCleaningError(f"Object class {c!r} is not a WordNet 3.0 synset ({e}); fix {OBJECT_CLASSES_FILE}.") from e
        # For every class, the other classes below it in WordNet.
        self._class_descendants = {c: set() for c in self.classes}
        for c in self.classes:
            for h, dist in self.wn.synset(c).hypernym_distances():
                if dist > 0 and h.name() in self._class_descendants:
                    self._class_descendants[h.name()].add(c)
        self._synset_class = functools.lru_cache(maxsize=None)(self._synset_class_uncached)
        self._name_synset = functools.lru_cache(maxsize=None)(self._name_synset_uncached)

    def _synset_class_uncached(self, synset_name: str) -> int:
        try:
            synset = self.wn.synset(synset_name)
        except Exception:
            return -1
        # Every class on any hypernym path (instance hypernyms included) matches; the most specific
        # are those that are not themselves hypernyms of another match (dog: mammal, not animal via
        # domestic_animal); Table 3's order, which lists specific classes first, breaks the rest.
        matches = {h.name() for h, _ in synset.hypernym_distances()} & self.class_index.keys()
        specific = [c for c in matches if not (self._class_descendants[c] & matches)]
        return min((self.class_index[c] for c in specific), default=-1)

    def _name_synset_uncached(self, name: str) -> str | None:
        name = " ".join(str(name).lower().split())
        if not name:
            return None
        candidates = [name.replace(" ", "_")]
        if " " in name:
            candidates.append(name.split()[-1])  # head noun of "tennis racket"-like names without an entry
        for cand in candidates:
            synsets = self.wn.synsets(cand, pos="n")
            if synsets:
                return synsets[0].name()
        return None

    def synset_of(self, names: Iterable[str], synsets: Iterable[str]) -> str | None:
        for s in synsets or ():
            if isinstance(s, str) and ".n." in s:
                return s
        for n in names or ():
            found = self._name_synset(n)
            if found is not None:
                return found
        return None

    def classify(self, names: Iterable[str], synsets: Iterable[str]) -> int:
        synset = self.synset_of(names, synsets)
        return -1 if synset is None else self._synset_class(synset)

    def synset_class(self, synset: str) -> int:
        return self._synset_class(synset)


# ---------------------------------------------------------------------------------------------
# Cleaning
# ---------------------------------------------------------------------------------------------
def _names(entity: dict) -> list[str]:
    names = entity.get("names")
    if names is None:  # VG v1.2/1.4 relationships.json spell it "name"
        names = [entity["name"]] if entity.get("name") else []
    return [str(n) for n in names]


def _load_relationships(path: Path) -> list[dict]:
    if not path.is_file():
        raise VGCleaningError(f"{path} not found: --root must be a Visual Genome folder holding relationships.json "
                              "(from https://homes.cs.washington.edu/~ranjay/visualgenome/api.html).")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise VGCleaningError(f"{path} is not valid JSON ({e}); re-download or regenerate it.") from e
    if not isinstance(data, list) or any(not isinstance(r, dict) or "relationships" not in r for r in data[:10]):
        raise VGCleaningError(f"{path}: expected a list of {{'image_id', 'relationships': [...]}} records "
                              "(Visual Genome's relationships.json schema).")
    return data


def _split_count(size: float, n: int, flag: str) -> int:
    if size < 0:
        raise VGCleaningError(f"{flag} must be >= 0, got {size}.")
    count = round(size * n) if 0 < size < 1 else int(size)
    if count >= n and count > 0:
        raise VGCleaningError(f"{flag}={size} asks for {count} of only {n} kept images; pass a smaller count "
                              "or a fraction such as 0.1.")
    return count


def cleaning_key(root: Path, params: dict, object_classes_file: Path, merge_file: Path) -> dict:
    """What the output depends on: input file hashes, resource tables, parameters, format."""
    return {"version": FORMAT_VERSION, "params": params,
            "inputs": {"relationships.json": sha1_of_file(root / "relationships.json"),
                       "object_classes": sha1_of_file(object_classes_file),
                       "relation_merge": sha1_of_file(merge_file)}}


def _reusable_output(out: Path, key: str, verbose: bool) -> dict | None:
    """The cleaned file at ``out`` when it was made from the same inputs (``key``), its DataModule split file
    rewritten if missing; None when it must be cleaned again (another key, or unreadable)."""
    try:
        cached = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        cached = None
    if isinstance(cached, dict) and cached.get("key") == key:
        if not split_file_for(out).is_file():
            atomic_write_json(split_file_for(out), datamodule_split(cached["split"]))
        if verbose:
            print(f"Reusing {out} (inputs unchanged).")
            print_statistics(cached)
        return cached
    return None


def _relation_labels(records: list[dict], merge: dict[str, str], min_predicate_count: int,
                     unlisted: str) -> tuple[collections.Counter, set[str], dict[str, str], list[str]]:
    """App. A.3.2's relation labels: the normalised predicates seen more than ``min_predicate_count`` times, merged
    by the Table 4 table (``unlisted`` ones kept as themselves or dropped), labels ordered by their instances.
    Returns (every predicate's count, the frequent ones, frequent predicate -> label, the labels)."""
    counts = collections.Counter(normalize_predicate(r.get("predicate", "")) for rec in records
                                 for r in rec["relationships"])
    counts.pop("", None)
    frequent = {p for p, c in counts.items() if c > min_predicate_count}  # "more than 250 instances"
    predicate_map = {p: merge.get(p, p if unlisted == "keep" else None) for p in frequent}
    predicate_map = {p: lab for p, lab in predicate_map.items() if lab is not None}
    label_counts = collections.Counter()
    for p, lab in predicate_map.items():
        label_counts[lab] += counts[p]
    relation_labels = sorted(label_counts, key=lambda lab: (-label_counts[lab], lab))
    return counts, frequent, predicate_map, relation_labels


def _kept_images(records: list[dict], predicate_map: dict[str, str], label_index: dict[str, int],
                 classifier: SynsetClassifier, min_triplets: int) -> list[dict]:
    """Per image with at least ``min_triplets`` kept triplets: its triplets with a mapped predicate (one per
    subject, label, object; none relating an object to itself) and the objects they use, each with its class."""
    images = []
    for rec in records:
        objects: dict[int, dict] = {}
        triplets: list[list] = []
        seen = set()
        for r in rec["relationships"]:
            lab = predicate_map.get(normalize_predicate(r.get("predicate", "")))
            if lab is None:
                continue
            ends = []
            for entity in (r["subject"], r["object"]):
                oid = entity.get("object_id", entity.get("id"))
                if oid not in objects:
                    names, synsets = _names(entity), list(entity.get("synsets") or [])
                    objects[oid] = {"object_id": oid, "names": names, "synsets": synsets,
                                    "class": classifier.classify(names, synsets),
                                    **{k: entity.get(k) for k in ("x", "y", "w", "h")}}
                ends.append(oid)
            triplet = (ends[0], label_index[lab], ends[1])
            if triplet in seen or ends[0] == ends[1]:
                continue
            seen.add(triplet)
            triplets.append([*triplet, str(r.get("predicate", ""))])
        if len(triplets) >= min_triplets:
            images.append({"image_id": rec["image_id"], "objects": list(objects.values()),
                           "triplets": triplets})  # [subject object_id, label id, object object_id, raw predicate]
    return images


def _split_images(images: list[dict], params: dict, rel_path: Path) -> tuple[list, list, list]:
    """A seeded train / val / test split of the kept images' ids (each image's ``split`` set too)."""
    ids = sorted(img["image_id"] for img in images)
    if not ids:
        raise VGCleaningError(f"No image of {rel_path} keeps {params['min_triplets']} triplets with predicates seen "
                              f"more than {params['min_predicate_count']} times; lower --min-predicate-count / "
                              "--min-triplets for small data.")
    order = ids[:]
    random.Random(params["seed"]).shuffle(order)
    n_test = _split_count(params["test_size"], len(order), "--test-size")
    n_val = _split_count(params["val_size"], len(order) - n_test, "--val-size")
    test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
    split_of = {**{i: "train" for i in train}, **{i: "val" for i in val}, **{i: "test" for i in test}}
    for img in images:
        img["split"] = split_of[img["image_id"]]
    return train, val, test


def clean_visual_genome(root: str | Path, out: str | Path, min_predicate_count: int = 250, min_triplets: int = 5,
                        test_size: float = 5000, val_size: float = 0, seed: int = 0, unlisted: str = "drop",
                        object_classes_file: str | Path = OBJECT_CLASSES_FILE,
                        merge_file: str | Path = RELATION_MERGE_FILE, force: bool = False,
                        verbose: bool = True) -> dict:
    """Clean ``root/relationships.json`` into ``out`` (reused when its inputs match); returns the result."""
    root, out = Path(root), Path(out)
    object_classes_file, merge_file = Path(object_classes_file), Path(merge_file)
    if unlisted not in ("drop", "keep"):
        raise VGCleaningError(f"unlisted must be 'drop' or 'keep', got {unlisted!r}.")
    params = dict(min_predicate_count=int(min_predicate_count), min_triplets=int(min_triplets),
                  test_size=float(test_size), val_size=float(val_size), seed=int(seed), unlisted=unlisted)
    rel_path = root / "relationships.json"
    if not rel_path.is_file():
        _load_relationships(rel_path)  # raises the explanatory error
    key = sha1_of_json(cleaning_key(root, params, object_classes_file, merge_file))
    if out.is_file() and not force:
        cached = _reusable_output(out, key, verbose)
        if cached is not None:
            return cached

    records = _load_relationships(rel_path)
    merge = load_relation_merge(merge_file)
    classes = load_object_classes(object_classes_file)
    classifier = SynsetClassifier(classes)

    # 1. Predicate frequencies over the whole dataset (normalised surface forms), merged into Table 4's labels.
    counts, frequent, predicate_map, relation_labels = _relation_labels(records, merge, params["min_predicate_count"],
                                                                        unlisted)
    # 2. Per image: kept triplets (mapped predicate), de-duplicated, and the objects they use.
    images = _kept_images(records, predicate_map, {lab: i for i, lab in enumerate(relation_labels)}, classifier,
                          params["min_triplets"])
    # 3. Seeded split of the kept images.
    train, val, test = _split_images(images, params, rel_path)

    n_objects = sum(len(img["objects"]) for img in images)
    n_classified = sum(o["class"] >= 0 for img in images for o in img["objects"])
    result = {
        "key": key, "version": FORMAT_VERSION, "params": params, "source": str(rel_path),
        "object_classes": classes, "relation_labels": relation_labels,
        "predicate_map": dict(sorted(predicate_map.items())),
        "synset_classes": dict(sorted({o["synsets"][0]: o["class"] for img in images for o in img["objects"]
                                       if o["synsets"]}.items())),
        "statistics": {"images_in": len(records), "images_kept": len(images),
                       "triplets_kept": sum(len(img["triplets"]) for img in images), "objects_kept": n_objects,
                       "objects_classified": n_classified, "unique_predicates": len(counts),
                       "frequent_predicates": len(frequent), "merged_predicates": len(predicate_map),
                       "relation_labels": len(relation_labels), "object_classes": len(classes),
                       "object_classes_used": len({o["class"] for img in images for o in img["objects"]} - {-1}),
                       "train": len(train), "val": len(val), "test": len(test)},
        "split": {"train": train, "val": val, "test": test},
        "images": images,
    }
    atomic_write_json(out, result)
    atomic_write_json(split_file_for(out), datamodule_split(result["split"]))
    if verbose:
        print(f"Wrote {out} and {split_file_for(out)}.")
        print_statistics(result)
    return result


def datamodule_split(split: dict) -> dict:
    """The DataModule's split file: with no validation split (the paper's train/test only) the
    test images also serve as ``val``, as in the paper's learning curves (App. A.3.3, Fig. 4)."""
    return {"train": split["train"], "val": split["val"] or split["test"], "test": split["test"]}


def split_file_for(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".split.json")


def print_statistics(result: dict) -> None:
    s = result["statistics"]
    print(f"  images kept: {s['images_kept']} of {s['images_in']} (train {s['train']}, val {s['val']}, test {s['test']})")
    print(f"  triplets kept: {s['triplets_kept']}; objects: {s['objects_kept']} "
          f"({s['objects_classified']} in a class)")
    print(f"  predicates: {s['unique_predicates']} unique, {s['frequent_predicates']} frequent, "
          f"{s['merged_predicates']} merged into {s['relation_labels']} relation labels")
    print(f"  object classes: {s['object_classes']} ({s['object_classes_used']} used)")


# ---------------------------------------------------------------------------------------------
# LabelMapping for the Visual Genome DataModule
# ---------------------------------------------------------------------------------------------
class CleanedVGLabelMapping:
    """The 55-class / Table-4 label mapping of a cleaning output (data_modules LabelMapping protocol).

    ``object_label(names, synsets)``: class of the VG synset (else the name's first noun synset);
    ``relation_label(predicate, synsets)``: merged label of a frequent predicate, -1 otherwise.
    ``split`` holds the kept image ids per split, ``kept_image_ids`` all of them.
    """

    def __init__(self, object_classes: Sequence[str], relation_labels: Sequence[str], predicate_map: dict[str, str],
                 synset_classes: dict[str, int] | None = None, split: dict[str, list] | None = None,
                 source: str | None = None):
        self.object_classes = list(object_classes)
        self.relation_labels = list(relation_labels)
        self.predicate_map = dict(predicate_map)
        self.synset_classes = dict(synset_classes or {})
        self.split = {k: list(v) for k, v in (split or {}).items()}
        self.source = source
        self._relation_index = {lab: i for i, lab in enumerate(self.relation_labels)}
        self._classifier: SynsetClassifier | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> "CleanedVGLabelMapping":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise VGCleaningError(f"Cannot read the cleaned Visual Genome file {path} ({e}); create it with "
                                  f"`python -m data_modules.vg_cleaning --root VG_DIR --out {path}`.") from e
        missing = {"object_classes", "relation_labels", "predicate_map"} - set(data)
        if missing:
            raise VGCleaningError(f"{path} lacks {sorted(missing)}: not a data_modules.vg_cleaning output; "
                                  "regenerate it with `python -m data_modules.vg_cleaning`.")
        return cls(data["object_classes"], data["relation_labels"], data["predicate_map"],
                   data.get("synset_classes"), data.get("split"), source=str(path))

    @property
    def kept_image_ids(self) -> set:
        return {i for ids in self.split.values() for i in ids}

    def object_label(self, names: Sequence[str], synsets: Sequence[str]) -> int:
        for s in synsets or ():
            if s in self.synset_classes:
                return int(self.synset_classes[s])
        if self._classifier is None:
            self._classifier = SynsetClassifier(self.object_classes)
        return self._classifier.classify(names, synsets)

    def relation_label(self, predicate: str, synsets: Sequence[str] = ()) -> int:
        label = self.predicate_map.get(normalize_predicate(predicate))
        return -1 if label is None else self._relation_index.get(label, -1)


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m data_modules.vg_cleaning", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="Visual Genome folder holding relationships.json")
    p.add_argument("--out", required=True, help="output JSON (a FILE.split.json is written beside it)")
    p.add_argument("--min-predicate-count", type=int, default=250,
                   help="keep predicates seen MORE than this many times (paper: 250)")
    p.add_argument("--min-triplets", type=int, default=5, help="drop images with fewer kept triplets (paper: 5)")
    p.add_argument("--test-size", type=float, default=5000, help="held-out test images: a count, or a fraction < 1")
    p.add_argument("--val-size", type=float, default=0, help="validation images carved from the rest (count or fraction)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unlisted", choices=("drop", "keep"), default="drop",
                   help="frequent predicates missing from the merge table: drop (paper labels only) or keep as labels")
    p.add_argument("--merge-table", default=str(RELATION_MERGE_FILE))
    p.add_argument("--object-classes", default=str(OBJECT_CLASSES_FILE))
    p.add_argument("--force", action="store_true", help="recompute even when the cached output matches")
    a = p.parse_args(argv)
    try:
        return clean_visual_genome(a.root, a.out, a.min_predicate_count, a.min_triplets, a.test_size, a.val_size,
                                   a.seed, a.unlisted, a.object_classes, a.merge_table, force=a.force)
    except VGCleaningError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
