"""Detector region files and object boxes (data_modules/regions.py), RoI regions, and the warm-up schedule COMPOSER's paper config uses."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_composer_model import tiny_net
from torchvision.transforms.functional import to_pil_image

from data_modules.file_checks import MalformedDataError, MissingDataError
from data_modules.images import build_transform
from data_modules.regions import BoxStore, RegionStore, image_keys, read_npz_regions
from grounding.composer.data import collate_visual
from grounding.composer.model import box_regions
from grounding.composer.training import ComposerTraining
from grounding.schedules import WarmupStepDecay

FEATURES = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
BOXES = np.array([[0, 0, 50, 25], [10, 5, 100, 50], [0, 0, 100, 50]], dtype=np.float32)  # image 100 x 50
NORMALISED = [[0, 0, 0.5, 0.5], [0.1, 0.1, 1, 1], [0, 0, 1, 1]]


def test_npz_folder(tmp_path):
    np.savez(tmp_path / "1000092795.npz", features=FEATURES, boxes=BOXES, image_h=50, image_w=100)
    features, boxes = RegionStore(tmp_path).load("images/1000092795.jpg")
    assert features.tolist() == FEATURES.tolist()
    np.testing.assert_allclose(boxes, NORMALISED)
    with pytest.raises(MissingDataError, match="no region file for image .*other.jpg"):
        RegionStore(tmp_path).load("other.jpg")
    np.savez(tmp_path / "bad.npz", features=FEATURES, boxes=BOXES)
    with pytest.raises(MalformedDataError, match="bad.npz lacks image_h, image_w"):
        read_npz_regions(tmp_path / "bad.npz")


def test_bottom_up_attention_tsv(tmp_path):
    def b64(a):
        return base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode()

    path = tmp_path / "regions.tsv"
    path.write_text(f"391895\t100\t50\t3\t{b64(BOXES)}\t{b64(FEATURES)}\n7\t100\t50\t1\tnot-base64\t!!\n")
    store = RegionStore(path)
    features, boxes = store.load("COCO_val2014_000000391895.jpg")  # found by the number the stem ends with
    assert features.tolist() == FEATURES.tolist()
    np.testing.assert_allclose(boxes, NORMALISED)
    with pytest.raises(MalformedDataError, match=r"regions.tsv \(image_id 7\)"):
        store.load("7.jpg")
    with pytest.raises(MissingDataError, match="is not in the region TSV"):
        store.load("8.jpg")
    assert image_keys("a/COCO_val2014_000000000042.jpg") == ["COCO_val2014_000000000042", "42"]


def test_regions_are_padded_with_a_mask():
    items = [{"region_features": torch.ones(2, 4), "region_boxes": torch.zeros(2, 4), "image_index": 0},
             {"region_features": torch.ones(3, 4), "region_boxes": torch.zeros(3, 4), "image_index": 1}]
    out = collate_visual(items)
    assert out["region_features"].shape == (2, 3, 4)
    assert out["region_mask"].tolist() == [[True, True, False], [True, True, True]]


def _vg_boxes(folder, objects, sizes=((7, 100, 50),)):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "image_data.json").write_text(json.dumps([{"image_id": i, "width": w, "height": h} for i, w, h in sizes]))
    (folder / "objects.json").write_text(json.dumps(objects))
    return folder / "objects.json"


def test_object_boxes_from_visual_genome(tmp_path):
    objects = [{"image_id": 7, "objects": [{"x": 0, "y": 0, "w": 50, "h": 25}, {"x": 10, "y": 5, "w": 90, "h": 45},
                                           {"x": 0, "y": 0, "w": 100, "h": 50}]}]
    store = BoxStore(_vg_boxes(tmp_path, objects), max_boxes=2)
    np.testing.assert_allclose(store.load("flickr/world_000007.jpg"), NORMALISED[:2])  # x,y,w,h -> x1,y1,x2,y2 / size
    with pytest.raises(MissingDataError, match="world_000008.jpg .* has no entry in .*objects.json"):
        store.load("world_000008.jpg")
    empty = BoxStore(_vg_boxes(tmp_path / "e", [{"image_id": 7, "objects": []}]))
    assert empty.load("7.jpg").tolist() == [[0, 0, 1, 1]]  # no objects: the whole image is the one region
    with pytest.raises(MalformedDataError, match=r"objects.json: an entry lacks image_id or an object's x/y/w/h"):
        BoxStore(_vg_boxes(tmp_path / "bad", [{"image_id": 7, "objects": [{"x": 0}]}]))
    with pytest.raises(MalformedDataError, match="image_id 9 has no size in .*image_data.json"):
        BoxStore(_vg_boxes(tmp_path / "nosize", [{"image_id": 9, "objects": []}]))
    with pytest.raises(MissingDataError, match="object boxes .*missing.json do not exist"):
        BoxStore(tmp_path / "missing.json")


def test_object_boxes_follow_the_resize_and_centre_crop(tmp_path):
    # a 200 x 100 image: short side 100 -> 256 (x2.56, 512 x 256), centre crop 224 at left 144, top 16
    objects = [{"image_id": 7, "objects": [{"x": 100, "y": 25, "w": 40, "h": 50},    # inside the crop
                                           {"x": 0, "y": 0, "w": 50, "h": 100},     # left of the crop: dropped
                                           {"x": 40, "y": 0, "w": 40, "h": 100}]}]  # straddles its left edge
    store = BoxStore(_vg_boxes(tmp_path, objects, sizes=((7, 200, 100),)), resize_size=256, image_size=224)
    expected = np.clip(np.array([[256 - 144, 64 - 16, 358.4 - 144, 192 - 16], [-41.6, -16, 204.8 - 144, 240]]) / 224, 0, 1)
    np.testing.assert_allclose(store.load("7.jpg"), expected, rtol=1e-5)
    image = torch.zeros(3, 100, 200)
    image[:, 25:75, 100:140] = 1.0  # paint the first box and check it lands where the boxes say
    crop = build_transform(224, 256, (0, 0, 0), (1, 1, 1))(to_pil_image(image))
    x1, y1, x2, y2 = (store.load("7.jpg")[0] * 224).round().astype(int)
    assert crop[0, y1 + 2:y2 - 2, x1 + 2:x2 - 2].min() > 0.9 and crop[0].sum() < 1.1 * crop[0, y1:y2, x1:x2].sum()
    empty = BoxStore(_vg_boxes(tmp_path / "e", [{"image_id": 7, "objects": objects[0]["objects"][1:2]}],
                               sizes=((7, 200, 100),)), resize_size=256, image_size=224)
    assert empty.load("7.jpg").tolist() == [[0, 0, 1, 1]]  # every box outside the crop: the whole crop


def test_images_with_boxes_are_padded_with_a_mask():
    items = [{"image": torch.zeros(3, 8, 8), "region_boxes": torch.zeros(1, 4), "image_index": 0},
             {"image": torch.ones(3, 8, 8), "region_boxes": torch.ones(2, 4), "image_index": 1}]
    out = collate_visual(items)
    assert out["images"].shape == (2, 3, 8, 8) and "region_features" not in out
    assert out["region_boxes"].shape == (2, 2, 4)
    assert out["region_mask"].tolist() == [[True, False], [True, True]]


def test_box_regions_average_the_cells_under_each_box():
    maps = torch.arange(2 * 3 * 4 * 4, dtype=torch.float64).reshape(2, 3, 4, 4)
    boxes = torch.tensor([[[0, 0, 0.5, 0.5], [0.25, 0.5, 1.0, 1.0]], [[0, 0, 1, 1], [0.75, 0.25, 1.0, 0.5]]],
                         dtype=torch.float64)
    out = box_regions(maps, boxes)
    assert out.shape == (2, 2, 3)
    expected = [[maps[0, :, :2, :2].mean((1, 2)), maps[0, :, 2:, 1:].mean((1, 2))],
                [maps[1].mean((1, 2)), maps[1, :, 1, 3]]]  # whole cells: the mean of exactly those cells
    torch.testing.assert_close(out, torch.stack([torch.stack(r) for r in expected]))


@pytest.mark.parametrize("source,files,boxes,message", [
    ("boxes", None, None, "region_source is 'boxes' but the DataModule's regions are 'grid': set "
                                    "data.init_args.region_inputs.region_boxes"),
    ("grid", None, "objects.json", "regions are 'boxes': unset data.init_args.region_inputs.region_files and region_boxes"),
    ("grid", "regions/", None, "regions are 'files'"),
])
def test_network_and_data_must_agree_on_the_region_source(source, files, boxes, message):
    module = ComposerTraining(tiny_net(region_source=source), feature_cache=False)
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(region_files=files, region_boxes=boxes))
    with pytest.raises(ValueError, match=message):
        module.setup("fit")


def test_warmup_step_decay():
    opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=4e-5)
    sched = WarmupStepDecay(opt, warmup_epochs=2, milestones=(10, 15), gamma=0.1)
    sched.set_steps_per_epoch(100)
    assert [sched.factor(s) for s in (0, 100, 200, 999, 1000, 1500, 1999)] == pytest.approx([0, 0.5, 1, 1, 0.1, 0.01, 0.01])
