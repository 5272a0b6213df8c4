"""DataModules: real formats on tiny hand-written fixtures, the generated world, real Flickr8k,
and clear failures on a missing root, a missing image, malformed JSON and a corrupt JPEG."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from data_modules import (
    CocoCaptionsDataModule,
    CorruptImageError,
    FlickrDataModule,
    MalformedDataError,
    MissingDataError,
    VisualGenomeDataModule,
    VocabularyLabelMapping,
)
from data_modules.captions import EpochSampler
from data_modules.file_checks import iter_json_array
from data_modules.options import CaptionLoaderOptions, ImageTransform, LoaderOptions, SplitSubsets
from data_modules.visual_genome import VGFilters, VGSplit
from grounding.nets import constructor_args

TOK = "tiny-random"  # same WordPiece tokenizer as minilm, nothing to download
SMALL = dict(text_encoder=TOK, transform=ImageTransform(image_size=32, resize_size=36), batch_size=3)


# --------------------------------------------------------------------------------------------
# Fixture writers: tiny datasets in the real on-disk formats
# --------------------------------------------------------------------------------------------
def write_jpeg(path: Path, seed: int, size: int = 40) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)).save(path, "JPEG")
    return path


def caps(i: int, n: int = 5) -> list[str]:
    return [f"image {i} caption {j} a dog runs" for j in range(n)]


def write_flickr_token(root: Path, n: int = 10) -> dict:
    """Flickr8k layout: token file, three split lists, images/. Images 0-5 train, 6-7 dev, 8-9 test;
    image 9 is listed but has no captions; an extra captioned image is in no list; one caption id names no photo
    (Flickr8k.token.txt's ``2258277193_586949ec62.jpg.1``)."""
    names = [f"{1000 + i}_abc.jpg" for i in range(n)]
    for i, name in enumerate(names):
        write_jpeg(root / "images" / name, i)
    extra = "5555_zzz.jpg"
    write_jpeg(root / "images" / extra, 99)
    lines = [f"{name}#{j}\t{c}" for i, name in enumerate(names[:-1]) for j, c in enumerate(caps(i))]
    lines += [f"{extra}#0\tnot in any split", f"{names[0]}.1#0\ta malformed id"]
    (root / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    (root / "Flickr_8k.trainImages.txt").write_text("\n".join(names[:6]) + "\n")
    (root / "Flickr_8k.devImages.txt").write_text("\n".join(names[6:8]) + "\n")
    (root / "Flickr_8k.testImages.txt").write_text("\n".join(names[8:]) + "\n")
    return {"names": names}


def karpathy_entry(i: int, split: str, filename: str, filepath: str | None = None, n_caps: int = 5) -> dict:
    e = {"filename": filename, "imgid": i, "cocoid": i, "split": split, "sentids": list(range(n_caps)),
         "sentences": [{"raw": c, "tokens": c.split(), "imgid": i, "sentid": j} for j, c in enumerate(caps(i, n_caps))]}
    if filepath is not None:
        e["filepath"] = filepath
    return e


def write_flickr_karpathy(root: Path) -> None:
    splits = ["train"] * 5 + ["val"] * 2 + ["test"] * 2
    entries = []
    for i, s in enumerate(splits):
        write_jpeg(root / "images" / f"{i}.jpg", i)
        entries.append(karpathy_entry(i, s, f"{i}.jpg", n_caps=5 if i != 3 else 3))
    (root / "dataset_flickr30k.json").write_text(json.dumps({"images": entries, "dataset": "flickr30k"}))


def write_coco(root: Path) -> None:
    """Official 2017 files (6 train images, 4 val images) plus a Karpathy file over the same ids:
    val2017 ids 6,7 -> val, 8,9 -> test; train2017 id 5 is restval."""
    sets = {"train2017": range(0, 6), "val2017": range(6, 10)}
    ann_id = 0
    for name, ids in sets.items():
        images, anns = [], []
        for i in ids:
            fname = f"{i:012d}.jpg"
            write_jpeg(root / name / fname, i)
            images.append({"id": i, "file_name": fname, "width": 48, "height": 40})
            for c in caps(i):
                anns.append({"id": ann_id, "image_id": i, "caption": c})
                ann_id += 1
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / f"captions_{name}.json").write_text(json.dumps({"images": images, "annotations": anns}))
    split_of = {i: "train" for i in range(5)} | {5: "restval", 6: "val", 7: "val", 8: "test", 9: "test"}
    entries = [karpathy_entry(i, split_of[i], f"{i:012d}.jpg", "train2017" if i < 6 else "val2017") for i in range(10)]
    (root / "dataset_coco.json").write_text(json.dumps({"images": entries, "dataset": "coco"}))


def vg_obj(oid, name, synset, x=1, y=2, w=3, h=4, key="names"):
    return {"object_id": oid, "x": x, "y": y, "w": w, "h": h,
            key: [name] if key == "names" else name, "synsets": [synset] if synset else []}


def write_vg(root: Path, n: int = 12) -> None:
    """Image i: elephant(10i) in water(10i+1), man(10i+2) near elephant, plus a tree(10i+3) in no triplet.
    Odd images add a third triplet (man holding a stick known only from the relationship); even images
    repeat "elephant in water" and add "water near water". Image 1's subject uses the singular "name" key."""
    image_data, objects, rels, attrs = [], [], [], []
    for i in range(1, n + 1):
        write_jpeg(root / ("VG_100K" if i % 2 else "VG_100K_2") / f"{i}.jpg", i)
        image_data.append({"image_id": i, "url": f"https://x/{'VG_100K' if i % 2 else 'VG_100K_2'}/{i}.jpg",
                           "width": 48, "height": 40, "coco_id": None, "flickr_id": None})
        b = 10 * i
        ele, water, man, tree = (vg_obj(b, "elephant", "elephant.n.01"), vg_obj(b + 1, "water", "water.n.01"),
                                 vg_obj(b + 2, "Man", "man.n.01"), vg_obj(b + 3, "tree", "tree.n.01"))
        objects.append({"image_id": i, "objects": [ele, water, man, tree]})
        subj = vg_obj(b, "elephant", "elephant.n.01", key="name") if i == 1 else ele
        r = [{"relationship_id": b, "predicate": "IN", "synsets": ["in.r.01"], "subject": subj, "object": water},
             {"relationship_id": b + 1, "predicate": "near", "synsets": [], "subject": man, "object": ele}]
        if i % 2 == 0:  # a repeated triplet and a self-relation: never served
            r.append({"relationship_id": b + 3, "predicate": "in", "synsets": [], "subject": ele, "object": water})
            r.append({"relationship_id": b + 4, "predicate": "near", "synsets": [], "subject": water, "object": water})
        if i % 2:
            # an object only present inside the relationship (real VG has these)
            r.append({"relationship_id": b + 2, "predicate": "holding", "synsets": [],
                      "subject": man, "object": vg_obj(b + 4, "stick", "stick.n.01")})
        rels.append({"image_id": i, "relationships": r})
        attrs.append({"image_id": i, "attributes": [dict(ele, attributes=["Large", "black", "old"]),
                                                     dict(water, attributes=["blue"])]})
    for name, data in [("image_data", image_data), ("objects", objects), ("relationships", rels),
                       ("attributes", attrs)]:
        (root / f"{name}.json").write_text(json.dumps(data))


def first(loader):
    return next(iter(loader))


# --------------------------------------------------------------------------------------------
# Flickr
# --------------------------------------------------------------------------------------------
def test_flickr_token_format_splits_and_batches(tmp_path, caplog):
    info = write_flickr_token(tmp_path)
    dm = FlickrDataModule(root=str(tmp_path), **SMALL)
    dm.setup("fit")
    # image 9 is listed for test but has no captions: dropped; the unlisted captioned image is in no split
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [6, 2, 1]
    assert [p.name for p in dm.test_dataset.image_paths] == [info["names"][8]]
    assert dm.train_dataset.captions[0] == caps(0)
    # skipped and counted, not an error: the unlisted photo, and the id that names no photo
    assert dm.unlisted_captioned == {"photos": 1, "no_photo": 1}
    # ... and the listed image without captions is said, not dropped in silence
    assert dm.listed_uncaptioned["test"] == {"photos": 1, "no_photo": 0}
    assert dm.listed_uncaptioned["train"] == dm.listed_uncaptioned["val"] == {"photos": 0, "no_photo": 0}
    with (tmp_path / "Flickr_8k.devImages.txt").open("a") as f:
        f.write("typo_1234.jpg\n")
    with caplog.at_level(logging.WARNING, logger="data_modules.flickr"):
        FlickrDataModule(root=str(tmp_path), **SMALL).setup("fit")
    said = [r.getMessage() for r in caplog.records if "Flickr_8k.devImages.txt" in r.getMessage()]
    assert len(said) == 1 and "1 image(s)" in said[0] and "typo_1234.jpg" in said[0] and "1 with no photo" in said[0]

    batch = first(dm.train_dataloader())
    assert batch["images"].shape == (3, 3, 32, 32) and batch["images"].dtype == torch.float32
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["input_ids"].shape == batch["attention_mask"].shape and batch["input_ids"].shape[0] == 3
    for idx, cap in zip(batch["image_index"].tolist(), batch["captions"]):
        assert cap in dm.train_dataset.captions[idx]  # one of that image's own captions
    # padding to the longest in the batch: some row uses the full width
    assert batch["attention_mask"].sum(1).max() == batch["input_ids"].shape[1]

    ev = first(dm.val_dataloader())
    assert ev["images"].shape[0] == 2 and ev["input_ids"].shape[0] == 10
    assert ev["caption_image_index"].tolist() == [0] * 5 + [1] * 5
    assert ev["captions"] == caps(6) + caps(7)
    assert first(dm.predict_dataloader())["image_index"].tolist() == [0]


FLICKR8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flickr8k"


@pytest.mark.skipif(not (FLICKR8K / "images-224").is_dir(), reason="../shared/data/flickr8k/images-224 is absent")
def test_real_flickr8k_official_lists():
    """The real benchmark's split: the official lists give 6,000 / 1,000 / 1,000 photos with 5 captions each; the
    91 captioned photos outside the lists and the malformed id are skipped with a count."""
    dm = FlickrDataModule(root=str(FLICKR8K), captions_file="Flickr8k.token.txt", image_dir="images-224")
    splits = dm.read_splits(FLICKR8K)
    assert {k: len(v) for k, v in splits.items()} == {"train": 6000, "val": 1000, "test": 1000}
    assert {len(c) for sp in splits.values() for c in sp.captions} == {5}
    assert dm.unlisted_captioned == {"photos": 91, "no_photo": 1}


def test_flickr_karpathy_format_and_index_maps(tmp_path):
    write_flickr_karpathy(tmp_path)
    dm = FlickrDataModule(root=str(tmp_path), **SMALL, eval_batch_size=2)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [5, 2, 2]
    train = dm.train_dataset
    assert train.num_captions == [5, 5, 5, 3, 5]
    assert train.caption_image_index.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 3 + [4] * 5
    assert train.caption_offsets.tolist() == [0, 5, 10, 15, 18, 23]
    # eval batches over a whole split reproduce the split-level index map
    test = dm.test_dataset
    got = torch.cat([b["caption_image_index"] for b in dm.test_dataloader()])
    assert torch.equal(got, test.caption_image_index)


def test_caption_sampling_is_seeded_and_varies_by_epoch(tmp_path):
    write_flickr_karpathy(tmp_path)

    def captions(seed, epoch):
        dm = FlickrDataModule(root=str(tmp_path), **SMALL, seed=seed)
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return [(int(i), c) for b in loader for i, c in zip(b["image_index"], b["captions"])]

    a, b = captions(0, 0), captions(0, 0)
    assert a == b
    assert sorted(i for i, _ in a) == list(range(5))  # each image once per epoch
    assert captions(0, 1) != a and captions(1, 0) != a


def test_every_caption_once_an_epoch_with_captions_per_epoch_all(tmp_path):
    write_flickr_karpathy(tmp_path)

    def pairs(epoch, **kw):
        dm = FlickrDataModule(root=str(tmp_path), **SMALL, **kw)
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return dm, [(int(i), c) for b in loader for i, c in zip(b["image_index"], b["captions"])]

    every = CaptionLoaderOptions(captions_per_epoch="all")
    dm, a = pairs(0, loader=every)
    expected = sorted((i, c) for i, cs in enumerate(dm.train_dataset.captions) for c in cs)
    assert len(expected) > len(dm.train_dataset) and sorted(a) == expected  # each (image, caption) exactly once
    assert pairs(0, loader=every)[1] == a and pairs(1, loader=every)[1] != a
    assert len(pairs(0)[1]) == len(dm.train_dataset)  # the default: one caption an image
    with pytest.raises(ValueError, match="loader.captions_per_epoch must be one of"):
        FlickrDataModule(root=str(tmp_path), **SMALL, loader={"captions_per_epoch": "every"})


def test_epoch_sampler_covers_captions_uniformly():
    sampler = EpochSampler(4, shuffle=True, seed=3, num_choices=[5, 1, 2, 3])
    seen = {i: set() for i in range(4)}
    for epoch in range(60):
        sampler.set_epoch(epoch)
        items = list(sampler)
        assert sorted(i for i, _ in items) == [0, 1, 2, 3]
        for i, c in items:
            seen[i].add(c)
    assert seen == {0: set(range(5)), 1: {0}, 2: {0, 1}, 3: {0, 1, 2}}


# --------------------------------------------------------------------------------------------
# COCO
# --------------------------------------------------------------------------------------------
def test_coco_official_layout_val_serves_val_and_test(tmp_path):
    write_coco(tmp_path)
    dm = CocoCaptionsDataModule(root=str(tmp_path), **SMALL)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [6, 4, 4]
    assert dm.val_dataset.image_paths == dm.test_dataset.image_paths
    assert dm.val_dataset.image_paths[0] == tmp_path / "val2017" / "000000000006.jpg"
    assert dm.train_dataset.captions[2] == caps(2)


@pytest.mark.parametrize("layout,karpathy_file", [("karpathy", None), ("official", "dataset_coco.json")])
@pytest.mark.parametrize("use_restval", [True, False])
def test_coco_karpathy_splits(tmp_path, layout, karpathy_file, use_restval):
    write_coco(tmp_path)
    dm = CocoCaptionsDataModule(root=str(tmp_path), layout=layout, karpathy_file=karpathy_file,
                                use_restval=use_restval, **SMALL)
    dm.setup()
    names = {s: [p.name for p in dm.datasets[s].image_paths] for s in ("train", "val", "test")}
    assert names["train"] == [f"{i:012d}.jpg" for i in range(6 if use_restval else 5)]
    assert names["val"] == ["000000000006.jpg", "000000000007.jpg"]
    assert names["test"] == ["000000000008.jpg", "000000000009.jpg"]
    assert dm.test_dataset.image_paths[0].parent.name == "val2017"
    assert dm.test_dataset.captions[1] == caps(9)


def test_coco_subsets(tmp_path):
    write_coco(tmp_path)
    dm = CocoCaptionsDataModule(root=str(tmp_path), subsets=SplitSubsets(train=3, test=1), seed=5, **SMALL)
    dm.setup()
    assert len(dm.train_dataset) == 3 and len(dm.test_dataset) == 1 and len(dm.val_dataset) == 4
    dm2 = CocoCaptionsDataModule(root=str(tmp_path), subsets=SplitSubsets(train=3, test=1), seed=5, **SMALL)
    dm2.setup()
    assert dm.train_dataset.image_paths == dm2.train_dataset.image_paths


# --------------------------------------------------------------------------------------------
# The shared option groups (data_modules/options.py)
# --------------------------------------------------------------------------------------------
def test_every_datamodule_takes_the_shared_transform_and_loader_groups():
    """The image transform and the loader block are defined once: every image DataModule takes them as the same
    dataclasses (the caption readers and COMPOSER's add the training sampler to the loader, and the caption readers
    the subsets), and none keeps a flat copy of their fields."""
    import dataclasses
    import inspect

    from data_modules.image_folder import ImageFolderDataModule
    from grounding.composer.data import ComposerDataModule
    from grounding.nets import option_groups

    captions = (FlickrDataModule, CocoCaptionsDataModule)
    for cls in (*captions, VisualGenomeDataModule, ImageFolderDataModule, ComposerDataModule):
        groups = option_groups(cls)
        assert groups["transform"] is ImageTransform, cls
        assert issubclass(groups["loader"], LoaderOptions), cls
        assert (groups.get("subsets") is SplitSubsets) == (cls in captions), cls
        flat = set(inspect.signature(cls).parameters)
        for group in (ImageTransform, CaptionLoaderOptions, SplitSubsets):
            assert not flat & {f.name for f in dataclasses.fields(group)}, (cls, group)
        assert len(flat) <= 15, cls


def test_a_group_given_as_a_mapping_or_its_fields_given_flat(tmp_path):
    """Python callers (and runs recorded before the groups) may give a group as a mapping or its fields flat, also
    under their former names (``train_subset``): the DataModule builds the same thing."""
    write_coco(tmp_path)
    grouped = CocoCaptionsDataModule(root=str(tmp_path), text_encoder=TOK, transform=ImageTransform(32, 36),
                                     loader=CaptionLoaderOptions(num_workers=0, drop_last=True),
                                     subsets=SplitSubsets(train=3), seed=5)
    mapping = CocoCaptionsDataModule(root=str(tmp_path), text_encoder=TOK, transform={"image_size": 32, "resize_size": 36},
                                     loader={"drop_last": True}, subsets={"train": 3}, seed=5)
    flat = CocoCaptionsDataModule(root=str(tmp_path), text_encoder=TOK, image_size=32, resize_size=36, drop_last=True,
                                  train_subset=3, seed=5)
    for dm in (grouped, mapping, flat):
        assert (dm.transform_options, dm.loader_options, dm.subsets) == (
            grouped.transform_options, grouped.loader_options, grouped.subsets)
        assert (dm.image_size, dm.resize_size, dm.drop_last, dm.train_subset) == (32, 36, True, 3)
        dm.setup()
        assert dm.train_dataset.image_paths == grouped.train_dataset.image_paths
    with pytest.raises(ValueError, match="subsets.test must be >= 0"):
        SplitSubsets(test=-1)


# --------------------------------------------------------------------------------------------
# Visual Genome
# --------------------------------------------------------------------------------------------
def vg_module(root, **kw):
    args = dict(text_encoder=TOK, image_size=32, resize_size=32, batch_size=4, val_size=2, test_size=2, seed=0)
    args.update(kw)  # the split's and filters' fields flat here (grounding.nets.constructor_args groups them)
    return VisualGenomeDataModule(root=str(root), **constructor_args(VisualGenomeDataModule, args))


def test_visual_genome_batch_layout(tmp_path):
    write_vg(tmp_path)
    dm = vg_module(tmp_path)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [8, 2, 2]
    ids = [set(dm.datasets[s].image_ids.tolist()) for s in ("train", "val", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    mapping = dm.label_mapping_in_use
    # default mapping: built from the training split's own synsets and predicates
    assert mapping.object_classes == sorted(["elephant.n.01", "water.n.01", "man.n.01", "tree.n.01", "stick.n.01"])
    assert mapping.relation_labels == ["holding", "in", "near"]

    ds = dm.train_dataset
    row = list(ds.image_ids).index(1)
    item = ds[row]
    assert item["image"].shape == (3, 32, 32)
    assert item["object_descriptions"] == ["large black elephant", "blue water", "man", "tree", "stick"]
    assert item["object_names"] == ["elephant", "water", "man", "tree", "stick"]
    assert item["triplets"].tolist() == [[0, 1, mapping.relation_label("in", [])],
                                         [2, 0, mapping.relation_label("near", [])],
                                         [2, 4, mapping.relation_label("holding", [])]]
    assert item["predicates"] == ["in", "near", "holding"]
    assert item["object_boxes"][0].tolist() == [1, 2, 3, 4]

    batch = first(dm.val_dataloader())
    n_obj = batch["object_labels"].shape[0]
    assert batch["images"].shape == (2, 3, 32, 32)
    assert batch["object_input_ids"].shape[0] == n_obj == batch["object_attention_mask"].shape[0]
    assert batch["object_input_ids"].dtype == torch.long
    assert batch["object_image_index"].tolist() == sorted(batch["object_image_index"].tolist())
    assert len(batch["object_names"]) == n_obj and len(batch["predicates"]) == batch["triplet_predicate"].shape[0]
    # triplet indices point into the flattened objects of the same image
    s, o = batch["triplet_subject"], batch["triplet_object"]
    assert torch.equal(batch["object_image_index"][s], batch["object_image_index"][o])
    assert all(batch["object_names"][i] == "elephant"
               for i, p in zip(s.tolist(), batch["predicates"]) if p == "in")
    assert all(batch["object_names"][i] == "water" for i, p in zip(o.tolist(), batch["predicates"]) if p == "in")
    assert (batch["object_labels"] >= 0).all() and (batch["triplet_predicate"] >= 0).all()


class OnlyElephantsIn:
    """A custom mapping (the VG-BERT cleaning plugs in the same way): one class, one relation."""

    object_classes = ["animal", "water"]
    relation_labels = ["in"]

    def object_label(self, names, synsets):
        return {"elephant.n.01": 0, "water.n.01": 1}.get(synsets[0] if synsets else "", -1)

    def relation_label(self, predicate, synsets):
        return 0 if predicate == "in" else -1


def test_visual_genome_custom_mapping_drop_and_min_triplets(tmp_path):
    write_vg(tmp_path)
    dm = vg_module(tmp_path, label_mapping=OnlyElephantsIn())
    dm.setup()
    item = dm.train_dataset[0]
    assert item["object_names"] == ["elephant", "water"] and item["object_labels"].tolist() == [0, 1]
    assert item["triplets"].tolist() == [[0, 1, 0]]
    # every image has only one mapped triplet: min_triplets=2 leaves nothing and says so
    with pytest.raises(MalformedDataError, match="min_triplets"):
        vg_module(tmp_path, label_mapping=OnlyElephantsIn(), min_triplets=2).setup()
    # drop_unmapped=False serves everything with -1 labels
    dm = vg_module(tmp_path, label_mapping=OnlyElephantsIn(), drop_unmapped=False)
    dm.setup()
    item = dm.train_dataset[0]
    assert item["object_labels"].tolist()[:4] == [0, 1, -1, -1]
    assert item["triplets"][:, 2].tolist()[:2] == [0, -1]


class NearOnly(OnlyElephantsIn):
    relation_labels = ["near"]

    def relation_label(self, predicate, synsets):
        return 0 if predicate == "near" else -1


def test_visual_genome_unmapped_objects_in_kept_triplets_stay(tmp_path):
    write_vg(tmp_path)
    dm = vg_module(tmp_path, label_mapping=NearOnly())
    dm.setup()
    item = dm.train_dataset[0]
    # man is unmapped but "man near elephant" is kept: served with -1; the unmapped tree is dropped
    assert item["object_names"] == ["elephant", "water", "man"]
    assert item["object_labels"].tolist() == [0, 1, -1]
    assert item["triplets"].tolist() == [[2, 0, 0]] and item["predicates"] == ["near"]


def test_visual_genome_split_carried_by_the_mapping(tmp_path):
    write_vg(tmp_path)
    mapping = OnlyElephantsIn()
    mapping.split = {"train": [1, 2, 3, 4, 5, 6], "val": [], "test": [7, 8]}
    # The official choice (issue 12, item 9): the train/test split validates on its test images.
    dm = vg_module(tmp_path, label_mapping=mapping, validation="test")
    dm.setup()
    assert [dm.datasets[s].image_ids.tolist() for s in ("train", "val", "test")] == [[1, 2, 3, 4, 5, 6], [7, 8], [7, 8]]
    # The default carves val_size (2) validation images out of the training images, seeded.
    dm = vg_module(tmp_path, label_mapping=mapping)
    dm.setup()
    train, val, test = (dm.datasets[s].image_ids.tolist() for s in ("train", "val", "test"))
    assert len(val) == 2 and sorted(train + val) == [1, 2, 3, 4, 5, 6] and test == [7, 8]
    again = vg_module(tmp_path, label_mapping=mapping)
    again.setup()
    assert again.datasets["val"].image_ids.tolist() == val
    # A split file whose val repeats its test images (vg_cleaning's train/test split) has no val of its own.
    (tmp_path / "split.json").write_text(json.dumps({"train": [1, 2, 3, 4, 5, 6], "val": [7, 8], "test": [7, 8]}))
    from_file = vg_module(tmp_path, split_file="split.json", label_mapping=mapping)
    from_file.setup()
    assert from_file.datasets["val"].image_ids.tolist() == val
    # val_size 0 keeps its documented meaning: the test images validate.
    zero = vg_module(tmp_path, split_file="split.json", label_mapping=mapping, val_size=0)
    zero.setup()
    assert zero.datasets["val"].image_ids.tolist() == [7, 8]
    with pytest.raises(ValueError, match="validation must be one of"):
        vg_module(tmp_path, validation="val")


def test_visual_genome_seeded_split_keeps_listed_images_in_training(tmp_path):
    write_vg(tmp_path)
    everything = vg_module(tmp_path)
    everything.setup()
    ids = {s: everything.datasets[s].image_ids.tolist() for s in ("train", "val", "test")}
    listed = ids["val"] + ids["test"]  # the images the unrestricted seeded split evaluates on
    (tmp_path / "held.txt").write_text("".join(f"vg:{i}\n" for i in listed))
    dm = vg_module(tmp_path, exclude_eval_images=str(tmp_path / "held.txt"))
    dm.setup()
    val, test = dm.datasets["val"].image_ids.tolist(), dm.datasets["test"].image_ids.tolist()
    assert len(val) == len(test) == 2 and not set(val + test) & set(listed)
    assert set(listed) <= set(dm.datasets["train"].image_ids.tolist())  # drawn into training, not lost


def test_visual_genome_with_the_vg_bert_cleaning(tiny_world, tmp_path):
    from data_modules.vg_cleaning import clean_visual_genome, split_file_for

    vg_root = tiny_world / "visual_genome"
    out = tmp_path / "clean.json"
    result = clean_visual_genome(vg_root, out, min_predicate_count=0, min_triplets=2, test_size=0.2, verbose=False)
    args = dict(root=str(vg_root), label_mapping=str(out), filters=VGFilters(min_triplets=2), text_encoder=TOK,
                image_size=32, resize_size=32, batch_size=4)
    # the official model selection: val = test
    dm = VisualGenomeDataModule(split=VGSplit(split_file=str(split_file_for(out)), validation="test"), **args)
    dm.setup()
    assert dm.relation_labels == result["relation_labels"] and len(dm.object_classes) == 55
    split = json.loads(split_file_for(out).read_text())
    for s in ("train", "val", "test"):
        assert dm.datasets[s].image_ids.tolist() == sorted(split[s])
    carved = VisualGenomeDataModule(split=VGSplit(split_file=str(split_file_for(out))), **args)  # default: carved
    carved.setup()
    train, val = carved.datasets["train"].image_ids.tolist(), carved.datasets["val"].image_ids.tolist()
    assert val and not set(val) & set(train) and sorted(train + val) == sorted(split["train"])
    kept = {img["image_id"]: img for img in result["images"]}
    for s in ("train", "test"):
        ds = dm.datasets[s]
        for i in range(len(ds)):
            item = ds.annotations(i)
            img = kept[int(ds.image_ids[i])]
            assert len(item["triplets"]) == len(img["triplets"])  # same triplets kept as the cleaning
            assert sorted(item["triplets"][:, 2].tolist()) == sorted(t[1] for t in img["triplets"])
    batch = first(dm.train_dataloader())
    assert (batch["triplet_predicate"] >= 0).all()


def test_visual_genome_min_triplets_max_objects_and_split_file(tmp_path):
    write_vg(tmp_path)
    dm = vg_module(tmp_path, min_triplets=3, val_size=0, test_size=2)
    dm.setup()
    odd = {i for i in range(1, 13) if i % 2}
    assert all(set(dm.datasets[s].image_ids.tolist()) <= odd for s in ("train", "val", "test"))
    assert dm.val_dataset.image_ids.tolist() == dm.test_dataset.image_ids.tolist()  # val_size 0: val = test
    # the cap keeps objects that take part in triplets first (the tree is dropped)
    capped = vg_module(tmp_path, max_objects=3)
    capped.setup()
    item = capped.train_dataset[list(capped.train_dataset.image_ids).index(2)]
    assert item["object_names"] == ["elephant", "water", "man"] and len(item["triplets"]) == 2
    (tmp_path / "split.json").write_text(json.dumps({"train": [1, 2, 3, 4], "val": [5], "test": [6, 7]}))
    dm = vg_module(tmp_path, split_file="split.json")
    dm.setup()
    assert [dm.datasets[s].image_ids.tolist() for s in ("train", "val", "test")] == [[1, 2, 3, 4], [5], [6, 7]]
    assert capped.train_dataset.image_paths[0].parent.name in ("VG_100K", "VG_100K_2")
    assert all(p.parent.name == ("VG_100K" if int(p.stem) % 2 else "VG_100K_2")
               for p in capped.train_dataset.image_paths)


def test_visual_genome_split_is_seeded(tmp_path):
    write_vg(tmp_path)
    a, b, c = vg_module(tmp_path, seed=1), vg_module(tmp_path, seed=1), vg_module(tmp_path, seed=2)
    for dm in (a, b, c):
        dm.setup()
    assert a.test_dataset.image_ids.tolist() == b.test_dataset.image_ids.tolist()
    assert (a.test_dataset.image_ids.tolist(), a.val_dataset.image_ids.tolist()) != \
        (c.test_dataset.image_ids.tolist(), c.val_dataset.image_ids.tolist())


def test_visual_genome_index_cache(tmp_path, monkeypatch):
    import data_modules.visual_genome as vg

    write_vg(tmp_path / "vg")
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vg, "CACHE_MIN_BYTES", 0)
    first_dm = vg_module(tmp_path / "vg")
    first_dm.setup()
    cached = list((tmp_path / "cache" / "visual_genome").glob("index-*.npz"))
    assert len(cached) == 1

    def no_parse(*a, **k):
        raise AssertionError("parsed again although the cache is valid")

    monkeypatch.setattr(vg, "parse_visual_genome", no_parse)
    again = vg_module(tmp_path / "vg")
    again.setup()
    a, b = first_dm.index, again.index
    for name in vg.VGIndex._ARRAYS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert (a.object_keys, a.descriptions, a.predicate_keys, a.image_urls) == \
        (b.object_keys, b.descriptions, b.predicate_keys, b.image_urls)
    assert first_dm.train_dataset[1]["object_descriptions"] == again.train_dataset[1]["object_descriptions"]
    # an edited annotation file is a different key: parsed again
    rel = tmp_path / "vg" / "relationships.json"
    rel.write_text(rel.read_text() + " ")
    with pytest.raises(AssertionError, match="parsed again"):
        vg_module(tmp_path / "vg").setup()


def test_every_datamodule_is_exported():
    import importlib
    import pkgutil

    from lightning.pytorch import LightningDataModule

    import data_modules

    for info in pkgutil.iter_modules(data_modules.__path__):
        module = importlib.import_module(f"data_modules.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, type) and issubclass(obj, LightningDataModule) and obj.__module__ == module.__name__:
                assert getattr(data_modules, name) is obj, name


@pytest.mark.parametrize("indent", [None, 1])
def test_iter_json_array_streams_exactly_what_json_loads(tmp_path, indent):
    rng = np.random.default_rng(0)
    path = tmp_path / "a.json"
    for _ in range(30):
        data = [{"id": int(rng.integers(100)), "s": "a\nb" * int(rng.integers(3)), "l": list(range(int(rng.integers(9))))}
                for _ in range(int(rng.integers(0, 12)))]
        text = json.dumps(data, indent=indent)
        path.write_text(text)
        chunk = int(rng.integers(1, 40))  # elements straddle chunk boundaries
        assert list(iter_json_array(path, "T", "schema", "hint", chunk_chars=chunk)) == data
        cut = int(rng.integers(0, len(text)))
        path.write_text(text[:cut])
        with pytest.raises(MalformedDataError, match="a.json"):
            list(iter_json_array(path, "T", "schema", "hint", chunk_chars=chunk))
    path.write_text('[{"a": 1},\n {"b": \n 2 x}]')
    with pytest.raises(MalformedDataError, match="line 3, column 4"):  # where json.loads says it is
        list(iter_json_array(path, "T", "schema", "hint", chunk_chars=5))
    path.write_text('{"a": []}')
    with pytest.raises(MalformedDataError, match="holds an object where a JSON list"):
        list(iter_json_array(path, "T", "schema", "hint"))


def test_vocabulary_label_mapping():
    m = VocabularyLabelMapping(["dog.n.01", "table"], ["on", "next to"])
    assert m.object_label(["puppy"], ["dog.n.01"]) == 0
    assert m.object_label(["Table"], []) == 1 and m.object_label(["cat"], ["cat.n.01"]) == -1
    assert m.relation_label("Next  To", []) == 1 and m.relation_label("under", []) == -1


# --------------------------------------------------------------------------------------------
# Failures: missing root, missing image, malformed JSON, corrupt JPEG
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CocoCaptionsDataModule, FlickrDataModule, VisualGenomeDataModule])
def test_missing_root_is_named_with_layout(tmp_path, cls):
    root = tmp_path / "nowhere"
    with pytest.raises(MissingDataError, match="nowhere") as e:
        cls(root=str(root), text_encoder=TOK).setup()
    assert "Expected layout" in str(e.value) and "data_modules.synthetic" in str(e.value)


def test_missing_annotation_file_is_named(tmp_path):
    write_coco(tmp_path)
    (tmp_path / "annotations" / "captions_val2017.json").unlink()
    with pytest.raises(MissingDataError, match="captions_val2017.json"):
        CocoCaptionsDataModule(root=str(tmp_path), **SMALL).setup()
    write_vg(tmp_path / "vg")
    (tmp_path / "vg" / "relationships.json").unlink()
    with pytest.raises(MissingDataError, match="relationships.json"):
        vg_module(tmp_path / "vg").setup()


def test_missing_image_is_named(tmp_path):
    write_coco(tmp_path / "coco")
    (tmp_path / "coco" / "val2017" / "000000000007.jpg").unlink()
    with pytest.raises(MissingDataError, match=r"val2017/000000000007\.jpg"):
        CocoCaptionsDataModule(root=str(tmp_path / "coco"), **SMALL).setup()
    write_flickr_token(tmp_path / "f8k")
    (tmp_path / "f8k" / "images" / "1002_abc.jpg").unlink()
    with pytest.raises(MissingDataError, match=r"images/1002_abc\.jpg"):
        FlickrDataModule(root=str(tmp_path / "f8k"), **SMALL).setup()
    write_vg(tmp_path / "vg")
    (tmp_path / "vg" / "VG_100K_2" / "4.jpg").unlink()
    with pytest.raises(MissingDataError, match=r"4\.jpg"):
        vg_module(tmp_path / "vg", val_size=0.3, test_size=0.3).setup()


@pytest.mark.parametrize("which", ["coco", "coco_karpathy", "flickr_karpathy", "vg_objects", "vg_split"])
def test_malformed_json_names_file_and_position(tmp_path, which):
    if which.startswith("coco"):
        write_coco(tmp_path)
        bad = tmp_path / ("dataset_coco.json" if which == "coco_karpathy" else "annotations/captions_train2017.json")
        make = lambda: CocoCaptionsDataModule(root=str(tmp_path), layout="karpathy" if which == "coco_karpathy"
                                              else "official", **SMALL)
    elif which == "flickr_karpathy":
        write_flickr_karpathy(tmp_path)
        bad = tmp_path / "dataset_flickr30k.json"
        make = lambda: FlickrDataModule(root=str(tmp_path), **SMALL)
    else:
        write_vg(tmp_path)
        bad = tmp_path / ("objects.json" if which == "vg_objects" else "split.json")
        if which == "vg_split":
            bad.write_text("{}")
        make = lambda: vg_module(tmp_path, split_file="split.json" if which == "vg_split" else None)
    text = bad.read_text()
    bad.write_text(text[: len(text) // 2])  # a truncated download
    with pytest.raises(MalformedDataError, match=bad.name) as e:
        make().setup()
    assert "line 1, column" in str(e.value) and "Expected" in str(e.value)


def test_json_with_wrong_schema_is_explained(tmp_path):
    write_coco(tmp_path)
    path = tmp_path / "annotations" / "captions_train2017.json"
    data = json.loads(path.read_text())
    del data["annotations"][3]["caption"]
    path.write_text(json.dumps(data))
    with pytest.raises(MalformedDataError, match=r"captions_train2017\.json lacks key\(s\) \['caption'\] at annotations\[3\]"):
        CocoCaptionsDataModule(root=str(tmp_path), **SMALL).setup()
    write_vg(tmp_path / "vg")
    rel = tmp_path / "vg" / "relationships.json"
    data = json.loads(rel.read_text())
    del data[2]["relationships"][1]["predicate"]
    rel.write_text(json.dumps(data))
    with pytest.raises(MalformedDataError, match=r"relationships\.json lacks key\(s\) \['predicate'\] at \[2\]\.relationships\[1\]"):
        vg_module(tmp_path / "vg").setup()
    (tmp_path / "f8k").mkdir()
    write_flickr_token(tmp_path / "f8k")
    token = tmp_path / "f8k" / "Flickr8k.token.txt"
    token.write_text(token.read_text() + "1000_abc.jpg a caption without a tab\n")
    line = len(token.read_text().splitlines())  # the appended one
    with pytest.raises(MalformedDataError, match=rf"Flickr8k\.token\.txt:{line} is malformed"):
        FlickrDataModule(root=str(tmp_path / "f8k"), **SMALL).setup()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_jpeg_is_reported_by_path(tmp_path, damage):
    write_flickr_token(tmp_path)
    victim = tmp_path / "images" / "1006_abc.jpg"  # first val image
    data = victim.read_bytes()
    victim.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a jpeg at all" * 20, "empty": b""}[damage])
    dm = FlickrDataModule(root=str(tmp_path), **SMALL)
    dm.setup()  # existence is checked up front; decoding happens at load time
    with pytest.raises(CorruptImageError, match=r"1006_abc\.jpg"):
        first(dm.val_dataloader())


def test_corrupt_jpeg_in_a_worker_keeps_type_and_path(tmp_path):
    write_vg(tmp_path)
    dm = vg_module(tmp_path, num_workers=1, split_file="split.json")
    (tmp_path / "split.json").write_text(json.dumps({"train": [1, 2, 3], "val": [5], "test": [6]}))
    (tmp_path / "VG_100K" / "5.jpg").write_bytes(b"\xff\xd8\xff" + b"\x00" * 50)
    dm.setup()
    with pytest.raises(CorruptImageError, match=r"VG_100K/5\.jpg"):
        first(dm.val_dataloader())


# --------------------------------------------------------------------------------------------
# Configuration: the CLI selects DataModules by class path (jsonargparse reads the typed args)
# --------------------------------------------------------------------------------------------
def test_classes_parse_from_config(tmp_path):
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    write_vg(tmp_path)
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningDataModule, "data")
    cfg = parser.parse_object({"data": {"class_path": "data_modules.VisualGenomeDataModule",
                                        "init_args": {"root": str(tmp_path), "filters": {"min_triplets": 5},
                                                      "split": {"val_size": 0, "test_size": 0.25}, "text_encoder": TOK,
                                                      "transform": {"mean": [0.5, 0.5, 0.5]},
                                                      "loader": {"num_workers": 0},
                                                      "label_mapping": {
                                                          "class_path": "data_modules.VocabularyLabelMapping",
                                                          "init_args": {"object_classes": ["man.n.01"],
                                                                        "relation_labels": ["near"]}}}}})
    dm = parser.instantiate(cfg).data
    assert isinstance(dm, VisualGenomeDataModule) and dm.min_triplets == 5 and dm.test_size == 0.25
    assert dm.label_mapping.relation_labels == ["near"] and dm.mean == (0.5, 0.5, 0.5)
    assert dm.resize_size == 224  # Visual Genome's own default of the shared group (the caption readers': 256)
    for cls in ("CocoCaptionsDataModule", "FlickrDataModule"):
        cfg = parser.parse_object({"data": {"class_path": f"data_modules.{cls}",
                                            "init_args": {"root": "data/world", "batch_size": 7,
                                                          "subsets": {"test": 5}, "loader": {"captions_per_epoch": "all"}}}})
        dm = parser.instantiate(cfg).data
        assert (dm.batch_size, dm.test_subset, dm.captions_per_epoch, dm.resize_size) == (7, 5, "all", 256)


# --------------------------------------------------------------------------------------------
# Real data: the first 1,000 Flickr8k photos
# --------------------------------------------------------------------------------------------
@pytest.mark.shared_data
def test_flickr8k_real_photos(shared_data):
    root = shared_data / "flickr8k"
    dm = FlickrDataModule(root=str(root), captions_file="Flickr8k.token.1000img.txt", text_encoder=TOK,
                          batch_size=2, eval_batch_size=2)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [753, 113, 125]
    assert all(n == 5 for n in dm.train_dataset.num_captions)
    batch = first(dm.val_dataloader())
    assert batch["images"].shape == (2, 3, 224, 224) and batch["input_ids"].shape[0] == 10
    assert batch["images"].std() > 0.3  # real photos, normalised with ImageNet statistics
    # the full token file lists 8,000 split images, most of them absent here: named, with the fix
    with pytest.raises(MissingDataError, match=r"images/\S+\.jpg") as e:
        FlickrDataModule(root=str(root), text_encoder=TOK).setup()
    assert "Flickr8k.token.1000img.txt" in str(e.value)


# --------------------------------------------------------------------------------------------
# Round trip through the generated world (data_modules.synthetic)
# --------------------------------------------------------------------------------------------
def _world(world: Path) -> list[dict]:
    return json.loads((world / "world.json").read_text())["images"]


def _names_by_split(world: Path) -> dict[str, list[str]]:
    images = _world(world)
    return {s: [r["file_name"] for r in images if r["split"] == s] for s in ("train", "val", "test")}


@pytest.mark.parametrize("layout,karpathy_file", [("official", None), ("karpathy", None),
                                                  ("official", "dataset_coco.json")])
def test_world_coco_round_trip(tiny_world, layout, karpathy_file):
    dm = CocoCaptionsDataModule(root=str(tiny_world / "coco"), layout=layout, karpathy_file=karpathy_file, **SMALL)
    dm.setup()
    want = _names_by_split(tiny_world)
    got = {s: [p.name for p in dm.datasets[s].image_paths] for s in ("train", "val", "test")}
    assert got["train"] == want["train"]
    if layout == "official" and karpathy_file is None:  # val2017 = the world's val + test
        assert got["val"] == got["test"] and sorted(got["val"]) == sorted(want["val"] + want["test"])
    else:
        assert got["val"] == want["val"] and got["test"] == want["test"]
    batch = first(dm.test_dataloader())
    assert batch["images"].shape[1:] == (3, 32, 32) and len(batch["captions"]) == batch["input_ids"].shape[0]
    assert batch["captions"][:5] == dm.test_dataset.captions[0]


@pytest.mark.parametrize("kwargs", [{}, {"captions_file": "Flickr8k.token.txt"}])
def test_world_flickr_round_trip(tiny_world, kwargs):
    dm = FlickrDataModule(root=str(tiny_world / "flickr"), **kwargs, **SMALL)
    dm.setup()
    want = _names_by_split(tiny_world)
    assert {s: [p.name for p in dm.datasets[s].image_paths] for s in ("train", "val", "test")} == want
    coco = CocoCaptionsDataModule(root=str(tiny_world / "coco"), layout="karpathy", **SMALL)
    coco.setup()
    assert dm.train_dataset.captions == coco.train_dataset.captions  # same captions through both formats
    batch = first(dm.train_dataloader())
    assert all(c in dm.train_dataset.captions[i] for i, c in zip(batch["image_index"].tolist(), batch["captions"]))


def test_world_visual_genome_round_trip(tiny_world):
    dm = VisualGenomeDataModule(root=str(tiny_world / "visual_genome"), text_encoder=TOK,
                                transform=ImageTransform(image_size=32, resize_size=32), batch_size=4)
    dm.setup()
    images = {r["image_id"]: r for r in _world(tiny_world)}
    rels = {e["image_id"]: e["relationships"]
            for e in json.loads((tiny_world / "visual_genome" / "relationships.json").read_text())}
    for split in ("train", "val", "test"):  # the world's splits.json, minus images without a relation
        want = [i for i, r in images.items() if r["split"] == split and rels[i]]
        assert dm.datasets[split].image_ids.tolist() == want
    assert not any(images[i]["held_out_pairs"] for i in dm.train_dataset.image_ids.tolist())
    item = dm.train_dataset[0]
    image_id = int(dm.train_dataset.image_ids[0])
    o = images[image_id]["objects"][0]
    assert item["object_descriptions"][0] == f"{o['size']} {o['color']} {item['object_names'][0]}"
    assert len(item["triplets"]) == len(rels[image_id])
    assert item["predicates"] == [r["predicate"] for r in rels[image_id]]
    batch = first(dm.train_dataloader())
    assert batch["images"].shape == (4, 3, 32, 32)
    assert batch["triplet_subject"].max() < batch["object_labels"].shape[0]


# --------------------------------------------------------------------------------------------
# Inside a Lightning Trainer: per-epoch caption sampling is seeded and reproducible
# --------------------------------------------------------------------------------------------
class _Recorder:
    @staticmethod
    def module():
        from lightning.pytorch import LightningModule

        class Recorder(LightningModule):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(1))
                self.seen: list[tuple[int, int, str]] = []
                self.val_captions = 0

            def training_step(self, batch, batch_idx):
                self.seen += [(self.current_epoch, i, c) for i, c in zip(batch["image_index"].tolist(),
                                                                         batch["captions"])]
                return (self.w * batch["images"].mean()).sum()

            def validation_step(self, batch, batch_idx):
                self.val_captions += len(batch["caption_image_index"])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Recorder()


def test_trainer_epochs_sample_captions_reproducibly(tmp_path):
    from lightning.pytorch import Trainer

    write_flickr_karpathy(tmp_path)

    def fit():
        model = _Recorder.module()
        trainer = Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(model, datamodule=FlickrDataModule(root=str(tmp_path), **SMALL, seed=7))
        return model

    a, b = fit(), fit()
    assert a.seen == b.seen and len(a.seen) == 15
    by_epoch = [[(i, c) for e, i, c in a.seen if e == epoch] for epoch in range(3)]
    assert all(sorted(i for i, _ in ep) == list(range(5)) for ep in by_epoch)
    assert by_epoch[0] != by_epoch[1] != by_epoch[2]
    assert a.val_captions == 10 * (3 + 1)  # 2 val images x 5 captions, every epoch plus the sanity check


def test_malformed_flickr_token_line_names_file_line_and_format(tmp_path):
    from data_modules.file_checks import MalformedDataError
    from data_modules.flickr import read_token_file

    f = tmp_path / "Flickr8k.token.txt"
    f.write_text("a.jpg#0\tA dog runs .\na.jpg#1\tA dog .\nb.jpg A cat sits .\n")
    with pytest.raises(MalformedDataError) as e:
        read_token_file(f)
    msg = str(e.value)
    assert f"{f}:3" in msg and "<caption number><TAB><caption>" in msg and "Fix:" in msg
    f.write_text("a.jpg#0\tA dog runs .\na.jpg#1\t A dog . \n\nb.jpg#0\tA cat .\n")
    assert read_token_file(f) == {"a.jpg": ["A dog runs .", "A dog ."], "b.jpg": ["A cat ."]}


def test_non_utf8_caption_and_list_files_name_file_and_line(tmp_path):
    write_flickr_token(tmp_path)
    token = tmp_path / "Flickr8k.token.txt"
    lines = token.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"\t", b"\t\xe9 ", 1)  # a Latin-1 byte on line 3
    token.write_bytes(b"\n".join(lines))
    with pytest.raises(MalformedDataError, match=r"Flickr8k\.token\.txt:3 is not UTF-8 text") as e:
        FlickrDataModule(root=str(tmp_path), **SMALL).setup()
    assert "Expected:" in str(e.value) and "Fix:" in str(e.value)
    write_flickr_token(tmp_path)
    (tmp_path / "Flickr_8k.devImages.txt").write_bytes(b"1006_abc.jpg\n1007_\xff.jpg\n")
    with pytest.raises(MalformedDataError, match=r"Flickr_8k\.devImages\.txt:2 is not UTF-8 text"):
        FlickrDataModule(root=str(tmp_path), **SMALL).setup()
    write_coco(tmp_path / "coco")
    ann = tmp_path / "coco" / "annotations" / "captions_val2017.json"
    ann.write_bytes(ann.read_bytes().replace(b"a", b"\xe0", 1))
    with pytest.raises(MalformedDataError, match=r"captions_val2017\.json is not UTF-8 JSON \(line 1"):
        CocoCaptionsDataModule(root=str(tmp_path / "coco"), **SMALL).setup()
