"""STE sweeps (grounding/sweep.py, ``--report-kind ste``): the STE sweep files, a run's fit -> own export -> STE
report -> sweep_result.json chain (no test step), its failure paths, and the summary's Table 2 row per run beside
the paper's STE column."""

from __future__ import annotations

import json

import numpy as np
import pytest

from grounding import sweep as sw
from grounding.paths import EXPERIMENTS_DIR, REPO_ROOT

SWEEPS = EXPERIMENTS_DIR / "sweeps"
KNOBS = {"model.init_args.temperature", "data.init_args.positive_weighting", "data.init_args.wup_threshold",
         "data.init_args.non_synonym_weight"}


def _plan(cmd):
    at = cmd.index("grounding.sweep")
    return sw.RunPlan(*sw.run_parser().parse_known_args(cmd[at + 2:]), env={})


@pytest.mark.parametrize("name,config", [("ste_wordnet", "ste_wordnet.yaml"), ("ste_world", "ste_world.yaml")])
def test_ste_sweeps_run_the_ste_report_in_their_own_folders(name, config):
    sweep = sw.load_sweep(SWEEPS / f"{name}.yaml")
    grid = sw.expand_grid(sweep)
    assert set(grid[0]) == KNOBS and len(grid) == 24
    plans = [_plan(sw.build_command(sweep, params)) for params in grid]
    assert len({p.folder for p in plans}) == len(plans)
    for p in plans:
        assert p.kind == "ste" and p.no_test and p.report is None
        assert (REPO_ROOT / p.args.config).is_file() and p.args.config.endswith(f"semclip/{config}")
        export = f"--model.init_args.export_dir={p.folder / sw.STE_EMBEDDING}"
        assert export in p.fit_args and p.fit_args[-1] == f"--trainer.default_root_dir={p.folder}"
        assert p.ste_report_args[:3] == ["report", "--ste", str(p.folder / sw.STE_EMBEDDING)]
        assert "--sample" not in p.ste_report_args  # the full protocol
    if name == "ste_wordnet":  # each Wu–Palmer threshold gets its own cached lists, not the config's fixed file
        assert all("--data.init_args.path=null" in p.fit_args for p in plans)


def _fake_steps(monkeypatch, fail=None, export=True):
    calls = []

    def step(label, cmd, env):
        calls.append((label, cmd))
        if label == fail:
            return 3, 0.1
        if label == "fit":
            root = sw.Path(cmd[-1].split("=", 1)[1])
            export_dir = sw.Path(next(a for a in cmd if a.startswith("--model.init_args.export_dir=")).split("=", 1)[1])
            (root / "checkpoints").mkdir(parents=True)
            (root / "fit_record.json").write_text(json.dumps({"seconds": 4.0, "epochs": 2}))
            if export:
                export_dir.mkdir(parents=True)
                np.save(export_dir / "vectors.npy", np.zeros((2, 3), np.float32))
        elif label == "report":
            out = sw.Path(cmd[cmd.index("--out") + 1])
            out.mkdir(parents=True)
            (out / "meta.json").write_text(json.dumps({"protocol": "all 10 queries"}))
            (out / "synonym_coverage.csv").write_text(
                "embedding,queries,synonyms_in_top10,coverage,synonym_recall,queries_in_vocabulary\n"
                "STE,10,8,0.8,0.6,10\nminilm,10,5,0.5,0.4,10\n")
            (out / "word_similarity.csv").write_text(
                "dataset,model,pairs,wordnet_filtered,covered_full,spearman_full,covered_wordnet,spearman_wordnet\n"
                "EN-SIMLEX-999-N,STE,666,666,600,0.41,600,0.42\nEN-RG-65,STE,65,65,60,0.7,60,0.71\n"
                "EN-RG-65,minilm,65,65,65,0.8,65,0.81\n")
        return 0, 0.1

    monkeypatch.setattr(sw, "_step", step)
    return calls


def test_ste_run_chains_fit_and_report(tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    rc = sw.main(["run", "--sweep", "s", "--config", "c.yaml", "--report-kind", "ste", "--report-sample", "50",
                  "--report-encoders", "minilm", "--root", str(tmp_path), "--model.init_args.temperature=0.1"])
    assert rc == 0 and [c[0] for c in calls] == ["fit", "report"]  # no test: the STE has no test split
    folder = tmp_path / "s" / "temperature=0.1"
    report_cmd = calls[1][1]
    assert report_cmd[1:4] == ["-m", "grounding.semclip", "report"]
    assert report_cmd[report_cmd.index("--ste") + 1] == str(folder / "embedding")
    assert report_cmd[report_cmd.index("--sample") + 1] == "50"
    assert report_cmd[report_cmd.index("--encoders") + 1] == "minilm"
    result = json.loads((folder / sw.RESULT_FILE).read_text())
    assert result["checkpoint"] is None and result["learnable_parameters"] is None
    assert result["ste_report"]["coverage"]["coverage"] == 0.8
    assert result["ste_report"]["word_similarity"]["EN-SIMLEX-999-N"]["spearman_wordnet"] == 0.42
    flat = sw.headline(result)
    assert flat["ste/coverage"] == 0.8 and flat["ste/EN-RG-65"] == 0.71 and flat["fit_seconds"] == 4.0


def test_ste_run_failures(tmp_path, monkeypatch):
    calls = _fake_steps(monkeypatch, export=False)
    argv = ["run", "--sweep", "s", "--config", "c.yaml", "--report-kind", "ste", "--root", str(tmp_path)]
    assert sw.main([*argv, "--model.init_args.temperature=0.1"]) == 1 and [c[0] for c in calls] == ["fit"]
    calls = _fake_steps(monkeypatch, fail="report")
    assert sw.main([*argv, "--model.init_args.temperature=0.2"]) == 3 and [c[0] for c in calls] == ["fit", "report"]
    assert not (tmp_path / "s" / "temperature=0.2" / sw.RESULT_FILE).exists()
    with pytest.raises(sw.SweepError, match="own folder"):
        sw.main([*argv, "--model.init_args.export_dir=elsewhere"])
    with pytest.raises(sw.SweepError, match="report-kind ste"):
        sw.main([*argv, "--report", "r.yaml"])


def _ste_result(folder, params, coverage, spearman):
    run = sw.run_name(params)
    (folder / run).mkdir(parents=True)
    ws = {d: {"spearman_wordnet": v, "spearman_full": v} for d, v in spearman.items()}
    from grounding.semclip.evaluation import PAPER_TABLE1, PAPER_TABLE2

    paper = {"table1_coverage": PAPER_TABLE1["STE"][2], "table2": {d: [v[3], v[4]] for d, v in PAPER_TABLE2.items()}}
    result = {"run": run, "params": params,
              "ste_report": {"coverage": {"coverage": coverage}, "word_similarity": ws, "paper": paper}}
    (folder / run / sw.RESULT_FILE).write_text(json.dumps(result))


def test_summary_gives_a_table2_row_per_run_beside_the_papers(tmp_path):
    from grounding.semclip.evaluation import PAPER_TABLE2

    folder = tmp_path / "ste_world"
    every = {d: 0.5 for d in PAPER_TABLE2}
    _ste_result(folder, {"model.init_args.temperature": 0.05}, 0.9, every)
    _ste_result(folder, {"model.init_args.temperature": 0.1}, 0.8, {**every, "EN-SIMLEX-999-N": 0.95})
    _ste_result(folder, {"model.init_args.temperature": 0.2}, 0.7, {"EN-RG-65": 0.99})  # misses sets: no mean
    sw.summarize(folder)
    md = (folder / "summary.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in md.split("## SemCLIP Table 2", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    assert header[:3] == ["run", "Table 1 coverage", f"mean of the paper's {len(PAPER_TABLE2)} sets"]
    assert [r[0] for r in body] == ["temperature=0.1", "temperature=0.05", "temperature=0.2", "paper: STE",
                                    "paper: STE (similar subset)"]  # best mean first, the paper's rows last
    assert body[0][2] == f"{(0.5 * (len(PAPER_TABLE2) - 1) + 0.95) / len(PAPER_TABLE2):.3f}" and body[2][2] == "—"
    simlex = header.index("EN-SIMLEX-999-N")
    assert body[3][simlex] == "0.398" and body[4][simlex] == "0.670" and body[3][1] == "0.877"
    assert (folder / "ste_table2.csv").is_file()


def test_ste_report_options_need_the_ste_kind(tmp_path):
    with pytest.raises(sw.SweepError, match="report-kind ste"):
        sw.main(["run", "--sweep", "s", "--config", "c.yaml", "--report-sample", "5", "--root", str(tmp_path), "--a=1"])
