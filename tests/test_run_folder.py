"""A run folder is owned by one run (grounding/run_folder.py): lock, refusal of another config, test beside fit."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from run_helpers import tiny_stage1_config

from grounding.lightning import AtomicCheckpointIO
from grounding.paths import REPO_ROOT
from grounding.run_folder import RunFolderError, RunLock, check_fit_target, config_differences


def test_config_differences_count_only_values_both_configs_set():
    old = {"model": {"init_args": {"lr": 1e-3, "dropout": 0.1}}, "ckpt_path": None, "trainer": {"max_epochs": 2}}
    new = {"model": {"init_args": {"lr": 1e-4, "dropout": 0.1, "added_since": 3}}, "ckpt_path": "last",
           "trainer": {"max_epochs": 2}, "overwrite": True}
    assert config_differences(old, new) == ["model.init_args.lr"]
    assert config_differences(old, old) == []
    # evaluation block sizes do not change what a fit trains (their default moved from 128/512 to "by device")
    blocks_old = {"model": {"init_args": {"eval_image_chunk": 128, "eval_text_chunk": 512}}}
    blocks_new = {"model": {"init_args": {"eval_image_chunk": None, "eval_text_chunk": None}}}
    assert config_differences(blocks_old, blocks_new) == []


def test_check_fit_target_refuses_another_config_unless_resume_or_overwrite(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": {"lr": 1}}))
    check_fit_target(tmp_path, {"model": {"lr": 1}}, resuming=False, overwrite=False)  # same config: a rerun
    check_fit_target(tmp_path, {"model": {"lr": 2}}, resuming=False, overwrite=False)  # no checkpoints: nothing lost
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    with pytest.raises(RunFolderError, match=r"model\.lr.*--trainer.default_root_dir.*--ckpt_path last.*--overwrite"):
        check_fit_target(tmp_path, {"model": {"lr": 2}}, resuming=False, overwrite=False)
    check_fit_target(tmp_path, {"model": {"lr": 1}, "trainer": {"max_epochs": 9}}, resuming=True, overwrite=False)
    (tmp_path / "config.yaml").write_text("model: [unclosed")  # unreadable: cannot show it is the same run
    with pytest.raises(RunFolderError, match="config.yaml is unreadable"):
        check_fit_target(tmp_path, {"model": {"lr": 1}}, resuming=False, overwrite=False)
    check_fit_target(tmp_path, {"model": {"lr": 2}}, resuming=False, overwrite=True)  # set aside, not lost
    [aside] = (tmp_path / "replaced").iterdir()
    assert (aside / "checkpoints" / "last.ckpt").read_bytes() == b"x" and (aside / "config.yaml").is_file()
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "config.yaml").exists()


def test_a_resume_keeps_what_the_run_trains(tmp_path, capsys):
    """Resuming under other model/data values would train the run's later epochs as another model: refused;
    trainer settings (a longer schedule) may change, and --overwrite accepts the change on purpose, the run's
    records moved aside whole (the resumed run writes its own)."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    old = {"model": {"init_args": {"mvsa_max_concepts": None, "lr": 1, "eval_pair_chunk": 2048}}, "data": {"seed": 0},
           "trainer": {"max_epochs": 8}, "seed_everything": 0}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    longer = {**old, "trainer": {"max_epochs": 16}}
    check_fit_target(tmp_path, longer, resuming=True, overwrite=False)
    # an evaluation block size (the cross-encoders' pairs at a time) does not change what trains
    check_fit_target(tmp_path, {**old, "model": {"init_args": {"mvsa_max_concepts": None, "lr": 1, "eval_pair_chunk": 512}}},
                     resuming=True, overwrite=False)
    for changed, key in [({**old, "model": {"init_args": {"mvsa_max_concepts": 2, "lr": 1}}}, "model.init_args.mvsa_max_concepts"),
                         ({**old, "data": {"seed": 1}}, "data.seed")]:
        with pytest.raises(RunFolderError, match=rf"differs in {key}: .*own config.*--overwrite true"):
            check_fit_target(tmp_path, changed, resuming=True, overwrite=False)
        assert (tmp_path / "checkpoints" / "last.ckpt").read_bytes() == b"x"  # nothing moved by a refusal
        moved = check_fit_target(tmp_path, changed, resuming=True, overwrite=True)
        assert f"differs in {key}" in capsys.readouterr().err
        assert (moved / "checkpoints" / "last.ckpt").read_bytes() == b"x" and yaml.safe_load(
            (moved / "config.yaml").read_text()) == old and not (tmp_path / "config.yaml").exists()
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "config.yaml").unlink()  # a checkpoint without its run's record: nothing to compare with
    check_fit_target(tmp_path, longer, resuming=True, overwrite=False)


def test_lock_refuses_a_live_owner_and_takes_over_a_dead_ones(tmp_path, capsys):
    lock = RunLock(tmp_path).acquire()
    owner = json.loads((tmp_path / ".lock").read_text())
    assert owner["pid"] == os.getpid() and lock.held
    # a second process cannot take the folder while this one holds it
    probe = subprocess.run([sys.executable, "-c", "import sys; from grounding.run_folder import RunLock\n"
                            f"RunLock({str(tmp_path)!r}).acquire()"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert probe.returncode != 0 and "is in use by another run (pid" in probe.stderr
    lock.release()
    assert not (tmp_path / ".lock").exists()
    # a lock left by a killed run (its pid is gone) is taken over, with a line saying so
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({**owner, "pid": dead.pid, "pid_start": None}))
    RunLock(tmp_path).acquire().release()
    assert "the run that held it is gone" in capsys.readouterr().err


def test_cli_run_folder_owned_by_one_run(tiny_world, tmp_path, monkeypatch):
    """A concurrent fit is refused; a fit of another config into a run's folder is refused (files untouched) unless
    --overwrite; test writes config.test.yaml and metrics.test.json beside the fit's config.yaml."""
    from grounding.cli import main

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, root, max_epochs=1, limit_train_batches=1,
                                limit_val_batches=1, limit_test_batches=1)

    def run(*args):
        with contextlib.redirect_stdout(io.StringIO()):
            return main([args[0], "--config", str(config), *args[1:]])

    run("fit")
    fit_config = (root / "config.yaml").read_bytes()
    last = (root / "checkpoints" / "last.ckpt").read_bytes()
    assert not (root / ".lock").exists()  # released when the fit ended

    with pytest.raises(RunFolderError, match="optimizer.init_args.lr"):
        run("fit", "--model.init_args.optimizer.init_args.lr=0.5")
    assert (root / "config.yaml").read_bytes() == fit_config and (root / "checkpoints" / "last.ckpt").read_bytes() == last

    held = RunLock(root).acquire()  # another run (here: this test) owns the folder
    try:
        with pytest.raises(RunFolderError, match="is in use by another run"):
            run("fit")
    finally:
        held.release()

    run("test", "--ckpt_path=last")
    assert (root / "config.yaml").read_bytes() == fit_config  # never over the fit's
    assert yaml.safe_load((root / "config.test.yaml").read_text())["ckpt_path"].endswith("last.ckpt")
    metrics = json.loads((root / "metrics.test.json").read_text())
    assert "test/rsum" in metrics and isinstance(metrics["test/rsum"], float)

    run("fit", "--model.init_args.optimizer.init_args.lr=0.5", "--overwrite=true")
    assert yaml.safe_load((root / "config.yaml").read_text())["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.5


def test_a_resume_never_ignores_a_changed_model_value(tiny_world, tmp_path, monkeypatch, capsys):
    """`fit --ckpt_path last` with another model value (the temperature) is refused, the run's files untouched; with
    --overwrite true the given value is the one trained and recorded, and the earlier run is moved aside, whole."""
    from grounding.cli import main

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, root, max_epochs=1, limit_train_batches=1,
                                limit_val_batches=1)

    def run(*args):
        with contextlib.redirect_stdout(io.StringIO()):
            return main([args[0], "--config", str(config), *args[1:]])

    run("fit")
    recorded = yaml.safe_load((root / "config.yaml").read_text())["model"]["init_args"]["temperature"]
    before = {p: p.read_bytes() for p in [root / "config.yaml", root / "checkpoints" / "last.ckpt"]}
    with pytest.raises(RunFolderError, match=rf"(?s)temperature \({recorded!r} in the checkpoint, 0.5 given\).*--overwrite"):
        run("fit", "--trainer.max_epochs=2", "--ckpt_path=last", "--model.init_args.temperature=0.5")
    assert all(p.read_bytes() == data for p, data in before.items())

    cli = run("fit", "--trainer.max_epochs=2", "--ckpt_path=last", "--model.init_args.temperature=0.5", "--overwrite=true")
    assert cli.model.hparams.temperature == 0.5 and cli.trainer.current_epoch == 2  # resumed after epoch 0
    assert yaml.safe_load((root / "config.yaml").read_text())["model"]["init_args"]["temperature"] == 0.5
    (aside,) = (root / "replaced").iterdir()
    assert {p: (aside / p.relative_to(root)).read_bytes() for p in before} == before
    assert "moved to" in capsys.readouterr().err

    # a save killed part-way left its temporary beside last.ckpt: the next fit removes it, and saves atomically
    stale = root / "checkpoints" / ".last.ckpt.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    cli = run("fit", "--trainer.max_epochs=3", "--ckpt_path=last", "--model.init_args.temperature=0.5")
    assert not stale.exists() and type(cli.trainer.strategy.checkpoint_io).__name__ == "AtomicCheckpointIO"

    # test: the checkpoint's network is the one evaluated, and the command says so when the config differs
    run("test", "--ckpt_path=last", "--model.init_args.temperature=0.7", "--trainer.limit_test_batches=1")
    assert "temperature (0.5 in the checkpoint, 0.7 given)" in capsys.readouterr().err


def test_a_checkpoint_save_killed_part_way_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    """AtomicCheckpointIO writes beside the target and renames: a save that fails part-way leaves the earlier
    checkpoint whole and nothing in the system temp folder (Lightning's fsspec writer stages the file there)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "system_tmp"))
    (tmp_path / "system_tmp").mkdir()
    target = tmp_path / "checkpoints" / "last.ckpt"
    io_plugin = AtomicCheckpointIO()
    io_plugin.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, target)
    earlier = target.read_bytes()

    def killed(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        io_plugin.save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, target)
    assert target.read_bytes() == earlier and [p.name for p in target.parent.iterdir()] == ["last.ckpt"]
    assert not any((tmp_path / "system_tmp").iterdir())
