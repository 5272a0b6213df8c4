"""The STE's paper protocol (SemCLIP §5): Table 1 on every query (vectorised, chunked), SimLex-999's noun
subset, the 64-member list cap's statistics, and the report that holds them; tiny generated data."""

from __future__ import annotations

import json
import random

import pytest
import torch
from semclip_helpers import markdown_tables

from data_modules.wordnet_lists import SimilarityLists
from grounding.docs_tables import render_table, validate_record
from grounding.semclip.evaluation import (
    SIMLEX_BLOCKS,
    SIMLEX_EDGES,
    SynonymQueries,
    encoder_synonym_coverage,
    list_cap_statistics,
    simlex_noun_subset,
    ste_synonym_coverage,
    write_report,
)
from grounding.semclip.ste import STEEmbedding


def _reference_coverage(bank, bank_forms, query_rows, queries, k):
    """Table 1 by hand: the k nearest distinct forms of each query (its own row and form excluded)."""
    hits = found = 0
    for q, row in enumerate(query_rows):
        if row < 0:
            continue
        sims = bank @ bank[row]
        sims[row] = float("-inf")
        seen = []
        for r in torch.argsort(sims, descending=True, stable=True).tolist():
            if r == row or bank_forms[r] == queries.words[q] or bank_forms[r] in seen:
                continue
            seen.append(bank_forms[r])
            if len(seen) == k:
                break
        got = queries.synonyms[q] & set(seen)
        hits += bool(got)
        found += len(got)
    return hits, found


def _toy_ste(seed=0):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    words = [f"w{i}" for i in range(150)]
    keys = []
    for s in range(80):  # senses share written forms: an STE's neighbours are deduplicated by form
        keys += [f"s{s}.n.01.{f}" for f in rng.sample(words, rng.randint(1, 4))]
    counts = {}
    for key in keys:
        counts[key.rsplit(".", 1)[1]] = counts.get(key.rsplit(".", 1)[1], 0) + 1
    words_q, syns, qkeys = [], [], []
    for key in keys:
        synset, form = key.rsplit(".", 1)
        others = {k.rsplit(".", 1)[1] for k in keys if k.rsplit(".", 1)[0] == synset} - {form}
        if counts[form] == 1 and others:
            words_q.append(form)
            syns.append(others)
            qkeys.append(key)
    words_q.append("absent")  # not in the vocabulary: counted as a query, never covered
    syns.append({"w1"})
    qkeys.append("absent.n.01.absent")
    vectors = torch.randn(len(keys), 6)
    vectors[1::3] = vectors[0::3][: len(vectors[1::3])] + 0.3 * torch.randn(len(vectors[1::3]), 6)  # some close pairs
    return STEEmbedding(keys, vectors), SynonymQueries(words_q, syns, qkeys)


@pytest.mark.parametrize("k,chunk", [(1, 3), (3, 1000), (10, 2), (60, 4)])
def test_ste_coverage_matches_the_definition(k, chunk):
    ste, queries = _toy_ste()
    got = ste_synonym_coverage(ste, queries, k=k, chunk=chunk)
    rows = [ste.index.get(key, -1) for key in queries.keys]
    forms = [key.rsplit(".", 1)[1] for key in ste.keys]
    hits, found = _reference_coverage(ste.normalized, forms, rows, queries, k)
    total = sum(len(s) for s in queries.synonyms)
    assert got["queries"] == len(queries.words) and got["queries_in_vocabulary"] == len(queries.words) - 1
    assert got["synonyms_in_top10"] == hits and got["synonym_recall"] == pytest.approx(found / total)
    assert got["coverage"] == pytest.approx(hits / len(queries.words))


def test_encoder_coverage_matches_the_definition():
    torch.manual_seed(1)
    forms = [f"f{i}" for i in range(30)]
    vectors = torch.nn.functional.normalize(torch.randn(30, 4), dim=-1)
    queries = SynonymQueries(["f0", "f3", "f7", "nope"], [{"f1", "f2"}, {"f9"}, {"f8", "f20"}, {"f0"}],
                             ["a.n.01.f0", "b.n.01.f3", "c.n.01.f7", "d.n.01.nope"])
    for k in (1, 4, 29):
        got = encoder_synonym_coverage(vectors, forms, queries, k=k, chunk=2)
        rows = [forms.index(w) if w in forms else -1 for w in queries.words]
        hits, found = _reference_coverage(vectors, forms, rows, queries, k)
        assert (got["synonyms_in_top10"], got["queries_in_vocabulary"]) == (hits, 3)
        assert got["synonym_recall"] == pytest.approx(found / 6)
    assert encoder_synonym_coverage(vectors, forms, queries, k=29)["synonyms_in_top10"] == 3  # every other form


# ---- SimLex-999's noun pairs ---------------------------------------------------------------------
class FakeWordNet:
    """synsets(word, pos) / morphy / synset for a handful of words."""

    def __init__(self, pos_of: dict[str, str]):
        self.pos_of = pos_of

    def synsets(self, word, pos=None):
        return [word] if pos is None or pos in self.pos_of.get(word, "") else []

    def morphy(self, word, pos=None):
        return None


def _simlex_pairs():
    pairs = [(f"a{i}", f"b{i}", float(i % 10)) for i in range(999)]
    for i, (w1, w2) in SIMLEX_EDGES.items():
        pairs[i] = (w1, w2, 5.0)
    return pairs


def test_simlex_nouns_from_the_release_order(tmp_path):
    path = tmp_path / "EN-SIMLEX-999.txt"
    path.write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in _simlex_pairs()))
    nouns, info = simlex_noun_subset(path)
    assert len(nouns) == 666 == dict(SIMLEX_BLOCKS)["N"]
    assert nouns[0][:2] == ("wife", "husband") and nouns[-1][:2] == ("bowl", "tail")
    assert "block order" in info["method"] and info["noun_pairs"] == 666


def test_simlex_nouns_from_the_release_pos_column(tmp_path):
    path = tmp_path / "SimLex-999.txt"
    rows = ["word1\tword2\tPOS\tSimLex999\tconc(w1)", "old\tnew\tA\t1.58\t2.7", "dog\tcat\tN\t5.0\t4.9",
            "go\tcome\tV\t2.42\t2.0", "car\tvan\tN\t6.0\t4.8"]
    path.write_text("\n".join(rows) + "\n")
    nouns, info = simlex_noun_subset(path)
    assert nouns == [("dog", "cat", 5.0), ("car", "van", 6.0)] and "POS column" in info["method"]


def test_simlex_nouns_fall_back_to_wordnet_when_the_order_is_not_the_release(tmp_path):
    pairs = _simlex_pairs()
    pairs[0], pairs[500] = pairs[500], pairs[0]  # not the release's order any more
    path = tmp_path / "EN-SIMLEX-999.txt"
    path.write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs))
    wn = FakeWordNet({"wife": "n", "husband": "n", "bowl": "nv", "tail": "n", "old": "a", "new": "a"})
    nouns, info = simlex_noun_subset(path, wn)
    assert nouns == [("wife", "husband", 5.0)] and "WordNet" in info["method"]
    assert info["wordnet_noun_pairs"] == 2 and info["wordnet_noun_only_pairs"] == 1
    with pytest.raises(ValueError, match="needs WordNet"):
        simlex_noun_subset(path)


# ---- the 64-member cap -------------------------------------------------------------------------
def _uncapped_lists():
    vocab = ["x.n.01.x", "x.n.01.xx", "up.n.01.up", "d.n.01.d1", "d.n.01.d2", "e.n.01.e", "f.n.01.f", "g.n.01.g"]
    lists = {
        # 1 synonym + 5 neighbours: capped at 3 -> the synonym, up (0.9), then d1 (0.85) of d's two lemmas
        "x.n.01.x": [("x.n.01.xx", 1.0), ("up.n.01.up", 0.9), ("d.n.01.d1", 0.85), ("d.n.01.d2", 0.85),
                     ("e.n.01.e", 0.85), ("f.n.01.f", 0.8)],
        "x.n.01.xx": [("x.n.01.x", 1.0), ("up.n.01.up", 0.9)],   # under the cap
        "g.n.01.g": [("up.n.01.up", 0.95), ("e.n.01.e", 0.9), ("f.n.01.f", 0.85), ("d.n.01.d1", 0.8)],  # 4 -> 3
    }
    return SimilarityLists.from_mapping(lists, metadata={"config": {"max_depth_diff": 2}}), vocab


class FakeSynset:
    def __init__(self, name, parents):
        self._name, self._parents = name, parents

    def name(self):
        return self._name

    def hypernyms(self):
        return [FakeSynset(p, HIERARCHY.get(p, [])) for p in self._parents]

    def instance_hypernyms(self):
        return []


HIERARCHY = {"x.n.01": ["up.n.01"], "g.n.01": ["up.n.01"], "d.n.01": ["x.n.01"], "e.n.01": ["x.n.01"],
             "f.n.01": ["d.n.01"], "up.n.01": []}


class FakeHierarchy:
    def synset(self, name):
        return FakeSynset(name, HIERARCHY.get(name, []))


def test_list_cap_statistics_by_hand():
    lists, _ = _uncapped_lists()
    stats = list_cap_statistics(lists, cap=3, wn=FakeHierarchy())
    assert stats["lists"] == 3 and stats["pairs_uncapped"] == 12 and stats["pairs_capped"] == 8
    assert stats["lists_truncated"] == 2 and stats["pairs_dropped"] == 4
    assert stats["pairs_dropped_share"] == pytest.approx(4 / 12)
    assert stats["cuts_inside_equal_scores"] == 1          # x's cut: d1 kept, d2 (0.85) dropped
    assert stats["cuts_splitting_a_synset"] == 1           # d.n.01's lemmas on both sides
    assert stats["lowest_kept_score_in_truncated_lists_median"] == pytest.approx((0.85 + 0.85) / 2)
    assert stats["dropped_score_max"] == pytest.approx(0.85)
    assert stats["synonym_share_uncapped"] == pytest.approx(2 / 12)
    assert stats["synonym_share_capped"] == pytest.approx(2 / 8)
    assert stats["largest_truncated"][0] == {"anchor": "x.n.01.x", "size": 6, "kept": 3}
    # hypernym-side neighbours: up for x and xx (1 edge) and for g; every other neighbour is below its anchor
    assert stats["hypernym_side_share_all"] == pytest.approx(3 / 10)
    assert stats["hypernym_side_share_dropped"] == pytest.approx(0.0)
    # synonyms are never cut, even beyond the cap
    assert list_cap_statistics(lists, cap=1)["pairs_capped"] == 1 + 1 + 1
    assert list_cap_statistics(lists, cap=100)["lists_truncated"] == 0


# ---- the report ---------------------------------------------------------------------------------
def test_report_full_protocol_and_sample(tmp_path):
    ste, queries = _toy_ste()
    ste.save(tmp_path / "ste")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "EN-SIMLEX-999.txt").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in _simlex_pairs()))
    (ws / "EN-RG-65.txt").write_text("w1\tw2\t3.0\nw3\tw4\t1.0\nw5\tw6\t2.0\nw7\tw8\t4.0\n")
    wn = FakeWordNet({f"w{i}": "n" for i in range(150)} | {"wife": "n", "husband": "n"})
    out = write_report(tmp_path / "ste", tmp_path / "full", encoders=(), word_similarity=ws, cap_statistics=False,
                       wn=wn, queries=queries, record=tmp_path / "records" / "ste.json")
    meta = json.loads((out / "meta.json").read_text())
    n = len(queries.words) - 1  # the absent query is outside the STE
    assert meta["protocol"] == f"all {n} queries" and meta["wordnet_queries"] == n + 1
    assert meta["simlex_nouns"]["EN-SIMLEX-999-N"]["noun_pairs"] == 666
    readme = (out / "README.md").read_text()
    assert "EN-SIMLEX-999-N" in readme and "0.398" in readme  # the paper's EN-SIMLEX STE column beside ours
    table2 = (out / "table2.csv").read_text().splitlines()
    assert table2[0].startswith("dataset,pairs,wordnet_filtered,STE,STE all pairs,paper dataset")
    assert any(line.startswith("EN-SIMLEX-999-N,666,") for line in table2)
    # record=: Tables 1 and 2 as one record, each rendering back to the README's table
    record = json.loads((tmp_path / "records" / "ste.json").read_text())
    validate_record(record, "ste.json")
    for number, lines in zip(("1", "2"), markdown_tables(readme)[:2]):
        rendered = render_table(record, columns=record["tables"][number]["columns"], where=("table", [number]), digits=3)
        assert rendered.replace("–", "—") == "\n".join(lines) + "\n", number
    assert record["config"] == [str(tmp_path / "ste"), str(ws)] and record["seeds"] is None and record["sample"] is None
    assert record["protocol"] == f"all {n} queries" and record["report"] == str(out / "README.md")
    sampled = write_report(tmp_path / "ste", tmp_path / "sampled", encoders=(), word_similarity=ws,
                           cap_statistics=False, wn=wn, queries=queries, sample=5, seed=3)
    meta = json.loads((sampled / "meta.json").read_text())
    assert meta["protocol"].startswith("a seeded sample of 5 queries") and meta["sample"] == 5
    cov = (sampled / "synonym_coverage.csv").read_text().splitlines()[1].split(",")
    assert cov[:2] == ["STE", "5"]


def test_report_cli_sample_switch():
    from grounding.semclip.__main__ import build_parser

    cfg = build_parser().parse_args(["report", "--ste", "x", "--out", "y", "--sample", "500"])
    assert cfg.report.sample == 500 and cfg.report.max_queries is None
    cfg = build_parser().parse_args(["report", "--ste", "x", "--out", "y"])
    assert cfg.report.sample is None  # the full protocol by default
