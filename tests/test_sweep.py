"""Sweeps (grounding/sweep.py): the paper's VG-BERT ablation grids, one folder per parameter set whoever launches
the run (the offline runner or ``wandb agent``), the fit -> test -> report chain and its failure path, the summary
laid out as Fig. 3 / Fig. 12 / Table 2 / Table 5, and bad input as one line with exit status 2."""

from __future__ import annotations

import json
import os
import random
import sys

import pytest
import torch
import yaml

from grounding import sweep as sw
from grounding.errors import user_errors_exit
from grounding.paths import EXPERIMENTS_DIR, REPO_ROOT

SWEEPS = EXPERIMENTS_DIR / "sweeps"
NET = "model.init_args.net.init_args"
# sweep file -> (grid points, the sweep name its runs go under, fits after --skip-if)
PAPER_SWEEPS = {"stage1_layers.yaml": (16, "stage1_layers", 14), "stage1_layers_world.yaml": (16, "stage1_layers_world", 14),
                "stage1_losses.yaml": (3, "stage1_losses", 3), "stage1_losses_world.yaml": (3, "stage1_losses_world", 3),
                "stage2_losses.yaml": (4, "stage2_losses", 4), "stage2_losses_world.yaml": (4, "stage2_losses_world", 4)}


def _plan(cmd: list[str], env: dict | None = None) -> sw.RunPlan:
    """The run program's plan of a sweep command (what ``python -m grounding.sweep run ...`` would do)."""
    at = cmd.index("grounding.sweep")
    assert cmd[at + 1] == "run"
    return sw.RunPlan(*sw.run_parser().parse_known_args(cmd[at + 2:]), env={} if env is None else env)


def wandb_agent_command(sweep: dict, params: dict) -> list[str]:
    """The command ``wandb agent`` runs for one grid point: its own ``${args}`` (``--key=value`` with Python's
    ``str`` of the value: ``True``, ``0.1``), ``${interpreter}`` = python, ``${env}`` = /usr/bin/env."""
    try:  # wandb's own formatting when installed
        from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

        args = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})["args"]
    except ImportError:
        args = [f"--{k}={v}" for k, v in params.items()]
    macros = {"${env}": ["/usr/bin/env"], "${interpreter}": ["python"], "${program}": [sweep.get("program", "")],
              "${args}": args}
    return [token for item in sweep["command"] for token in macros.get(item, [item])]


# ---------------------------------------------------------------------------------------------- grids and folders
@pytest.mark.parametrize("name", sorted(PAPER_SWEEPS))
def test_paper_sweeps_expand_to_run_commands(name):
    points, sweep_name, fits = PAPER_SWEEPS[name]
    sweep = sw.load_sweep(SWEEPS / name)
    grid = sw.expand_grid(sweep, name)
    assert len(grid) == points
    plans = [_plan(sw.build_command(sweep, params)) for params in grid]
    assert all(p.args.sweep == sweep_name and p.report is not None for p in plans)
    assert all((REPO_ROOT / p.report).is_file() and (REPO_ROOT / p.args.config).is_file() for p in plans)
    trained = [p for p in plans if p.skip is None]
    assert len(trained) == fits
    # every fit trains into its own folder under outputs/sweeps/<sweep>/
    folders = [p.folder for p in trained]
    assert len(set(folders)) == len(folders)
    assert all(f.parent == sw.Path(sw.DEFAULT_ROOT) / sweep_name for f in folders)
    for p in trained:
        assert p.fit_args[:3] == ["fit", "--config", p.args.config] and p.fit_args[-1] == f"--trainer.default_root_dir={p.folder}"
        assert "--ckpt_path" in p.test_args and p.test_args[p.test_args.index("--ckpt_path") + 1] == "best"


def test_the_layer_grid_is_the_papers():
    """Fig. 3 x Fig. 12: k in {0, 4, 8, 12} x Q/K frozen / trainable x dropout 0.1 / 0.3; k = 0 with trainable Q/K
    (the same model as frozen: no BERT layer trains) is skipped."""
    sweep = sw.load_sweep(SWEEPS / "stage1_layers.yaml")
    grid = sw.expand_grid(sweep)
    combos = {(g[f"{NET}.trainable_layers"], g[f"{NET}.freeze_query_key"], g[f"{NET}.dropout"]) for g in grid}
    assert combos == {(k, qk, d) for k in (0, 4, 8, 12) for qk in (True, False) for d in (0.1, 0.3)}
    skipped = {(g[f"{NET}.trainable_layers"], g[f"{NET}.freeze_query_key"]) for g in grid
               if _plan(sw.build_command(sweep, g)).skip is not None}
    assert skipped == {(0, False)}
    assert "stage1_paper.yaml" in " ".join(sweep["command"]) and "sweep_stage1.yaml" in " ".join(sweep["command"])
    world = sw.expand_grid(sw.load_sweep(SWEEPS / "stage1_layers_world.yaml"))
    assert sorted({g[f"{NET}.trainable_layers"] for g in world}) == [0, 2, 4, 6]  # MiniLM's 6 layers in proportion


@pytest.mark.parametrize("name", ["stage1_layers.yaml", "stage1_losses.yaml", "stage2_losses.yaml"])
def test_run_folder_is_the_same_under_the_runner_and_wandb_agent(name, monkeypatch):
    sweep = sw.load_sweep(SWEEPS / name)
    offline, agent = [], []
    for i, params in enumerate(sw.expand_grid(sweep)):
        offline.append(_plan(sw.build_command(sweep, params)).folder)
        env = {"WANDB_SWEEP_ID": "abc123", "WANDB_RUN_ID": f"run{i:04d}", "WANDB_SWEEP_PARAM_PATH": "wandb/x.yaml"}
        shuffled = dict(random.Random(i).sample(sorted(params.items()), len(params)))  # wandb's order may differ
        cmd = wandb_agent_command(sweep, shuffled)
        assert cmd[:2] == ["/usr/bin/env", "python"]
        plan = _plan(cmd, env)
        agent.append(plan.folder)
        assert plan.run_id == f"run{i:04d}"
        # --append-run-id: one folder per wandb run instead
        with_id = _plan(cmd[:cmd.index("run") + 1] + ["--append-run-id"] + cmd[cmd.index("run") + 1:], env)
        assert with_id.folder == plan.folder.parent / f"{plan.folder.name}__run{i:04d}"
    assert offline == agent
    assert len(set(offline)) == len(offline)


def test_run_name_is_canonical_and_unique():
    a = {f"{NET}.trainable_layers": "4", f"{NET}.freeze_query_key": "True", f"{NET}.dropout": "0.3"}
    b = {f"{NET}.dropout": 0.3, f"{NET}.freeze_query_key": True, f"{NET}.trainable_layers": 4}
    assert sw.run_name(a) == sw.run_name(b) == "dropout=0.3_freeze_query_key=true_trainable_layers=4"
    assert sw.run_name({"model.init_args.dropout": 1, "data.init_args.dropout": 2}) == \
        "data.init_args.dropout=2_model.init_args.dropout=1"  # a shared last component is written in full
    odd = [sw.run_name({"x": v}) for v in ("a b", "a/b", "a-b", "[1, 2]", "[1, 3]")]
    assert sw.run_name({"x": "[1,2]"}) == sw.run_name({"x": [1, 2]}) == odd[3]  # the same value, as YAML reads it
    assert len(set(odd)) == len(odd) and all("/" not in n and " " not in n for n in odd)
    assert len(sw.run_name({"x": "y" * 500})) < 170
    assert sw.run_name({}) == "default"


def test_offline_runner_options_reach_the_run(tmp_path, capsys):
    sweep = sw.load_sweep(SWEEPS / "stage1_layers_world.yaml")
    params = sw.expand_grid(sweep)[2]
    cmd = sw.build_command(sweep, params, config="other.yaml", extra=["trainer.max_epochs=1"],
                           report="r.yaml", root=str(tmp_path))
    plan = _plan(cmd)
    assert plan.args.config == "other.yaml" and plan.report == "r.yaml" and plan.sets == {"trainer.max_epochs": "1"}
    assert plan.folder == tmp_path / "stage1_layers_world" / sw.run_name(params)  # --set is not part of the name
    assert "--trainer.max_epochs=1" in plan.fit_args and "--trainer.max_epochs=1" in plan.test_args
    # the runner's dry run prints every run's folder and steps; --only keeps the matching grid points
    assert sw.main([str(SWEEPS / "stage1_layers_world.yaml"), "--dry-run", "--only", "trainable_layers=2,dropout=0.3",
                    "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("  fit:    ") == 2 and out.count("  report: ") == 2
    assert f"{tmp_path}/stage1_layers_world/dropout=0.3_freeze_query_key=false_trainable_layers=2" in out
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_legacy_fit_sweeps_keep_their_folders():
    sweep = {"program": "grounding", "method": "grid", "parameters": {"model.init_args.mvsa_weight": {"values": [0.0, 1.0]}},
             "command": ["${env}", "${interpreter}", "-m", "grounding", "fit", "--config", "a.yaml", "${args}"]}
    cmd = sw.build_command(sweep, sw.expand_grid(sweep)[1], extra=["trainer.max_epochs=1"])
    assert not sw.is_run_command(cmd) and cmd[-1] == "--trainer.max_epochs=1"
    assert sw.fit_arguments(cmd)[:3] == ["fit", "--config", "a.yaml"]
    assert sw.run_folder("composer_mvsa", {"model.init_args.mvsa_weight": 1.0}).as_posix() == \
        "outputs/sweeps/composer_mvsa/mvsa_weight=1.0"


# ---------------------------------------------------------------------------------------------- the chain, faked
def _fake_checkpoint(path, sizes=((3, 4), (5,))):
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(s), "exp_avg_sq": torch.zeros(s)} for i, s in enumerate(sizes)}
    torch.save({"state_dict": {}, "optimizer_states": [{"state": state, "param_groups": [{"params": list(range(len(sizes) + 1))}]}]},
               path)


def _fake_steps(monkeypatch, fail: str | None = None):
    """Replace the three subprocesses: the fit writes a checkpoint and its config, the test its metrics, the report
    the CSVs the result reads. Returns the steps run, in order."""
    calls = []

    def step(label, cmd, env):
        calls.append((label, cmd, dict(env)))
        if label == fail:
            return 2, 0.1
        if label == "fit":
            root = sw.Path(cmd[-1].split("=", 1)[1])
            _fake_checkpoint(root / "checkpoints" / "best-epoch000-step3.ckpt")
            (root / "config.yaml").write_text(yaml.safe_dump({"model": {"init_args": {"net": {"init_args": {"text_encoder": "minilm"}}}}}))
            (root / "fit_record.json").write_text(json.dumps({"seconds": 12.5, "epochs": 1}))
        elif label == "test":
            root = sw.Path(next(a for a in cmd if a.startswith("--trainer.default_root_dir=")).split("=", 1)[1])
            (root / "metrics.test.json").write_text(json.dumps({"test/i2t_r1": 25.0, "test/t2i_r1": 20.0}))
        elif label == "report":
            cfg = yaml.safe_load(sw.Path(cmd[-1]).read_text())["semantic_space"]
            out = sw.Path(cfg["out"])
            out.mkdir(parents=True)
            names = [m["name"] for m in cfg["models"]]
            (out / "silhouette_summary.csv").write_text(
                "model,n_categories,mean,median,p_greater_than_first,significance\n"
                f"{names[0]},3,0.1,0.09,,\n{names[1]},3,0.2,0.19,0.01,*\n")
            (out / "table2_composition.csv").write_text(
                f"query,target,{names[0]} cosine,{names[0]} rank,{names[1]} cosine,{names[1]} rank\n"
                "striped horse,zebra,0.1,300,0.5,3\nred fruit,strawberry,0.2,100,0.7,1\n")
        return 0, 0.1

    monkeypatch.setattr(sw, "_step", step)
    return calls


def _report_config(tmp_path):
    path = tmp_path / "report.yaml"
    path.write_text(yaml.safe_dump({"semantic_space": {
        "models": [{"source": sw.TEXT_ENCODER, "name": "Bert"}, {"source": sw.CHECKPOINT, "name": "Grounded"}],
        "parts": ["clustering", "composition"]}}))
    return path


def test_run_chains_fit_test_report_into_sweep_result(tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch)
    logged = {}

    class FakeRun:
        summary = {}

        def log(self, values):
            logged["log"] = values

        def finish(self):
            logged["finished"] = True

    class FakeWandb:
        @staticmethod
        def init(**kwargs):
            logged["init"] = kwargs
            return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_RUN_ID", "agent42")
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep7")
    rc = sw.main(["run", "--sweep", "s1", "--config", "c.yaml", "--report", str(_report_config(tmp_path)),
                  "--root", str(tmp_path / "out"), f"--{NET}.trainable_layers=8", f"--{NET}.freeze_query_key=True"])
    assert rc == 0
    assert [c[0] for c in calls] == ["fit", "test", "report"]
    folder = tmp_path / "out" / "s1" / "freeze_query_key=true_trainable_layers=8"
    fit_cmd = calls[0][1]
    assert fit_cmd[1:6] == ["-m", "grounding", "fit", "--config", "c.yaml"]
    assert f"--{NET}.freeze_query_key=true" in fit_cmd and fit_cmd[-1] == f"--trainer.default_root_dir={folder}"
    assert all(c[2]["WANDB_RUN_ID"] == "agent42" for c in calls)  # the fit logs into the agent's run
    report_cfg = yaml.safe_load((folder / sw.REPORT_CONFIG).read_text())["semantic_space"]
    assert report_cfg["models"][0]["source"] == "minilm"  # ${text_encoder}: the run's plain encoder
    assert report_cfg["models"][1]["source"].endswith("checkpoints/best-epoch000-step3.ckpt")
    assert report_cfg["out"] == str(folder / "semantic_space")
    result = json.loads((folder / sw.RESULT_FILE).read_text())
    assert result["params"] == {f"{NET}.trainable_layers": 8, f"{NET}.freeze_query_key": True}
    assert result["test"] == {"test/i2t_r1": 25.0, "test/t2i_r1": 20.0}
    assert result["learnable_parameters"] == 17  # Adam moments of a 3x4 and a 5 (a third parameter got no update)
    assert result["semantic_space"]["reference"]["silhouette_mean"] == 0.1
    assert result["semantic_space"]["run"] == {"name": "Grounded", "silhouette_mean": 0.2, "silhouette_median": 0.19,
                                               "silhouette_p_vs_reference": 0.01, "composition_mean_cosine": 0.6,
                                               "composition_median_rank": 2.0}
    assert result["wandb"] == {"run_id": "agent42", "sweep_id": "sweep7", "logged": True}
    assert logged["init"]["id"] == "agent42" and logged["init"]["resume"] == "allow" and logged["finished"]
    assert logged["log"]["sweep/test/i2t_r1"] == 25.0 and logged["log"]["sweep/semantic_space/silhouette_mean"] == 0.2
    assert logged["log"]["sweep/semantic_space/reference/silhouette_mean"] == 0.1


@pytest.mark.parametrize("fail", ["fit", "test", "report"])
def test_a_failed_step_stops_the_run_with_its_exit_status(fail, tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch, fail=fail)
    rc = sw.main(["run", "--sweep", "s1", "--config", "c.yaml", "--report", str(_report_config(tmp_path)),
                  "--root", str(tmp_path / "out"), "--model.init_args.loss_terms=l"])
    assert rc == 2
    steps = ["fit", "test", "report"]
    assert [c[0] for c in calls] == steps[:steps.index(fail) + 1]
    assert not (tmp_path / "out" / "s1" / "loss_terms=l" / sw.RESULT_FILE).exists()


def test_skip_if_ends_a_duplicate_grid_point_at_once(tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch)
    argv = ["run", "--sweep", "s", "--config", "c.yaml", "--root", str(tmp_path), "--skip-if",
            "trainable_layers=0,freeze_query_key=false", f"--{NET}.trainable_layers=0"]
    assert sw.main([*argv, f"--{NET}.freeze_query_key=False"]) == 0 and not calls and not list(tmp_path.iterdir())
    assert sw.main([*argv, f"--{NET}.freeze_query_key=true", "--no-test"]) == 0 and [c[0] for c in calls] == ["fit"]


def test_best_checkpoint_is_the_clis(tmp_path):
    from grounding.cli import resolve_run_checkpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for i, name in enumerate(["best-epoch001-step9.ckpt", "best-epoch000-step3.ckpt", "last.ckpt"]):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (1000 + i, 1000 + i))
    assert str(sw.best_checkpoint(tmp_path)) == resolve_run_checkpoint("best", str(tmp_path), "test")
    assert sw.best_checkpoint(tmp_path / "none") is None


# ---------------------------------------------------------------------------------------------- the summary
def _result(folder, params, test=None, silhouette=None, reference=0.05, learnable=None):
    run = sw.run_name(params)
    (folder / run).mkdir(parents=True)
    result = {"run": run, "params": params, "test": test or {}, "learnable_parameters": learnable,
              "semantic_space": {"reference": {"name": "Bert", "silhouette_mean": reference},
                                 "run": {"name": "Grounded", "silhouette_mean": silhouette}}}
    (folder / run / sw.RESULT_FILE).write_text(json.dumps(result))


def _md_table(text, title):
    """The rows of the Markdown table under the heading that starts with ``title``, as lists of cells."""
    block = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("|")]


def test_summary_lays_out_fig3_and_fig12(tmp_path):
    folder = tmp_path / "stage1_layers"
    for k in (0, 4, 8):
        for qk in (True, False):
            for d in (0.1, 0.3):
                if k == 0 and not qk:
                    continue  # skipped by the grid
                params = {f"{NET}.trainable_layers": k, f"{NET}.freeze_query_key": qk, f"{NET}.dropout": d}
                _result(folder, params, {"test/i2t_r1": 10 + k + d, "test/t2i_r1": 5 + k + d},
                        silhouette=0.05 if k == 0 else 0.1 + k / 100 + d / 10 + (0 if qk else 0.001),
                        learnable=(1_000_000 * (k + 1) * (1 if qk else 2)))
    sw.summarize(folder)
    md = (folder / "summary.md").read_text()
    fig3 = _md_table(md, "Fig. 3")
    assert fig3[0] == ["k", "Q/K frozen, dropout 0.1", "Q/K trainable, dropout 0.1", "Q/K frozen, dropout 0.3",
                       "Q/K trainable, dropout 0.3"]
    assert [r[0] for r in fig3[2:]] == ["0 (Bert)", "4", "8"]
    assert fig3[2][1] == fig3[2][2] == "10.1 / 5.1 / 1.00"  # one k = 0 run for both Q/K columns
    assert fig3[3][1:] == ["14.1 / 9.1 / 5.00", "14.1 / 9.1 / 10.00", "14.3 / 9.3 / 5.00", "14.3 / 9.3 / 10.00"]
    fig12 = _md_table(md, "Fig. 12")
    assert fig12[0] == fig3[0] and fig12[2][1:] == ["0.0500"] * 4
    assert fig12[4][1:] == ["0.1900", "0.1910", "0.2100", "0.2110"]
    rows = list(__import__("csv").DictReader(open(folder / "fig3.csv")))
    assert [r["k"] for r in rows] == ["0 (Bert)", "4", "8"]
    assert float(rows[2]["Q/K trainable, dropout 0.3: i2t R@1"]) == pytest.approx(18.3)
    assert float(rows[2]["Q/K trainable, dropout 0.3: learnable parameters (M)"]) == pytest.approx(18.0)
    long = list(__import__("csv").DictReader(open(folder / "summary.csv")))
    assert len(long) == 10 and {"run", "trainable_layers", "freeze_query_key", "dropout", "test/i2t_r1"} <= set(long[0])
    # without a k = 0 run, Fig. 12's k = 0 row is the reference (the plain encoder) every report holds
    for path in folder.glob("dropout=*_trainable_layers=0"):
        (path / sw.RESULT_FILE).unlink()
    sw.summarize(folder)
    md = (folder / "summary.md").read_text()
    assert [r[0] for r in _md_table(md, "Fig. 3")[2:]] == ["4", "8"]
    assert _md_table(md, "Fig. 12")[2] == ["0 (Bert)"] + ["0.0500"] * 4


def test_summary_lays_out_tables_2_and_5(tmp_path):
    t2 = tmp_path / "stage1_losses"
    for terms, (i2t, t2i) in {"both": (25.0, 24.0), "l": (26.0, 17.0), "v": (1.5, 25.0)}.items():
        _result(t2, {"model.init_args.loss_terms": terms}, {"test/i2t_r1": i2t, "test/t2i_r1": t2i}, silhouette=0.2)
    sw.summarize(t2)
    table = _md_table((t2 / "summary.md").read_text(), "Table 2")
    assert table[0] == ["loss", "this sweep", "paper"]
    assert table[2:] == [["Loss_l + Loss_v", "25.0 / 24.0 / 0.2000", "25.3 / 23.9 / —"],
                         ["Loss_l", "26.0 / 17.0 / 0.2000", "25.5 / 17.4 / —"],
                         ["Loss_v", "1.5 / 25.0 / 0.2000", "1.4 / 25.5 / —"]]
    t5 = tmp_path / "stage2_losses"
    for drop in ("none", "aux", "rel"):  # one run missing: its row says so
        _result(t5, {"model.init_args.drop_loss": drop},
                {"test/object_top1": 0.9, "test/relation_top1": 0.6, "test/relation_top10": 0.95}, silhouette=0.3)
    sw.summarize(t5)
    table = _md_table((t5 / "summary.md").read_text(), "Table 5")
    assert [r[0] for r in table[2:]] == ["Combined loss", "No auxiliary loss", "No Loss_rel", "No Loss_obj"]
    assert table[2][1:] == ["90.00 / 60.00 / 95.00 / 0.3000", "97.71 / 64.26 / 95.21 / —"]
    assert table[5][1] == "—"
    assert (t5 / "table5.csv").read_text().startswith("model,this sweep: object top-1,")


def test_summary_record_holds_the_every_run_table(tmp_path, capsys):
    """``summarize --record``: a record of the schema whose rows are summary.csv's rows (parameters as values, numbers
    unrounded), whose columns are summary.md's every-run table, with the runs' configs and fit seeds."""
    from grounding.docs_tables import validate_record

    folder = tmp_path / "stage1_layers"
    for k, seed in ((0, 3), (4, 1), (8, 1)):
        params = {f"{NET}.trainable_layers": k, f"{NET}.freeze_query_key": k == 4, "seed_everything": seed} if k == 8 \
            else {f"{NET}.trainable_layers": k, f"{NET}.freeze_query_key": k == 4}
        _result(folder, params, {"test/i2t_r1": 10 + k + 1 / 3, "test/t2i_r1": 5.0 + k}, silhouette=0.1 + k / 100,
                learnable=1000 * (k + 1))
        run = folder / sw.run_name(params)
        result = json.loads((run / sw.RESULT_FILE).read_text())
        (run / sw.RESULT_FILE).write_text(json.dumps({**result, "config": "experiments/vgbert/stage1_tiny.yaml"}))
        if k != 8:  # the seed from the fit's config.yaml; k = 8 names it as a parameter
            (run / "config.yaml").write_text(yaml.safe_dump({"seed_everything": seed, "model": {}}))
    path = tmp_path / "rec" / "x.json"
    assert sw.main(["summarize", str(folder), "--record", str(path)]) == 0
    record = json.loads(path.read_text())
    validate_record(record, str(path))
    assert record["config"] == "experiments/vgbert/stage1_tiny.yaml" and record["seeds"] == [1, 3]
    assert record["command"].startswith("python") and record["title"] == "Sweep stage1_layers: 3 runs"
    header = _md_table((folder / "summary.md").read_text(), "Every run")[0]
    assert record["columns"] == header and record["labels"] == {c: c for c in header}
    assert "test/i2t_r1" in header and "semantic_space/silhouette_mean" in header
    table = list(__import__("csv").DictReader(open(folder / "summary.csv")))
    assert [r["run"] for r in record["rows"]] == [r["run"] for r in table]
    for written, row in zip(record["rows"], table):
        assert set(row) <= set(written) and written["seed"] in (1, 3)
        for column, text in row.items():
            if column in ("run",):
                assert written[column] == text
            elif isinstance(written[column], float):  # summary.csv rounds to 4 decimals, the record does not
                assert written[column] == pytest.approx(float(text), abs=1e-4), column
            else:
                assert written[column] == yaml.safe_load(text), column  # parameters: 4, true, null as values
    assert record["rows"][0]["test/i2t_r1"] == pytest.approx(10 + 1 / 3, abs=1e-12)


@pytest.mark.parametrize("bad", ["bad name!", "folder", "file/x.json"])
def test_summary_record_bad_names_are_one_line_before_any_work(bad, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    name = {"folder": str(tmp_path), "file/x.json": str(tmp_path / "file" / "x.json")}.get(bad, bad)
    _result(tmp_path / "sweep", {"x": 1}, {"test/i2t_r1": 1.0})
    code, err = _exit_line(["summarize", str(tmp_path / "sweep"), "--record", name], capsys)
    assert code == 2 and len(err) == 2 and err[0].startswith(f"{sw.PROG}: error: ")
    assert "--record " in err[0] or "record name " in err[0]
    assert not (tmp_path / "sweep" / "summary.md").exists()


# ---------------------------------------------------------------------------------------------- bad input
def _exit_line(argv, capsys):
    with pytest.raises(SystemExit) as info, user_errors_exit(sw.PROG):
        sw.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return info.value.code, err


@pytest.mark.parametrize("case", ["missing", "bad_yaml", "not_mapping", "bayes", "empty_folder", "no_folder",
                                  "bad_param", "bad_sweep_name", "root_dir"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text({"bad_yaml": "program: [unclosed\n", "not_mapping": "- a\n- b\n",
                    "bayes": "method: bayes\nparameters: {x: {values: [1]}}\n"}.get(case, "x: 1\n"))
    argv = {"missing": [str(tmp_path / "nope.yaml")], "bad_yaml": [str(bad)], "not_mapping": [str(bad)],
            "bayes": [str(bad)], "empty_folder": ["summarize", str(tmp_path)],
            "no_folder": ["summarize", str(tmp_path / "nope")],
            "bad_param": ["run", "--sweep", "s", "--config", "c.yaml", "stray"],
            "bad_sweep_name": ["run", "--sweep", "a/b", "--config", "c.yaml"],
            "root_dir": ["run", "--sweep", "s", "--config", "c.yaml", "--trainer.default_root_dir=x"]}[case]
    code, err = _exit_line(argv, capsys)
    assert code == 2
    assert len(err) == 2 and err[0].startswith(f"{sw.PROG}: error: ") and err[1].startswith("(set GROUNDING_DEBUG")


# ---------------------------------------------------------------------------------------------- the real chain
TINY_SEMCAT = {"animal": ["dog", "cat", "horse", "cow", "sheep"], "vehicle": ["car", "bus", "truck", "train", "boat"],
               "food": ["apple", "bread", "cheese", "rice", "soup"]}


@pytest.mark.slow
def test_real_chain_on_a_tiny_config(tiny_world, tmp_path):
    """fit -> test -> report on tiny networks (1 epoch of 2 batches), then a failing fit (a typo in an option) that
    exits non-zero before any test or report."""
    import subprocess

    from run_helpers import tiny_stage1_config

    semcat = tmp_path / "semcat"
    semcat.mkdir()
    for category, words in TINY_SEMCAT.items():
        (semcat / f"{category}-{len(words)}.txt").write_text("\n".join(words) + "\n")
    report = tmp_path / "report.yaml"
    report.write_text(yaml.safe_dump({"semantic_space": {
        "models": [{"source": sw.TEXT_ENCODER, "name": "Bert"}, {"source": sw.CHECKPOINT, "name": "Grounded"}],
        "semcat": str(semcat), "parts": ["clustering"], "embedding": {"vocabulary_sample": 64}}}))
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, max_epochs=1, limit_train_batches=2,
                                limit_val_batches=2, limit_test_batches=2)
    env = {**os.environ, "GROUNDING_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    base = [sys.executable, "-m", "grounding.sweep", "run", "--sweep", "chain", "--config", str(config),
            "--report", str(report), "--root", str(tmp_path / "out")]
    done = subprocess.run([*base, f"--{NET}.trainable_layers=1", "--model.init_args.loss_terms=both"], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = tmp_path / "out" / "chain" / "loss_terms=both_trainable_layers=1"
    result = json.loads((folder / sw.RESULT_FILE).read_text())
    assert result["test"]["test/i2t_r1"] >= 0 and result["learnable_parameters"] > 0
    assert result["semantic_space"]["reference"]["name"] == "Bert" and result["semantic_space"]["run"]["silhouette_mean"] is not None
    assert (folder / "semantic_space" / "report.md").is_file() and (folder / "metrics.test.json").is_file()
    assert yaml.safe_load((folder / sw.REPORT_CONFIG).read_text())["semantic_space"]["models"][0]["source"] == "tiny-random"

    failed = subprocess.run([*base, f"--{NET}.trainable_layer=1"], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "[sweep] test:" not in failed.stdout and "[sweep] report:" not in failed.stdout
    assert "the fit failed" in failed.stderr
    assert not (tmp_path / "out" / "chain" / "trainable_layer=1" / sw.RESULT_FILE).exists()
