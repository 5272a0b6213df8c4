"""Results as data (grounding/docs_tables.py): every table between markers in README.md and docs/**/*.md is what its
record in docs/records/ renders, every marker names a record that exists, every record is published by a marker and
follows the schema; and the renderer on tiny generated files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grounding.docs_tables import (
    PROVENANCE,
    DocsTableError,
    differences,
    main,
    provenance,
    record_option,
    record_path,
    render_table,
    scan,
    unpublished,
    validate_record,
    write_record,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "docs" / "records").glob("*.json"))
KEYS = {"command": "make x", "config": "x.yaml", "commit": "abc1234", "date": "2026-12-06",
        "machine": {"cpu": "a CPU", "cores": 2, "gpu": None}, "seeds": [0, 1]}


# ------------------------------------------------------------------------------------------ the repository's docs
def test_the_docs_tables_are_what_their_records_render():
    """A marker that names a missing record (or cannot render) is an error naming file:line; a table typed or edited
    by hand between markers differs from its record: run `make docs-tables`."""
    found = scan(ROOT)
    assert not found.errors, "markers that cannot be rendered:\n" + "\n".join(found.errors)
    stale = differences(found)
    assert not stale, "tables that differ from their records (`make docs-tables` renders them):\n" + "\n".join(stale)


def test_every_record_is_published_by_a_marker():
    loose = unpublished(ROOT)
    assert not loose, ("records in docs/records/ that no <!-- table: NAME --> ... <!-- /table --> in README.md or "
                       f"docs/**/*.md renders: {loose}")


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_every_record_follows_the_schema(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    validate_record(record, str(path))
    render_table(record)  # its default columns exist
    if record.get("transcribed_from"):  # typed from the docs: says from where, and the command that measured it
        assert record["command"] or all(r.get("command") for r in record["rows"]), path


def test_the_two_readme_records_exist():
    """The README publishes these by name (the real benchmark's table and the papers' claims)."""
    board = json.loads((ROOT / "docs" / "records" / "leaderboard_flickr8k_full.json").read_text(encoding="utf-8"))
    assert "docs/results.md at" in board["transcribed_from"] and board["command"] == "make leaderboard-flickr8k-full"
    ok = [r for r in board["rows"] if r["status"] == "ok"]
    assert all(r["rsum_low"] <= r["rsum"] <= r["rsum_high"] for r in ok) and len(ok) == 11
    for r in board["rows"]:  # rsum is the sum of the six recalls, to the rounding of the typed numbers
        assert sum(r[k] for k in ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10")) == pytest.approx(r["rsum"], abs=0.35)
    claims = json.loads((ROOT / "docs" / "records" / "papers_claims.json").read_text(encoding="utf-8"))
    assert claims["columns"] == ["claim", "paper", "here", "verdict", "link"]
    assert {r["paper_name"] for r in claims["rows"]} == {"VG-BERT", "SemCLIP", "COMPOSER"}
    assert {r["verdict"] for r in claims["rows"]} <= {"holds", "does not hold", "partly"}
    assert all(r["link"].startswith("docs/results/") and r["source"] for r in claims["rows"])


# ------------------------------------------------------------------------------------------ the renderer
def _record(rows=None, **more) -> dict:
    rows = rows if rows is not None else [
        {"model": "A", "rsum": 281.456, "rsum_low": 270.0, "rsum_high": 290.25, "seeds": 3, "note": "x | y"},
        {"model": "B", "rsum": 100.0, "rsum_low": None, "rsum_high": None, "seeds": 1, "note": None}]
    return {**KEYS, "columns": ["model", "rsum", "seeds"], "rows": rows, **more}


def _repo(tmp_path: Path, pages: dict[str, str], records: dict[str, dict]) -> Path:
    for name, text in pages.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "docs" / "records").mkdir(parents=True, exist_ok=True)
    for name, record in records.items():
        (tmp_path / "docs" / "records" / f"{name}.json").write_text(json.dumps(record), encoding="utf-8")
    return tmp_path


def test_a_table_is_rendered_between_its_markers_and_a_second_run_changes_nothing(tmp_path, capsys):
    page = "# Title\n\ntext\n<!-- table: board -->\n| typed | by hand |\n<!-- /table -->\nafter\n"
    root = _repo(tmp_path, {"README.md": page}, {"board": _record()})
    assert main(["--root", str(root), "--check"]) == 1
    assert "README.md:4: table board differs from docs/records/board.json" in capsys.readouterr().out
    assert (root / "README.md").read_text() == page  # --check changes nothing
    assert main(["--root", str(root)]) == 0
    assert (root / "README.md").read_text() == (
        "# Title\n\ntext\n<!-- table: board -->\n"
        "| model | rsum | seeds |\n|---|---|---|\n| A | 281.456 | 3 |\n| B | 100.0 | 1 |\n"
        "<!-- /table -->\nafter\n")
    rendered = (root / "README.md").read_bytes()
    assert main(["--root", str(root)]) == 0 and (root / "README.md").read_bytes() == rendered
    assert main(["--root", str(root), "--check"]) == 0


def test_columns_rows_where_digits_intervals_and_labels():
    record = _record(labels={"rsum": "rsum (of 600)"})
    assert render_table(record, columns=["model", "rsum", "rsum_ci", "note"], digits=1) == (
        "| model | rsum (of 600) | rsum [low, high] | note |\n|---|---|---|---|\n"
        "| A | 281.5 | [270.0, 290.2] | x \\| y |\n| B | 100.0 | – | – |\n")
    assert render_table(record, columns=["seeds", "model"], rows=[2, 1]).splitlines()[2:] == ["| 1 | B |", "| 3 | A |"]
    assert render_table(record, where=("model", ["B", "C"])).splitlines()[2:] == ["| B | 100.0 | 1 |"]
    assert render_table(record, where=("note", ["null"])).splitlines()[2:] == ["| B | 100.0 | 1 |"]
    with pytest.raises(DocsTableError, match="here: no column 'params'"):
        render_table(record, columns=["model", "params"], place="here")
    with pytest.raises(DocsTableError, match="names row 3; the record has 2 rows"):
        render_table(record, rows=[3])


def test_marker_attributes_and_links_relative_to_the_page(tmp_path):
    record = _record(rows=[{"model": "A", "rsum": 1.25, "page": "docs/results/a.md#x"}], links=["page"])
    record["columns"] = ["model", "rsum", "page"]
    page = ('<!-- table: r columns=model,page where="model=A|B C" digits=0 -->\n<!-- /table -->\n'
            "```\n<!-- table: an_example_in_a_fence -->\n```\n")
    root = _repo(tmp_path, {"docs/results/b.md": page}, {"r": record})
    assert main(["--root", str(root)]) == 0
    assert (root / "docs/results/b.md").read_text().splitlines()[1:4] == [
        "| model | page |", "|---|---|", "| A | [a](a.md#x) |"]
    assert render_table(record, digits=0).splitlines()[2] == "| A | 1 | docs/results/a.md#x |"  # no page: plain text


@pytest.mark.parametrize("page, message", [
    ("x\n<!-- table: missing -->\n<!-- /table -->\n", "docs/p.md:2: no record .*missing.json"),
    ("<!-- table: r colums=a -->\n<!-- /table -->\n", "docs/p.md:1: 'colums=a': expected one of rows=, where="),
    ("<!-- table: r digits=two -->\n<!-- /table -->\n", "docs/p.md:1: digits=two"),
    ("<!-- table: r rows=0 -->\n<!-- /table -->\n", "docs/p.md:1: rows=0"),
    ("\n\n<!-- table: r -->\n", "docs/p.md:3: .* is never closed"),
    ("<!-- /table -->\n", "docs/p.md:1: <!-- /table --> without"),
    ("<!-- table: r -->\n<!-- table: r -->\n<!-- /table -->\n", "docs/p.md:2: a table marker inside"),
])
def test_a_bad_marker_is_one_line_naming_the_file_and_line(tmp_path, capsys, page, message):
    root = _repo(tmp_path, {"docs/p.md": page, "README.md": "<!-- table: r -->\n<!-- /table -->\n"}, {"r": _record()})
    before = (root / "README.md").read_text()
    assert main(["--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and re.search(message, err[0]), err
    assert (root / "README.md").read_text() == before  # nothing written when any marker fails


def test_a_record_published_nowhere_fails_the_check(tmp_path, capsys):
    root = _repo(tmp_path, {"README.md": "<!-- table: a -->\n<!-- /table -->\n"}, {"a": _record(), "b": _record()})
    assert main(["--root", str(root)]) == 0
    assert "note: docs/records/b.json is published by no marker" in capsys.readouterr().err
    assert unpublished(root) == ["b"]
    assert main(["--root", str(root), "--check"]) == 1
    assert "docs/records/b.json: published by no marker" in capsys.readouterr().out


def test_a_record_without_provenance_or_table_is_refused(tmp_path, capsys):
    bad = {k: v for k, v in _record().items() if k != "commit"}
    root = _repo(tmp_path, {"README.md": "<!-- table: a -->\n<!-- /table -->\n"}, {"a": bad})
    assert main(["--root", str(root), "--check"]) == 2
    assert "README.md:1: " in capsys.readouterr().err
    for key, value in (("date", "06/12/2026"), ("seeds", [0.5]), ("machine", {"cpu": "x"}), ("columns", []),
                       ("rows", [["A", 1]]), ("columns", ["a", "a"])):
        with pytest.raises(DocsTableError, match=key if key != "rows" else "rows must be"):
            validate_record({**_record(), key: value}, "r")


# ------------------------------------------------------------------------------------------ writing records
def test_write_record_with_this_machines_provenance(tmp_path):
    keys = provenance(command="make y", config="y.yaml", seeds=[0])
    assert set(keys) == set(PROVENANCE) and keys["commit"]  # this checkout's commit
    assert keys["machine"]["cores"] >= 1 and "gpu" in keys["machine"] and len(keys["date"]) == 10
    path = write_record(tmp_path / "r.json", ["model", "rsum"], [{"model": "A", "rsum": float("nan")}], keys, title="t")
    written = json.loads(path.read_text(encoding="utf-8"))
    assert list(written)[:6] == list(PROVENANCE) and written["title"] == "t"
    assert written["rows"] == [{"model": "A", "rsum": None}]  # no NaN in JSON
    assert record_path("leaderboard_x") == Path("docs/records/leaderboard_x.json")
    assert record_path("out/r.json") == Path("out/r.json")
    with pytest.raises(DocsTableError, match="record name"):
        record_path("two words")


def test_record_option_refuses_a_bad_name_a_folder_and_a_file_in_the_way(tmp_path):
    assert record_option(None) is None and record_option("") is None
    assert record_option("x") == Path("docs/records/x.json") and record_option(str(tmp_path / "r.json")) == tmp_path / "r.json"
    (tmp_path / "file").write_text("x")
    for name, message in (("two words", "record name"), (str(tmp_path), "a folder, not a record"), ("new/", "a folder"),
                          (str(tmp_path / "file" / "r.json"), "is a file, not a folder")):
        with pytest.raises(DocsTableError, match=message):
            record_option(name)


def test_the_leaderboard_writes_its_record_and_rewrite_keeps_its_provenance(tmp_path):
    import yaml

    from grounding.leaderboard import load_leaderboard, write_outputs
    from grounding.leaderboard.__main__ import main as leaderboard_main

    board_yaml = {"test_set": {"name": "tiny", "captions": {"class_path": "data_modules.FlickrDataModule",
                                                            "init_args": {"root": str(tmp_path)}}},
                  "out": str(tmp_path / "out"), "models": [{"name": "A", "config": "x.yaml", "ckpt": "x.ckpt",
                                                          "command": "make x"}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board_yaml))
    board = load_leaderboard(str(tmp_path / "board.yaml"))
    row = {"model": "A", "status": "ok", "t2i_r1": 10.0, "t2i_r5": 20.0, "t2i_r10": 30.0, "i2t_r1": 11.0, "i2t_r5": 21.0,
           "i2t_r10": 31.0, "rsum": 123.0, "rsum_low": 110.0, "rsum_high": 130.0, "commit": "def5678"}
    write_outputs([row], board, record=tmp_path / "records" / "tiny.json", provenance_keys=KEYS)
    record = json.loads((tmp_path / "records" / "tiny.json").read_text())
    assert {k: record[k] for k in PROVENANCE} == KEYS and record["rows"][0]["commit"] == "def5678"
    assert json.loads((tmp_path / "out" / "leaderboard.json").read_text())["commit"] == "abc1234"
    assert "| A | 10.0 | 20.0 | 30.0 | 11.0 | 21.0 | 31.0 | 123.0 | – | [110.0, 130.0] | – |" in render_table(record)
    # --rewrite (tests nothing) writes the record with the provenance leaderboard.json holds, not today's
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--rewrite", "--record",
                             str(tmp_path / "again.json")]) == 0
    assert json.loads((tmp_path / "again.json").read_text()) == record
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--rewrite", "--record", "a b"]) == 2
