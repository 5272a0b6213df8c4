"""A network's switches grouped into option dataclasses (``Composer(sizes=..., composition=...)``): recorded as plain
mappings, rebuilt from either layout, and checkpoints written before the grouping (flat ``init_args``) still load,
test and resume (grounding/nets.py, GroundingCLI._parse_ckpt_path)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest
import torch
import yaml

from grounding.cli import main as cli_main
from grounding.composer.model import Composer, ComposerSizes, CompositionOptions
from grounding.nets import build_net, constructor_args, flat_args, net_spec, regrouped_spec
from grounding.paths import EXPERIMENTS_DIR

TINY = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None)


def test_flat_arguments_move_into_their_groups():
    args = constructor_args(Composer, {**TINY, "ct_layers": 1, "co_dim": 16, "child_skip": True, "readout": "mean"})
    assert args["sizes"] == ComposerSizes(ct_layers=1, co_dim=16)
    assert args["composition"] == CompositionOptions(child_skip=True, readout="mean")
    assert "ct_layers" not in args and args["text_encoder"] == "tiny-random"
    # a group given as a mapping becomes its dataclass; a flat argument beside it replaces the group's field
    args = constructor_args(Composer, {"sizes": {"ct_layers": 3, "heads": 2}, "ct_layers": 1})
    assert args == {"sizes": ComposerSizes(ct_layers=1, heads=2)}
    assert constructor_args(Composer, TINY) == TINY  # no group named: the defaults stay the constructor's
    assert flat_args(Composer, {"sizes": {"heads": 2}, "dim": 8}) == {"heads": 2, "dim": 8}
    assert flat_args(Composer, {"sizes": ComposerSizes()})["co_dim"] == ComposerSizes().co_dim


def test_a_wrong_switch_is_refused_when_the_group_is_built():
    with pytest.raises(ValueError, match="readout must be one of"):
        CompositionOptions(readout="max")


def test_groups_are_recorded_as_plain_mappings_and_rebuild_from_either_layout():
    torch.manual_seed(0)
    net = Composer(**TINY, sizes=ComposerSizes(pt_layers=2, heads=2, co_dim=16, co_heads=2, ct_layers=1),
                   composition=CompositionOptions(child_skip=True))
    spec = net_spec(net)
    assert spec["init_args"]["sizes"]["co_dim"] == 16 and spec["init_args"]["composition"]["child_skip"] is True
    assert not any(dataclasses.is_dataclass(v) for v in spec["init_args"].values())
    flat = {**spec, "init_args": flat_args(Composer, spec["init_args"])}  # as checkpoints before the grouping
    assert "sizes" not in flat["init_args"] and flat["init_args"]["co_dim"] == 16
    assert regrouped_spec(flat) == spec
    for layout in (spec, flat):
        rebuilt = build_net(layout)
        assert rebuilt.init_args == net.init_args
        assert rebuilt.load_state_dict(net.state_dict()) is not None  # same shapes, same names


def test_a_checkpoint_with_flat_arguments_tests_as_it_was_trained(tiny_world, tmp_path, monkeypatch):
    """A checkpoint written before the grouping (its network's arguments flat) tests through ``python -m grounding``
    with the same numbers as the same weights recorded with groups."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    net = {**TINY, "sizes": {"pt_layers": 2, "heads": 2, "co_heads": 2, "co_dim": 16, "dim": 32, "ct_layers": 1}}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "base": str(EXPERIMENTS_DIR / "composer" / "composer_world.yaml"),
        "model": {"init_args": {"net": {"init_args": net}}},
        "data": {"init_args": {"captions": {"class_path": "data_modules.FlickrDataModule",
                                            "init_args": {"root": str(tiny_world / "flickr")}},
                               "world_meta": str(tiny_world / "world.json"), "batch_size": 8}}}))
    quiet = ["--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli_main(["fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
                  "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp_path / 'run'}", *quiet])
    grouped = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(grouped, map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["net"]["init_args"]["sizes"]["co_dim"] == 16
    spec = ckpt["hyper_parameters"]["net"]
    ckpt["hyper_parameters"]["net"] = {**spec, "init_args": flat_args(Composer, spec["init_args"])}
    # the module's own group (ComposerTraining's ``losses``) as a plain mapping, flat in the older checkpoint
    losses = ckpt["hyper_parameters"]["losses"]
    assert isinstance(losses, dict) and losses["concept_reduction"] == "mean"  # composer_world.yaml's
    ckpt["hyper_parameters"].update(ckpt["hyper_parameters"].pop("losses"))
    flat = tmp_path / "flat.ckpt"
    torch.save(ckpt, flat)
    metrics = {}
    for name, path in (("grouped", grouped), ("flat", flat)):
        out = tmp_path / f"test_{name}"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli = cli_main(["test", "--config", str(config), "--ckpt_path", str(path),
                            f"--trainer.default_root_dir={out}", "--trainer.limit_test_batches=1", *quiet])
        assert cli.model.net.init_args == build_net(spec).init_args
        assert dataclasses.asdict(cli.model.losses) == losses
        metrics[name] = json.loads((out / "metrics.test.json").read_text())
    assert metrics["flat"] == metrics["grouped"] and metrics["flat"]


def test_stage_3_reads_a_stage_2_checkpoint_of_either_layout(tmp_path):
    """SearchHeads takes its frozen network's architecture from the stage-2 checkpoint: grouped (today) or flat
    (before the grouping), the same network."""
    from grounding.vgbert.finetune import RelationalFinetune
    from grounding.vgbert.relational import RelationHeadOptions, VGBertRelational
    from grounding.vgbert.search_heads import SearchHeads

    torch.manual_seed(0)
    net = VGBertRelational(2, 3, **TINY, visual_heads=2, image_size=64,
                           relation=RelationHeadOptions(key_position="keys_values", relation_dim=8))
    stage2 = RelationalFinetune(net, ["on", "near"], ["ball", "box", "car"], feature_cache=False)
    hparams = dict(stage2.hparams)
    flat = {**hparams, "net": {**hparams["net"], "init_args": flat_args(VGBertRelational, hparams["net"]["init_args"])}}
    assert "relation" in hparams["net"]["init_args"] and "relation_dim" in flat["net"]["init_args"]
    for name, hp in (("grouped", hparams), ("flat", flat)):
        path = tmp_path / f"{name}.ckpt"
        torch.save({"state_dict": stage2.state_dict(), "hyper_parameters": hp}, path)
        heads = SearchHeads(init_from=str(path), feature_cache=False)
        heads.load_stage2(path)  # every weight found, every shape the same
        grounding = heads.search.grounding
        assert grounding.relational.attention.key_position == "keys_values"
        assert grounding.init_args == net.init_args | {"backbone_weights": None}


def test_a_nested_null_on_the_command_line_is_null(tiny_world):
    """jsonargparse reads ``--<nested key> null`` as the string "None"; the CLI passes such a flag as an inline config."""
    from grounding.stage_config import nested_nulls_as_config

    key = "--model.init_args.net.init_args.relation.classifier_hidden"
    assert nested_nulls_as_config(["fit", key, "null", "--data.init_args.split.split_file=None", "--x.y", "null",
                                   "--data.init_args.batch_size", "4", "--data.init_args.root=null"]) == [
        "fit", "--config", "{model: {init_args: {net: {init_args: {relation: {classifier_hidden: null}}}}}}",
        "--config", "{data: {init_args: {split: {split_file: null}}}}", "--x.y", "null",
        "--data.init_args.batch_size", "4", "--data.init_args.root=null"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = cli_main(["--config", str(EXPERIMENTS_DIR / "vgbert" / "stage2_tiny.yaml"), key, "null",
                        "--data.init_args.split.split_file=null", f"--data.init_args.root={tiny_world / 'visual_genome'}",
                        "--trainer.logger=false"], run=False)
    assert cli.model.model.init_args["relation"]["classifier_hidden"] is None and cli.datamodule.split_file is None


@pytest.mark.parametrize("where, flat, expected", [
    ("model", {"net": {"init_args": {"ct_layers": 3}}},
     "model.init_args.net.init_args.ct_layers is now model.init_args.net.init_args.sizes.ct_layers"),
    ("data", {"hard_negative_pool_size": 5},
     "data.init_args.hard_negative_pool_size is now data.init_args.hard_negative_pool.pool_size"),
])
def test_a_config_with_a_moved_option_says_where_it_went(tmp_path, monkeypatch, where, flat, expected):
    """One line naming the new place and the file (grounding/renamed_options.py), exit 2, before the parse."""
    from grounding.cli import run_command

    monkeypatch.delenv("GROUNDING_DEBUG", raising=False)
    config = tmp_path / "old.yaml"
    config.write_text(yaml.safe_dump({"base": str(EXPERIMENTS_DIR / "composer" / "composer_world.yaml"),
                                      where: {"init_args": flat}}))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        run_command(["fit", "--config", str(config), "--trainer.fast_dev_run=true"])
    assert e.value.code == 2
    lines = stderr.getvalue().strip().splitlines()
    assert len(lines) <= 3 and f"{expected} (moved); rename it in {config}" in lines[0], lines


def test_a_run_recorded_before_the_groups_resumes_and_its_moved_values_are_still_compared(tmp_path):
    """A run folder's config.yaml written before the option groups holds their fields flat: resuming it under
    today's config compares each field in its group, so the same values resume and a changed one is refused."""
    from grounding.run_folder import RunFolderError, check_fit_target

    composer = "grounding.composer.model.Composer"
    data = "grounding.composer.data.ComposerDataModule"
    old = {"model": {"class_path": "grounding.composer.training.ComposerTraining",
                     "init_args": {"net": {"class_path": composer, "init_args": {**TINY, "ct_layers": 3}}}},
           "data": {"class_path": data, "init_args": {"hard_negative_pool_size": 100, "batch_size": 8}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))

    def today(ct_layers, pool_size):
        net = {**TINY, "sizes": dataclasses.asdict(ComposerSizes(ct_layers=ct_layers)),
               "composition": dataclasses.asdict(CompositionOptions())}
        return {"model": {"class_path": old["model"]["class_path"],
                          "init_args": {"net": {"class_path": composer, "init_args": net}}},
                "data": {"class_path": data, "init_args": {"hard_negative_pool": {"pool_size": pool_size,
                                                                                  "embeddings": None},
                                                           "batch_size": 8}}}

    check_fit_target(tmp_path, today(3, 100), resuming=True, overwrite=False)
    for changed, key in ((today(5, 100), "sizes.ct_layers"), (today(3, 7), "hard_negative_pool.pool_size")):
        with pytest.raises(RunFolderError, match=key):
            check_fit_target(tmp_path, changed, resuming=True, overwrite=False)
