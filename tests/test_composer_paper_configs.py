"""COMPOSER's paper-scale configs: C30K as the COCO DataModule's seeded subsets.train, the COCO subsets.val, and
the Table 2 test configs reading the MCD splits where the MCD configs write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_configs import stage_config

from data_modules import CocoCaptionsDataModule
from data_modules.options import SplitSubsets
from grounding.composer.captions import C30K_SEED, c30k, read_captions
from grounding.paths import EXPERIMENTS_DIR

COMPOSER = EXPERIMENTS_DIR / "composer"
SPLITS = ["train", "restval", "val", "test", "restval", "train", "test", "train", "val", "restval", "train", "train"]


def karpathy_coco(root: Path) -> Path:
    """A Karpathy dataset_coco.json of 12 images (train / restval interleaved as in the real file) and the images."""
    images = []
    for i, split in enumerate(SPLITS):
        folder = "val2014" if split in ("val", "test", "restval") else "train2014"
        name = f"COCO_{folder}_{i:012d}.jpg"
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_bytes(b"")  # only listed: the DataModule checks that files exist
        images.append({"filepath": folder, "filename": name, "split": split, "cocoid": i, "imgid": i,
                       "sentences": [{"raw": f"a photo number {i} of a dog {k}", "tokens": []} for k in range(5)]})
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path


@pytest.mark.parametrize("n,seed", [(4, C30K_SEED), (6, C30K_SEED), (5, 3)])
def test_train_subset_draws_the_c30k_images(tmp_path, n, seed):
    """composer_c30k_paper.yaml trains on `subsets: {train: 29000}, seed: 0`: the images c30k() (crg_c30k.yaml,
    mcd_coco_to_f30k.yaml) draws from Karpathy train + restval, whatever the sampler."""
    path = karpathy_coco(tmp_path)
    dm = CocoCaptionsDataModule(root=str(tmp_path), layout="karpathy", karpathy_file=path.name,
                                subsets=SplitSubsets(train=n), seed=seed)
    dm.setup()
    drawn = c30k(read_captions(path), seed=seed, n_images=n)
    assert [p.name for p in dm.train_dataset.image_paths] == [Path(name).name for name in drawn.image_names]
    assert dm.train_dataset.captions == [drawn.captions_of(i) for i in range(n)]


def test_val_subset_keeps_the_first_validation_images(tmp_path):
    path = karpathy_coco(tmp_path)
    dm = CocoCaptionsDataModule(root=str(tmp_path), layout="karpathy", karpathy_file=path.name,
                                subsets=SplitSubsets(val=1, test=1))
    dm.setup()
    assert [p.name for p in dm.val_dataset.image_paths] == ["COCO_val2014_000000000002.jpg"]
    assert [p.name for p in dm.test_dataset.image_paths] == ["COCO_val2014_000000000003.jpg"]
    assert len(dm.train_dataset) == 8  # train + restval


def test_c30k_config_is_the_paper_subset():
    reader = stage_config(COMPOSER / "composer_c30k_paper.yaml")["data"]["init_args"]["captions"]
    assert reader["class_path"].endswith("CocoCaptionsDataModule") and reader["init_args"]["layout"] == "karpathy"
    assert (reader["init_args"]["subsets"]["train"], reader["init_args"]["seed"]) == (29000, C30K_SEED)
    crg = yaml.safe_load((COMPOSER / "crg_c30k.yaml").read_text())["crg"]
    assert (crg["captions_subset"], crg["captions_sample_seed"]) == ("c30k", C30K_SEED)


@pytest.mark.parametrize("test_config,mcd_config", [("f30k_to_coco_mcd", "mcd_f30k_to_coco"), ("c30k_to_f30k_mcd", "mcd_coco_to_f30k")])
def test_mcd_test_configs_read_the_split_the_mcd_config_writes(test_config, mcd_config):
    reader = stage_config(COMPOSER / "table2" / f"{test_config}.yaml")["data"]["init_args"]["captions"]["init_args"]
    out = yaml.safe_load((COMPOSER / f"{mcd_config}.yaml").read_text())["mcd"]["out"]
    assert (Path(reader["root"]) / reader["karpathy_file"]).resolve() == (Path(out) / "mcd.json").resolve()
    assert reader["test_only"] is True
