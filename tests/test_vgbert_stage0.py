"""VG-BERT stage 0 (App. A.1): object crops as class folders, the ImageFolder DataModule, the classifier's fit,
stage 1 starting from its visual stream, and the occlusion experiment (Figs. 1-2)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from data_modules.object_crops import crop_objects, square_box
from grounding.cli import main
from grounding.paths import EXPERIMENTS_DIR

STAGE0_TINY = EXPERIMENTS_DIR / "vgbert" / "stage0_tiny.yaml"
TINY_NET = {"width": 32, "backbone": "tiny_cnn", "backbone_weights": None, "visual_heads": 4, "image_size": 32}
TRAINER = {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False}


@pytest.fixture(scope="module")
def crops(tiny_world, tmp_path_factory):
    """The tiny world's object boxes as an ImageFolder tree (train / val / test)."""
    out = tmp_path_factory.mktemp("crops") / "object_crops"
    crop_objects(tiny_world / "visual_genome", out, min_size=4)
    return out


def stage0_config(path, root, **trainer):
    path.write_text(yaml.safe_dump({
        "base": str(STAGE0_TINY), "model": {"init_args": {"net": {"init_args": TINY_NET}}},
        "data": {"init_args": {"root": str(root), "batch_size": 8, "eval_batch_size": 8}},
        "trainer": {**TRAINER, **trainer}}))
    return path


# ------------------------------------------------------------------------------------------------ crops
def test_square_box_hand_checked():
    # a 10x20 box at (30, 40) in a 100x80 image, margin 0.5: a 30-px square centred on (35, 50)
    assert square_box(30, 40, 10, 20, 100, 80, 0.5) == (20, 35, 50, 65)
    # near the border it is shifted inside, not cut
    assert square_box(0, 0, 10, 10, 100, 80, 1.0) == (0, 0, 20, 20)
    # larger than the image: cut to it
    assert square_box(10, 10, 60, 60, 64, 64, 0.5) == (0, 0, 64, 64)


def test_object_crops_tree_is_complete_and_kept(crops, tiny_world, capsys):
    manifest = json.loads((crops / "crops.json").read_text())
    train = sorted(p.name for p in (crops / "train").iterdir())
    assert train == manifest["classes"] and len(train) >= 2
    for split in ("val", "test"):
        if (crops / split).is_dir():
            assert {p.name for p in (crops / split).iterdir()} <= set(train)  # no class without training crops
    total = sum(1 for _ in crops.rglob("*.jpg"))
    assert total == manifest["total"] > 0
    assert not list(crops.parent.glob(".*tmp*"))  # written under a temporary name, renamed when complete
    crop_objects(tiny_world / "visual_genome", crops, min_size=4)
    assert "up to date" in capsys.readouterr().out


def test_object_crops_rebuilt_when_the_split_file_changes(tiny_world, tmp_path, capsys):
    import os
    import shutil

    vg = tmp_path / "vg"
    shutil.copytree(tiny_world / "visual_genome", vg)
    crop_objects(vg, tmp_path / "crops", min_size=4)
    capsys.readouterr()
    stat = (vg / "splits.json").stat()
    os.utime(vg / "splits.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a rewritten split file
    crop_objects(vg, tmp_path / "crops", min_size=4)
    assert "up to date" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ DataModule
def test_image_folder_datamodule(crops):
    from data_modules import ImageFolderDataModule

    dm = ImageFolderDataModule(str(crops), batch_size=4, transform={"image_size": 32, "resize_size": 32})
    dm.check_inputs()
    assert dm.class_names == sorted(p.name for p in (crops / "train").iterdir())
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape == (4, 3, 32, 32) and batch["labels"].dtype == torch.long
    val = dm.val_dataset
    first = val.image_paths[0]
    assert dm.class_names[int(val.labels[0])] == first.parent.name  # a label is its folder's class index
    assert len(dm.image_datasets()) == 3  # train, val and test, all deterministic: the feature cache holds each
    augmented = ImageFolderDataModule(str(crops), transform={"image_size": 32}, augment=True)
    assert augmented.train_dataset not in augmented.image_datasets()  # random crops differ every epoch: not cached


def test_test_split_falls_back_to_val(crops, tmp_path):
    from data_modules import ImageFolderDataModule

    root = tmp_path / "imagenet"
    shutil.copytree(crops / "train", root / "train")
    shutil.copytree(crops / "val", root / "val")
    dm = ImageFolderDataModule(str(root), transform={"image_size": 32})
    assert dm.test_dataset is dm.val_dataset


def _bad_roots(crops, tmp_path):
    empty_class = tmp_path / "empty_class"
    shutil.copytree(crops, empty_class)
    (empty_class / "train" / "zebra.n.01").mkdir()
    unknown = tmp_path / "unknown_val_class"
    shutil.copytree(crops, unknown)
    shutil.copytree(crops / "val" / next(iter(sorted(p.name for p in (crops / "val").iterdir()))),
                    unknown / "val" / "unicorn.n.01")
    return {"missing_root": (tmp_path / "nope", "does not exist"),
            "empty_class_folder": (empty_class, "zebra.n.01 holds no image"),
            "val_class_unknown_to_train": (unknown, "unicorn.n.01")}


@pytest.mark.parametrize("case", ["missing_root", "empty_class_folder", "val_class_unknown_to_train"])
def test_bad_input_is_one_message_and_exit_2_before_any_model(case, crops, tmp_path, capsys, monkeypatch):
    from lightning.pytorch import LightningModule

    from grounding.cli import run_command

    root, words = _bad_roots(crops, tmp_path)[case]

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the bad input was reported")
    monkeypatch.setattr(LightningModule, "__init__", no_model)
    config = stage0_config(tmp_path / "stage0.yaml", root, default_root_dir=str(tmp_path / "run"))
    with pytest.raises(SystemExit) as exit_info:
        run_command(["fit", "--config", str(config)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert words in err and str(root) in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("python -m grounding: error:")]) == 1


# ------------------------------------------------------------------------------------------------ the classifier
def test_head_and_baseline_switch():
    from grounding.vgbert.visual_pretrain import VisualStreamClassifier

    torch.manual_seed(0)
    paper_head = VisualStreamClassifier(5, **{**TINY_NET, "image_size": 224}).head  # 14x14 -> 7x7 -> 4096 -> 4096 -> 5
    assert [type(m).__name__ for m in paper_head][:3] == ["MaxPool2d", "AdaptiveAvgPool2d", "Flatten"]
    assert [m.out_features for m in paper_head if isinstance(m, torch.nn.Linear)] == [4096, 4096, 5]
    assert paper_head[3].in_features == 32 * 7 * 7
    net = VisualStreamClassifier(3, **TINY_NET, use_attention=False, head_maxpool=1, head_pool=1, head_hidden=0).eval()
    images = torch.randn(2, 3, 32, 32)
    maps = net.backbone_maps(images)
    assert torch.allclose(net(images), net(maps))  # pixels or cached backbone maps alike
    expected = net.head[-1](net.visual.embed(maps).mean((1, 2)))  # no positional encoding, no self-attention
    assert torch.allclose(net(images), expected, atol=1e-6)
    assert not any(p.requires_grad for p in net.visual.attention.parameters()) and not net.visual.position.requires_grad
    with pytest.raises(ValueError, match="without self-attention"):
        net.attention_weights(images)


def test_attention_weights_are_the_layers():
    from grounding.vgbert.visual_pretrain import VisualStreamClassifier

    torch.manual_seed(0)
    net = VisualStreamClassifier(3, **TINY_NET).eval()
    images = torch.randn(2, 3, 32, 32)
    weights = net.attention_weights(images)  # (B, heads, h*w, h*w)
    assert weights.shape == (2, 4, 4, 4) and torch.allclose(weights.sum(-1), torch.ones(2, 4, 4))
    # the layer's output rebuilt from these weights (post-norm encoder layer) equals the stream's
    visual, layer = net.visual, net.visual.attention
    x = (net.visual.embed(net.backbone_maps(images)) + visual.position).reshape(2, 4, 32)
    v = torch.nn.functional.linear(x, layer.self_attn.in_proj_weight[64:], layer.self_attn.in_proj_bias[64:])
    heads = (weights @ v.reshape(2, 4, 4, 8).transpose(1, 2)).transpose(1, 2).reshape(2, 4, 32)
    h = layer.norm1(x + layer.self_attn.out_proj(heads))
    out = layer.norm2(h + layer.linear2(torch.relu(layer.linear1(h))))
    assert torch.allclose(out.reshape(2, 2, 2, 32), net.tokens(images), atol=1e-5)


def test_stage0_fast_dev_run_fit(crops, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    config = stage0_config(tmp_path / "stage0.yaml", crops, fast_dev_run=True, default_root_dir=str(tmp_path / "run"))
    cli = main(["fit", "--config", str(config)])
    model = cli.model
    assert model.hparams.class_names == cli.datamodule.class_names
    assert model.model.init_args["num_classes"] == len(cli.datamodule.class_names)  # linked from the DataModule
    assert {"train/loss", "val/top1", "val/top5"} <= set(cli.trainer.callback_metrics)
    assert not any(p.requires_grad for p in model.model.visual.backbone.parameters())
    assert (tmp_path / "cache" / "features").is_dir()  # the frozen CNN's maps were cached


def _stage0_checkpoint(path, width=32, heads=2, **net):
    from grounding.vgbert.visual_pretrain import VisualPretrain, VisualStreamClassifier

    torch.manual_seed(1)
    stage0 = VisualPretrain(VisualStreamClassifier(3, width=width, backbone="tiny_cnn", backbone_weights=None,
                                                   visual_heads=heads, image_size=64, **net),
                            class_names=["a", "b", "c"], feature_cache=False)
    torch.save({"state_dict": stage0.state_dict(), "hyper_parameters": dict(stage0.hparams)}, path)
    return stage0


def test_stage1_loads_the_stage0_visual_stream(tmp_path):
    from grounding.checkpoints import CheckpointError
    from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding

    stage0 = _stage0_checkpoint(tmp_path / "stage0.ckpt")
    torch.manual_seed(2)
    stage1 = GroundingPretrain(MatchMapGrounding(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                                                 visual_heads=2, image_size=64), feature_cache=False,
                               visual_init_from=str(tmp_path / "stage0.ckpt"))
    before = {k: v.clone() for k, v in stage1.state_dict().items()}
    stage1.load_stage0(tmp_path / "stage0.ckpt")
    after, theirs = stage1.state_dict(), stage0.state_dict()
    loaded = ("model.visual.embedder.", "model.visual.embed_norm.", "model.visual.attention.", "model.visual.position")
    for key, value in after.items():
        if key.startswith(loaded):
            assert torch.equal(value, theirs[key]), key  # the stage-0 weights
        else:
            assert torch.equal(value, before[key]), key  # CNN, language stream, projection heads untouched
    assert any(k.startswith("model.visual.attention.") for k in after)
    for key in ("model.visual.embedder.weight", "model.visual.position", "model.visual.attention.linear1.weight"):
        assert not torch.equal(before[key], theirs[key])  # (so the equalities above are the load's doing)
    # another width / head count / image size: a clear error, nothing half-loaded matters (it raises first)
    _stage0_checkpoint(tmp_path / "wide.ckpt", width=64)
    with pytest.raises(CheckpointError, match="width 64"):
        stage1.load_stage0(tmp_path / "wide.ckpt")
    _stage0_checkpoint(tmp_path / "heads.ckpt", heads=4)
    with pytest.raises(CheckpointError, match="visual_heads"):
        stage1.load_stage0(tmp_path / "heads.ckpt")
    # App. A.1's baseline (no self-attention) holds untrained attention weights: refused, not silently loaded
    _stage0_checkpoint(tmp_path / "baseline.ckpt", use_attention=False)
    with pytest.raises(CheckpointError, match="use_attention: false"):
        stage1.load_stage0(tmp_path / "baseline.ckpt")
    # a stage-1 checkpoint has the visual stream but no classifier: not a stage-0 checkpoint
    from grounding.checkpoints import check_stage_checkpoint
    from grounding.vgbert.pretrain import STAGE0_PREFIXES

    torch.save({"state_dict": stage1.state_dict(), "hyper_parameters": dict(stage1.hparams)}, tmp_path / "s1.ckpt")
    with pytest.raises(CheckpointError, match="not a stage-0 checkpoint.*model.head."):
        check_stage_checkpoint(tmp_path / "s1.ckpt", "stage-0", STAGE0_PREFIXES, "visual_init_from")
    check_stage_checkpoint(tmp_path / "stage0.ckpt", "stage-0", STAGE0_PREFIXES, "visual_init_from")


def test_visual_init_from_defaults_to_none_and_the_paper_config_names_stage0():
    import inspect

    from grounding.cli import resolved_config
    from grounding.vgbert.pretrain import GroundingPretrain

    assert inspect.signature(GroundingPretrain).parameters["visual_init_from"].default is None
    for name in ("stage1_tiny", "stage1_flickr8k"):
        assert resolved_config(EXPERIMENTS_DIR / "vgbert" / f"{name}.yaml")["model"]["init_args"]["visual_init_from"] is None
    paper = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage1_paper.yaml")["model"]["init_args"]
    assert paper["visual_init_from"] == "outputs/vgbert/stage0_paper/checkpoints/best.ckpt"
    stage0 = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage0_paper.yaml")
    assert stage0["trainer"]["default_root_dir"] == "outputs/vgbert/stage0_paper"
    sgd = stage0["model"]["init_args"]["optimizer"]
    assert sgd["class_path"] == "torch.optim.SGD" and (sgd["init_args"]["lr"], sgd["init_args"]["momentum"],
                                                        sgd["init_args"]["weight_decay"]) == (0.01, 0.9, 1e-4)
    assert stage0["model"]["init_args"]["lr_scheduler"]["init_args"] == {"step_size": 20, "gamma": 0.5, "last_epoch": -1}


def test_visual_init_from_checked_before_any_model(tmp_path, tiny_world, capsys, monkeypatch):
    from lightning.pytorch import LightningModule
    from run_helpers import tiny_stage1_config

    from grounding.cli import run_command

    torch.save({"state_dict": {"model.language.x": torch.zeros(1)}, "hyper_parameters": {}}, tmp_path / "other.ckpt")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the bad input was reported")
    monkeypatch.setattr(LightningModule, "__init__", no_model)
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, tmp_path / "run")
    for path, words in ((tmp_path / "none.ckpt", "no such checkpoint"), (tmp_path / "other.ckpt", "not a stage-0")):
        with pytest.raises(SystemExit) as exit_info:
            run_command(["fit", "--config", str(config), "--model.init_args.visual_init_from", str(path)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and words in err and "visual_init_from" in err and str(path) in err, err


def test_stage1_fit_starts_from_stage0(tmp_path, tiny_world, monkeypatch):
    """A stage-1 fit whose one step moves nothing measurable (lr 1e-12: the lr must be > 0) with visual_init_from: its
    checkpoint holds stage 0's visual weights."""
    from run_helpers import tiny_stage1_config

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    stage0 = _stage0_checkpoint(tmp_path / "stage0.ckpt", heads=4)
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, tmp_path / "run", net={"image_size": 64},
                                max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    main(["fit", "--config", str(config), "--model.init_args.visual_init_from", str(tmp_path / "stage0.ckpt"),
          "--model.init_args.optimizer.init_args.lr", "1e-12"])
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    for key, value in stage0.state_dict().items():
        if key.startswith(("model.visual.attention.", "model.visual.embedder.", "model.visual.position")):
            torch.testing.assert_close(state[key], value, rtol=0, atol=1e-9, msg=key)


# ------------------------------------------------------------------------------------------------ occlusion
def test_window_masks_hand_checked():
    from grounding.vgbert.occlusion import cell_masks, occlude, window_centres, window_masks

    assert window_centres(8, 4).tolist() == [2, 6]
    masks = window_masks(8, 4, 4)  # 2x2 trials of a 4-px square at centres 2 and 6: rows/cols [0, 4) and [4, 8)
    assert masks.shape == (4, 8, 8)
    expected = torch.zeros(4, 8, 8, dtype=torch.bool)
    expected[0, :4, :4] = expected[1, :4, 4:] = expected[2, 4:, :4] = expected[3, 4:, 4:] = True
    assert torch.equal(masks, expected)
    edge = window_masks(6, 4, 3)  # centres 1 and 4: [-1, 3) cut to [0, 3), and [2, 6)
    assert edge[0].nonzero().max().item() == 2 and edge[0].sum() == 9 and edge[3].sum() == 16
    cells = cell_masks(5, 2, 4, 0.5, torch.Generator().manual_seed(0))  # 2 of the 4 cells, each a 2x2 block
    assert cells.shape == (5, 4, 4) and (cells.sum((1, 2)) == 8).all()
    blocks = cells.reshape(5, 2, 2, 2, 2).permute(0, 1, 3, 2, 4).reshape(5, 4, 4)
    assert ((blocks.sum(-1) == 0) | (blocks.sum(-1) == 4)).all()  # whole cells only
    image = torch.arange(3 * 8 * 8, dtype=torch.float).reshape(3, 8, 8)
    grey = torch.tensor([-1.0, -2.0, -3.0])
    out = occlude(image, masks, grey)
    assert out.shape == (4, 3, 8, 8)
    assert (out[1, :, :4, 4:] == grey[:, None, None]).all() and torch.equal(out[1, :, 4:], image[:, 4:])


def test_trial_histogram_hand_checked():
    from grounding.vgbert.occlusion import trial_histogram

    h = trial_histogram(torch.tensor([0.875, 0.5, 0.25, 0.5]), torch.tensor([0.0625, 0.46875, 0.75, 0.5]), bins=10)
    # differences +0.8125, +0.03125, -0.5, 0 (exact in binary): better in bins 8 and 0, worse in bin 5, the tie in neither
    assert h["better_percent"][8] == 25 and h["better_percent"][0] == 25 and h["worse_percent"][5] == 25
    assert h["better_total_percent"] == 50 and h["worse_total_percent"] == 25 and h["trials"] == 4


def test_occlusion_command_writes_its_figures(crops, tmp_path, capsys):
    from grounding.vgbert.occlusion import main as occlusion_main

    with_attention = tmp_path / "attention.ckpt"
    names = sorted(p.name for p in (crops / "train").iterdir())
    for path, attention in ((with_attention, True), (tmp_path / "baseline.ckpt", False)):
        from grounding.vgbert.visual_pretrain import VisualPretrain, VisualStreamClassifier

        module = VisualPretrain(VisualStreamClassifier(len(names), **TINY_NET, use_attention=attention, head_hidden=0),
                                class_names=names, feature_cache=False)
        torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, path)
    out = tmp_path / "report"
    record = occlusion_main(["--ckpt", str(with_attention), "--baseline-ckpt", str(tmp_path / "baseline.ckpt"),
                             "--images", str(crops / "val"), "--out", str(out), "--limit", "3", "--window", "8",
                             "--stride", "8", "--fractions", "0,0.5,1", "--draws", "2", "--examples", "2"])
    for name in ("occlusion_heatmaps.png", "occlusion_histogram.png", "occlusion_fraction.png", "attention_maps.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    saved = json.loads((out / "occlusion.json").read_text())
    assert saved["trials_per_image"] == 16 and saved["n_images"] == 3 and set(saved["models"]) == {"attention", "no attention"}
    for model in saved["models"].values():
        assert [p["fraction"] for p in model["fraction_curve"]] == [0, 0.5, 1]
    c = record["comparison"]
    assert c["trials"] == 3 * 16 and c["better_total_percent"] + c["worse_total_percent"] <= 100 + 1e-6
    assert "attention better in" in capsys.readouterr().out
    assert not list(out.glob(".*tmp*"))
    # two attention models are not App. A.1's comparison: one line, exit 2
    with pytest.raises(SystemExit) as exit_info:
        occlusion_main(["--ckpt", str(with_attention), "--baseline-ckpt", str(with_attention), "--images",
                        str(crops / "val"), "--out", str(tmp_path / "again"), "--limit", "1"])
    assert exit_info.value.code == 2 and "use_attention: false" in capsys.readouterr().err


def test_occlusion_command_bad_input_exit_2(crops, tmp_path, capsys):
    from grounding.vgbert.occlusion import main as occlusion_main

    with pytest.raises(SystemExit) as exit_info:
        occlusion_main(["--ckpt", str(tmp_path / "none.ckpt"), "--images", str(crops / "val"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "none.ckpt" in err and "make stage0" in err
