"""STE evaluation: synonym coverage (Table 1) and word similarity (Table 2) on hand-made cases."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from data_modules.lexical import read_word_similarity
from grounding.semclip.evaluation import (
    SynonymQueries,
    coverage_from_neighbours,
    encoder_synonym_coverage,
    spearman,
    ste_pair_similarity,
    ste_synonym_coverage,
    word_similarity_table,
)
from grounding.semclip.ste import STEEmbedding

KEYS = ["car.n.01.car", "car.n.01.auto", "dog.n.01.dog", "dog.n.01.domestic_dog", "cat.n.01.cat", "bank.n.01.bank", "bank.n.02.bank"]


def _embedding():
    v = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.05, 0.1, 1], [0, 0.9, 0.2], [0, 0, 1], [1, 0, 0.1]])
    return STEEmbedding(KEYS, v)


def test_coverage_counts_by_hand():
    q = SynonymQueries(words=["auto", "domestic dog"], synonyms=[{"car"}, {"dog"}], keys=["car.n.01.auto", "dog.n.01.domestic_dog"])
    res = coverage_from_neighbours([["car", "bank"], ["bank", "cat"]], q)
    assert res == {"queries": 2, "synonyms_in_top10": 1, "coverage": 0.5, "synonym_recall": 0.5}
    ste = ste_synonym_coverage(_embedding(), q, k=1)
    # auto's nearest item is car (or bank.n.02, same form "bank" never a synonym); domestic_dog's is bank.n.01
    assert ste["synonyms_in_top10"] == 1 and ste["queries_in_vocabulary"] == 2
    forms = ["auto", "bank", "car", "dog", "domestic dog"]
    vec = torch.nn.functional.normalize(torch.tensor([[1.0, 0.1], [0, 1], [1, 0], [0.7, 0.7], [0.72, 0.7]]), dim=-1)
    enc = encoder_synonym_coverage(vec, forms, q, k=1)
    assert enc["synonyms_in_top10"] == 2


def test_word_similarity_spearman_and_sense_max(tmp_path):
    path = tmp_path / "toy.txt"
    path.write_text("car\tauto\t9.0\ndog\tcat\t6.0\ncar\tdog\t1.0\nbank\tcar\t2.0\nzzz\tcar\t3.0\n")
    pairs = read_word_similarity(path)
    assert pairs[0] == ("car", "auto", 9.0) and len(pairs) == 5
    emb = _embedding()
    # "bank" has two sense items: the pair score is the best over senses (bank.n.02 ~ car)
    expected = float(torch.nn.functional.normalize(torch.tensor([1.0, 0, 0.1]), dim=0)[0])
    assert ste_pair_similarity(emb, "bank", "car") == pytest.approx(expected)
    assert ste_pair_similarity(emb, "zzz", "car") is None
    pred, gold = [0.3, 0.1, 0.2], [9.0, 6.0, 1.0]
    assert spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold).statistic)

    class FakeWN:
        def synsets(self, w, pos):
            return [] if w == "zzz" else [w]

    rows = word_similarity_table([path], {"STE": lambda a, b: ste_pair_similarity(emb, a, b)}, FakeWN())
    (row,) = rows
    assert row["pairs"] == 5 and row["wordnet_filtered"] == 4 and row["covered_full"] == 4
    preds = [ste_pair_similarity(emb, a, b) for a, b, _ in pairs[:4]]
    assert row["spearman_full"] == pytest.approx(stats.spearmanr(preds, [9, 6, 1, 2]).statistic)


def test_bad_word_similarity_file(tmp_path):
    (tmp_path / "bad.txt").write_text("car\tauto\tnine\n")
    with pytest.raises(ValueError, match=r"bad.txt:1.*not a number"):
        read_word_similarity(tmp_path / "bad.txt")


@pytest.mark.shared_data
def test_shared_benchmarks_parse(shared_data):
    for path in sorted((shared_data / "word-similarity").glob("*.txt")):
        pairs = read_word_similarity(path)
        assert len(pairs) > 10 and all(isinstance(s, float) for _, _, s in pairs)


# ---- the report's record (python -m grounding.semclip report --record NAME) ------------------------
def test_report_record_is_the_report_tables(tmp_path):
    """Tables 1 and 2 as one record: each, shown by its `where=table=N` and columns, renders to the report's own
    Markdown table (the same numbers, the report's headers as labels; NaN is null); the record validates."""
    import json

    from semclip_helpers import markdown_tables

    from grounding.docs_tables import provenance, render_table, validate_record
    from grounding.semclip.evaluation import report_markdown, report_record_table, write_report_record

    nan = float("nan")
    coverage = [{"embedding": "STE", "queries": 10, "synonyms_in_top10": 7, "coverage": 0.7, "synonym_recall": 0.55,
                 "queries_in_vocabulary": 9},
                {"embedding": "minilm", "queries": 10, "synonyms_in_top10": 4, "coverage": 0.4, "synonym_recall": nan,
                 "queries_in_vocabulary": 10}]
    ws_rows = [{"dataset": d, "model": m, "pairs": 65, "wordnet_filtered": 64, "covered_full": 60, "spearman_full": full,
                "covered_wordnet": 59, "spearman_wordnet": filtered}
               for d in ("EN-RG-65", "MY-SET") for m, full, filtered in (("STE", 0.61, 0.6512), ("minilm", 0.7, nan))]
    md = report_markdown("ste", _embedding(), coverage, ws_rows, protocol="all 10 queries", all_queries=10,
                         subset_notes={}, cap=None)
    table = report_record_table(coverage, ws_rows)
    assert table["tables"]["2"]["columns"] == ["dataset", "pairs", "wordnet_filtered", "ste", "minilm", "ste_all_pairs",
                                               "minilm_all_pairs", "paper_pairs", "paper_wordnet_filtered", "paper_ste",
                                               "paper_ste_similar_subset"]
    assert table["labels"]["ste_all_pairs"] == "STE all pairs" and table["labels"]["paper_ste"] == "paper STE"
    path = write_report_record(tmp_path / "ste_report.json", coverage, ws_rows, provenance(config=["ste", "ws"]),
                               encoders=["minilm"])
    record = json.loads(path.read_text())
    validate_record(record, str(path))
    assert record["rows"] == table["rows"] and record["encoders"] == ["minilm"] and record["seeds"] is None
    assert [r["embedding"] for r in record["rows"] if r["table"] == 1] == ["STE", "minilm", "paper: CLIP", "paper: SBERT",
                                                                           "paper: STE"]
    mine = next(r for r in record["rows"] if r.get("dataset") == "MY-SET")
    assert mine["ste"] == 0.6512 and mine["minilm"] is None and mine["paper_ste"] is None and mine["pairs"] == 65
    tables = markdown_tables(md)
    for number, lines in (("1", tables[0]), ("2", tables[1])):
        rendered = render_table(record, columns=record["tables"][number]["columns"], where=("table", [number]), digits=3)
        assert rendered.replace("–", "—") == "\n".join(lines) + "\n", number  # the report prints null as —


def test_report_record_bad_name_exits_2_before_any_work(tmp_path, capsys):
    """`report --record` with a name that cannot be a record: one line, exit 2, before the STE is looked for."""
    from grounding.semclip.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--ste", str(tmp_path / "no_ste"), "--out", str(tmp_path / "r"), "--record", "no good"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "report: --record" in err and "'no good'" in err and "no_ste" not in err
    assert not (tmp_path / "r").exists()
