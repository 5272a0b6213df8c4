"""The embedded world generator (data_modules.synthetic): determinism, the four real layouts,
captions, boxes against the drawn pixels and the spatial relations, WordNet names, held-out
attribute-object pairs, skip / force / atomic behaviour and the CLI.

Round trips through the real loaders (COCO, Flickr, Visual Genome DataModules) on the same
``tiny_world`` live in tests/test_datamodules.py.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from data_modules import synthetic
from data_modules.synthetic import (
    Scene,
    SceneObject,
    choose_held_out_pairs,
    generate_world,
    load_vocabulary,
    render_background,
    render_object,
)

SPLITS = ("train", "val", "test")


def _json(path: Path):
    return json.loads(path.read_text())


def _world(root: Path) -> dict:
    return _json(root / "world.json")


# ----------------------------------------------------------------------------------------------
# Determinism
# ----------------------------------------------------------------------------------------------
def test_same_seed_gives_identical_files_and_another_seed_differs(tmp_path):
    a, b, c = (generate_world(tmp_path / name, n_images=10, seed=s, image_size=48)
               for name, s in (("a", 3), ("b", 3), ("c", 4)))
    assert not a["skipped"] and a["n_images"] == 10
    files = ["world.json", "images/world_000001.jpg", "images/world_000007.jpg", "coco/dataset_coco.json",
             "coco/annotations/captions_train2017.json", "coco/annotations/captions_val2017.json",
             "flickr/Flickr8k.token.txt", "visual_genome/relationships.json", "visual_genome/attributes.json"]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    for f in ("images/world_000001.jpg", "flickr/Flickr8k.token.txt", "visual_genome/objects.json"):
        assert (tmp_path / "a" / f).read_bytes() != (tmp_path / "c" / f).read_bytes(), f
    # the whole tree, not only the sampled files: same names, same bytes
    tree = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert tree == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in tree)


# ----------------------------------------------------------------------------------------------
# The four layouts
# ----------------------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_vg_object(o: dict, size: int) -> None:
    assert all(_is_int(o[k]) for k in ("object_id", "x", "y", "w", "h"))
    assert isinstance(o["names"], list) and o["names"] and all(isinstance(n, str) for n in o["names"])
    assert isinstance(o["synsets"], list) and len(o["synsets"]) == 1
    assert o["w"] > 0 and o["h"] > 0 and o["x"] >= 0 and o["y"] >= 0
    assert o["x"] + o["w"] <= size and o["y"] + o["h"] <= size


def test_layouts_exist_with_the_real_schemas(tiny_world):
    world = _world(tiny_world)
    size, n = world["image_size"], world["n_images"]
    assert (world["seed"], n, size, world["version"]) == (0, 48, 64, synthetic.GENERATOR_VERSION)
    images = world["images"]
    split = {r["file_name"]: r["split"] for r in images}
    assert Counter(split.values()) == Counter({"train": 38, "val": 5, "test": 5})
    files = sorted(p.name for p in (tiny_world / "images").iterdir())
    assert files == [f"world_{i:06d}.jpg" for i in range(1, n + 1)] == sorted(split)

    # COCO official: train2017 = train, val2017 = val + test
    ann_ids = set()
    for coco_set, members in (("train2017", {"train"}), ("val2017", {"val", "test"})):
        data = _json(tiny_world / "coco" / "annotations" / f"captions_{coco_set}.json")
        assert set(data) >= {"info", "licenses", "images", "annotations"}
        names = [im["file_name"] for im in data["images"]]
        assert sorted(names) == sorted(f for f, s in split.items() if s in members)
        for im in data["images"]:
            assert _is_int(im["id"]) and im["width"] == im["height"] == size
            assert (tiny_world / "coco" / coco_set / im["file_name"]).is_file()
        ids = {im["id"] for im in data["images"]}
        per_image = Counter(a["image_id"] for a in data["annotations"])
        assert set(per_image) == ids and set(per_image.values()) == {5}
        for a in data["annotations"]:
            assert _is_int(a["id"]) and isinstance(a["caption"], str) and a["id"] not in ann_ids
            ann_ids.add(a["id"])

    # Karpathy files (COCO with filepath + cocoid, Flickr30k without)
    for path, dataset in ((tiny_world / "coco" / "dataset_coco.json", "coco"),
                          (tiny_world / "flickr" / "dataset_flickr30k.json", "flickr30k")):
        data = _json(path)
        assert data["dataset"] == dataset and len(data["images"]) == n
        sentids = set()
        for idx, e in enumerate(data["images"]):
            assert e["imgid"] == idx and e["split"] == split[e["filename"]]
            assert len(e["sentids"]) == len(e["sentences"]) == 5
            for s, sid in zip(e["sentences"], e["sentids"]):
                assert s["sentid"] == sid and s["imgid"] == idx and sid not in sentids
                sentids.add(sid)
                assert s["tokens"] == re.findall(r"[a-z0-9]+", s["raw"].lower())
            if dataset == "coco":
                assert e["filepath"] == ("train2017" if e["split"] == "train" else "val2017")
                assert (tiny_world / "coco" / e["filepath"] / e["filename"]).is_file() and _is_int(e["cocoid"])
            else:
                assert "filepath" not in e and (tiny_world / "flickr" / "images" / e["filename"]).is_file()

    # Flickr8k token file and split lists
    lines = (tiny_world / "flickr" / "Flickr8k.token.txt").read_text().splitlines()
    assert len(lines) == 5 * n
    for line in lines:
        m = re.fullmatch(r"(world_\d{6}\.jpg)#([0-4])\t(.+)", line)
        assert m, line
    for s, name in (("train", "trainImages"), ("val", "devImages"), ("test", "testImages")):
        listed = (tiny_world / "flickr" / f"Flickr_8k.{name}.txt").read_text().split()
        assert sorted(listed) == sorted(f for f, sp in split.items() if sp == s)

    # Visual Genome v1.4
    vg = tiny_world / "visual_genome"
    image_data = _json(vg / "image_data.json")
    assert [d["image_id"] for d in image_data] == [r["image_id"] for r in images]
    for d in image_data:
        # the same scene as the COCO image of that id (cross-dataset identity, grounding.training_images)
        assert d["url"].endswith(f"/VG_100K/{d['image_id']}.jpg") and d["coco_id"] == d["image_id"]
        assert d["flickr_id"] is None
        assert (d["width"], d["height"]) == (size, size) and (vg / "VG_100K" / f"{d['image_id']}.jpg").is_file()
    objects, attributes, relationships = (_json(vg / f) for f in ("objects.json", "attributes.json",
                                                                   "relationships.json"))
    all_ids = [o["object_id"] for e in objects for o in e["objects"]]
    assert len(all_ids) == len(set(all_ids)) > n  # unique across the world
    for e_obj, e_att, e_rel in zip(objects, attributes, relationships):
        assert e_obj["image_id"] == e_att["image_id"] == e_rel["image_id"]
        ids = {o["object_id"] for o in e_obj["objects"]}
        assert 1 <= len(ids) <= 4
        for o in e_obj["objects"]:
            _check_vg_object(o, size)
        for a in e_att["attributes"]:
            _check_vg_object(a, size)
            assert a["attributes"] and all(isinstance(x, str) for x in a["attributes"])
        k = len(ids)
        assert len(e_rel["relationships"]) == k * (k - 1) // 2  # one relation per pair of objects
        for r in e_rel["relationships"]:
            assert _is_int(r["relationship_id"]) and isinstance(r["predicate"], str) and isinstance(r["synsets"], list)
            for side in ("subject", "object"):
                _check_vg_object(r[side], size)
                assert r[side]["object_id"] in ids
    assert _json(vg / "splits.json") == {s: [r["image_id"] for r in images if r["split"] == s] for s in SPLITS}


def test_layout_images_are_links_or_copies_of_the_one_image(tiny_world):
    src = tiny_world / "images" / "world_000001.jpg"
    world = _world(tiny_world)
    coco_set = "train2017" if world["images"][0]["split"] == "train" else "val2017"
    for dst in (tiny_world / "coco" / coco_set / src.name, tiny_world / "flickr" / "images" / src.name,
                tiny_world / "visual_genome" / "VG_100K" / "1.jpg"):
        assert dst.read_bytes() == src.read_bytes()
        assert os.stat(dst).st_ino == os.stat(src).st_ino  # hard links on one file system


# ----------------------------------------------------------------------------------------------
# Captions
# ----------------------------------------------------------------------------------------------
def test_five_different_grammatical_captions_per_image(tiny_world):
    data = _json(tiny_world / "coco" / "dataset_coco.json")
    vocab = load_vocabulary()
    nouns = {o["name"] for o in vocab["objects"]} | {s["word"].split()[-1] for o in vocab["objects"]
                                                      for s in o["synonyms"]}
    nouns |= {o["plural"] for o in vocab["objects"]} | {s["plural"].split()[-1] for o in vocab["objects"]
                                                         for s in o["synonyms"]}
    words = Counter()
    for e in data["images"]:
        token_seqs = [" ".join(s["tokens"]) for s in e["sentences"]]
        assert len(set(token_seqs)) == 5, token_seqs
        for s in e["sentences"]:
            raw = s["raw"]
            assert raw[0].isupper() and "  " not in raw and raw.strip() == raw
            assert s["tokens"][0] in ("a", "an", "there", "two", "three", "four"), raw
            assert nouns & set(s["tokens"]), raw  # every caption names an object
            for det, nxt in zip(s["tokens"], s["tokens"][1:]):  # a / an agree with the next word
                if det == "a":
                    assert nxt[0] not in "aeiou", raw
                if det == "an":
                    assert nxt[0] in "aeiou", raw
            words.update(s["tokens"])
    # the grammar varies wording and order: synonyms and both directions of a relation occur
    assert {"left", "right"} <= set(words)
    synonyms = {s["word"] for o in vocab["objects"] for s in o["synonyms"] if " " not in s["word"]}
    assert len(synonyms & set(words)) >= 3
    assert words["and"] > 0 and (words["on"] + words["above"] + words["below"] + words["under"]) > 0


def test_captions_describe_the_scene(tiny_world):
    """Every colour word in a caption belongs to an object of that image, and every noun to its kinds."""
    world = _world(tiny_world)
    vocab = load_vocabulary()
    color_words = {c["name"]: c["name"] for c in vocab["colors"]}
    color_words.update({s["word"]: c["name"] for c in vocab["colors"] for s in c["synonyms"]})
    noun_kind = {}
    for o in vocab["objects"]:
        for w in [o["name"], o["plural"]] + [s["word"] for s in o["synonyms"]] + [s["plural"] for s in o["synonyms"]]:
            noun_kind[w.split()[-1]] = o["name"]
    data = _json(tiny_world / "coco" / "dataset_coco.json")
    for rec, e in zip(world["images"], data["images"]):
        colors = {o["color"] for o in rec["objects"]}
        kinds = {o["kind"] for o in rec["objects"]}
        for s in e["sentences"]:
            toks = s["tokens"]
            assert {color_words[t] for t in toks if t in color_words} <= colors, (s["raw"], colors)
            # "coffee" only appears in "coffee cup"
            assert {noun_kind[t] for t in toks if t in noun_kind and t != "coffee"} <= kinds, (s["raw"], kinds)


# ----------------------------------------------------------------------------------------------
# Boxes and relations
# ----------------------------------------------------------------------------------------------
def test_relationships_hold_for_the_drawn_boxes(tiny_world):
    world = _world(tiny_world)
    size = world["image_size"]
    rels = _json(tiny_world / "visual_genome" / "relationships.json")
    seen = Counter()
    for rec, e in zip(world["images"], rels):
        boxes = {o["object_id"]: o for o in rec["objects"]}
        triples = [(r["subject"], r["predicate"], r["object"]) for r in e["relationships"]]
        triples += [(boxes[s], p, boxes[o]) for s, p, o in rec["facts"]]
        for s, p, o in triples:
            seen[p] += 1
            sx1, sy1, ox1, oy1 = s["x"] + s["w"], s["y"] + s["h"], o["x"] + o["w"], o["y"] + o["h"]
            overlap_x = min(sx1, ox1) - max(s["x"], o["x"])
            if p == "left of":
                assert sx1 <= o["x"] + 1, (s, o)
            elif p == "right of":
                assert ox1 <= s["x"] + 1, (s, o)
            elif p == "next to":
                assert min(abs(o["x"] - sx1), abs(s["x"] - ox1)) <= 0.12 * size, (s, o)
            elif p == "above":
                assert sy1 <= o["y"] and overlap_x > 0, (s, o)
            elif p == "below":  # under something on it, or under something floating above it
                assert s["y"] > o["y"] and oy1 <= s["y"] + 0.35 * s["h"] and overlap_x > 0, (s, o)
            elif p == "on":  # resting on the top face of the supporting object
                assert o["y"] <= sy1 <= o["y"] + 0.35 * o["h"] and overlap_x > 0, (s, o)
            else:
                raise AssertionError(f"unknown predicate {p}")
    assert {"left of", "next to", "above"} <= set(seen)


def _single_object_scene(kind="ball", color="red", texture="plain", size=96):
    vocab = load_vocabulary()
    obj = SceneObject(kind, color, "large", texture, x=30.3, y=20.6, w=40.0, h=40.0 / synthetic.SHAPES[kind][0],
                      place="sky")
    scene = Scene("room", 0.55 * size, [obj])
    rgb = np.asarray(next(c for c in vocab["colors"] if c["name"] == color)["rgb"], np.float32)
    return scene, obj, rgb


@pytest.mark.parametrize("kind", sorted(synthetic.SHAPES))
def test_drawn_box_is_where_the_pixels_changed(kind):
    size = 96
    scene, obj, rgb = _single_object_scene(kind)
    rng = np.random.default_rng(0)
    background = render_background(scene, size, rng)
    canvas = background.copy()
    box = render_object(canvas, obj, rgb, rng)
    assert np.isfinite(canvas).all() and canvas.min() >= 0 and canvas.max() <= 1
    changed = np.abs(canvas - background).max(axis=-1) > 0.5 / 255
    rows, cols = np.flatnonzero(changed.any(axis=1)), np.flatnonzero(changed.any(axis=0))
    x, y, w, h = box
    # the box covers the pixels at least half covered; anti-aliased edge pixels lie at most 1 px outside
    assert cols[0] >= x - 1 and cols[-1] <= x + w and rows[0] >= y - 1 and rows[-1] <= y + h
    assert abs(cols[0] - x) <= 1 and abs(rows[0] - y) <= 1
    assert abs(x - obj.x) <= 1.5 and abs(y - obj.y) <= 1.5 and abs(w - obj.w) <= 2 and abs(h - obj.h) <= 2


def test_object_colour_and_texture_are_drawn():
    size = 96
    scene, obj, rgb = _single_object_scene("ball", "red", "plain")
    rng = np.random.default_rng(1)
    canvas = render_background(scene, size, rng)
    x, y, w, h = render_object(canvas, obj, rgb, rng)
    centre = canvas[y + h // 4: y + 3 * h // 4, x + w // 4: x + 3 * w // 4].reshape(-1, 3).mean(0)
    assert centre[0] > 0.5 and centre[0] > 2.5 * centre[1] and centre[0] > 2.5 * centre[2]  # red
    spread = {}
    for texture in ("plain", "striped", "dotted", "checkered"):
        scene, obj, rgb = _single_object_scene("box", "blue", texture)
        rng = np.random.default_rng(1)
        canvas = render_background(scene, size, rng)
        x, y, w, h = render_object(canvas, obj, rgb, rng)
        front = canvas[y + int(0.45 * h): y + h - 2, x + 2: x + int(0.78 * w)]  # the box's front face
        spread[texture] = float(front.std(axis=(0, 1)).mean())
    assert all(spread[t] > 3 * spread["plain"] for t in ("striped", "dotted", "checkered")), spread


# ----------------------------------------------------------------------------------------------
# WordNet
# ----------------------------------------------------------------------------------------------
def _lemma(word: str) -> str:
    return word.replace(" ", "_").lower()


def test_vocabulary_words_are_wordnet_synsets_and_synonyms_are_related():
    from grounding.lexicon import wordnet

    wn = wordnet()
    vocab = load_vocabulary()
    for group in ("objects", "colors", "sizes", "textures"):
        for item in vocab[group]:
            syn = wn.synset(item["synset"])
            assert _lemma(item["name"]) in [lem.lower() for lem in syn.lemma_names()], item["name"]
            for s in item["synonyms"]:
                other = wn.synset(s["synset"])
                assert _lemma(s["word"]) in [lem.lower() for lem in other.lemma_names()], s
                related = {"lemma": [syn], "hypernym": syn.hypernyms(), "hyponym": syn.hyponyms()}[s["relation"]]
                assert other in related, (item["name"], s)
    for rel in vocab["relations"]:
        for name in rel["synsets"]:
            wn.synset(name)
        assert rel["inverse"] in {r["predicate"] for r in vocab["relations"]}
    assert set(synthetic.SHAPES) == {o["name"] for o in vocab["objects"]}


def test_world_synsets_are_the_vocabulary_synsets(tiny_world):
    vocab = load_vocabulary()
    obj_synsets = {o["synset"] for o in vocab["objects"]}
    rel_synsets = {r["predicate"]: r["synsets"] for r in vocab["relations"]}
    name_of = {o["synset"]: {o["name"]} | {s["word"] for s in o["synonyms"]} for o in vocab["objects"]}
    for e in _json(tiny_world / "visual_genome" / "objects.json"):
        for o in e["objects"]:
            assert o["synsets"][0] in obj_synsets and o["names"][0] in name_of[o["synsets"][0]]
    for e in _json(tiny_world / "visual_genome" / "relationships.json"):
        for r in e["relationships"]:
            assert r["synsets"] == rel_synsets[r["predicate"]]
    assert _world(tiny_world)["vocabulary"] == vocab
    vg = tiny_world / "visual_genome"
    from grounding.lexicon import wordnet

    wn = wordnet()
    for f in ("object_synsets.json", "attribute_synsets.json", "relationship_synsets.json"):
        for word, synset in _json(vg / f).items():
            assert isinstance(word, str) and wn.synset(synset)
    attr_synsets = _json(vg / "attribute_synsets.json")
    assert all(a in attr_synsets for e in _json(vg / "attributes.json") for o in e["attributes"]
               for a in o["attributes"])


# ----------------------------------------------------------------------------------------------
# Held-out attribute-object pairs
# ----------------------------------------------------------------------------------------------
def _mentions(pair: list[str], vocab: dict) -> re.Pattern:
    """A caption mentions (attribute, object) when the attribute modifies that noun in one noun phrase."""
    attr, kind = pair
    obj = next(o for o in vocab["objects"] if o["name"] == kind)
    nouns = [obj["name"], obj["plural"]] + [w for s in obj["synonyms"] for w in (s["word"], s["plural"])]
    noun = "(?:" + "|".join(sorted(map(re.escape, nouns), key=len, reverse=True)) + ")"
    colors = {c["name"]: [c["name"]] + [s["word"] for s in c["synonyms"]] for c in vocab["colors"]}
    if attr in colors:
        return re.compile(rf"\b(?:{'|'.join(colors[attr])})\s+{noun}\b")
    tex = next(t for t in vocab["textures"] if t["name"] == attr)
    adjs = "|".join([tex["name"]] + [s["word"] for s in tex["synonyms"]])
    any_color = "|".join(w for ws in colors.values() for w in ws)
    withs = "|".join(map(re.escape, tex["with"]))
    return re.compile(rf"\b(?:{adjs})\s+(?:(?:{any_color})\s+)?{noun}\b|\b{noun}\s+(?:{withs})\b")


def test_held_out_pairs_never_reach_training(tiny_world):
    world = _world(tiny_world)
    vocab = load_vocabulary()
    pairs = world["held_out_pairs"]
    assert pairs == choose_held_out_pairs(0, vocab) and len(pairs) == 4
    assert len({o for _, o in pairs}) == 4 and len({a for a, _ in pairs}) == 4
    held = {tuple(p) for p in pairs}
    split = {r["image_id"]: r["split"] for r in world["images"]}
    # world.json ground truth
    for r in world["images"]:
        shown = {(o["color"], o["kind"]) for o in r["objects"]} | {(o["texture"], o["kind"]) for o in r["objects"]}
        assert sorted(map(list, shown & held)) == r["held_out_pairs"]
        if r["split"] == "train":
            assert not shown & held
    assert sum(bool(r["held_out_pairs"]) for r in world["images"] if r["split"] != "train") >= 3
    # Visual Genome attributes of the training images (the world's splits.json)
    synset_kind = {o["synset"]: o["name"] for o in vocab["objects"]}
    for e in _json(tiny_world / "visual_genome" / "attributes.json"):
        if split[e["image_id"]] == "train":
            for a in e["attributes"]:
                kind = synset_kind[a["synsets"][0]]
                assert not any((attr, kind) in held for attr in a["attributes"]), (e["image_id"], a)
    # captions: never in train, and the same detector finds them in val/test
    patterns = [_mentions(p, vocab) for p in pairs]
    data = _json(tiny_world / "coco" / "dataset_coco.json")
    found = 0
    for e in data["images"]:
        for s in e["sentences"]:
            hit = any(p.search(" ".join(s["tokens"])) for p in patterns)
            if e["split"] == "train":
                assert not hit, s["raw"]
            found += hit
    assert found >= 3


def test_held_out_pairs_depend_on_the_seed():
    vocab = load_vocabulary()
    assert choose_held_out_pairs(0, vocab) == choose_held_out_pairs(0, vocab)
    assert len({str(choose_held_out_pairs(s, vocab)) for s in range(5)}) > 1


# ----------------------------------------------------------------------------------------------
# Skipping, forcing, atomicity, bad input, CLI
# ----------------------------------------------------------------------------------------------
def test_complete_world_is_kept_and_force_or_new_parameters_regenerate(tmp_path):
    out = tmp_path / "world"
    first = generate_world(out, n_images=6, seed=0, image_size=40)
    stamp = (out / "world.json").stat().st_mtime_ns
    again = generate_world(out, n_images=6, seed=0, image_size=40)
    assert again["skipped"] and (out / "world.json").stat().st_mtime_ns == stamp
    assert {k: again[k] for k in ("n_images", "splits", "n_captions")} == \
        {k: first[k] for k in ("n_images", "splits", "n_captions")}
    forced = generate_world(out, n_images=6, seed=0, image_size=40, force=True)
    assert not forced["skipped"] and (out / "world.json").stat().st_mtime_ns != stamp
    other = generate_world(out, n_images=7, seed=0, image_size=40)
    assert not other["skipped"] and _world(out)["n_images"] == 7 and len(list((out / "images").iterdir())) == 7
    # a world missing a layout file is not complete: regenerated
    (out / "visual_genome" / "objects.json").unlink()
    assert not generate_world(out, n_images=7, seed=0, image_size=40)["skipped"]
    assert (out / "visual_genome" / "objects.json").is_file()


def test_interrupted_generation_leaves_no_world(tmp_path, monkeypatch):
    def boom(root, records):
        (root / "coco").mkdir()
        (root / "coco" / "half.json").write_text("{")
        raise KeyboardInterrupt("simulated interruption")

    out = tmp_path / "world"
    monkeypatch.setattr(synthetic, "_write_layouts", boom)
    with pytest.raises(KeyboardInterrupt):
        generate_world(out, n_images=4, seed=0, image_size=40)
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no world, no temporary left behind
    # an interrupted regeneration keeps the previous complete world untouched
    monkeypatch.undo()
    generate_world(out, n_images=4, seed=0, image_size=40)
    before = (out / "world.json").read_bytes()
    monkeypatch.setattr(synthetic, "_write_layouts", boom)
    with pytest.raises(KeyboardInterrupt):
        generate_world(out, n_images=4, seed=0, image_size=40, force=True)
    assert (out / "world.json").read_bytes() == before and not (out / "coco" / "half.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["world"]


def test_refuses_to_replace_a_folder_that_is_not_a_world(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="not empty and holds no embedded world"):
        generate_world(out, n_images=2, image_size=40)
    assert (out / "thesis.tex").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert generate_world(empty, n_images=2, image_size=40)["n_images"] == 2  # an empty folder is fine


@pytest.mark.parametrize("kwargs,match", [
    ({"n_images": 0}, "n_images"), ({"image_size": 16}, "image_size"),
    ({"split_fractions": (0.5, 0.1, 0.1)}, "split_fractions"), ({"split_fractions": (0.0, 0.5, 0.5)}, "train > 0"),
])
def test_bad_arguments_are_explained(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_world(tmp_path / "w", **kwargs)
    assert not (tmp_path / "w").exists()


def test_split_fractions_and_small_worlds(tmp_path):
    s = generate_world(tmp_path / "w", n_images=20, image_size=40, split_fractions=(0.5, 0.25, 0.25))
    assert s["splits"] == {"train": 10, "val": 5, "test": 5}
    s = generate_world(tmp_path / "tiny", n_images=3, image_size=40)
    assert s["splits"] == {"train": 1, "val": 1, "test": 1}


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli_world"
    assert synthetic.main(["--out", str(out), "--images", "5", "--seed", "2", "--size", "40"]) == 0
    text = capsys.readouterr().out
    assert "5 images (train" in text and "25 captions" in text and "held out of train" in text
    assert _world(out)["seed"] == 2
    assert synthetic.main(["--out", str(out), "--images", "5", "--seed", "2", "--size", "40"]) == 0
    assert "skipped" in capsys.readouterr().out
    assert synthetic.main(["--out", str(out), "--images", "5", "--seed", "2", "--size", "40", "--force"]) == 0
    assert "Embedded world in" in capsys.readouterr().out
    assert synthetic.main(["--out", str(out), "--images", "5", "--size", "8"]) == 2
    assert "image_size" in capsys.readouterr().err


def test_real_loaders_serve_no_held_out_pair_in_training(tiny_world):
    """Round trip through the real DataModules: their training splits never show a held-out pair."""
    from data_modules import CocoCaptionsDataModule, FlickrDataModule, VisualGenomeDataModule

    world = _world(tiny_world)
    vocab = load_vocabulary()
    patterns = [_mentions(p, vocab) for p in world["held_out_pairs"]]
    small = dict(text_encoder="tiny-random", transform={"image_size": 32, "resize_size": 32}, batch_size=2)
    coco = CocoCaptionsDataModule(root=str(tiny_world / "coco"), **small)
    flickr = FlickrDataModule(root=str(tiny_world / "flickr"), captions_file="Flickr8k.token.txt", **small)
    for dm in (coco, flickr):
        dm.setup()
        train = dm.datasets["train"]
        assert len(train.image_paths) == sum(r["split"] == "train" for r in world["images"])
        caps = [" ".join(synthetic.tokenize(c)) for cs in train.captions for c in cs]
        assert len(caps) == 5 * len(train.image_paths) and not any(p.search(c) for p in patterns for c in caps)
        held = [" ".join(synthetic.tokenize(c)) for s in ("val", "test") for cs in dm.datasets[s].captions for c in cs]
        assert any(p.search(c) for p in patterns for c in held)  # the pairs are there to be measured
    vg = VisualGenomeDataModule(root=str(tiny_world / "visual_genome"), **small)
    vg.setup()
    by_id = {r["image_id"]: r for r in world["images"]}
    assert not any(by_id[int(i)]["held_out_pairs"] for i in vg.datasets["train"].image_ids)
    assert any(by_id[int(i)]["held_out_pairs"] for s in ("val", "test") for i in vg.datasets[s].image_ids)
