"""Summary tables laid out as the papers' (a sweep's Fig. 3 / Fig. 12 / Tables 2 and 5 / the STE's Table 2): the
table type and the readers of a run's ``sweep_result.json`` they are filled from. Each paper's tables live in its
package (``grounding.vgbert.sweep_tables``, ``grounding.semclip.sweep_tables``); ``python -m grounding.sweep
summarize`` gathers them."""

from __future__ import annotations

import math


def finite_float(value) -> float | None:
    """``value`` as a finite float, else None (a missing, empty or NaN cell)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def param(result: dict, leaf: str, default=None):
    """A run's parameter by its last key component (``trainable_layers``)."""
    for key, value in (result.get("params") or {}).items():
        if key.split(".")[-1] == leaf:
            return value
    return default


def metric(result: dict, name: str):
    """A run's number: ``test/...`` from its test metrics, ``space:<metric>`` / ``reference:<metric>`` from the
    report's run / reference row, or a top-level key (``learnable_parameters``)."""
    if name.startswith("space:"):
        value = ((result.get("semantic_space") or {}).get("run") or {}).get(name[6:])
    elif name.startswith("reference:"):
        value = ((result.get("semantic_space") or {}).get("reference") or {}).get(name[10:])
    elif "/" in name:
        value = (result.get("test") or {}).get(name)
    else:
        value = result.get(name)
    return finite_float(value)


class Table:
    """A table laid out as the paper's: row labels, column labels, and per cell one or more numbers (the Markdown
    shows them joined by " / "; the CSV gives each its own column, ``<column>: <number>``)."""

    def __init__(self, name: str, title: str, row_header: str, columns: list[str], metrics: list[tuple[str, str, int]],
                 note: str = ""):
        self.name, self.title, self.row_header, self.columns, self.metrics, self.note = (
            name, title, row_header, columns, metrics, note)
        self.rows: list[tuple[str, list[list[float | None]]]] = []

    def add(self, label: str, cells: list[list[float | None]]) -> None:
        self.rows.append((label, cells))

    def markdown(self) -> str:
        def cell(values):
            if all(v is None for v in values):
                return "—"
            return " / ".join("—" if v is None else f"{v:.{d}f}" for v, (_, _, d) in zip(values, self.metrics))

        what = " / ".join(label for _, label, _ in self.metrics)
        lines = [f"## {self.title}\n", f"Cells: {what}." + (f" {self.note}" if self.note else "") + "\n",
                 "| " + " | ".join([self.row_header, *self.columns]) + " |", "|" + "---|" * (len(self.columns) + 1)]
        lines += ["| " + " | ".join([label, *map(cell, cells)]) + " |" for label, cells in self.rows]
        return "\n".join(lines) + "\n"

    def csv_columns(self) -> list[str]:
        return [self.row_header] + [f"{c}: {label}" for c in self.columns for _, label, _ in self.metrics]

    def csv_rows(self) -> list[dict]:
        cols = self.csv_columns()
        return [dict(zip(cols, [label, *(v for values in cells for v in values)])) for label, cells in self.rows]


RETRIEVAL = [("test/i2t_r1", "i2t R@1", 1), ("test/t2i_r1", "t2i R@1", 1)]
