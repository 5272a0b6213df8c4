"""An option under a former name (grounding/renamed_options.py): one line naming its new place and where to rename it,
exit 2, before jsonargparse parses (whose answer would be its 50-line usage without the new name)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import subprocess
import sys

import pytest
import yaml

from grounding.cli import run_command
from grounding.errors import DEBUG_ENV
from grounding.nets import class_of, option_groups
from grounding.paths import EXPERIMENTS_DIR, REPO_ROOT
from grounding.renamed_options import annotated_net, class_moves, moved_keys, moved_option_table

STAGE1 = str(EXPERIMENTS_DIR / "vgbert" / "stage1_tiny.yaml")
COMPOSER = str(EXPERIMENTS_DIR / "composer" / "composer_world.yaml")


def run(argv: list[str], monkeypatch) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``python -m grounding <argv>``, run in this process."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        run_command(argv)
    return e.value.code, err.getvalue().strip().splitlines()


def old_config(tmp_path, base: str, section: dict) -> str:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"base": base, **section}))
    return str(path)


@pytest.mark.parametrize("flag, value, new", [
    ("--model.init_args.backbone", "tiny_cnn", "--model.init_args.net.init_args.backbone"),  # moved into the network
    ("--model.init_args.visual_heads", "4", "--model.init_args.net.init_args.visual_heads"),
    ("--data.init_args.num_workers", "2", "--data.init_args.loader.num_workers"),  # the shared loader group
    ("--data.init_args.image_size", "64", "--data.init_args.transform.image_size"),  # the shared transform group
])
def test_an_old_flag_names_its_new_place(monkeypatch, flag, value, new):
    code, lines = run(["fit", "--config", STAGE1, flag, value], monkeypatch)
    assert code == 2 and 1 <= len(lines) <= 3, lines
    assert f"{flag} is now {new} (moved); rename it in the command line" in lines[0], lines
    assert "usage:" not in "\n".join(lines)


def test_an_old_yaml_key_names_its_new_place_and_file(tmp_path, monkeypatch):
    config = old_config(tmp_path, STAGE1, {"model": {"init_args": {"text_encoder": "tiny-random"}}})
    code, lines = run(["fit", "--config", config, "--trainer.fast_dev_run=true"], monkeypatch)
    assert code == 2 and 1 <= len(lines) <= 3, lines
    assert ("model.init_args.text_encoder is now model.init_args.net.init_args.text_encoder (moved); "
            f"rename it in {config}") in lines[0], lines


@pytest.mark.parametrize("data, old, new", [
    ({"train_subset": 8}, "data.init_args.train_subset", "data.init_args.subsets.train"),
    ({"resize_size": 64, "pin_memory": True}, "data.init_args.resize_size", "data.init_args.transform.resize_size"),
    ({"captions_per_epoch": "all"}, "data.init_args.captions_per_epoch", "data.init_args.loader.captions_per_epoch"),
])
def test_a_moved_data_option_in_a_yaml(tmp_path, monkeypatch, data, old, new):
    config = old_config(tmp_path, STAGE1, {"data": {"init_args": data}})
    code, lines = run(["test", "--config", config], monkeypatch)
    assert code == 2 and 1 <= len(lines) <= 3, lines
    assert f"{old} is now {new}" in lines[0] and config in lines[0], lines
    assert ("them" if len(data) > 1 else "it") in lines[0]


def test_the_reader_inside_composers_datamodule_and_the_networks_groups(tmp_path, monkeypatch):
    """Classes nested in the config are checked against their own moves: COMPOSER's caption reader, its network's
    option groups (``ct_layers`` moved into ``sizes`` before the DataModules' groups), and its training losses."""
    config = old_config(tmp_path, COMPOSER, {
        "model": {"init_args": {"mvsa_weight": 0.5, "net": {"init_args": {"ct_layers": 3}}}},
        "data": {"init_args": {"captions": {"init_args": {"test_subset": 4}}}}})
    found = {(old, new) for _, old, new, _ in moved_keys(["fit", "--config", config])}
    assert found == {("model.init_args.mvsa_weight", "model.init_args.losses.mvsa_weight"),
                     ("model.init_args.net.init_args.ct_layers", "model.init_args.net.init_args.sizes.ct_layers"),
                     ("data.init_args.captions.init_args.test_subset", "data.init_args.captions.init_args.subsets.test")}
    code, lines = run(["fit", "--config", config], monkeypatch)
    assert code == 2 and len(lines) <= 3 and "rename them in" in lines[0], lines


def test_options_that_did_not_move_pass(tmp_path):
    """No false alarm: every config under experiments/ as written, a class whose own option shares a moved name
    (the search heads' text_encoder and image_size are theirs: they build no injected network), and a flag that
    gives the new place."""
    for path in sorted(EXPERIMENTS_DIR.rglob("*.yaml")):
        assert moved_keys(["fit", "--config", str(path)]) == [], path
    search = str(EXPERIMENTS_DIR / "vgbert" / "search_tiny.yaml")
    assert moved_keys(["fit", "--config", search, "--model.init_args.text_encoder", "minilm",
                       "--model.init_args.image_size=224"]) == []
    assert moved_keys(["fit", "--config", STAGE1, "--data.init_args.loader.num_workers", "2",
                       "--model.init_args.net.init_args.backbone", "tiny_cnn"]) == []
    # the class a flag is checked against is the one the command line ends with
    assert moved_keys(["fit", "--config", STAGE1, "--model", "SearchHeads", "--model.init_args.backbone", "x"]) == []
    assert [k[1] for k in moved_keys(["fit", "--model", "GroundingPretrain", "--model.init_args.backbone", "x"])] == [
        "model.init_args.backbone"]


SUITE_CLASSES = ["data_modules.FlickrDataModule", "data_modules.CocoCaptionsDataModule",
                 "data_modules.VisualGenomeDataModule", "data_modules.ImageFolderDataModule",
                 "grounding.composer.data.ComposerDataModule", "grounding.composer.training.ComposerTraining",
                 "grounding.composer.vse_vilbert.ViLBERTTraining", "grounding.composer.vse_vilbert.VSETraining",
                 "grounding.vgbert.pretrain.GroundingPretrain", "grounding.vgbert.finetune.RelationalFinetune",
                 "grounding.vgbert.dual_encoder.DualEncoderBaseline", "grounding.vgbert.visual_pretrain.VisualPretrain"]


def _resolves(cls: type, dotted: str) -> bool:
    """Whether ``dotted`` (relative to ``cls``'s init_args) names an argument, a group's field or a network's."""
    head, _, rest = dotted.partition(".")
    params = inspect.signature(cls).parameters
    if head not in params:
        return False
    if not rest:
        return True
    groups = option_groups(cls)
    if head in groups:
        return rest in {f.name for f in dataclasses.fields(groups[head])}
    net = annotated_net(cls) if head == "net" else None
    return rest.startswith("init_args.") and net is not None and _resolves(net, rest.removeprefix("init_args."))


def test_the_table_points_at_options_that_exist():
    """Every row of the table names an option its class takes today, under a name it does not take."""
    classes = [class_of(path) for path in SUITE_CLASSES]
    rows = moved_option_table(classes)
    assert ("FlickrDataModule", "train_subset", "subsets.train") in rows
    assert ("GroundingPretrain", "backbone", "net.init_args.backbone") in rows
    assert ("ComposerTraining", "ct_layers", "net.init_args.sizes.ct_layers") in rows
    for cls in classes:
        for old, new in class_moves(cls).items():
            assert old not in inspect.signature(cls).parameters, (cls, old)
            assert _resolves(cls, new), (cls.__name__, old, new)


def test_the_entry_point_prints_one_line_and_exits_2():
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    done = subprocess.run([sys.executable, "-m", "grounding", "fit", "--config", STAGE1, "--model.init_args.backbone",
                           "tiny_cnn"], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) <= 3, done.stderr
    assert lines[0] == ("python -m grounding: error: --model.init_args.backbone is now "
                        "--model.init_args.net.init_args.backbone (moved); rename it in the command line "
                        "(docs/configs.md, \"Renamed options\")")
