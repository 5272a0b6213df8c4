"""Detector region files (data_modules/regions.py) and the warm-up schedule COMPOSER's paper config uses."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from data_modules.common import MalformedDataError, MissingDataError
from data_modules.regions import RegionStore, image_keys, read_npz_regions
from grounding.composer.data import collate_visual
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


def test_warmup_step_decay():
    opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=4e-5)
    sched = WarmupStepDecay(opt, warmup_epochs=2, milestones=(10, 15), gamma=0.1)
    sched.set_steps_per_epoch(100)
    assert [sched.factor(s) for s in (0, 100, 200, 999, 1000, 1500, 1999)] == pytest.approx([0, 0.5, 1, 1, 0.1, 0.01, 0.01])
