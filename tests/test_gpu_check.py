"""`make gpu-check`'s CPU form: every model of the suite trains 2 steps at the papers' widths and depths (slow tier)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CROSS_ENCODERS = ("VSE", "ViLBERT-style", "ViLBERT + MVSA", "COMPOSER")


@pytest.mark.slow
def test_gpu_check_cpu_form_trains_every_model(tmp_path):
    """``GPU_CHECK_ARGS="--accelerator cpu --steps 2"``: every row trains (a failure is a row, not a crash), writes its
    report and its record (``--record``: the report's table in grounding/docs_tables.py's schema), and the
    cross-encoders' steps make no host synchronisation."""
    from data_modules.synthetic import generate_world

    if not (REPO / "data/world/world.json").is_file():  # what `make world` makes
        generate_world(REPO / "data/world", n_images=400, seed=0, image_size=128)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    from grounding.docs_tables import validate_record

    out = tmp_path / "report"
    status = gpu_check.main(["--accelerator", "cpu", "--steps", "2", "--out", str(out), "--record",
                             str(tmp_path / "bench" / "gpu_check.json")])
    record = json.loads(next(out.glob("*.json")).read_text())
    results = {r["model"]: r for r in record["results"]}
    assert set(results) == {row.name for row in gpu_check.ROWS}
    failed = {name: r["status"] for name, r in results.items() if r["status"] != "ok"}
    assert not failed and status == 0, failed
    for r in results.values():
        assert r["steps_per_s"] > 0 and r["gpu_hours"] > 0 and r["batch"] == 4, r
    for name in CROSS_ENCODERS:
        assert results[name]["syncs_per_step"] == 0, (name, results[name]["sync_sites"])
    markdown = next(out.glob("*.md")).read_text()
    assert "| COMPOSER |" in markdown
    table = json.loads((tmp_path / "bench" / "gpu_check.json").read_text())
    validate_record(table, "gpu_check.json")
    rows = {r["model"]: r for r in table["rows"]}
    assert set(rows) == set(results) and table["labels"]["gpu_hours"] == "CPU-hours" and table["config"]
    for name, r in results.items():
        assert rows[name]["steps_per_s"] == r["steps_per_s"] and rows[name]["gpu_hours"] == r["gpu_hours"]
        assert f"| {name} | {r['tables']} | 4 | {r['steps_per_s']:.2f} |" in markdown  # the printed number, in the record
