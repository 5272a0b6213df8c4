"""Issue 12 item 8: every checkpoint records its training images (and those of the checkpoints it was built from),
and a stage is never evaluated on images an earlier stage of its chain trained on (grounding.training_images)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from grounding.nets import constructor_args
from grounding.paths import EXPERIMENTS_DIR
from grounding.training_images import (
    RECORD_KEY,
    EvalOverlapError,
    TrainingImages,
    checkpoint_entries,
    describe_key,
    file_key,
    flickr_file_key,
    image_key,
    key_set,
    parse_key,
)

NET = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=4, image_size=64)
DATA = dict(text_encoder="tiny-random", transform={"image_size": 64, "resize_size": 64}, batch_size=8)


def _coco(world, **kw):
    from data_modules import CocoCaptionsDataModule

    return CocoCaptionsDataModule(root=str(world / "coco"), **{**DATA, **kw})


def _vg(world, **kw):
    from data_modules import VisualGenomeDataModule

    return VisualGenomeDataModule(root=str(world / "visual_genome"), **constructor_args(VisualGenomeDataModule,
                                                                                        {**DATA, **kw}))


def _fit(module, dm, root: Path) -> Path:
    import lightning as L

    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=False, accelerator="cpu",
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root))
    trainer.fit(module, dm)
    return root / "checkpoints" / "last.ckpt"


def _stage2(init_from, dm):
    from grounding.vgbert.finetune import RelationalFinetune
    from grounding.vgbert.relational import VGBertRelational

    rel, obj = dm.relation_labels, dm.object_classes
    return RelationalFinetune(VGBertRelational(len(rel), len(obj), **NET), rel, obj, init_from=init_from,
                              feature_cache=False, top_k=(1,))


def _world_ids(world, split: str) -> list[int]:
    return json.loads((world / "visual_genome" / "splits.json").read_text())[split]


def _setup_check(module, dm, root="run") -> TrainingImages:
    """The callback's fit-time check alone (what Trainer.fit runs at setup, before any batch)."""
    dm.setup()
    callback = TrainingImages()
    callback.setup(SimpleNamespace(datamodule=dm, default_root_dir=root), module, "fit")
    return callback


@pytest.fixture(scope="module")
def chain(tiny_world, tmp_path_factory):
    """Stage 1 on the world's COCO layout -> stage 2 on its Visual Genome layout -> search heads on COCO, one tiny
    step each (the world's splits agree across layouts: every stage evaluates on held-out scenes)."""
    from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding
    from grounding.vgbert.search_heads import SearchHeads

    d = tmp_path_factory.mktemp("chain")
    torch.manual_seed(0)
    s1 = _fit(GroundingPretrain(MatchMapGrounding(**NET), feature_cache=False), _coco(tiny_world), d / "stage1")
    vg = _vg(tiny_world)
    s2 = _fit(_stage2(str(s1), vg), vg, d / "stage2")
    s3 = _fit(SearchHeads(init_from=str(s2), feature_cache=False), _coco(tiny_world), d / "heads")
    return {"dir": d, "world": tiny_world, "stage1": s1, "stage2": s2, "heads": s3}


# ------------------------------------------------------------------------------------------------ keys
def test_canonical_keys_and_cross_dataset_identity(tiny_world):
    assert describe_key(image_key("coco", 397133)) == "coco:397133" == describe_key(parse_key("coco:397133"))
    assert image_key("coco", None) == image_key("vg", 0) == 0
    assert flickr_file_key("1000268201_693b08cb0e.jpg") == image_key("flickr", 1000268201)  # Flickr8k
    assert flickr_file_key("images/1000092795.jpg") == parse_key("flickr:1000092795")       # Flickr30K
    assert flickr_file_key("world_000001.jpg") == file_key("world_000001.jpg") == parse_key("file:world_000001.jpg")
    assert describe_key(file_key("a.jpg"), "a.jpg") == "file:a.jpg"
    assert len({image_key(ns, 7) for ns in ("coco", "flickr", "vg")}) == 3  # namespaces never collide
    with pytest.raises(ValueError, match="not an image key"):
        parse_key("397133")
    # the world's Visual Genome image i is its COCO image i (image_data.json's coco_id): keys vg, coco, flickr
    vg, coco = _vg(tiny_world), _coco(tiny_world)
    keys = vg.image_keys("train")
    ids = vg.train_dataset.image_ids
    assert keys.shape == (len(ids), 3) and (keys[:, 2] == 0).all()
    assert [describe_key(k) for k in keys[:2, 0]] == [f"vg:{i}" for i in ids[:2]]
    assert np.array_equal(keys[:, 1], [image_key("coco", i) for i in ids])
    # the same scenes in the same split (VG keeps those with a relation)
    assert set(keys[:, 1].tolist()) <= set(coco.image_keys("train").tolist())
    assert not set(keys[:, 1].tolist()) & set(coco.image_keys("val").tolist())


# ------------------------------------------------------------------------------------------------ records
def test_checkpoints_record_their_training_images_and_their_chain(chain):
    world = chain["world"]
    coco_train = key_set(_coco(world).image_keys("train"))
    vg_train = key_set(_vg(world).image_keys("train"))
    s1 = torch.load(chain["stage1"], map_location="cpu", weights_only=True)[RECORD_KEY]
    assert [e["depth"] for e in s1["entries"]] == [0]
    assert s1["entries"][0]["dataset"] == "COCO captions" and s1["entries"][0]["keys"].dtype == torch.int64
    assert np.array_equal(s1["entries"][0]["keys"].numpy(), coco_train)
    s2 = checkpoint_entries(chain["stage2"], depth=0)
    assert [(e["depth"], e["checkpoint"]) for e in s2] == [(0, str(chain["stage2"])), (1, str(chain["stage1"]))]
    assert np.array_equal(s2[0]["keys"], vg_train) and np.array_equal(s2[1]["keys"], coco_train)
    heads = checkpoint_entries(chain["heads"])  # as a stage built from it inherits them: one deeper
    assert [(e["depth"], e["checkpoint"]) for e in heads] == [(1, str(chain["heads"])), (2, str(chain["stage2"])),
                                                              (3, str(chain["stage1"]))]


def test_disjoint_evaluation_passes(chain):
    world = chain["world"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*training images")  # no warning either
        stage2 = _setup_check(_stage2(str(chain["stage1"]), _vg(world)), _vg(world))
        from grounding.vgbert.search_heads import SearchHeads

        heads = _setup_check(SearchHeads(init_from=str(chain["stage2"]), feature_cache=False), _coco(world))
    # the check ran on the whole chain (not skipped for want of a record): its own images and every earlier stage's
    assert stage2.checked and heads.checked
    assert [e["depth"] for e in stage2.entries] == [0, 1] and [e["depth"] for e in heads.entries] == [0, 1, 2]
    assert np.array_equal(key_set(stage2.entries[1]["keys"]), key_set(_coco(world).image_keys("train")))


# ------------------------------------------------------------------------------------------------ the check
def _overlapping_vg_split(world, folder: Path, n: int = 3) -> Path:
    """A VG split whose test images are the first ``n`` scenes stage 1 trained on (through their coco_id)."""
    train = _world_ids(world, "train")
    path = folder / "overlap_split.json"
    path.write_text(json.dumps({"train": train[n:], "val": _world_ids(world, "val"), "test": train[:n]}))
    return path


def test_stage2_on_stage1_training_scenes_raises_across_datasets(chain, tmp_path):
    world = chain["world"]
    dm = _vg(world, split_file=str(_overlapping_vg_split(world, tmp_path)))
    first = _world_ids(world, "train")[0]
    with pytest.raises(EvalOverlapError) as info:
        _fit(_stage2(str(chain["stage1"]), dm), dm, tmp_path / "run")
    message = str(info.value)
    assert "\n" not in message
    assert "3 of the 3 'test' images" in message and str(chain["stage1"]) in message, message
    assert f"vg:{first} = coco:{first}" in message and "COCO captions" in message
    assert "split_file" in message and "--allow_eval_overlap true" in message
    assert not (tmp_path / "run" / "checkpoints").exists()  # raised before any training step


def test_search_heads_check_the_whole_chain(chain):
    from grounding.vgbert.search_heads import SearchHeads

    world = chain["world"]
    heads = SearchHeads(init_from=str(chain["stage2"]), feature_cache=False)
    on_train = _coco(world, val_set="train2017")  # val and test = the scenes stage 1 and stage 2 trained on
    with pytest.raises(EvalOverlapError, match=r"'val' images .* training images of .*stage2.*last\.ckpt") as info:
        _setup_check(heads, on_train)
    assert str(chain["stage1"]) in str(info.value) and "more split/checkpoint overlap" in str(info.value)
    # the downgrade: a warning, and the check passes
    heads.allow_eval_overlap = True
    with pytest.warns(UserWarning, match="--allow_eval_overlap: .* training images of"):
        _setup_check(heads, on_train)


def test_testing_a_checkpoint_checks_its_record(chain, tmp_path):
    import lightning as L

    from grounding.vgbert.search_heads import SearchHeads

    heads = SearchHeads.load_from_checkpoint(chain["heads"], init_from=None, feature_cache=False)
    trainer = L.Trainer(logger=False, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), limit_test_batches=1)
    with pytest.raises(EvalOverlapError, match=r"'test' images .* training images of"):
        trainer.test(heads, _coco(chain["world"], val_set="train2017"), ckpt_path=str(chain["heads"]), verbose=False)
    result = trainer.test(heads, _coco(chain["world"]), ckpt_path=str(chain["heads"]), verbose=False)
    assert "test/rsum" in result[0]


def test_old_checkpoint_without_record_warns_once(chain, tmp_path):
    world = chain["world"]
    ckpt = torch.load(chain["stage1"], map_location="cpu", weights_only=True)
    old = tmp_path / "old_stage1.ckpt"
    torch.save({"state_dict": ckpt["state_dict"], "hyper_parameters": ckpt["hyper_parameters"]}, old)
    dm = _vg(world, split_file=str(_overlapping_vg_split(world, tmp_path)))
    with pytest.warns(UserWarning, match="old_stage1.ckpt holds no record of its training images"):
        callback = _setup_check(_stage2(str(old), dm), dm)
    assert [(e["depth"], e["keys"]) for e in callback.entries[1:]] == [(1, None)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*training images")  # once
        _setup_check(_stage2(str(old), dm), dm)


# ------------------------------------------------------------------------------------------------ the fix
def test_exclude_eval_images_leaves_out_an_earlier_stage_s_images(chain, tmp_path):
    from data_modules import MalformedDataError

    world = chain["world"]
    full = _coco(world, val_set="train2017")
    n = len(full.val_dataset)
    with pytest.raises(MalformedDataError, match="exclude_eval_images leaves no 'val' image"):
        _coco(world, val_set="train2017", exclude_eval_images=[str(chain["stage2"])]).setup()
    listed = tmp_path / "held_out.txt"
    ids = _world_ids(world, "train")[:2]
    listed.write_text("# scenes to leave out\n" + "".join(f"coco:{i}\n" for i in ids))
    dm = _coco(world, val_set="train2017", exclude_eval_images=str(listed))
    assert len(dm.val_dataset) == len(dm.test_dataset) == n - 2 and len(dm.train_dataset) == len(full.train_dataset)
    assert not set(dm.image_keys("val").tolist()) & {image_key("coco", i) for i in ids}
    listed.write_text("397133\n")
    with pytest.raises(MalformedDataError, match="not an image key"):
        _coco(world, exclude_eval_images=str(listed)).setup()
    # the heads' data, held out from the whole chain: nothing of the world's val2017 was trained on
    dm = _coco(world, exclude_eval_images=[str(chain["stage2"])])
    assert len(dm.val_dataset) == len(_coco(world).val_dataset)


def test_stage2_exclude_eval_images_keeps_val_and_test_off_stage1_scenes(chain, tmp_path):
    """VG-BERT's train/test split (no val of its own) with test images stage 1 trained on: exclude_eval_images drops
    them from test and carves validation only out of training images stage 1 never saw (the paper config's fix)."""
    world = chain["world"]
    train, held_out = _world_ids(world, "train"), _world_ids(world, "val") + _world_ids(world, "test")
    split = tmp_path / "train_test.json"
    split.write_text(json.dumps({"train": train[3:] + held_out[len(held_out) // 2:], "val": [],
                                 "test": train[:3] + held_out[:len(held_out) // 2]}))
    dm = _vg(world, split_file=str(split), val_size=2, exclude_eval_images=[str(chain["stage1"])])
    dm.setup()
    stage1 = {image_key("coco", i) for i in train}
    for name in ("val", "test"):
        assert not set(dm.image_keys(name)[:, 1].tolist()) & stage1, name
    plain = _vg(world, split_file=str(split), val_size=2)
    plain.setup()
    plain_test = plain.datasets["test"].image_ids.tolist()
    assert set(plain_test) & set(train[:3])  # the split does hold stage-1 scenes in test
    assert dm.datasets["test"].image_ids.tolist() == [i for i in plain_test if i not in set(train)]
    assert len(dm.datasets["val"]) == 2 and set(dm.datasets["val"].image_ids.tolist()) <= set(held_out)
    _setup_check(_stage2(str(chain["stage1"]), dm), dm)  # no overlap left: the fit-time check passes
    with pytest.raises(EvalOverlapError):  # without the exclusion the check stops the fit
        _setup_check(_stage2(str(chain["stage1"]), plain), plain)


# ------------------------------------------------------------------------------------------------ the command
def _stage2_config(path: Path, world: Path, root: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "base": str(EXPERIMENTS_DIR / "vgbert" / "stage2_tiny.yaml"),
        "model": {"init_args": {"net": {"init_args": {k: v for k, v in NET.items() if k != "image_size"}}}},
        "data": {"init_args": {"root": str(world / "visual_genome"), "batch_size": 8, "transform": {"resize_size": 64}}},
        "trainer": {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": str(root), "max_epochs": 1, "limit_train_batches": 1, "limit_val_batches": 1}}))
    return path


def test_cli_refuses_overlap_with_one_line_exit_2_before_any_model(chain, tmp_path, capsys, monkeypatch):
    from lightning.pytorch import LightningModule

    from grounding.cli import run_command

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GROUNDING_DEBUG", raising=False)
    world = chain["world"]
    config = _stage2_config(tmp_path / "stage2.yaml", world, tmp_path / "run")
    argv = ["fit", "--config", str(config), "--model.init_args.init_from", str(chain["stage1"]),
            "--model.init_args.net.init_args.image_size", "64",
            "--data.init_args.split.split_file", str(_overlapping_vg_split(world, tmp_path))]

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the overlap was reported")

    with monkeypatch.context() as m:
        m.setattr(LightningModule, "__init__", no_model)
        with pytest.raises(SystemExit) as exit_info:
            run_command(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    line = next(ln for ln in err.splitlines() if ln.startswith("python -m grounding: error:"))
    assert "3 of the 3 'test' images" in line and str(chain["stage1"]) in line and "--allow_eval_overlap" in line
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()
    # knowingly: a warning, and the fit runs
    with pytest.warns(UserWarning, match="--allow_eval_overlap"):
        run_command([*argv, "--allow_eval_overlap", "true"])
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
