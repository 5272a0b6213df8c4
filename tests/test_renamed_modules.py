"""Renamed modules keep their old names importable (grounding/renamed_modules.py): checkpoints and run configs
written before a rename record the old dotted class paths, and ``test --ckpt_path`` imports them again."""

from __future__ import annotations

import importlib
import importlib.util
import runpy
import sys

import pytest
import torch

from grounding.cli import check_checkpoint_class
from grounding.renamed_modules import RENAMED_MODULES
from grounding.stage_config import ConfigError


@pytest.mark.parametrize("old,new", sorted(RENAMED_MODULES.items()))
def test_an_old_name_is_the_new_module_itself(old, new):
    assert importlib.util.find_spec(new).origin.endswith(".py")
    sys.modules.pop(old, None)
    with pytest.warns(FutureWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # one module object: the same classes, isinstance holds
    assert module.__spec__.name == new


@pytest.mark.filterwarnings("ignore:grounding.semclip.align was renamed:FutureWarning")
def test_a_checkpoint_recording_the_old_class_path_passes_the_class_check(tmp_path):
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "grounding.semclip.align.SemCLIPAlignment"}}, ckpt)
    check_checkpoint_class(ckpt, "grounding.semclip.alignment_training.SemCLIPAlignment")  # no error

    with pytest.raises(ConfigError, match="SemCLIPAlignment"):  # another class is still refused
        check_checkpoint_class(ckpt, "grounding.semclip.ste.SemanticTextEmbedding")


def test_python_dash_m_under_the_old_name_runs_the_new_command(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m grounding.vgbert.search", "--help"])
    monkeypatch.delitem(sys.modules, "grounding.vgbert.search", raising=False)  # as in a new process
    with pytest.warns(FutureWarning, match="image_search"), pytest.raises(SystemExit) as stop:
        runpy.run_module("grounding.vgbert.search", run_name="__main__", alter_sys=True)
    assert stop.value.code == 0
    assert "--query-text" in capsys.readouterr().out
