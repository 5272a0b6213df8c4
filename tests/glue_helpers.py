"""A tiny generated GLUE folder in the download script's layout, every task's quirks included: CoLA without a
header, MRPC with a UTF-8 byte-order mark and bare double quotes, STS-B's regression scores, QQP's columns, MNLI's
matched and mismatched dev sets. Each task's label is readable from one word of its text (``good`` / ``bad``), so a
probe on a random encoder can learn it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FILLERS = ("the film", "a cat", "this story", "my friend", "the weather", "our plan", "that song", "his car")
NLI = ("entailment", "not_entailment")
MNLI = ("entailment", "neutral", "contradiction")


def _sentence(rng, word: str) -> str:
    return f"{FILLERS[rng.integers(len(FILLERS))]} is {word} ."


def _rows(task: str, n: int, rng, dev: bool) -> list[str]:
    rows = []
    for i in range(n):
        y = i % 2
        a, b = _sentence(rng, ("bad", "good")[y]), _sentence(rng, "here")
        if task == "CoLA":  # no header: source, label, original mark, sentence
            rows.append(f"gj04\t{y}\t{'' if y else '*'}\t{a}")
        elif task == "SST-2":
            rows.append(f"{a} \t{y}")  # the real file's trailing space
        elif task == "MRPC":
            rows.append(f"{y}\t{1000 + i}\t{2000 + i}\t\" {a}\t{b} \"")  # bare quotes: quoting must be off
        elif task == "STS-B":
            rows.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{5.0 * y:.3f}")
        elif task == "QQP":
            rows.append(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{y}")
        elif task == "MNLI":
            label = MNLI[0] if y else MNLI[2]
            labels = "\t".join([label] * (5 if dev else 1))
            rows.append(f"{i}\t{31193 + i}\t{31193 + i}n\tfiction\t( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})\t{a}\t{b}\t"
                        f"{labels}\t{label}")
        elif task == "QNLI":
            rows.append(f"{i}\t{a}\t{b}\t{NLI[1 - y]}")
        elif task == "RTE":
            rows.append(f"{i}\t{a}\t{b}\t{NLI[1 - y]}")
        else:  # WNLI
            rows.append(f"{i}\t{a}\t{b}\t{y}")
    return rows


HEADERS = {
    "SST-2": "sentence\tlabel",
    "MRPC": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
    "QQP": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
    "QNLI": "index\tquestion\tsentence\tlabel",
    "RTE": "index\tsentence1\tsentence2\tlabel",
    "WNLI": "index\tsentence1\tsentence2\tlabel",
}
MNLI_COLUMNS = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t" \
               "sentence2_parse\tsentence1\tsentence2"
TASK_FILES = {"MNLI": ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv")}
ALL_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")


def _header(task: str, dev: bool) -> str | None:
    if task == "CoLA":
        return None
    if task == "MNLI":
        return MNLI_COLUMNS + ("\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5" if dev else "\tlabel1") + "\tgold_label"
    return HEADERS[task]


def write_tiny_glue(root: Path, n_train: int = 24, n_dev: int = 8, tasks=ALL_TASKS, seed: int = 0) -> Path:
    """``root/<TASK>/{train,dev}.tsv`` (MNLI: ``dev_matched`` / ``dev_mismatched``) for each of ``tasks``."""
    rng = np.random.default_rng(seed)
    for task in tasks:
        folder = Path(root) / task
        folder.mkdir(parents=True, exist_ok=True)
        for name in TASK_FILES.get(task, ("train.tsv", "dev.tsv")):
            dev = name != "train.tsv"
            header = _header(task, dev)
            lines = ([header] if header else []) + _rows(task, n_dev if dev else n_train, rng, dev)
            (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(root)
