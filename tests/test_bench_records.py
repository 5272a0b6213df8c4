"""``--record`` of the benchmark scripts (``benchmarks/``): the table a script prints, also written as a record
(``grounding/docs_tables.py``'s schema) when asked, and nothing written when not.

The scripts that run in seconds at their tiniest options run for real (``main([...])`` in this process, stdout captured)
and the record's numbers are checked against the printed ones; the slow ones (the VG-BERT memory and feature-cache
sections, the cross-encoder fits, SemCLIP's STE timings, gpu-check) have the functions that turn their measurements
into printed lines and record rows checked on synthetic measurements.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import yaml

from grounding.docs_tables import PROVENANCE, validate_record
from grounding.paths import EXPERIMENTS_DIR

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark script by its stem (the scripts import their sibling ``table_record`` as a plain module)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module


def read_record(path: Path) -> dict:
    record = json.loads(path.read_text(encoding="utf-8"))
    validate_record(record, str(path))
    assert set(PROVENANCE) <= set(record) and record["title"] and record["command"].startswith("python")
    assert set(record["columns"]) <= set(record["labels"]), "every shown column has its printed header"
    return record


def rows_of(record: dict, **where) -> list[dict]:
    return [r for r in record["rows"] if all(r.get(k) == v for k, v in where.items())]


# ------------------------------------------------------------------------------------------ run for real
def test_composer_model_record_holds_the_printed_rates(bench, tmp_path, capsys, tiny_world, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))  # the tiny world's parses
    out = tmp_path / "r" / "composer_model.json"
    assert bench("bench_composer_model").main(["--world", str(tiny_world), "--captions", "2", "--images", "2",
                                               "--repeats", "1", "--record", str(out)]) == 0
    printed = capsys.readouterr().out
    record = read_record(out)
    assert record["seeds"] == [0] and record["config"] is None and record["world"] == str(tiny_world)
    level, node = rows_of(record, part="recursion (forward)")
    assert (level["method"], node["method"], level["pairs"]) == ("level-batched", "node-by-node", 4)
    for row in (level, node):
        assert f"{row['method']:14s} {row['seconds']:8.3f} s   {row['rate']:10.1f} pairs/s" in printed
    assert f"speed-up of the level-batched recursion: {level['speedup']:.1f}x" in printed
    (evaluation,) = rows_of(record, part="exhaustive evaluation")
    assert f"{evaluation['rate']:.0f} compositions/s" in printed and f"~{evaluation['paper_test_hours']:.1f} h" in printed


def test_step_operators_record_holds_the_printed_counts(bench, tmp_path, capsys, tiny_world, monkeypatch):
    """One config (VSE on the tiny world), one batch, one timed round: the row's operator counts as printed."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))  # the tiny world's parses
    config = tmp_path / "vse_tiny.yaml"
    reader = {"class_path": "data_modules.FlickrDataModule", "init_args": {"root": str(tiny_world / "flickr")}}
    config.write_text(yaml.safe_dump({"base": str(EXPERIMENTS_DIR / "composer" / "vse_world.yaml"),
                                      "data": {"init_args": {"captions": reader, "world_meta": str(tiny_world / "world.json")}}}))
    out = tmp_path / "ops.json"
    assert bench("bench_step_operators").main(["--configs", str(config), "--batches", "1", "--repeats", "1",
                                               "--record", str(out)]) == 0
    printed = capsys.readouterr().out
    record = read_record(out)
    (row,) = record["rows"]
    assert row["config"] == "vse_tiny" and row["ops"] == row["forward_ops"] + row["backward_ops"] > 0
    assert row["syncs"] == 0 and row["ops_ratio"] == row["time_ratio"] == 1.0  # the reference row
    assert f"{row['forward_ops']:8d} {row['backward_ops']:8d} {row['ops']:7d} {row['syncs']:6d} {row['seconds_per_step']:8.3f}" \
        in printed
    assert record["config"] == [str(config)] and record["seeds"] == [0, 1] and record["labels"]["forward_ops"] == "fwd ops"


def test_glue_probe_record_is_its_printed_markdown_table(bench, tmp_path, capsys, shared_data):
    out = tmp_path / "glue.json"
    assert bench("bench_glue_probe").main(["--root", str(shared_data / "glue"), "--examples", "16", "--steps", "2",
                                           "--rounds", "1", "--width", "32", "--record", str(out)]) == 0
    printed = capsys.readouterr().out
    record = read_record(out)
    header = "| " + " | ".join(record["labels"][c] for c in record["columns"]) + " |"
    assert header in printed
    assert [r["path"] for r in record["rows"]] == ["padded token states", "summaries"]
    for r in record["rows"]:
        assert f"| {r['path']} | {r['load_ms_per_step']:.2f} | {r['step_ms']:.2f} | {r['step_vs_padded']:.2f}× |" in printed
    assert record["rows"][0]["step_vs_padded"] == 1.0 and record["width"] == 32 and record["tasks"]


def test_text_stream_record_holds_the_printed_times(bench, tmp_path, capsys):
    out = tmp_path / "text.json"
    bench("bench_text_stream").main(["--batch", "4", "--repeats", "1", "--record", str(out)])
    printed = capsys.readouterr().out
    (row,) = read_record(out)["rows"]
    assert (row["model"], row["batch"], row["device"]) == ("minilm", 4, "cpu")
    assert f"padded {row['padded_ms']:.1f} ms, packed {row['packed_ms']:.1f} ms, {row['speedup']:.2f}x" in printed
    assert f"real tokens {row['real_token_share']:.1%}" in printed


def test_composer_data_record_holds_the_subset_and_full_file_rows(bench, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))  # the full file's parse cache
    captions = tmp_path / "captions.txt"
    captions.write_text("".join(f"img{i}.jpg#{j}\t{text}\n" for i, text in enumerate(
        ["A dog runs on the grass .", "A man sits on a bench .", "Two children play in the park ."]) for j in range(2)))
    out = tmp_path / "composer.json"
    assert bench("bench_composer").main(["--captions", str(captions), "--backends", "spacy", "--workers", "1",
                                         "--record", str(out)]) == 0
    printed = capsys.readouterr().out
    record = read_record(out)
    (subset,) = rows_of(record, part="subset")
    (full,) = rows_of(record, part="full file")
    assert (subset["backend"], subset["workers"], subset["captions"], subset["unparsed"]) == ("spacy", 1, 6, 0)
    assert f"{subset['cold_captions_per_s']:>12.1f}{subset['warm_captions_per_s']:>12.1f}" in printed
    assert full["captions"] == 6 and f"graph build {full['graph_build_s']:.2f}s" in printed
    assert record["captions_file"] == str(captions)


def test_semclip_index_record_holds_the_printed_table(bench, tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "semclip.json"
    try:
        assert bench("bench_semclip").main(["--only-index", "--index-sizes", "200", "--record", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # main caps them at 2
    printed = capsys.readouterr().out
    record = read_record(out)
    (torch_row,) = rows_of(record, section="index", method="torch")
    assert torch_row["items"] == 200 and torch_row["recall"] == 1.0 and torch_row["ratio"] == 1.0
    for r in record["rows"]:
        assert f"{r['items']:>8} {r['method']:>11} {r['build_s']:>8.2f} {r['value']:>9.2f} {r['ms_per_query']:>9.3f}" in printed


def test_vgbert_loss_record_and_nothing_without_record(bench, tmp_path, capsys, monkeypatch):
    """The loss section at batch 2 as a record named like docs/records' (relative to the working folder); the same
    run without --record writes no file."""
    monkeypatch.chdir(tmp_path)
    script = bench("bench_vgbert")
    script.main(["--sections", "loss", "--batches", "2", "--repeats", "1", "--record", "bench_vgbert_test"])
    printed = capsys.readouterr().out
    out = tmp_path / "docs" / "records" / "bench_vgbert_test.json"
    record = read_record(out)
    rows = rows_of(record, section="loss")
    assert len(rows) == 4 and record["seeds"] == [0, 2] and rows[0]["ratio"] == 1.0
    for r in rows:
        assert f"{r['method']:<60}{r['seconds']:>10.3f}{r['gflop_per_s']:>10.1f}{r['ratio']:>11.2f}x" in printed
        assert r["table"].startswith("match-map loss fwd+bwd, batch 2") and r["reference"] == rows[0]["method"]
    out.unlink()
    script.main(["--sections", "loss", "--batches", "2", "--repeats", "1"])
    assert "record:" not in capsys.readouterr().out
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_bad_record_name_stops_before_measuring(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench("bench_composer_model").main(["--record", "two words"])
    assert stop.value.code == 2 and "record name 'two words'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ synthetic measurements
def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+\.\d+", text)]


def test_vgbert_memory_and_cache_rows(bench, capsys):
    script = bench("bench_vgbert")
    suite = [{"peak_gib": p, "before_gib": 1.25, "seconds": 10.0} for p in (3.5, 3.25, 3.75)]
    dynamic = [{"peak_gib": p, "before_gib": 1.25, "seconds": 11.0} for p in (4.5, 6.0, 4.25)]
    row = script.memory_row("memory", 1000, 5000, suite, dynamic)
    printed = capsys.readouterr().out
    assert row["peak_rss_gib"] == [3.5, 3.25, 3.75] and row["peak_rss_gib_dynamic"] == [4.5, 6.0, 4.25]
    assert "3.50 / 3.25 / 3.75 G" in printed and "4.50 / 6.00 / 4.25 G" in printed and f"{row['features_gib']:.2f} G" in printed
    assert row["scores_gib"] == pytest.approx(1000 * 5000 * 4 / 2**30) and row["method"] == "1,000 x 5,000"
    row = script.cache_row("cache", "vgg16", 30.0, (2.0, 0.5), (3.0, 1.5), ("table a", ""))
    printed = capsys.readouterr().out
    assert row["method"] == "vgg16 (random weights)" and (row["speedup"], row["padded_speedup"]) == (4.0, 2.0)
    assert numbers(printed) == [30.0, 2.0, 0.5, 4.0, 3.0, 1.5, 2.0]
    assert (row["profile_packed"], row["profile_padded"]) == ("table a", None)


def test_cross_encoder_report_rows(bench, capsys):
    script = bench("bench_cross_encoder_train")
    run = {"config": "c.yaml", "label": "c.yaml, packed_tokens true, 32-true", "step": 2.0, "steps_per_epoch": 10,
           "photos": 100, "max_epochs": 3, "params": 5_000_000, "trainable": 2_000_000, "seed": 0, "syncs": None,
           "phases": {"forward": 1.0, "backward": 0.75, "optimizer update": 0.25},
           "parts": {"text encoder (BERT layers)": 0.5, "rest of the forward": 0.25}}
    rows = script.report_run(run, 1000, 4.0)
    printed = capsys.readouterr().out
    step = rows[0]
    assert (step["section"], step["seconds"], step["ratio"]) == ("step", 2.0, 0.5)
    assert step["hours"] == pytest.approx(2.0 * 10 * 10 * 3 / 3600) and f"-> {step['hours']:.1f} h for 1000 photos" in printed
    phases = {r["part"]: r for r in rows if r["section"] == "phase"}
    assert phases["backward"]["percent"] == 37.5 and phases["wait for the batch"]["seconds"] == 0.0 and "37.5 %" in printed
    parts = {r["part"]: r["percent"] for r in rows if r["section"] == "forward part"}
    assert parts == {"text encoder (BERT layers)": 50.0, "rest of the forward": 25.0}
    ab = script.report_predicate_ab("composer_world.yaml", {"padding": 0.4, False: 2.0, True: 1.0})
    assert [(r["part"], r["seconds"], r["ratio"]) for r in ab] == [("padded", 2.0, None), ("real tokens only", 1.0, 0.5)]
    groups = script.report_length_groups_ab("mvsa.yaml", {"concept_padding": 0.5, 1: 4.0, 8: 3.0})
    assert [r["seconds"] for r in groups] == [4.0, 3.0] and groups[1]["ratio"] == 0.75
    printed = capsys.readouterr().out
    assert "padded 2.00 s, real tokens only 1.00 s: 0.50x" in printed and "length_groups 1 4.00 s, 8 3.00 s: 0.75x" in printed


def test_semclip_timing_rows(bench, capsys):
    script = bench("bench_semclip")
    wup = script.report_wup(100, 9.0, 0.02, 0.004)
    assert [r["value"] for r in wup] == pytest.approx([200.0, 40.0]) and wup[1]["ratio"] == pytest.approx(5.0)
    assert "nltk 200 us, graph 40 us (x5.0)" in capsys.readouterr().out
    ste = script.report_ste({True: 0.5, False: 2.0}, 1000, 1600, 1234.0)
    assert [r["value"] for r in ste] == [0.5, 2.0] and ste[1]["ratio"] == 4.0 and ste[0]["steps_per_epoch"] == 2
    assert "dense / sparse step time: x4.00" in capsys.readouterr().out
    measured = {name: {"step": (s, s / 2), "validation": (1.0, 0.5), "checkpoints": (2.0, 1.0), "anchors": 800, "gb": 0.5}
                for name, s in (("old", 3.0), ("new", 1.0))}
    old, new = script.report_ste_epoch(measured, 1600, 2, 10, 1.0)
    assert (old["value"], new["value"]) == (9.0, 5.0) and old["ratio"] == pytest.approx(9.0 / 5.0)
    assert "old / new per epoch: x1.80 wall" in capsys.readouterr().out


def test_gpu_check_record_rows(bench):
    script = bench("gpu_check")
    ok = {"model": "VSE", "paper_config": "a.yaml", "tables": "T2", "status": "ok", "batch": 4, "steps_timed": 2,
          "s_per_step": 0.5, "steps_per_s": 2.0, "peak_memory_gib": None, "syncs_per_step": 0.0, "sync_sites": {},
          "params_m": 1.5, "paper_steps_one_gpu": 1000, "gpu_hours": 0.25, "wall_s": 3.0,
          "schedule": {"items": 10, "item": "x", "epochs": 20, "source": "App. C"}, "stand_ins": ["a -> b", "c"]}
    failed = {"model": "COMPOSER", "paper_config": "b.yaml", "tables": "T3", "status": "failed: RuntimeError: x",
              "stand_ins": [], "wall_s": 1.0}
    rows = script.record_rows([ok, failed])
    assert rows[0]["epochs"] == 20 and rows[0]["stand_ins"] == "a -> b; c" and rows[0]["steps_per_s"] == 2.0
    assert rows[1]["status"].startswith("failed") and rows[1]["steps_per_s"] is None and rows[1]["stand_ins"] is None
    columns = [c for c, _ in script.record_table("GPU")]
    assert set(columns) <= set(rows[0]) and dict(script.record_table("CPU"))["gpu_hours"] == "CPU-hours"
