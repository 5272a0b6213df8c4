"""Object crops of a Visual Genome layout as an ImageFolder tree: the embedded world's stand-in for ImageNet in
VG-BERT's stage 0 (the visual stream's classification pretraining, paper App. A.1).

``python -m data_modules.object_crops --vg data/world/visual_genome --out data/world/object_crops`` reads
``objects.json`` (boxes and WordNet synsets) and the images (``VG_100K/<image_id>.jpg``, ``VG_100K_2/`` or
``images/``) and writes::

    <out>/train/<synset>/<image_id>_<object_id>.jpg     one square crop per object box (context margin around it)
    <out>/val/<synset>/...  <out>/test/<synset>/...      the images' split: <vg>/splits.json (the world's), else
                                                         a seeded split by image (--val-fraction, no test)
    <out>/crops.json                                     parameters, classes and counts per split

The class is an object's first synset (``ball.n.03``: a WordNet id, as ImageNet's folders are). Boxes smaller
than ``--min-size`` pixels are skipped, and a val / test object whose class has no training crop is dropped (the
classifier has no output for it). The tree is written under a temporary name and renamed into place when complete;
an existing tree made from the same files with the same parameters is kept (``--force`` remakes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from grounding.errors import UserInputError, user_errors_exit
from grounding.utils.io import atomic_path, sha1_of_json

from .file_checks import iter_json_array

FORMAT_VERSION = 1
MANIFEST = "crops.json"
IMAGE_DIRS = ("VG_100K", "VG_100K_2", "images")
SPLITS = ("train", "val", "test")


class ObjectCropsError(UserInputError, FileNotFoundError):
    """The Visual Genome folder lacks what the crops are cut from (the message names it and the fix)."""


def square_box(x: float, y: float, w: float, h: float, width: int, height: int, margin: float) -> tuple[int, ...]:
    """The crop of an object box: a square of side ``max(w, h) * (1 + margin)`` centred on the box, shifted to lie
    inside the image (cut to the image where it is larger), as PIL's (left, top, right, bottom)."""
    side = max(w, h) * (1.0 + margin)
    sx, sy = min(side, width), min(side, height)
    left = min(max(x + w / 2 - sx / 2, 0.0), width - sx)
    top = min(max(y + h / 2 - sy / 2, 0.0), height - sy)
    return round(left), round(top), round(left + sx), round(top + sy)


def _image_file(root: Path, image_id: int) -> Path | None:
    for folder in IMAGE_DIRS:
        path = root / folder / f"{image_id}.jpg"
        if path.is_file():
            return path
    return None


def _splits(root: Path, image_ids: list[int], val_fraction: float, seed: int) -> dict[int, str]:
    """image id -> split: the world's ``splits.json`` when there is one, else a seeded train / val split."""
    path = root / "splits.json"
    if path.is_file():
        listed = json.loads(path.read_text(encoding="utf-8"))
        return {int(i): split for split in SPLITS for i in listed.get(split, ())}
    order = np.random.default_rng(seed).permutation(len(image_ids))
    n_val = int(round(val_fraction * len(image_ids)))
    return {image_ids[k]: "val" if rank < n_val else "train" for rank, k in enumerate(order.tolist())}


def crop_objects(vg_root: str | os.PathLike, out: str | os.PathLike, margin: float = 0.25, min_size: int = 8,
                 size: int | None = None, val_fraction: float = 0.1, seed: int = 0, max_per_class: int | None = None,
                 force: bool = False) -> dict:
    """Write the ImageFolder tree of ``vg_root``'s object boxes to ``out`` (see the module docstring); its manifest."""
    from PIL import Image

    root, out = Path(vg_root), Path(out)
    objects_file = root / "objects.json"
    if not objects_file.is_file():
        raise ObjectCropsError(f"object crops: {objects_file} is missing (Visual Genome's objects.json: boxes and "
                               "synsets per image). Fix: run `make world` (the world's copy is data/world/visual_genome) "
                               "or point --vg at a Visual Genome folder.")
    stat = objects_file.stat()
    splits_file = root / "splits.json"  # decides each crop's split (a rewritten one makes the crops stale)
    splits = splits_file.stat() if splits_file.is_file() else None
    params = {"version": FORMAT_VERSION, "objects": [str(objects_file.resolve()), stat.st_size, stat.st_mtime_ns],
              "splits": [splits.st_size, splits.st_mtime_ns] if splits else None,
              "margin": margin, "min_size": min_size, "size": size, "val_fraction": val_fraction, "seed": seed,
              "max_per_class": max_per_class}
    key = sha1_of_json(params)
    manifest_file = out / MANIFEST
    if manifest_file.is_file() and not force:
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = {}
        if manifest.get("key") == key:
            print(f"object crops: {out} is up to date ({manifest['total']} crops, {len(manifest['classes'])} classes)")
            return manifest

    hint = "regenerate it (make world) or download objects.json again"
    entries = [e for e in iter_json_array(objects_file, "Visual Genome", '[{"image_id", "objects": [...]}]', hint)
               if e.get("objects")]
    split_of = _splits(root, [int(e["image_id"]) for e in entries], val_fraction, seed)
    # (split, class, image_id, object): every usable box, in file order
    boxes = [(split_of.get(int(e["image_id"])), o["synsets"][0], int(e["image_id"]), o) for e in entries
             for o in e["objects"] if o.get("synsets") and max(o["w"], o["h"]) >= min_size]
    boxes = [b for b in boxes if b[0] in SPLITS]
    train_classes = sorted({b[1] for b in boxes if b[0] == "train"})
    if not train_classes:
        raise ObjectCropsError(f"object crops: {objects_file} has no object box of at least {min_size} px with a synset "
                               "in a training image. Fix: lower --min-size or check the file.")
    known = set(train_classes)
    dropped = sum(b[1] not in known for b in boxes)
    boxes = [b for b in boxes if b[1] in known]
    if max_per_class is not None:  # the first N per (split, class), in file order
        seen: Counter = Counter()
        kept = []
        for b in boxes:
            seen[b[:2]] += 1
            if seen[b[:2]] <= max_per_class:
                kept.append(b)
        boxes = kept

    by_image: dict[int, list] = {}
    for b in boxes:
        by_image.setdefault(b[2], []).append(b)
    counts = {s: Counter() for s in SPLITS}
    with atomic_path(out) as tmp:
        for image_id, items in by_image.items():
            path = _image_file(root, image_id)
            if path is None:
                raise ObjectCropsError(f"object crops: no image for image_id {image_id} under {root} "
                                       f"({' / '.join(IMAGE_DIRS)}/{image_id}.jpg). Fix: {hint}.")
            with Image.open(path) as img:
                img = img.convert("RGB")
            for split, cls, _, o in items:
                crop = img.crop(square_box(o["x"], o["y"], o["w"], o["h"], img.width, img.height, margin))
                if size:
                    crop = crop.resize((size, size), Image.BICUBIC)
                folder = tmp / split / cls
                folder.mkdir(parents=True, exist_ok=True)
                crop.save(folder / f"{image_id}_{o['object_id']}.jpg", quality=95)
                counts[split][cls] += 1
        manifest = {"key": key, "parameters": params, "classes": train_classes,
                    "counts": {s: dict(sorted(c.items())) for s, c in counts.items() if c},
                    "total": sum(sum(c.values()) for c in counts.values()), "dropped_unknown_class": dropped}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    print(f"object crops: {manifest['total']} crops of {len(train_classes)} classes in {out} ("
          + ", ".join(f"{s} {sum(c.values())}" for s, c in counts.items() if c) + ")")
    return manifest


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m data_modules.object_crops", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--vg", default="data/world/visual_genome", help="Visual Genome folder (objects.json + images)")
    p.add_argument("--out", default="data/world/object_crops", help="the ImageFolder tree to write")
    p.add_argument("--margin", type=float, default=0.25, help="context around the box: side = max(w, h) * (1 + margin)")
    p.add_argument("--min-size", type=int, default=8, help="skip boxes whose longer side is below this (pixels)")
    p.add_argument("--size", type=int, default=None, help="resize every crop to SIZE x SIZE (default: as cut)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="without splits.json: images held out for val")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-per-class", type=int, default=None, help="at most N crops per class and split")
    p.add_argument("--force", action="store_true", help="remake the tree even when it is up to date")
    a = p.parse_args(argv)
    with user_errors_exit(p.prog):
        return crop_objects(a.vg, a.out, a.margin, a.min_size, a.size, a.val_fraction, a.seed, a.max_per_class,
                            a.force)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
