"""SemCLIP's STE sweep table: Table 2 (with Table 1's coverage) per STE run beside the paper's STE columns."""

from __future__ import annotations

from grounding.summary_tables import Table, finite_float

STE_DATASETS = ("EN-MC-30", "EN-MEN-TR-3k", "EN-MTurk-287", "EN-RG-65", "EN-RW-STANFORD", "EN-SIMLEX-999-N",
                "EN-SIMLEX-999", "EN-WS-353-REL", "EN-WS-353-SIM", "EN-WS-353-ALL")


def ste_table(results: list[dict]) -> Table:
    """SemCLIP Table 2 (with Table 1's coverage) per STE run, beside the paper's STE columns: one row per run,
    Spearman on the WordNet-filtered pairs of each benchmark (the paper's STE column; ``-N``: SimLex-999's 666 noun
    pairs, the paper's EN-SIMLEX), their mean over the benchmarks the paper reports, and the Table 1 coverage.
    Runs are sorted by that mean (best first)."""
    runs = [r for r in results if r.get("ste_report")]
    # the paper's numbers as the runs' reports recorded them
    paper = next((r["ste_report"]["paper"] for r in runs if r["ste_report"].get("paper")), None) or {}
    paper_table2 = paper.get("table2") or {}
    found = list(dict.fromkeys(d for r in runs for d in (r["ste_report"].get("word_similarity") or {})))
    datasets = [d for d in STE_DATASETS if d in found or d in paper_table2] + [d for d in found if d not in STE_DATASETS]
    paper_sets = [d for d in datasets if d in paper_table2]

    def mean(values: dict) -> float | None:
        got = [values.get(d) for d in paper_sets]
        return None if not got or any(v is None for v in got) else sum(got) / len(got)

    t = Table("ste_table2", "SemCLIP Table 2 (and Table 1's coverage): STE runs beside the paper's STE", "run",
              ["Table 1 coverage", f"mean of the paper's {len(paper_sets)} sets", *datasets],
              [("value", "Spearman ρ on the WordNet-filtered pairs (coverage: Table 1 fraction)", 3)],
              "Runs sorted by the mean, best first; `-N`: SimLex-999's noun pairs (the paper's 666-pair EN-SIMLEX); "
              "the paper's rows: its Table 1 STE coverage and Table 2 STE columns (on 71,895 queries and its own "
              "pair counts). Per-run pair counts and all-pairs Spearman: summary.csv / each run's ste_report/.")
    rows = []
    for r in runs:
        ws = r["ste_report"].get("word_similarity") or {}
        values = {d: finite_float((ws.get(d) or {}).get("spearman_wordnet")) for d in datasets}
        coverage = finite_float((r["ste_report"].get("coverage") or {}).get("coverage"))
        rows.append((mean(values), r.get("run") or "?", coverage, values))
    rows.sort(key=lambda row: (row[0] is None, -(row[0] or 0.0), row[1]))
    for m, label, coverage, values in rows:
        t.add(label, [[coverage], [m], *[[values[d]] for d in datasets]])
    for column, label, cover in ((0, "paper: STE", paper.get("table1_coverage")), (1, "paper: STE (similar subset)", None)):
        if not paper_table2:
            break
        values = {d: paper_table2[d][column] if d in paper_table2 else None for d in datasets}
        t.add(label, [[cover], [mean(values)], *[[values[d]] for d in datasets]])
    return t
