"""The embedded world: small natural-looking scenes with captions and scene graphs, written in the
real datasets' layouts (COCO 2017 + Karpathy, Flickr8k/30k, Visual Genome v1.4).

Every scene holds 1-4 objects (a WordNet noun each), with a colour, size and texture, placed in
spatial relations (left of, right of, above, below, next to, on). Each image gets 5 different
captions from a small English grammar that varies wording (WordNet synonyms: ball / orb / sphere),
order ("a X to the left of a Y" / "a Y to the right of a X") and detail ("a ball" ... "a small
striped red ball to the left of a blue box"), and Visual-Genome objects, attributes and
(subject, predicate, object) relationships with WordNet synset names and pixel boxes.

A few attribute-object pairs (three colour-object and one texture-object pair, drawn from the
seed) never occur in the training split: images holding one go to val/test only, so compositional
generalisation (Composer, Sec. 5.1) can be measured on them. ``world.json`` lists the pairs, the
vocabulary with its synsets, and every image's split, objects and relations.

The whole world is built in a temporary folder beside ``out`` and renamed into place when complete,
so a half-generated world is never mistaken for a valid one; a complete world with the same
parameters is kept (``force`` regenerates it).

    python -m data_modules.synthetic --out data/world --images 200 --seed 0

Layout under ``out``: world.json, images/world_%06d.jpg, coco/{annotations/captions_{train,val}2017.json,
train2017/, val2017/, dataset_coco.json}, flickr/{images/, dataset_flickr30k.json, Flickr8k.token.txt,
Flickr_8k.{train,dev,test}Images.txt}, visual_genome/{image_data,objects,attributes,relationships,
object_synsets,attribute_synsets,relationship_synsets,splits}.json + VG_100K/<image_id>.jpg. The
layout folders hold hard links to images/ (copies where linking fails).

One scene, one id and one split in every layout: COCO id = Visual Genome image id (image_data.json's
``coco_id`` says so, as the real release does for its COCO images), COCO train2017 = the train split and val2017
= val + test, the Flickr lists and VG's splits.json the same; so a chain of stages (COCO stage 1, VG stage 2,
COCO search heads) evaluates every stage on images no earlier stage trained on (grounding.training_images).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from grounding.utils.io import atomic_path

GENERATOR_VERSION = "1.1"  # 1.1: Visual Genome's image_data.json names each image's coco_id (the same scene)
VOCABULARY_FILE = Path(__file__).resolve().parent / "resources" / "world_vocabulary.json"
SPLITS = ("train", "val", "test")
CAPTIONS_PER_IMAGE = 5
JPEG_QUALITY = 90
VG_URL = "https://cs.stanford.edu/people/rak248/VG_100K/{}.jpg"

# ----------------------------------------------------------------------------------------------
# Vocabulary and geometry
# ----------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def load_vocabulary() -> dict:
    """The world's vocabulary (resources/world_vocabulary.json), checked against the geometry table."""
    try:
        vocab = json.loads(VOCABULARY_FILE.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"Cannot read the embedded-world vocabulary {VOCABULARY_FILE}: {e}. "
                           "Reinstall the package (it ships data_modules/resources/).") from e
    missing = [o["name"] for o in vocab["objects"] if o["name"] not in SHAPES]
    if missing:
        raise RuntimeError(f"{VOCABULARY_FILE} names objects without a drawing in synthetic.SHAPES: {missing}")
    return vocab


@dataclass(frozen=True)
class Part:
    """One drawn primitive of an object, in unit coordinates of the object's box (u right, v down).

    kind: "ellipse" (bbox), "poly" (points) or "arc" (bbox, upper half); role "body" parts take the
    object's colour and texture, "fixed" parts keep ``rgb``; ``cut`` removes the part from what is
    drawn so far (the hole of a ring). ``shade``: flat | sphere | hcyl | vgrad, times ``factor``;
    ``frame`` is the unit-box region the shading is laid over (default: the part's own bbox).
    """
    kind: str
    coords: tuple
    role: str = "body"
    rgb: tuple = (0.0, 0.0, 0.0)
    shade: str = "flat"
    factor: float = 1.0
    cut: bool = False
    frame: tuple | None = None

    def bbox(self) -> tuple[float, float, float, float]:
        if self.kind == "poly":
            us, vs = zip(*self.coords)
            return min(us), min(vs), max(us), max(vs)
        return self.coords


def _star(points: int = 5, inner: float = 0.42) -> tuple[tuple, float]:
    ang = -np.pi / 2 + np.arange(2 * points) * np.pi / points
    r = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    x, y = r * np.cos(ang), r * np.sin(ang)
    x = (x - x.min()) / (x.max() - x.min())
    aspect = (np.ptp(r * np.cos(ang))) / (np.ptp(r * np.sin(ang)))
    y = (y - y.min()) / (y.max() - y.min())
    return tuple(zip(x.round(4).tolist(), y.round(4).tolist())), float(aspect)


_STAR_POINTS, _STAR_ASPECT = _star()
GLASS = (0.68, 0.80, 0.90)
TIRE = (0.09, 0.09, 0.10)
HUB = (0.62, 0.62, 0.64)
BARK = (0.40, 0.27, 0.15)
DOOR = (0.33, 0.21, 0.12)
HANDLE = (0.35, 0.35, 0.37)

# name -> (aspect w/h, parts drawn in order, v of the top surface something can rest on)
SHAPES: dict[str, tuple[float, tuple[Part, ...], float]] = {
    "ball": (1.0, (Part("ellipse", (0, 0, 1, 1), shade="sphere"),), 0.0),
    "ring": (1.0, (Part("ellipse", (0, 0, 1, 1), shade="vgrad"),
                   Part("ellipse", (0.27, 0.27, 0.73, 0.73), cut=True)), 0.0),
    "star": (_STAR_ASPECT, (Part("poly", _STAR_POINTS, shade="vgrad", factor=1.05),), 0.0),
    "box": (1.4, (Part("poly", ((0, 0.28), (0.82, 0.28), (0.82, 1), (0, 1)), shade="vgrad"),
                  Part("poly", ((0, 0.28), (0.18, 0), (1, 0), (0.82, 0.28)), factor=1.2),
                  Part("poly", ((0.82, 0.28), (1, 0), (1, 0.72), (0.82, 1)), shade="vgrad", factor=0.7),
                  Part("poly", ((0, 0.28), (0.82, 0.28), (0.82, 0.38), (0, 0.38)), factor=0.82)), 0.14),
    "cube": (1.0, (Part("poly", ((0, 0.25), (0.75, 0.25), (0.75, 1), (0, 1)), shade="vgrad"),
                   Part("poly", ((0, 0.25), (0.25, 0), (1, 0), (0.75, 0.25)), factor=1.22),
                   Part("poly", ((0.75, 0.25), (1, 0), (1, 0.75), (0.75, 1)), shade="vgrad", factor=0.68)), 0.125),
    "cup": (1.2, (Part("ellipse", (0.58, 0.24, 1.0, 0.8), shade="vgrad", factor=0.85),
                  Part("ellipse", (0.68, 0.37, 0.9, 0.67), cut=True),
                  Part("poly", ((0, 0.12), (0.76, 0.12), (0.76, 0.92), (0, 0.92)), shade="hcyl"),
                  Part("ellipse", (0, 0.84, 0.76, 1.0), shade="hcyl"),
                  Part("ellipse", (0, 0.03, 0.76, 0.21), factor=1.05),
                  Part("ellipse", (0.05, 0.07, 0.71, 0.17), factor=0.45)), 0.0),
    "bucket": (0.95, (Part("arc", (0.07, 0.0, 0.93, 0.5), role="fixed", rgb=HANDLE),
                      Part("poly", ((0, 0.22), (1, 0.22), (0.86, 1), (0.14, 1)), shade="hcyl"),
                      Part("ellipse", (0, 0.15, 1, 0.29), factor=1.05),
                      Part("ellipse", (0.05, 0.18, 0.95, 0.27), factor=0.45)), 0.0),
    "car": (1.9, (Part("poly", ((0.2, 0.42), (0.33, 0.06), (0.68, 0.06), (0.82, 0.42)), shade="vgrad", factor=0.95),
                  Part("poly", ((0.26, 0.4), (0.36, 0.13), (0.49, 0.13), (0.49, 0.4)), role="fixed", rgb=GLASS,
                       shade="vgrad"),
                  Part("poly", ((0.53, 0.4), (0.53, 0.13), (0.65, 0.13), (0.76, 0.4)), role="fixed", rgb=GLASS,
                       shade="vgrad"),
                  Part("poly", ((0, 0.46), (0.05, 0.38), (0.95, 0.38), (1, 0.48), (1, 0.8), (0, 0.8)), shade="vgrad"),
                  Part("ellipse", (0.104, 0.56, 0.336, 1.0), role="fixed", rgb=TIRE),
                  Part("ellipse", (0.664, 0.56, 0.896, 1.0), role="fixed", rgb=TIRE),
                  Part("ellipse", (0.173, 0.69, 0.267, 0.87), role="fixed", rgb=HUB, shade="sphere"),
                  Part("ellipse", (0.733, 0.69, 0.827, 0.87), role="fixed", rgb=HUB, shade="sphere")), 0.06),
    "tree": (0.8, (Part("poly", ((0.42, 0.5), (0.58, 0.5), (0.6, 1), (0.4, 1)), role="fixed", rgb=BARK, shade="hcyl"),
                   Part("ellipse", (0.0, 0.2, 0.62, 0.7), shade="sphere", frame=(0, 0, 1, 0.7)),
                   Part("ellipse", (0.38, 0.2, 1.0, 0.7), shade="sphere", frame=(0, 0, 1, 0.7)),
                   Part("ellipse", (0.13, 0.0, 0.87, 0.56), shade="sphere", frame=(0, 0, 1, 0.7))), 0.0),
    "house": (1.0, (Part("poly", ((0.1, 0.45), (0.9, 0.45), (0.9, 1), (0.1, 1)), shade="vgrad"),
                    Part("poly", ((0, 0.48), (0.5, 0.02), (1, 0.48)), shade="vgrad", factor=0.68),
                    Part("poly", ((0.42, 0.68), (0.58, 0.68), (0.58, 1), (0.42, 1)), role="fixed", rgb=DOOR),
                    Part("poly", ((0.18, 0.57), (0.34, 0.57), (0.34, 0.73), (0.18, 0.73)), role="fixed", rgb=GLASS),
                    Part("poly", ((0.66, 0.57), (0.82, 0.57), (0.82, 0.73), (0.66, 0.73)), role="fixed",
                         rgb=GLASS)), 0.0),
}

# ----------------------------------------------------------------------------------------------
# Scene sampling
# ----------------------------------------------------------------------------------------------


@dataclass
class SceneObject:
    kind: str
    color: str
    size: str
    texture: str
    x: float = 0.0  # nominal box in pixels (the drawn box is measured after rendering)
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0
    place: str = "ground"  # ground | sky | on | above
    column: int = -1
    box: tuple[int, int, int, int] | None = None  # drawn box (x, y, w, h)


@dataclass
class Scene:
    background: str
    horizon: float
    objects: list[SceneObject]
    facts: list[tuple[int, str, int]] = field(default_factory=list)  # (subject, left of|on|above|next to, object)
    style: dict = field(default_factory=dict)


def _by_name(items: Sequence[dict]) -> dict[str, dict]:
    return {it["name"]: it for it in items}


def choose_held_out_pairs(seed: int, vocab: dict, n_color: int = 3, n_texture: int = 1) -> list[list[str]]:
    """Attribute-object pairs kept out of training: distinct objects and attributes, drawn from the seed."""
    rng = np.random.default_rng([seed, 7])
    objects = [o["name"] for o in vocab["objects"]]
    order = rng.permutation(len(objects))[: n_color + n_texture]
    colors = rng.permutation([c["name"] for c in vocab["colors"]])[:n_color]
    textures = rng.permutation([t["name"] for t in vocab["textures"] if t["name"] != "plain"])[:n_texture]
    attrs = [str(a) for a in colors] + [str(t) for t in textures]
    return [[a, objects[i]] for a, i in zip(attrs, order)]


def _sample_object(rng: np.random.Generator, vocab: dict, forbidden: set[tuple[str, str]]) -> SceneObject:
    objects, colors = vocab["objects"], vocab["colors"]
    sizes, textures = vocab["sizes"], vocab["textures"]
    kind = objects[rng.integers(len(objects))]["name"]
    while True:  # redraw attributes until the pair is allowed (train images avoid held-out pairs)
        color = colors[rng.integers(len(colors))]["name"]
        texture = textures[rng.choice(len(textures), p=_texture_p(len(textures)))]["name"]
        if (color, kind) not in forbidden and (texture, kind) not in forbidden:
            break
    size = sizes[rng.integers(len(sizes))]["name"]
    return SceneObject(kind, color, size, texture)


def _texture_p(n: int) -> np.ndarray:
    """Plain (the first texture) 40% of the time, the patterns share the rest."""
    return np.array([0.4] + [0.6 / (n - 1)] * (n - 1)) if n > 1 else np.ones(1)


def _object_dims(obj: SceneObject, rng: np.random.Generator, S: int, vocab: dict) -> None:
    lo, hi = _by_name(vocab["sizes"])[obj.size]["scale"]
    s = rng.uniform(lo, hi) * S  # sqrt of the box area: "small"/"large" mean the same area for every kind
    aspect = SHAPES[obj.kind][0]
    obj.w, obj.h = s * math.sqrt(aspect), s / math.sqrt(aspect)


def sample_scene(rng: np.random.Generator, vocab: dict, S: int, forbidden: set[tuple[str, str]],
                 force_pair: list[str] | None = None) -> Scene:
    """Objects, placement and spatial facts of one scene (all geometry in pixels of an S x S image)."""
    info = _by_name(vocab["objects"])
    background = ["field", "beach", "room"][rng.integers(3)]
    horizon = rng.uniform(0.45, 0.58) * S
    ground_top = horizon + (0.07 * S if background == "beach" else 0.0)  # the sea band of a beach
    margin, min_gap = 0.02 * S, 0.015 * S
    for _attempt in range(200):
        n = int(rng.choice([1, 2, 3, 4], p=[0.2, 0.3, 0.3, 0.2]))
        objs = [_sample_object(rng, vocab, forbidden) for _ in range(n)]
        if force_pair is not None:  # a val/test scene showing a held-out pair
            attr, kind = force_pair
            o = objs[0]
            o.kind = kind
            if attr in _by_name(vocab["colors"]):
                o.color = attr
            else:
                o.texture = attr
        for o in objs:
            _object_dims(o, rng, S, vocab)
        baseline = rng.uniform(ground_top + 0.35 * (S - ground_top), S - 0.03 * S)
        # columns: [ground-or-sky object, optional object on / above it]
        columns: list[list[int]] = []
        for i, o in enumerate(objs):
            options = []
            for c, col in enumerate(columns):
                base = objs[col[0]]
                if len(col) == 2 or base.place == "sky":
                    continue
                if info[o.kind]["can_stack"] and info[base.kind]["can_support"] and o.w <= base.w * 0.95:
                    top = baseline - base.h + SHAPES[base.kind][2] * base.h
                    if top - o.h >= 0.02 * S:
                        options.append((c, "on"))
                if info[o.kind]["can_float"] and baseline - base.h - 0.06 * S - o.h >= 0.02 * S:
                    options.append((c, "above"))
            if options and rng.random() < 0.55:
                weights = np.array([2.0 if how == "on" else 1.0 for _, how in options])
                c, how = options[int(rng.choice(len(options), p=weights / weights.sum()))]
                o.place = how
                columns[c].append(i)
            else:
                o.place = "sky" if info[o.kind]["can_float"] and rng.random() < 0.3 else "ground"
                columns.append([i])
        widths = [max(objs[j].w for j in col) for col in columns]
        free = S - sum(widths) - 2 * margin - (len(columns) - 1) * min_gap
        if free < 0:
            continue  # too wide: draw another scene
        order = rng.permutation(len(columns))
        gaps = rng.dirichlet(np.ones(len(columns) + 1)) * free
        x = margin + gaps[0]
        for k, c in enumerate(order):
            col = columns[c]
            base = objs[col[0]]
            jitter = rng.uniform(-0.02, 0.02) * S
            base.column = col_index = k
            base.x = x + (widths[c] - base.w) / 2
            if base.place == "sky":
                hi = max(0.03 * S, ground_top - base.h - 0.02 * S)
                base.y = rng.uniform(0.03 * S, hi)
            else:
                bottom = min(baseline + jitter, S - 0.02 * S)
                base.y = bottom - base.h
            if len(col) == 2:
                top = objs[col[1]]
                top.column = col_index
                slack = (base.w - top.w) / 2
                top.x = base.x + slack + rng.uniform(-0.4, 0.4) * max(slack, 0.0)
                if top.place == "on":
                    top.y = base.y + SHAPES[base.kind][2] * base.h - top.h
                else:
                    gap = rng.uniform(0.06, 0.14) * S
                    top.y = max(0.02 * S, base.y - gap - top.h)
            x += widths[c] + min_gap + gaps[k + 1]
        scene = Scene(background, horizon, objs)
        scene.facts = _facts(objs, columns, S)
        return scene
    raise RuntimeError("could not lay out a scene in 200 attempts (image_size too small?)")


def _facts(objs: list[SceneObject], columns: list[list[int]], S: int) -> list[tuple[int, str, int]]:
    """Spatial facts from the layout: every pair in exactly one of left of / on / above, plus next to
    for neighbours at the same level (columns are disjoint in x, so "left of" is exact)."""
    facts = []
    for col in columns:
        if len(col) == 2:
            facts.append((col[1], objs[col[1]].place, col[0]))  # "on" or "above"
    n = len(objs)
    for a in range(n):
        for b in range(n):
            ca, cb = objs[a].column, objs[b].column
            if ca < cb:
                facts.append((a, "left of", b))
                gap = objs[b].x - (objs[a].x + objs[a].w)
                if cb == ca + 1 and gap < 0.1 * S and objs[a].place in ("ground", "sky") and \
                        objs[b].place == objs[a].place:
                    facts.append((a, "next to", b))
    return facts


# ----------------------------------------------------------------------------------------------
# Rendering (numpy + PIL, vectorised over pixels)
# ----------------------------------------------------------------------------------------------

def _upsampled_noise(rng: np.random.Generator, shape: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
    """Smooth noise: a coarse random grid resized bicubically (no Python loops over pixels)."""
    small = rng.standard_normal(grid).astype(np.float32)
    return np.asarray(Image.fromarray(small, mode="F").resize((shape[1], shape[0]), Image.BICUBIC))


def _soft_ellipse(S: int, cx: float, cy: float, rx: float, ry: float) -> tuple[tuple[slice, slice], np.ndarray]:
    """A soft-edged ellipse (cloud, contact shadow) over the window of the image it covers."""
    x0, x1 = max(0, int(cx - rx)), min(S, int(math.ceil(cx + rx)) + 1)
    y0, y1 = max(0, int(cy - ry)), min(S, int(math.ceil(cy + ry)) + 1)
    X = np.arange(x0, x1, dtype=np.float32)[None, :] + 0.5
    Y = np.arange(y0, y1, dtype=np.float32)[:, None] + 0.5
    d = ((X - cx) / rx) ** 2 + ((Y - cy) / ry) ** 2
    return (slice(y0, y1), slice(x0, x1)), np.clip(1.0 - d, 0.0, 1.0) ** 0.7


def _jitter(rgb, rng, amount=0.04) -> np.ndarray:
    return np.clip(np.asarray(rgb, np.float32) + rng.uniform(-amount, amount, 3), 0, 1).astype(np.float32)


def render_background(scene: Scene, S: int, rng: np.random.Generator) -> np.ndarray:
    Y = np.arange(S, dtype=np.float32)[:, None] + 0.5  # broadcast against X: no S x S index grids
    X = np.arange(S, dtype=np.float32)[None, :] + 0.5
    hz = scene.horizon
    img = np.empty((S, S, 3), np.float32)
    sky_t = np.clip((Y[:, :1] / max(hz, 1.0)), 0, 1)[..., None] ** 0.8
    if scene.background == "room":
        wall = _jitter((0.86, 0.82, 0.74), rng, 0.05)
        img[:] = wall * (0.88 + 0.12 * sky_t)
        floor_c = _jitter((0.58, 0.40, 0.24), rng, 0.05)
        plank_h = S / rng.uniform(9, 13)
        plank = np.floor((Y - hz) / plank_h)
        plank_shade = 0.85 + 0.3 * ((plank * 0.6180339) % 1.0)  # a different tone per plank row
        grain = _upsampled_noise(rng, (S, S), (max(2, S // 2), max(2, S // 24))) * 0.05
        seam = (((Y - hz) % plank_h) < max(1.0, S / 160)).astype(np.float32) * 0.25
        floor = floor_c * (plank_shade * (1 + grain) * (1 - seam))[..., None]
        img = np.where((Y >= hz)[..., None], floor, img)
        img[np.abs(Y[:, 0] - hz) < max(1.0, S / 110)] *= 0.7  # skirting line
    else:
        top, low = _jitter((0.32, 0.52, 0.84), rng, 0.05), _jitter((0.76, 0.86, 0.95), rng, 0.03)
        img[:] = top * (1 - sky_t) + low * sky_t
        for _ in range(rng.integers(0, 4)):  # soft clouds
            cx, cy = rng.uniform(0, S), rng.uniform(0.05, 0.35) * S
            rx, ry = rng.uniform(0.1, 0.22) * S, rng.uniform(0.03, 0.06) * S
            win, m = _soft_ellipse(S, cx, cy, rx, ry)
            m = m[..., None] * 0.75
            img[win] = img[win] * (1 - m) + 0.97 * m
        ground_top = hz
        if scene.background == "beach":
            sea = _jitter((0.16, 0.45, 0.62), rng, 0.04)
            ground_top = hz + 0.07 * S
            waves = 1 + 0.06 * np.sin(Y * 1.7 + 0.3 * X * 0.05)[..., None]
            img = np.where(((Y >= hz) & (Y < ground_top))[..., None], sea * waves, img)
            near, far = _jitter((0.86, 0.76, 0.56), rng, 0.04), _jitter((0.92, 0.85, 0.68), rng, 0.03)
        else:
            near, far = _jitter((0.24, 0.46, 0.16), rng, 0.04), _jitter((0.46, 0.64, 0.32), rng, 0.04)
        t = np.clip((Y - ground_top) / max(S - ground_top, 1.0), 0, 1)[..., None]
        ground = far * (1 - t) + near * t
        fine = _upsampled_noise(rng, (S, S), (max(2, S // 3), max(2, S // 3)))[..., None]
        ground = ground * (1 + 0.06 * fine)
        img = np.where((Y >= ground_top)[..., None], ground, img)
    light = _upsampled_noise(rng, (S, S), (5, 5))[..., None]
    return np.clip(img * (1 + 0.04 * light), 0, 1).astype(np.float32)


def _shading(mode: str, U: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
    """Multiplicative shading and additive highlight over unit frame coordinates."""
    if mode == "sphere":
        d2 = (U - 0.36) ** 2 + (V - 0.32) ** 2
        return 1.12 - 0.6 * np.sqrt(d2), 0.3 * np.exp(-d2 / 0.01)
    if mode == "hcyl":
        u = np.clip(U, 0, 1)
        return 0.7 + 0.38 * np.maximum(np.sin(np.pi * u), 0.0) ** 0.7, 0.12 * np.exp(-((U - 0.3) ** 2) / 0.004)
    if mode == "vgrad":
        return 1.08 - 0.2 * np.clip(V, 0, 1), 0.0
    return np.ones_like(U), 0.0


def _pattern(texture: str, X: np.ndarray, Y: np.ndarray, w: float, rng: np.random.Generator) -> np.ndarray | None:
    """Coverage (0..1) of the texture's second colour at every pixel of the object's patch."""
    if texture == "striped":
        p = max(2.6, w / 5.5)
        theta = rng.choice([0.0, 0.25, 0.5, 0.75]) * np.pi
        t = (X * np.cos(theta) + Y * np.sin(theta)) / p
        return np.clip(0.5 + np.sin(2 * np.pi * t) * p / 4.0, 0, 1)
    if texture == "dotted":
        p = max(3.2, w / 4.5)
        gy = Y / p
        gx = X / p + 0.5 * (np.floor(gy) % 2)  # staggered rows
        d = np.hypot((gx % 1.0) - 0.5, (gy % 1.0) - 0.5) * p
        return np.clip(0.3 * p - d + 0.5, 0, 1)
    if texture == "checkered":
        p = max(3.0, w / 4.0)
        return ((np.floor(X / p) + np.floor(Y / p)) % 2).astype(np.float32)
    return None


def _pattern_color(rgb: np.ndarray) -> np.ndarray:
    lum = float(rgb @ np.array([0.3, 0.59, 0.11], np.float32))
    return (0.22 * rgb + 0.72) if lum < 0.55 else (0.35 * rgb)


def render_object(canvas: np.ndarray, obj: SceneObject, rgb: np.ndarray, rng: np.random.Generator,
                  supersample: int = 4) -> tuple[int, int, int, int] | None:
    """Draw ``obj`` onto ``canvas`` in place; return its drawn box (x, y, w, h) in pixels."""
    S = canvas.shape[0]
    aspect, parts, _ = SHAPES[obj.kind]
    x0, y0 = max(0, int(math.floor(obj.x)) - 1), max(0, int(math.floor(obj.y)) - 1)
    x1, y1 = min(S, int(math.ceil(obj.x + obj.w)) + 2), min(S, int(math.ceil(obj.y + obj.h)) + 2)
    pw, ph = x1 - x0, y1 - y0
    if pw <= 0 or ph <= 0:
        return None
    ys = np.arange(y0, y1, dtype=np.float32)[:, None] + 0.5
    xs = np.arange(x0, x1, dtype=np.float32)[None, :] + 0.5
    U, V = (xs - obj.x) / obj.w, (ys - obj.y) / obj.h
    body = np.broadcast_to(rgb, (ph, pw, 3)).astype(np.float32)
    cover = _pattern(obj.texture, xs - obj.x, ys - obj.y, obj.w, rng)
    if cover is not None:
        body = body * (1 - cover[..., None]) + _pattern_color(rgb) * cover[..., None]
    out_rgb = np.zeros((ph, pw, 3), np.float32)
    alpha = np.zeros((ph, pw), np.float32)
    ss = supersample

    def to_px(u, v):
        return ((obj.x + u * obj.w - x0) * ss, (obj.y + v * obj.h - y0) * ss)

    for part in parts:
        mask = Image.new("L", (pw * ss, ph * ss), 0)
        draw = ImageDraw.Draw(mask)
        if part.kind == "poly":
            draw.polygon([to_px(u, v) for u, v in part.coords], fill=255)
        else:
            (ax, ay), (bx, by) = to_px(*part.coords[:2]), to_px(*part.coords[2:])
            if part.kind == "ellipse":
                draw.ellipse([ax, ay, bx, by], fill=255)
            else:  # arc: the upper half, a handle
                draw.arc([ax, ay, bx, by], 180, 360, fill=255, width=max(ss, int(0.045 * obj.w * ss)))
        a = np.asarray(mask.resize((pw, ph), Image.BOX), np.float32) / 255.0
        if part.cut:
            alpha *= 1 - a
            continue
        fu0, fv0, fu1, fv1 = part.frame or part.bbox()
        mul, add = _shading(part.shade, (U - fu0) / max(fu1 - fu0, 1e-6), (V - fv0) / max(fv1 - fv0, 1e-6))
        base = body if part.role == "body" else np.asarray(part.rgb, np.float32)
        add = np.broadcast_to(np.asarray(add, np.float32), mul.shape)
        col = np.clip(base * (mul * part.factor)[..., None] + add[..., None], 0, 1)
        out_rgb = out_rgb * (1 - a[..., None]) + col * a[..., None]
        alpha = alpha + a * (1 - alpha)
    # a thin darker outline, as edges of real objects catch less light
    eroded = np.asarray(Image.fromarray((alpha * 255).astype(np.uint8)).filter(ImageFilter.MinFilter(3)),
                        np.float32) / 255.0
    out_rgb *= (1 - 0.45 * np.clip(alpha - eroded, 0, 1))[..., None]
    patch = canvas[y0:y1, x0:x1]
    canvas[y0:y1, x0:x1] = patch * (1 - alpha[..., None]) + out_rgb * alpha[..., None]
    on = alpha >= 0.5
    if not on.any():
        return None
    rows, cols = np.flatnonzero(on.any(axis=1)), np.flatnonzero(on.any(axis=0))
    return (x0 + int(cols[0]), y0 + int(rows[0]), int(cols[-1] - cols[0] + 1), int(rows[-1] - rows[0] + 1))


def render_scene(scene: Scene, S: int, rng: np.random.Generator, vocab: dict, noise: float = 0.012) -> np.ndarray:
    """The scene as an S x S x 3 uint8 image; sets every object's drawn ``box``."""
    img = render_background(scene, S, rng)
    colors = _by_name(vocab["colors"])
    for o in scene.objects:  # contact shadows under grounded objects
        if o.place == "ground":
            win, m = _soft_ellipse(S, o.x + o.w / 2, o.y + o.h * 0.985, 0.58 * o.w, 0.06 * o.h + 0.008 * S)
            img[win] *= (1 - 0.4 * m)[..., None]
    # draw supporting objects before what stands on / floats above them
    for o in sorted(scene.objects, key=lambda o: o.place in ("on", "above")):
        o.box = render_object(img, o, _jitter(colors[o.color]["rgb"], rng, 0.03), rng)
    img = img + rng.normal(0.0, noise, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def encode_jpeg(pixels: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------
# Captions: a small English grammar
# ----------------------------------------------------------------------------------------------

NUMBERS = {2: "two", 3: "three", 4: "four"}


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def tokenize(text: str) -> list[str]:
    """Karpathy-style tokens: lowercase words, punctuation dropped."""
    return re.findall(r"[a-z0-9]+", text.lower())


class Grammar:
    """Caption grammar over one scene; every choice is drawn from ``rng``."""

    def __init__(self, scene: Scene, vocab: dict, rng: np.random.Generator):
        self.scene, self.rng = scene, rng
        self.objects = _by_name(vocab["objects"])
        self.colors = _by_name(vocab["colors"])
        self.sizes = _by_name(vocab["sizes"])
        self.textures = _by_name(vocab["textures"])
        self.relations = {r["predicate"]: r for r in vocab["relations"]}
        self.place = _by_name(vocab["scenes"])[scene.background]

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def _word(self, canonical: str, synonyms: list[dict], p_canonical: float) -> str:
        if not synonyms or self.rng.random() < p_canonical:
            return canonical
        return self.pick(synonyms)["word"]

    def noun(self, kind: str, plural: bool = False) -> str:
        o = self.objects[kind]
        if not o["synonyms"] or self.rng.random() < 0.6:
            return o["plural"] if plural else o["name"]
        s = self.pick(o["synonyms"])
        return s["plural"] if plural else s["word"]

    def adjectives(self, obj: SceneObject, detail: int) -> tuple[list[str], str]:
        """Adjectives (size, texture, colour order) and an optional 'with ...' phrase for a detail level."""
        color = self._word(obj.color, self.colors[obj.color]["synonyms"], 0.8)
        size = self._word(obj.size, self.sizes[obj.size]["synonyms"], 0.7)
        tex = self.textures[obj.texture]
        texture = self._word(obj.texture, tex["synonyms"], 0.75)
        patterned = obj.texture != "plain"
        if detail <= 0:
            return [], ""
        if detail == 1:
            r = self.rng.random()
            if r < 0.6 or (r >= 0.8 and not patterned):
                return [color], ""
            return ([size], "") if r < 0.8 else ([texture], "")
        if detail == 2:
            r = self.rng.random()
            if r < 0.45 or not patterned:
                return [size, color], ""
            return ([texture, color], "") if r < 0.75 else ([color], self.pick(tex["with"]))
        if patterned and self.rng.random() < 0.3:
            return [size, color], self.pick(tex["with"])
        if not patterned and self.rng.random() < 0.25:
            return [size, "plain", color], ""
        return [size, texture, color] if patterned else [size, color], ""

    def np(self, i: int, detail: int) -> str:
        obj = self.scene.objects[i]
        adjs, post = self.adjectives(obj, detail)
        words = adjs + [self.noun(obj.kind)]
        phrase = " ".join(words)
        return f"{article(phrase)} {phrase}" + (f" {post}" if post else "")

    def detail(self, low: int = 0, high: int = 3) -> int:
        return int(self.rng.integers(low, high + 1))

    def where(self, i: int) -> str:
        place = self.scene.objects[i].place
        key = {"ground": "ground", "sky": "air"}.get(place, "anywhere")
        return self.pick(self.place[key])

    def expressions(self) -> list[tuple[int, str, int]]:
        """Every true (subject, predicate, object) wording of the scene's facts, inverses included."""
        out = []
        for s, pred, o in self.scene.facts:
            out.append((s, pred, o))
            inv = self.relations[pred]["inverse"]
            out.append((o, inv, s))
        return out

    # templates ------------------------------------------------------------------------------
    def single(self, detail: int | None = None) -> str:
        i = int(self.rng.integers(len(self.scene.objects)))
        text = self.np(i, self.detail() if detail is None else detail)
        r = self.rng.random()
        if r < 0.3:
            text = f"{self.pick(['a photo of', 'a picture of', 'an image of', 'there is'])} {text}"
        if self.rng.random() < 0.4:
            text = f"{text} {self.where(i)}"
        return text

    def relation(self, low: int = 0, high: int = 3) -> str | None:
        expr = self.expressions()
        if not expr:
            return None
        s, pred, o = self.pick(expr)
        phrase = self.pick(self.relations[pred]["phrases"])
        text = f"{self.np(s, self.detail(low, high))} {phrase} {self.np(o, self.detail(low, high))}"
        r = self.rng.random()
        if r < 0.2:
            text = f"there is {text}"
        elif r < 0.45:
            text = f"{text} {self.pick(self.place['anywhere'])}"
        return text

    def listing(self) -> str | None:
        objs = self.scene.objects
        if len(objs) < 2:
            return None
        groups: dict[str, list[int]] = {}
        for i in self.rng.permutation(len(objs)):
            groups.setdefault(objs[int(i)].kind, []).append(int(i))
        items = []
        for kind, idx in groups.items():
            if len(idx) == 1:
                items.append(self.np(idx[0], self.detail(0, 2)))
            else:
                same_color = len({objs[j].color for j in idx}) == 1
                adj = f"{objs[idx[0]].color} " if same_color and self.rng.random() < 0.6 else ""
                items.append(f"{NUMBERS[len(idx)]} {adj}{self.noun(kind, plural=True)}")
        text = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
        if self.rng.random() < 0.4:
            text = f"{self.pick(['a picture of', 'a scene with', 'a photo of'])} {text}"
        if len(items) == 1 and self.rng.random() < 0.5:
            text = f"{text} {self.pick(self.place['anywhere'])}"
        return text

    def shared(self) -> str | None:
        """'a X <phrase> a Y and a Z' when one subject stands in the same relation to two objects."""
        expr = self.expressions()
        by: dict[tuple[int, str], list[int]] = {}
        for s, pred, o in expr:
            by.setdefault((s, pred), []).append(o)
        keys = [k for k, v in by.items() if len(v) >= 2]
        if not keys:
            return None
        s, pred = self.pick(keys)
        o1, o2 = self.rng.permutation(by[(s, pred)])[:2]
        phrase = self.pick(self.relations[pred]["phrases"])
        return f"{self.np(s, self.detail(1, 3))} {phrase} {self.np(int(o1), self.detail(0, 2))} and " \
               f"{self.np(int(o2), self.detail(0, 2))}"

    def captions(self, n: int = CAPTIONS_PER_IMAGE) -> list[str]:
        """``n`` captions, distinct as token sequences, from short to detailed."""
        multi = len(self.scene.objects) > 1
        plan = ([lambda: self.single(self.detail(0, 1)), lambda: self.relation(2, 3) or self.single(3),
                 lambda: self.relation(0, 2), self.listing, self.shared] if multi else
                [lambda: self.single(0), lambda: self.single(1), lambda: self.single(2), lambda: self.single(3),
                 self.single])
        fallback = [self.single, self.relation, self.listing, self.shared]
        out, seen = [], set()
        for slot in range(n):
            for attempt in range(60):
                make = plan[slot % len(plan)] if attempt < 20 else self.pick(fallback)
                text = make()
                if text is None:
                    continue
                key = " ".join(tokenize(text))
                if key not in seen:
                    seen.add(key)
                    out.append(text)
                    break
            else:
                raise RuntimeError("caption grammar could not produce distinct captions")  # pragma: no cover
        order = self.rng.permutation(n)
        return [_finish(out[int(k)], self.rng) for k in order]


def _finish(text: str, rng: np.random.Generator) -> str:
    text = text[0].upper() + text[1:]
    return text + "." if rng.random() < 0.5 else text


# ----------------------------------------------------------------------------------------------
# The world on disk
# ----------------------------------------------------------------------------------------------


def _split_of_images(n: int, fractions: Sequence[float], seed: int) -> list[str]:
    n_val = int(round(n * fractions[1]))
    n_test = int(round(n * fractions[2]))
    if n >= 3:  # every split gets an image when there are enough
        n_val, n_test = max(n_val, 1 if fractions[1] > 0 else 0), max(n_test, 1 if fractions[2] > 0 else 0)
    n_train = n - n_val - n_test
    labels = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    perm = np.random.default_rng([seed, 1]).permutation(n)
    out = [""] * n
    for pos, i in enumerate(perm):
        out[int(i)] = labels[pos]
    return out


def _vg_object(o: dict) -> dict:
    return {k: o[k] for k in ("object_id", "x", "y", "w", "h", "names", "synsets")}


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False))


def build_records(n_images: int, seed: int, image_size: int, split_fractions: Sequence[float],
                  vocab: dict, image_dir: Path | None = None) -> tuple[list[dict], list[list[str]]]:
    """Sample and render every scene; write images to ``image_dir``; return per-image records."""
    held_out = choose_held_out_pairs(seed, vocab)
    forbidden = {(a, o) for a, o in held_out}
    splits = _split_of_images(n_images, split_fractions, seed)
    objects_info = _by_name(vocab["objects"])
    relations = {r["predicate"]: r for r in vocab["relations"]}
    records, object_id, rel_id = [], 1, 1
    for i in range(n_images):
        image_id = i + 1
        rng = np.random.default_rng([seed, 2, i])
        split = splits[i]
        force = None
        if split != "train" and rng.random() < 0.5:  # val/test oversample the held-out pairs
            force = held_out[int(rng.integers(len(held_out)))]
        scene = sample_scene(rng, vocab, image_size, forbidden if split == "train" else set(), force)
        pixels = render_scene(scene, image_size, rng, vocab)
        file_name = f"world_{image_id:06d}.jpg"
        if image_dir is not None:
            (image_dir / file_name).write_bytes(encode_jpeg(pixels))
        grammar = Grammar(scene, vocab, rng)
        captions = grammar.captions()
        objs = []
        for o in scene.objects:
            x, y, w, h = o.box
            kinfo = objects_info[o.kind]
            names = [grammar._word(o.kind, kinfo["synonyms"], 0.7)]
            attrs = [o.size, o.color] + ([o.texture] if o.texture != "plain" else [])
            objs.append({"object_id": object_id, "x": x, "y": y, "w": w, "h": h, "names": names,
                         "synsets": [kinfo["synset"]], "attributes": attrs, "kind": o.kind, "color": o.color,
                         "size": o.size, "texture": o.texture, "place": o.place})
            object_id += 1
        rels = []
        for a, b in ((i, j) for i in range(len(objs)) for j in range(i + 1, len(objs))):
            options = [(s, p, t) for s, p, t in grammar.expressions() if {s, t} == {a, b}]
            weights = np.array([3.0 if p == "on" else 1.0 for _, p, _ in options])
            s, p, t = options[int(rng.choice(len(options), p=weights / weights.sum()))]
            rels.append({"relationship_id": rel_id, "predicate": p, "synsets": list(relations[p]["synsets"]),
                         "subject": _vg_object(objs[s]), "object": _vg_object(objs[t])})
            rel_id += 1
        pairs = {(o["color"], o["kind"]) for o in objs} | {(o["texture"], o["kind"]) for o in objs}
        records.append({"image_id": image_id, "file_name": file_name, "split": split, "width": image_size,
                        "height": image_size, "scene": scene.background, "captions": captions, "objects": objs,
                        "relationships": rels,
                        "facts": [[s, p, t] for s, p, t in scene.facts],
                        "held_out_pairs": sorted([a, k] for a, k in pairs if (a, k) in forbidden)})
    return records, held_out


def _write_layouts(root: Path, records: list[dict]) -> None:
    images = root / "images"
    # COCO 2017: official caption files (train2017 = train, val2017 = val + test) and Karpathy's file
    coco = root / "coco"
    for folder in ("train2017", "val2017"):
        (coco / folder).mkdir(parents=True)
    info = {"description": "grounding embedded world (generated scenes)", "version": GENERATOR_VERSION,
            "year": 2017, "contributor": "data_modules.synthetic", "url": "", "date_created": ""}
    licenses = [{"id": 1, "name": "CC0 1.0 (generated images)",
                 "url": "https://creativecommons.org/publicdomain/zero/1.0/"}]
    for coco_set, members in (("train2017", ("train",)), ("val2017", ("val", "test"))):
        recs = [r for r in records if r["split"] in members]
        _write_json(coco / "annotations" / f"captions_{coco_set}.json", {
            "info": info, "licenses": licenses,
            "images": [{"license": 1, "file_name": r["file_name"], "coco_url": "", "height": r["height"],
                        "width": r["width"], "date_captured": "", "flickr_url": "", "id": r["image_id"]} for r in recs],
            "annotations": [{"image_id": r["image_id"], "id": 5 * (r["image_id"] - 1) + k + 1, "caption": c}
                            for r in recs for k, c in enumerate(r["captions"])]})
        for r in recs:
            _link(images / r["file_name"], coco / coco_set / r["file_name"])

    def karpathy(with_coco: bool) -> list[dict]:
        out = []
        for idx, r in enumerate(records):
            sentids = [5 * idx + k for k in range(len(r["captions"]))]
            entry = {"filepath": "train2017" if r["split"] == "train" else "val2017"} if with_coco else {}
            entry.update({"sentids": sentids, "filename": r["file_name"], "imgid": idx, "split": r["split"],
                          "sentences": [{"tokens": tokenize(c), "raw": c, "imgid": idx, "sentid": s}
                                        for c, s in zip(r["captions"], sentids)]})
            if with_coco:
                entry["cocoid"] = r["image_id"]
            out.append(entry)
        return out

    _write_json(coco / "dataset_coco.json", {"images": karpathy(True), "dataset": "coco"})

    # Flickr8k files + Flickr30k's Karpathy file
    flickr = root / "flickr"
    (flickr / "images").mkdir(parents=True)
    for r in records:
        _link(images / r["file_name"], flickr / "images" / r["file_name"])
    _write_json(flickr / "dataset_flickr30k.json", {"images": karpathy(False), "dataset": "flickr30k"})
    (flickr / "Flickr8k.token.txt").write_text(
        "".join(f"{r['file_name']}#{k}\t{c}\n" for r in records for k, c in enumerate(r["captions"])))
    for split, name in (("train", "trainImages"), ("val", "devImages"), ("test", "testImages")):
        (flickr / f"Flickr_8k.{name}.txt").write_text(
            "".join(f"{r['file_name']}\n" for r in records if r["split"] == split))

    # Visual Genome v1.4
    vg = root / "visual_genome"
    (vg / "VG_100K").mkdir(parents=True)
    for r in records:
        _link(images / r["file_name"], vg / "VG_100K" / f"{r['image_id']}.jpg")
    _write_json(vg / "image_data.json", [
        {"image_id": r["image_id"], "url": VG_URL.format(r["image_id"]), "width": r["width"], "height": r["height"],
         # the world's VG image i is its COCO image i, as real VG names the COCO images it holds (no Flickr photo ids)
         "coco_id": r["image_id"], "flickr_id": None} for r in records])
    _write_json(vg / "objects.json", [
        {"image_id": r["image_id"], "objects": [_vg_object(o) for o in r["objects"]]} for r in records])
    _write_json(vg / "attributes.json", [
        {"image_id": r["image_id"], "attributes": [{**_vg_object(o), "attributes": list(o["attributes"])}
                                                   for o in r["objects"]]} for r in records])
    _write_json(vg / "relationships.json", [
        {"image_id": r["image_id"], "relationships": r["relationships"]} for r in records])
    # the release's name -> synset dictionaries
    vocab = load_vocabulary()
    object_synsets = {}
    for o in vocab["objects"]:
        for word in [o["name"]] + [syn["word"] for syn in o["synonyms"]]:
            object_synsets[word] = o["synset"]
    _write_json(vg / "object_synsets.json", object_synsets)
    _write_json(vg / "attribute_synsets.json", {a["name"]: a["synset"] for group in ("sizes", "colors", "textures")
                                                for a in vocab[group]})
    _write_json(vg / "relationship_synsets.json", {r["predicate"]: r["synsets"][0] for r in vocab["relations"]})
    # not a file of the real release: the world's split, so a VG loader can keep held-out pairs out of train
    _write_json(vg / "splits.json", {s: [r["image_id"] for r in records if r["split"] == s] for s in SPLITS})


def _world_image(r: dict) -> dict:
    """One image's ground truth in world.json: split, scene, objects with attributes, relations."""
    out = {k: r[k] for k in ("image_id", "file_name", "split", "scene", "held_out_pairs")}
    out["objects"] = [{k: o[k] for k in ("object_id", "kind", "color", "size", "texture", "place", "x", "y", "w", "h")}
                      for o in r["objects"]]
    out["relationships"] = [{"relationship_id": rel["relationship_id"], "predicate": rel["predicate"],
                             "subject_id": rel["subject"]["object_id"], "object_id": rel["object"]["object_id"]}
                            for rel in r["relationships"]]
    ids = [o["object_id"] for o in r["objects"]]
    out["facts"] = [[ids[s], p, ids[t]] for s, p, t in r["facts"]]  # every true (subject, predicate, object)
    return out


def _summary(meta: dict) -> dict:
    return dict(meta["summary"])


def _world_key(n_images: int, seed: int, image_size: int, split_fractions: Sequence[float]) -> dict:
    return {"version": GENERATOR_VERSION, "seed": int(seed), "n_images": int(n_images),
            "image_size": int(image_size), "split_fractions": [float(f) for f in split_fractions]}


REQUIRED_FILES = ("coco/annotations/captions_train2017.json", "coco/annotations/captions_val2017.json",
                  "coco/dataset_coco.json", "flickr/dataset_flickr30k.json", "flickr/Flickr8k.token.txt",
                  "flickr/Flickr_8k.trainImages.txt", "flickr/Flickr_8k.devImages.txt",
                  "flickr/Flickr_8k.testImages.txt", "visual_genome/image_data.json", "visual_genome/objects.json",
                  "visual_genome/attributes.json", "visual_genome/relationships.json")


def _existing_world(out: Path) -> dict | None:
    try:
        meta = json.loads((out / "world.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not all((out / f).is_file() for f in REQUIRED_FILES):
        return None
    if sum(1 for _ in (out / "images").glob("*.jpg")) != meta.get("n_images"):
        return None
    return meta


def generate_world(out: str | os.PathLike, n_images: int = 200, seed: int = 0, image_size: int = 224,
                   split_fractions: Sequence[float] = (0.8, 0.1, 0.1), *, force: bool = False,
                   verbose: bool = False) -> dict:
    """Generate the embedded world under ``out`` (see the module docstring); return a summary dict.

    Deterministic: the same arguments give byte-identical files. A complete world with the same
    (version, seed, n_images, image_size, split_fractions) already at ``out`` is kept unless ``force``
    (the summary then has ``skipped: True``).
    """
    out = Path(out)
    if int(n_images) != n_images or n_images < 1:
        raise ValueError(f"n_images must be a positive integer, got {n_images!r}")
    if int(image_size) != image_size or image_size < 32:
        raise ValueError(f"image_size must be an integer >= 32 pixels, got {image_size!r}")
    fr = [float(f) for f in split_fractions]
    if len(fr) != 3 or min(fr) < 0 or abs(sum(fr) - 1.0) > 1e-6 or fr[0] <= 0:
        raise ValueError(f"split_fractions must be 3 non-negative numbers (train, val, test) summing to 1 with "
                         f"train > 0, got {tuple(split_fractions)!r}")
    key = _world_key(n_images, seed, image_size, fr)
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is a file, not a folder; choose another --out.")
        meta = _existing_world(out)
        if meta is not None and all(meta.get(k) == v for k, v in key.items()) and not force:
            summary = {**_summary(meta), "out": str(out), "skipped": True}
            if verbose:
                print(f"{out} already holds a complete world (seed {seed}, {n_images} images, {image_size} px, "
                      f"version {GENERATOR_VERSION}); skipped. Use --force to regenerate.")
            return summary
        if not (out / "world.json").exists() and any(out.iterdir()):
            raise FileExistsError(
                f"{out} is not empty and holds no embedded world (world.json); refusing to replace it. "
                "Choose another --out or empty the folder.")
    vocab = load_vocabulary()
    t0 = time.perf_counter()
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "images").mkdir()
        records, held_out = build_records(n_images, seed, image_size, fr, vocab, tmp / "images")
        _write_layouts(tmp, records)
        counts = {s: sum(r["split"] == s for r in records) for s in SPLITS}
        summary = {"n_images": n_images, "splits": counts,
                   "n_captions": sum(len(r["captions"]) for r in records),
                   "n_objects": sum(len(r["objects"]) for r in records),
                   "n_relationships": sum(len(r["relationships"]) for r in records),
                   "held_out_pairs": held_out,
                   "n_held_out_images": sum(bool(r["held_out_pairs"]) for r in records)}
        meta = {"generator": "data_modules.synthetic", **key, "vocabulary": vocab, "held_out_pairs": held_out,
                "summary": summary,
                "layouts": {"coco": "coco", "karpathy_coco": "coco/dataset_coco.json", "flickr": "flickr",
                            "visual_genome": "visual_genome"},
                "images": [_world_image(r) for r in records]}
        _write_json(tmp / "world.json", meta)  # written last: its presence marks a complete world
    seconds = time.perf_counter() - t0
    summary = {**summary, "out": str(out), "skipped": False, "seconds": round(seconds, 3)}
    if verbose:
        print(format_summary(summary))
    return summary


def format_summary(s: dict) -> str:
    sp = s["splits"]
    pairs = ", ".join(f"{a} {o}" for a, o in s["held_out_pairs"])
    return (f"Embedded world in {s['out']}: {s['n_images']} images (train {sp['train']} / val {sp['val']} / "
            f"test {sp['test']}), {s['n_captions']} captions, {s['n_objects']} objects, "
            f"{s['n_relationships']} relationships; held out of train: {pairs} "
            f"({s['n_held_out_images']} val/test images show one) [{s.get('seconds', 0):.1f} s]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False,
        prog="python -m data_modules.synthetic",
        description="Generate the embedded world: captioned scenes with scene graphs in the COCO 2017 + Karpathy, "
                    "Flickr8k/30k and Visual Genome v1.4 layouts. Deterministic for a given seed.")
    parser.add_argument("--out", required=True, help="output folder (replaced atomically when complete)")
    parser.add_argument("--images", type=int, default=200, help="number of scenes (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels (default 224)")
    parser.add_argument("--split-fractions", type=float, nargs=3, default=(0.8, 0.1, 0.1),
                        metavar=("TRAIN", "VAL", "TEST"), help="split fractions (default 0.8 0.1 0.1)")
    parser.add_argument("--force", action="store_true", help="regenerate even if OUT holds this world already")
    args = parser.parse_args(argv)
    try:
        generate_world(args.out, args.images, args.seed, args.size, tuple(args.split_fractions), force=args.force,
                       verbose=True)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
