"""Does COMPOSER learn before it is measured? Content reaches its root at initialisation (fast tier), and it fits
16 generated training images (slow tier), with the switches of composer_world.yaml (docs/composer.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from run_helpers import same_json

from data_modules.captions import CaptionRoundsSampler
from grounding.composer.diagnostics import WORLD_FIT_COMPOSITION, WORLD_FIT_NET, fit_small, fit_world, init_diagnostics
from grounding.composer.model import Composer, ComposerSizes
from grounding.composer.training import ComposerLosses, ComposerTraining
from grounding.docs_tables import invoked_command
from grounding.nets import constructor_args

# the paper's reading of the same network: [CLS] readout, no skips
PAPER = dataclasses.replace(WORLD_FIT_COMPOSITION, readout="cls", modulator_skip=False, child_skip=False)
TINY = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
            sizes=ComposerSizes(pt_layers=2, heads=2, co_dim=16, co_heads=2, ct_layers=3))


@pytest.fixture(scope="module")
def world16(tmp_path_factory):
    return fit_world(tmp_path_factory.mktemp("fit16"), n_images=16)


def test_content_reaches_the_root_at_initialisation(world16):
    """Every caption composed with one image: captions of the same image closer than of different ones, and nouns
    moving the score. Measured (seed 0): with the world config's switches gap +0.34σ, noun/image 0.35; with
    ``composition_scale: 0.3`` as well (off in the world config) +0.61σ and 0.58, the issue's ≥ +0.5σ; the paper's
    reading (cls readout, no skips) +0.01σ and 0.05; before the fixes (FiLM a ≈ 0.07, equal placeholders) +0.005σ
    and 0.005."""
    torch.manual_seed(0)
    learns = init_diagnostics(Composer(**WORLD_FIT_NET), world16)
    assert learns["caption_gap_sigma"] >= 0.25, learns
    assert learns["noun_to_image"] >= 0.1, learns
    torch.manual_seed(0)
    paper = init_diagnostics(Composer(**{**WORLD_FIT_NET, "composition": PAPER}), world16)
    assert paper["caption_gap_sigma"] < learns["caption_gap_sigma"] and paper["noun_swap"] < learns["noun_swap"], paper
    torch.manual_seed(0)
    scaled = init_diagnostics(Composer(**constructor_args(Composer, {**WORLD_FIT_NET, "composition_scale": 0.3})), world16)
    assert scaled["caption_gap_sigma"] >= 0.5 and scaled["noun_to_image"] >= 0.1, scaled


@pytest.mark.slow
@pytest.mark.parametrize("score_head, steps", [("linear", 60), ("image_gated", 30)])
def test_composer_fits_16_training_images(world16, score_head, steps):
    """16 images, batch 16, Adam (PT 1e-4, new layers 5e-4), the suite's own losses: COMPOSER's train text→image R@1
    (seed 0; chance 6.2). The world config (the paper's linear head θᵀv): 43.8 at 30 steps, 71.2 at 60; over seeds
    0–7 at 30 steps 31.9 ± 8.9. With ``score_head: image_gated`` (beyond the paper; off in the world config: trained
    on the world it is level with the linear head): 53.8 at 30 steps, 54.5 ± 10.1 over seeds 0–7, higher at every seed (+22.7 on
    average), the issue's 30-step target. The same harness gives ViLBERT-style (vilbert_world.yaml's net, lr 1e-4)
    75.0 at 30 steps and 66.3 at 60. Before the fixes COMPOSER stayed at chance (6.2), ℓ_match flat at 1.40–1.45
    (docs/composer.md)."""
    torch.manual_seed(0)
    net = Composer(**constructor_args(Composer, {**WORLD_FIT_NET, "score_head": score_head}))
    module = ComposerTraining(net, ComposerLosses(concept_reduction="mean"), new_layer_lr_scale=5.0, feature_cache=False)
    result = fit_small(module, world16, steps=steps, lr=1e-4, seed=0)
    assert result["t2i_r1"] >= 50, result
    assert np.mean(result["match"][-10:]) < np.mean(result["match"][:10])


def test_caption_rounds_visit_every_caption_once_per_epoch_in_image_rounds():
    counts = np.array([3, 0, 1, 5, 2])
    sampler = CaptionRoundsSampler(counts, keep=[0, 2, 3, 4], hard_draws=np.array([4, 1, 4, 4, 4]), seed=0)
    items = list(sampler)
    assert len(items) == len(sampler) == 11
    pairs = sorted((i, c % counts[i]) for i, c in items)
    assert pairs == sorted((i, k) for i in (0, 2, 3, 4) for k in range(counts[i]))  # every caption once
    assert all(c // counts[i] < 4 for i, c in items)  # the hard-negative key below hard_draws
    # round r holds each image with more than r captions once, rounds in order
    sizes = [4, 3, 2, 1, 1]
    starts = np.cumsum([0] + sizes)
    for r, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        images = [i for i, _ in items[a:b]]
        assert len(set(images)) == len(images) == sizes[r]
    again = list(CaptionRoundsSampler(counts, [0, 2, 3, 4], np.array([4, 1, 4, 4, 4]), seed=0))
    assert again == items  # seeded
    sampler.set_epoch(1)
    assert list(sampler) != items  # another order next epoch


def test_new_layers_get_their_own_learning_rate():
    from grounding.lightning import scale_group_lrs

    torch.manual_seed(0)
    net = Composer(**TINY)
    module = ComposerTraining(net, new_layer_lr_scale=5.0, feature_cache=False)
    optimizer = scale_group_lrs(torch.optim.Adam(module.trainable_parameters(), lr=1e-4))
    pretrained, new = optimizer.param_groups
    assert pretrained["lr"] == 1e-4 and new["lr"] == pytest.approx(5e-4)
    pt = {id(p) for p in net.predicate_transformer.parameters()}
    assert {id(p) for p in pretrained["params"]} == pt
    assert id(net.theta.weight) in {id(p) for p in new["params"]}
    assert len(pretrained["params"]) + len(new["params"]) == sum(p.requires_grad for p in module.parameters())
    with pytest.raises(ValueError, match="new_layer_lr_scale"):
        ComposerTraining(net, new_layer_lr_scale=0.0)


def test_auxiliary_losses_ramp_in():
    torch.manual_seed(0)
    net = Composer(**TINY)
    module = ComposerTraining(net, ComposerLosses(aux_ramp_steps=10), feature_cache=False)
    factors = []
    for step in (0, 5, 10, 20):
        module.steps_taken = step
        factors.append(module.aux_weight())
    assert factors == [0.0, 0.5, 1.0, 1.0]
    assert ComposerTraining(net, feature_cache=False).aux_weight() == 1.0


def test_compare_reads_curves_and_tests_of_every_seed(tmp_path):
    from grounding.composer.compare import compare, main

    for model, seed, r1, rsum in (("composer", 0, [10.0, 30.0], 300.0), ("composer", 1, [12.0, 20.0], 320.0),
                                  ("vilbert", 0, [20.0, 25.0], 250.0)):
        fit, test = tmp_path / f"{model}_s{seed}" / "csv" / "version_0", tmp_path / f"{model}_s{seed}" / "csv" / "version_1"
        fit.mkdir(parents=True)
        test.mkdir()
        rows = ["epoch,step,train/t2i_r1,train/loss", "0,4,,1.3", f"0,9,{r1[0]},", "1,14,,1.1", f"1,19,{r1[1]},"]
        (fit / "metrics.csv").write_text("\n".join(rows) + "\n")
        (test / "metrics.csv").write_text(f"epoch,step,test/rsum,test/t2i_r1\n0,0,{rsum},{rsum / 10}\n")
    (tmp_path / "composer_s0" / "fit_record.json").write_text(
        '{"seconds": 600.0, "epochs": 2, "segments": [{"commit": "abc1234"}, {"commit": "def5678-dirty"}]}')
    table = compare(tmp_path, tmp_path / "report")["models"]
    assert table["composer"]["rsum"]["seeds"] == [300.0, 320.0]
    assert table["composer"]["rsum"]["mean"] == 310.0 and table["composer"]["rsum"]["sd"] == pytest.approx(14.142, abs=1e-3)
    assert table["vilbert"]["t2i R@1"]["mean"] == 25.0
    assert (tmp_path / "report" / "learning_curves.png").stat().st_size > 1000
    assert "| composer | 2 | 310.0 ± 14.1 |" in (tmp_path / "report" / "compare.md").read_text()
    from grounding.composer.compare import read_curve
    assert read_curve(tmp_path / "composer_s0") == ([1, 2], [10.0, 30.0])
    resumed = tmp_path / "composer_s0" / "csv" / "version_2"  # a fit resumed at epoch 2 logs in a later version
    resumed.mkdir()
    (resumed / "metrics.csv").write_text("epoch,step,train/t2i_r1\n1,19,31.0\n2,24,40.0\n")
    assert read_curve(tmp_path / "composer_s0") == ([1, 2, 3], [10.0, 31.0, 40.0])
    assert main(["--runs", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]) == 2
    # the compositional column: the world's held-out-pair R@1 of the run's own test, or, when the run was also tested
    # on an MCD split into <run>/compositional (make's COMPARE_MCD), that split's text→image R@1
    (tmp_path / "vilbert_s0" / "csv" / "version_1" / "metrics.csv").write_text(
        "epoch,step,test/rsum,test/t2i_r1,test/compositional/t2i_r1\n0,0,250.0,25.0,12.5\n")
    assert compare(tmp_path, tmp_path / "report")["models"]["vilbert"]["comp. R@1"]["seeds"] == [12.5]
    mcd = tmp_path / "vilbert_s0" / "compositional" / "csv" / "version_0"
    mcd.mkdir(parents=True)
    (mcd / "metrics.csv").write_text("epoch,step,test/rsum,test/t2i_r1\n0,0,180.0,22.0\n")
    report = compare(tmp_path, tmp_path / "report")
    assert report["models"]["vilbert"]["comp. R@1"]["seeds"] == [22.0]
    assert report["models"]["vilbert"]["rsum"]["seeds"] == [250.0]  # the MCD test is not the run's test
    assert report["runs"]["vilbert_s0"]["mcd_test"]["test/rsum"] == 180.0 and report["runs"]["composer_s1"]["mcd_test"] == {}
    assert "| vilbert_s0 | 250.0 | 22.0 |" in (tmp_path / "report" / "compare.md").read_text()


def test_compare_merges_recorded_runs(tmp_path, capsys):
    """A comparison that spans machines: the committed record's runs join the table, a run folder found again
    replaces its recorded run only when tested, and ``--list-tested`` names what make need not refit."""
    from grounding.composer.compare import compare, main

    def run(root, name, rsum=None, r1=(10.0, 20.0), seconds=120.0):
        fit = root / name / "csv" / "version_0"
        fit.mkdir(parents=True)
        rows = ["epoch,step,train/t2i_r1,val/rsum", f"0,4,{r1[0]},", f"1,9,{r1[1]},", "1,9,,150.5"]
        (fit / "metrics.csv").write_text("\n".join(rows) + "\n")
        (root / name / "fit_record.json").write_text(
            f'{{"seconds": {seconds}, "epochs": 2, "segments": [{{"commit": "c0ffee1"}}]}}')
        if rsum is not None:
            (root / name / "csv" / "version_1").mkdir()
            (root / name / "csv" / "version_1" / "metrics.csv").write_text(f"epoch,step,test/rsum\n0,0,{rsum}\n")

    first = tmp_path / "machine1"
    run(first, "composer_s0", rsum=300.0)
    run(first, "vilbert_s0", rsum=250.0)
    record = compare(first, tmp_path / "r1")
    assert record["runs"]["composer_s0"]["commits"] == ["c0ffee1"] and record["runs"]["composer_s0"]["train_minutes"] == 2.0
    assert record["runs"]["composer_s0"]["dev_rsum"] == 150.5 and record["runs"]["composer_s0"]["dev_epoch"] == 2
    kept = tmp_path / "record.json"
    kept.write_text((tmp_path / "r1" / "compare.json").read_text())
    second = tmp_path / "machine2"  # composer_s0's folder is gone; vilbert_s0 is refit but not yet tested
    run(second, "composer_s1", rsum=320.0)
    run(second, "vilbert_s0", rsum=None)
    merged = compare(second, tmp_path / "r2", [kept])
    assert merged["models"]["composer"]["rsum"]["seeds"] == [300.0, 320.0]
    assert merged["models"]["vilbert"]["rsum"]["seeds"] == [250.0]  # the untested folder does not hide the record
    assert merged["runs"]["composer_s0"]["recorded_in"] == str(kept) and "recorded_in" not in merged["runs"]["composer_s1"]
    assert "| composer_s0 | 300.0 | – | 20.0 | 150.5 (2) | 2 | 2.0 | c0ffee1 (recorded) |" in (
        tmp_path / "r2" / "compare.md").read_text()
    # a fit still going (no test yet, no record of it) is listed and plotted but neither counted as a seed nor
    # averaged: its mid-training dev rsum stays out of the row, and one tested seed prints no ± 0.0
    run(second, "vilbert_s1", rsum=None, r1=(5.0, 8.0))
    (second / "vilbert_s1" / "csv" / "version_0" / "metrics.csv").write_text(
        "epoch,step,train/t2i_r1,val/rsum\n0,4,5.0,\n0,4,,99.0\n")
    merged = compare(second, tmp_path / "r2", [kept])
    assert merged["models"]["vilbert"]["tested"] == 1 and merged["models"]["vilbert"]["dev rsum"]["seeds"] == [150.5]
    assert "| vilbert | 1 (+1 untested) | 250.0 |" in (tmp_path / "r2" / "compare.md").read_text()
    run(tmp_path / "machine3", "vilbert_s0", rsum=260.0)
    assert compare(tmp_path / "machine3", tmp_path / "r3", [kept])["models"]["vilbert"]["rsum"]["seeds"] == [260.0]
    capsys.readouterr()
    assert main(["--recorded", str(kept), "--list-tested"]) == 0
    assert capsys.readouterr().out.split() == ["composer_s0", "vilbert_s0"]
    assert main(["--recorded", str(kept), "--out", str(tmp_path / "r4")]) == 0  # the record alone redraws the table
    for bad in ('{"composer_s0": {}}', '{"runs": []}', '[1]'):
        (tmp_path / "bad.json").write_text(bad)
        assert main(["--recorded", str(tmp_path / "bad.json"), "--list-tested"]) == 2
        assert "not a compare.json" in capsys.readouterr().err


COMPARE_RECORDS = ("composer_compare_flickr8k", "composer_compare_flickr8k_linear_head",
                   "composer_ablation_flickr8k_image_gated", "composer_ablation_flickr8k_match_only")


@pytest.mark.parametrize("name", COMPARE_RECORDS)
def test_compare_record_rows_are_the_committed_records_rows(name):
    """Each committed comparison record's table (columns, labels, rows) is what compare's record_rows derives from
    the record's own models and runs: the command writing the record again writes the same table."""
    import json
    from pathlib import Path

    from grounding.composer.compare import RECORD_COLUMNS, RECORD_LABELS, record_rows

    record = json.loads((Path(__file__).resolve().parents[1] / "docs" / "records" / f"{name}.json").read_text())
    assert record["columns"] == list(RECORD_COLUMNS) and record["labels"] == RECORD_LABELS
    rows = record_rows(record)
    assert len(rows) == len(record["rows"])
    for derived, committed in zip(rows, record["rows"]):
        assert same_json(derived, committed), (derived, committed)


def test_compare_writes_its_record_and_reads_it_back(tmp_path, capsys):
    """--record: the comparison as a docs record (provenance, models, runs, table) that --recorded reads as an earlier
    run; the record alone, rewritten, keeps its provenance and is itself; a bad name is one line, exit 2."""
    import json

    from grounding.composer.compare import main, read_recorded
    from grounding.docs_tables import PROVENANCE, load_record

    for name, rsum in (("composer_s0", 300.0), ("composer_s1", 320.0), ("vilbert_s0", None)):
        fit = tmp_path / "runs" / name / "csv" / "version_0"
        fit.mkdir(parents=True)
        (fit / "metrics.csv").write_text("epoch,step,train/t2i_r1,val/rsum\n0,4,10.0,\n1,9,20.0,\n1,9,,150.5\n")
        (tmp_path / "runs" / name / "fit_record.json").write_text('{"seconds": 120.0, "epochs": 2, "segments": []}')
        if rsum is not None:
            (fit.parent / "version_1").mkdir()
            (fit.parent / "version_1" / "metrics.csv").write_text(f"epoch,step,test/rsum,test/t2i_r1\n0,0,{rsum},{rsum / 10}\n")
    first = tmp_path / "records" / "first.json"
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "r1"), "--record", str(first),
                 "--config", "a.yaml", "--config", "b.yaml"]) == 0
    record = load_record(first, "test")  # the schema
    assert record["config"] == ["a.yaml", "b.yaml"] and record["seeds"] == [0, 1] and record["commit"]
    assert record["command"] == invoked_command()  # this process's command line (a pytest worker's under xdist)
    assert record["models"] == json.loads((tmp_path / "r1" / "compare.json").read_text())["models"]
    assert [(r["model"], r["seed"], r["runs"], r.get("rsum")) for r in record["rows"]] == [
        ("composer", 0, 1, 300.0), ("composer", 1, 1, 320.0), ("vilbert", 0, 0, None), ("composer", None, 2, 310.0),
        ("vilbert", None, 0, None)]
    assert record["rows"][0]["t2i_r1"] == 30.0 and record["rows"][0]["epochs"] == 2 and record["rows"][0]["fit_commits"] is None
    assert record["rows"][3]["rsum_sd"] == pytest.approx(14.142, abs=1e-3)
    assert set(read_recorded(first)) == {"composer_s0", "composer_s1", "vilbert_s0"}  # --recorded reads the record
    again = tmp_path / "again.json"
    assert main(["--recorded", str(first), "--out", str(tmp_path / "r2"), "--record", str(again)]) == 0
    assert json.loads(again.read_text()) == record  # a rewrite: the same provenance, runs and table
    assert {k: json.loads(again.read_text())[k] for k in PROVENANCE} == {k: record[k] for k in PROVENANCE}
    capsys.readouterr()
    for bad in (["--record", "two words"], ["--record", str(tmp_path)], ["--config", "a.yaml"]):
        assert main(["--recorded", str(first), "--out", str(tmp_path / "r3"), *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert main(["--recorded", str(first), "--list-tested", "--record", str(tmp_path / "x.json")]) == 2


def test_compare_rewrites_the_committed_record_from_itself(tmp_path):
    """`--recorded docs/records/composer_compare_flickr8k.json --record ...` writes that record again: its provenance,
    models, runs, columns and rows (what a maintainer runs after a change to how records are written)."""
    import json
    from pathlib import Path

    from grounding.composer.compare import main

    committed = Path(__file__).resolve().parents[1] / "docs" / "records" / "composer_compare_flickr8k.json"
    assert main(["--recorded", str(committed), "--out", str(tmp_path), "--record", str(tmp_path / "r.json")]) == 0
    written, record = json.loads((tmp_path / "r.json").read_text()), json.loads(committed.read_text())
    assert written["columns"] == record["columns"] and same_json(written["rows"], record["rows"])
    assert written == record


@pytest.mark.parametrize("args, report, recorded", [
    ([], "reports/composer/compare_world", False),
    (["COMPARE_DATA=flickr8k"], "reports/composer/compare_flickr8k", True),
    # an ablation reports beside its own runs: its compare.json must not overwrite the comparison's
    (["COMPARE_DATA=flickr8k", "COMPARE_OUT=outputs/composer/ablation_flickr8k/x", "COMPARE_ARGS=--a 1"],
     "reports/composer/ablation_flickr8k/x", False),
    (["COMPARE_OUT=/elsewhere/runs"], "/elsewhere/runs_report", False),
])
def test_make_compare_reports_beside_its_runs(args, report, recorded):
    """`make composer-compare` (dry run): the report folder follows COMPARE_OUT, and only the default comparison reads
    the committed record."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["make", "-n", "--no-print-directory", "composer-compare", *args], cwd=root,
                         capture_output=True, text=True, timeout=120).stdout
    line = next(x for x in out.splitlines() if "-m grounding.composer.compare --runs" in x)
    words = line.split()
    assert words[words.index("--out") + 1] == report, line
    assert ("--recorded docs/records/composer_compare_flickr8k.json" in line) == recorded, line


def test_cross_encoders_score_in_float32_under_bf16_autocast(world16):
    """Under bf16-mixed the regions are bfloat16; COMPOSER's and ViLBERT-style's score matrices stay float32 (before,
    COMPOSER's evaluation failed to fill a bfloat16 matrix with its float32 scores, and ViLBERT-style's rounded its
    scores to bfloat16, whose steps of 0.06 near 10 tie close images). Same recalls as in float32 here (8 images, seed 0:
    t2i R@1 12.5 and 10.0 in both precisions)."""
    from grounding.composer.diagnostics import train_recall
    from grounding.composer.vse_vilbert import ViLBERT, ViLBERTSizes, ViLBERTTraining

    torch.manual_seed(0)
    vilbert = ViLBERT(text_encoder="minilm", backbone="efficientnet_lite0", image_size=128, text_pooling="mean",
                      sizes=ViLBERTSizes(image_layers=2, coattention_layers=2, image_dim=64, image_heads=2,
                                         image_ffn_dim=64, co_dim=64, co_heads=2, norm_first=True, dropout=0.0))
    modules = [ComposerTraining(Composer(**WORLD_FIT_NET), feature_cache=False),
               ViLBERTTraining(vilbert, eval_phrases="never", feature_cache=False)]
    for module in modules:
        dtypes = []
        score = module.score_caption_batch

        def recorded(*args, score=score, dtypes=dtypes, **kwargs):
            out = score(*args, **kwargs)
            dtypes.append(out[0].dtype)
            return out

        module.score_caption_batch = recorded
        # 8 of the 16 images (320 pairs): on a CPU without bfloat16 units autocast is emulated and slow
        exact = train_recall(module, world16, n_images=8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = train_recall(module, world16, n_images=8)
        assert dtypes == [torch.float32, torch.float32], (type(module).__name__, dtypes)
        assert mixed["t2i_r1"] == pytest.approx(exact["t2i_r1"], abs=15), (type(module).__name__, exact, mixed)
