"""VG-BERT's GLUE probe (App. B.6, Table 12): the GLUE reader (every task's layout and quirk, a missing task skipped
with a line, a malformed row one line naming file:line, exit 2 from the CLI), the probe's maths (it learns a
separable task; the cached token states are the encoder's), its metrics against scikit-learn / SciPy and the GLUE
average."""

from __future__ import annotations

import contextlib
import io
import logging
import math

import numpy as np
import pytest
import torch
from glue_helpers import ALL_TASKS, write_tiny_glue
from lightning.pytorch import Trainer
from scipy import stats
from sklearn import metrics

# imported at collection, not under a test's capture: Lightning binds its log handler to the stderr of the moment
from data_modules.glue import TASKS, GlueDataModule, MalformedDataError, glue_task, read_task_file
from grounding.cli import main as grounding_main
from grounding.errors import user_errors_exit
from grounding.paths import EXPERIMENTS_DIR
from grounding.semantic_space.embeddings import LanguageStreamError
from grounding.vgbert.glue_probe import (
    GlueProbe,
    GlueProbeNet,
    SharedPooler,
    glue_score,
    task_metrics,
    task_of_set,
)


@pytest.fixture(scope="module")
def glue_root(tmp_path_factory):
    return write_tiny_glue(tmp_path_factory.mktemp("glue") / "glue_data")


def datamodule(root, **kwargs) -> GlueDataModule:
    dm = GlueDataModule(str(root), text_encoder="tiny-random", batch_size=8, **kwargs)
    dm.setup()
    return dm


# ---- the reader --------------------------------------------------------------------------------------------
def test_every_task_layout_reads_with_its_quirks(glue_root):
    cola_a, cola_b, cola_y = read_task_file(TASKS["CoLA"], glue_root / "CoLA" / "train.tsv")
    assert len(cola_a) == 24 and cola_b is None  # no header: every line is a row
    assert cola_a[0].endswith(" is bad .") and cola_y[:2].tolist() == [0, 1] and cola_y.dtype == np.int64
    mrpc_a, mrpc_b, mrpc_y = read_task_file(TASKS["MRPC"], glue_root / "MRPC" / "train.tsv")
    assert len(mrpc_a) == 24 and mrpc_a[0].startswith('" ') and mrpc_b[0].endswith(' "')  # BOM skipped, quotes kept
    stsb_a, stsb_b, stsb_y = read_task_file(TASKS["STS-B"], glue_root / "STS-B" / "dev.tsv")
    assert stsb_y.dtype == np.float32 and set(stsb_y.tolist()) == {0.0, 5.0} and stsb_b[0].endswith("here .")
    _, _, mnli_y = read_task_file(TASKS["MNLI"], glue_root / "MNLI" / "dev_mismatched.tsv")  # 16 columns, gold_label
    assert set(mnli_y.tolist()) == {0, 2}
    sst_a, _, _ = read_task_file(TASKS["SST-2"], glue_root / "SST-2" / "train.tsv")
    assert sst_a[0].endswith(". ")  # the text as written
    dm = datamodule(glue_root)
    assert [s.name for s in dm.datasets["test"].splits] == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli_m", "mnli_mm",
                                                            "qnli", "rte", "wnli"]
    assert [s.name for s in dm.datasets["train"].splits] == [TASKS[t].key for t in ALL_TASKS]
    assert all(len(s) == 8 for s in dm.datasets["test"].splits)
    assert all(len(a) + len(b) == 24 for a, b in zip(dm.datasets["train"].splits, dm.datasets["val"].splits))
    assert glue_task("sts-b") is glue_task("STSB") is TASKS["STS-B"] and task_of_set("mnli_mm") is TASKS["MNLI"]


def test_batches_hold_one_task_with_segments(glue_root):
    dm = datamodule(glue_root, tasks=["SST-2", "RTE"])
    batches = list(dm.train_dataloader())
    assert {b["task"] for b in batches} == {"sst2", "rte"} and sum(len(b["labels"]) for b in batches) == 2 * 22
    rte = next(b for b in batches if b["task"] == "rte")
    sst = next(b for b in batches if b["task"] == "sst2")
    assert rte["token_type_ids"].max() == 1 and sst["token_type_ids"].max() == 0  # pairs: [SEP] b [SEP] is segment 1
    assert rte["input_ids"].shape == rte["attention_mask"].shape == rte["token_type_ids"].shape
    test = list(dm.test_dataloader())
    assert [b["eval_set"] for b in test] == ["sst2", "rte"] and test[0]["labels"].tolist() == [0, 1] * 4


def test_a_missing_task_is_skipped_with_one_line(tmp_path, caplog):
    root = write_tiny_glue(tmp_path / "glue", tasks=("CoLA", "RTE", "MNLI"))
    (root / "RTE" / "train.tsv").unlink()
    (root / "MNLI" / "dev_mismatched.tsv").unlink()
    with caplog.at_level(logging.WARNING, logger="data_modules.glue"):
        dm = datamodule(root)
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert [s.name for s in dm.datasets["test"].splits] == ["cola"]
    assert sum("RTE" in ln and "train.tsv" in ln for ln in lines) == 1
    assert sum("MNLI" in ln and "dev_mismatched.tsv" in ln for ln in lines) == 1
    assert len(lines) == len(ALL_TASKS) - 1 and all("\n" not in ln for ln in lines)


@pytest.mark.parametrize("task,file,row,expected", [
    ("MRPC", "train.tsv", "1\t7\tonly three fields", "3 tab-separated field(s), expected 5"),
    ("RTE", "dev.tsv", "9\ta b .\tc d .\tmaybe", "label 'maybe' is not one of"),
    ("STS-B", "train.tsv", "9\tg\tf\ty\t0009\tnone\tnone\ta .\tb .\thigh", "score 'high' is not a number"),
    ("CoLA", "dev.tsv", "gj04\t1\tno sentence", "3 tab-separated field(s), expected 4"),
])
def test_a_malformed_row_is_one_line_naming_file_and_line(tmp_path, task, file, row, expected):
    root = write_tiny_glue(tmp_path / "glue", tasks=(task,))
    path = root / task / file
    lines = path.read_text(encoding="utf-8").splitlines()
    lines.insert(3, row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(MalformedDataError) as info:
        GlueDataModule(str(root)).check_inputs()
    message = str(info.value)
    assert f"{path}:4:" in message and expected in message and "\n" not in message


def test_qqp_rows_with_a_stray_tab_are_skipped_and_counted(tmp_path, caplog):
    root = write_tiny_glue(tmp_path / "glue", tasks=("QQP",))
    path = root / "QQP" / "train.tsv"
    path.write_text(path.read_text(encoding="utf-8") + "\tWas it real?\t0\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="data_modules.glue"):
        texts, _, _ = read_task_file(TASKS["QQP"], path)
    assert len(texts) == 24 and any("skipped 1 row(s)" in r.getMessage() and "line 26" in r.getMessage()
                                    for r in caplog.records)


def test_a_malformed_row_exits_2_from_the_cli(tmp_path, capsys):
    root = write_tiny_glue(tmp_path / "glue", tasks=("SST-2", "MRPC"))
    path = root / "MRPC" / "dev.tsv"
    path.write_text(path.read_text(encoding="utf-8") + "1\t2\tbroken\n", encoding="utf-8")
    args = ["fit", "--config", str(EXPERIMENTS_DIR / "glue" / "tiny.yaml"), f"--data.init_args.root={root}",
            "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}"]
    capsys.readouterr()
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as info, \
            user_errors_exit("python -m grounding"):
        grounding_main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"{path}:10: 3 tab-separated field(s), expected 5" in err.splitlines()[0]


def test_the_shared_glue_folder_reads(shared_data):
    """The real ../shared/data/glue: its six trainable tasks' files parse (QNLI, dev only, is skipped)."""
    dm = GlueDataModule(str(shared_data / "glue"))
    assert [t.name for t in dm.present_tasks(report=False)] == ["CoLA", "SST-2", "MRPC", "STS-B", "RTE", "WNLI"]
    dm.check_inputs()


# ---- the probe -----------------------------------------------------------------------------------------------
def test_the_pooler_pools_the_real_tokens_only():
    torch.manual_seed(0)
    states, mask = torch.randn(2, 4, 6), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    for pool in ("mean", "first", "max", "attention"):
        pooler = SharedPooler(6, 5, pool)
        changed = states.clone()
        changed[0, 2:] = 100.0  # padding
        assert torch.allclose(pooler(states, mask), pooler(changed, mask), atol=1e-5), pool
    pooler = SharedPooler(6, 5, "mean")
    assert torch.allclose(pooler(states, mask)[0], pooler.project(states[0, :2]).mean(0), atol=1e-6)


def probe_fit(root, tmp_path, tasks, steps: int, init_from=None, summarise_states=True,
              pool="mean") -> tuple[GlueProbe, GlueDataModule]:
    torch.manual_seed(0)
    dm = datamodule(root, tasks=tasks)
    model = GlueProbe(GlueProbeNet("tiny-random", proj_dim=32, pool=pool, dropout=0.0, tasks=tasks),
                      init_from=init_from, cache_dir=str(tmp_path / "states"), summarise_states=summarise_states,
                      optimizer=lambda params: torch.optim.Adam(params, lr=1e-2))
    trainer = Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path / "run"), num_sanity_val_steps=0,
                      check_val_every_n_epoch=1000)
    trainer.fit(model, dm)
    return model, dm


def train_accuracy(model: GlueProbe, dm: GlueDataModule) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in dm.train_dataloader():
            right += int((model.outputs(batch).argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return right / total


def test_the_probe_learns_a_separable_task(tmp_path):
    root = write_tiny_glue(tmp_path / "glue", n_train=64, tasks=("SST-2", "RTE"))
    model, dm = probe_fit(root, tmp_path, ["SST-2", "RTE"], steps=60)
    assert not any(p.requires_grad for p in model.net.encoder.parameters())
    assert train_accuracy(model, dm) >= 0.9  # chance: 0.5
    states = dm.split_files("train")[0].states
    assert states is not None and len(list((tmp_path / "states").iterdir())) == 2  # one store a task file


def test_cached_states_are_the_encoders(tmp_path, glue_root):
    model, dm = probe_fit(glue_root, tmp_path, ["MRPC"], steps=1, summarise_states=False)
    batch = next(iter(dm.train_dataloader()))
    direct = model.net.token_states(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    assert torch.allclose(batch["states"][real], direct[real], atol=2e-3, rtol=1e-2)
    folder = dm.split_files("train")[0].states.folder
    mtime = (folder / "states.npy").stat().st_mtime_ns
    dm.split_files("train")[0].states = None
    model.attach_states(("train",))  # the stored states are read again, not recomputed
    assert dm.split_files("train")[0].states.folder == folder and (folder / "states.npy").stat().st_mtime_ns == mtime
    with torch.no_grad():
        model.net.encoder.embeddings.word_embeddings.weight.add_(1.0)  # another encoder: other states
    model._encoder_sha1 = None
    model.attach_states(("train",))
    assert dm.split_files("train")[0].states.folder != folder


@pytest.mark.parametrize("pool", ["mean", "first"])
def test_summarised_states_give_the_token_states_probe(tmp_path, glue_root, pool):
    """Pooling each example's cached states once (its mean or first state) and projecting that is the probe that
    projects every token and pools: the same outputs on every batch, and the same after a step of training."""
    model, dm = probe_fit(glue_root, tmp_path, ["MRPC", "STS-B"], steps=2, pool=pool)
    assert model.net.pooler.summary == pool
    model.eval()
    for split in ("train", "test"):
        model.attach_states((split,))
        summarised = list(dm._loader(split, False))
        model.hparams.summarise_states = False
        model.attach_states((split,))
        padded = list(dm._loader(split, False))
        model.hparams.summarise_states = True
        assert len(summarised) == len(padded) > 1
        for a, b in zip(summarised, padded):
            assert "summary_states" in a and "states" not in a and "states" in b and "summary_states" not in b
            assert a["task"] == b["task"] and torch.equal(a["labels"], b["labels"])
            with torch.no_grad():
                assert torch.allclose(model.outputs(a), model.outputs(b), atol=1e-5)


def test_summaries_are_the_mean_and_first_states_block_by_block(monkeypatch):
    from grounding.vgbert import glue_probe

    rng = np.random.default_rng(0)
    lengths = np.array([3, 1, 7, 2, 5, 4])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    states = rng.normal(size=(offsets[-1], 4)).astype(np.float16)
    expected = np.stack([states[a:b].astype(np.float64).mean(0) for a, b in zip(offsets[:-1], offsets[1:])])
    for rows in (1 << 16, 6, 1):  # one block; blocks of whole examples; an example longer than a block
        monkeypatch.setattr(glue_probe, "SUMMARY_ROWS", rows)
        assert np.allclose(glue_probe.summarise_states(states, offsets, "mean"), expected, atol=1e-6)
    assert np.array_equal(glue_probe.summarise_states(states, offsets, "first"), states[offsets[:-1]].astype(np.float32))
    with pytest.raises(ValueError, match="summary"):
        glue_probe.TokenStates("x", summary="max")


def test_init_from_probes_a_checkpoints_language_stream(tmp_path, glue_root):
    """A suite checkpoint's BERT (found by its prefix, as the semantic-space report finds it) becomes the encoder."""
    torch.manual_seed(7)
    stream = GlueProbeNet("tiny-random").encoder
    state = {f"model.language.bert.{k}": v.clone() for k, v in stream.state_dict().items()}
    state["model.visual.embed.weight"] = torch.zeros(2)
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"net": {"init_args": {"text_encoder": "tiny-random"}}}}, path)
    model, _ = probe_fit(glue_root, tmp_path, ["WNLI"], steps=1, init_from=str(path))
    for k, v in stream.state_dict().items():
        assert torch.equal(model.net.encoder.state_dict()[k], v), k
    wide = GlueProbe(GlueProbeNet("tiny-random", proj_dim=8), init_from=str(path))
    wide.net.text_encoder = "bert-base-random"  # another architecture than the checkpoint's
    with pytest.raises(LanguageStreamError, match="fix: set model.init_args.net.init_args.text_encoder"):
        wide.load_stream(path)


# ---- metrics ---------------------------------------------------------------------------------------------------
def test_the_metrics_are_scikit_learns_and_scipys():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    assert task_metrics(TASKS["CoLA"], p, y) == {"mcc": pytest.approx(metrics.matthews_corrcoef(y, p))}
    assert task_metrics(TASKS["MRPC"], p, y) == {"f1": pytest.approx(metrics.f1_score(y, p)),
                                                 "acc": pytest.approx(metrics.accuracy_score(y, p))}
    assert task_metrics(TASKS["SST-2"], p, y) == {"acc": pytest.approx(np.mean(p == y))}
    y3, p3 = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    assert task_metrics(TASKS["MNLI"], p3, y3)["acc"] == pytest.approx(metrics.accuracy_score(y3, p3))
    scores, guesses = rng.uniform(0, 5, 40), rng.uniform(0, 5, 40)
    assert task_metrics(TASKS["STS-B"], guesses, scores) == {
        "pearson": pytest.approx(stats.pearsonr(guesses, scores)[0]),
        "spearman": pytest.approx(stats.spearmanr(guesses, scores)[0])}
    constant = task_metrics(TASKS["STS-B"], np.full(40, 2.5), scores)
    assert constant == {"pearson": 0.0, "spearman": 0.0}


def test_the_glue_average_averages_each_tasks_metrics_first():
    # BERT-base on the GLUE leaderboard: the per-task numbers give its published score, 78.3
    results = {"cola": {"mcc": 52.1}, "sst2": {"acc": 93.5}, "mrpc": {"f1": 88.9, "acc": 84.8},
               "stsb": {"pearson": 87.1, "spearman": 85.8}, "qqp": {"f1": 71.2, "acc": 89.2},
               "mnli_m": {"acc": 84.6}, "mnli_mm": {"acc": 83.4}, "qnli": {"acc": 90.5}, "rte": {"acc": 66.4},
               "wnli": {"acc": 65.1}}
    assert round(glue_score(results), 1) == 78.3
    assert glue_score({"cola": {"mcc": 0.4}, "mrpc": {"f1": 0.9, "acc": 0.8}}) == pytest.approx((0.4 + 0.85) / 2)
    assert glue_score({"mnli_m": {"acc": 0.8}, "mnli_mm": {"acc": 0.7}, "rte": {"acc": 0.6}}) == pytest.approx(0.675)
    assert math.isnan(glue_score({}))


def test_limits_keep_only_the_rows_used(glue_root):
    full, small = datamodule(glue_root, tasks=["MRPC"]), datamodule(glue_root, tasks=["MRPC"], train_limit=5, eval_limit=3)
    assert [len(small.datasets[s]) for s in ("train", "val", "test")] == [5, 2, 3]
    big, little = full.split_files("train")[0], small.split_files("train")[0]
    assert len(little) == 7  # the file holds the 7 rows used, the probe encodes no others
    kept = np.union1d(small.held_out(TASKS["MRPC"], len(big))[0], small.held_out(TASKS["MRPC"], len(big))[1])
    for i, row in enumerate(kept):
        assert all(np.array_equal(a, b) for a, b in zip(little.example(i), big.example(row)))
    assert little.labels.tolist() == big.labels[kept].tolist()


# ---- the report (Table 12 with intervals) -------------------------------------------------------------------
def test_resampled_metrics_are_task_metrics_on_each_resample():
    from grounding.vgbert.glue_report import resampled_metric

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 60).astype(float)
    predictions = np.stack([labels.copy(), rng.integers(0, 2, 60).astype(float)])
    predictions[0, :9] = 1 - predictions[0, :9]
    scores, targets = rng.normal(size=(2, 60)), rng.uniform(0, 5, 60)
    idx = rng.integers(0, 60, size=(4, 60))
    for task, preds, tgt in ((glue_task("CoLA"), predictions, labels), (glue_task("MRPC"), predictions, labels),
                             (glue_task("STS-B"), scores, targets)):
        for metric in task.metrics:
            got = resampled_metric(metric, preds, tgt, idx)
            for m in range(2):
                for r in range(4):
                    want = task_metrics(task, preds[m, idx[r]], tgt[idx[r]])[metric]
                    assert got[m, r] == pytest.approx(want, abs=1e-9), (task.name, metric)
    constant = np.zeros((1, 60))
    assert resampled_metric("mcc", constant, labels, idx).tolist() == [[0.0] * 4]  # undefined: 0, as sklearn


def write_predictions(folder, sets):
    from grounding.utils.io import atomic_write_csv
    from grounding.vgbert.glue_probe import PREDICTIONS_FILE

    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"eval_set": name, "row": i, "prediction": float(p), "label": float(t)}
            for name, (preds, labels) in sets.items() for i, (p, t) in enumerate(zip(preds, labels))]
    atomic_write_csv(folder / PREDICTIONS_FILE, rows, ["eval_set", "row", "prediction", "label"], digits=6)
    return folder


def test_the_report_pairs_the_encoders_and_writes_its_record(tmp_path):
    from grounding.docs_tables import validate_record
    from grounding.vgbert.glue_report import main as report_main

    rng = np.random.default_rng(0)
    rte, cola = rng.integers(0, 2, 300), rng.integers(0, 2, 400)
    stsb = rng.uniform(0, 5, 200)
    good = {"rte": (rte, rte), "cola": (cola, cola), "stsb": (stsb + rng.normal(0, 0.5, 200), stsb)}
    worse_rte = rte.copy()
    worse_rte[:60] = 1 - worse_rte[:60]  # 20 % of RTE wrong: 100 -> 80
    worse = {"rte": (worse_rte, rte), "cola": (cola, cola), "stsb": good["stsb"]}
    a, b = write_predictions(tmp_path / "a", good), write_predictions(tmp_path / "b", worse)
    record = tmp_path / "glue_test_record.json"
    assert report_main(["--run", f"Before={a}", "--run", f"After={b}", "--out", str(tmp_path / "out"),
                        "--resamples", "200", "--record", str(record)]) == 0
    for name in ("glue.md", "glue.csv", "glue_differences.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    import json

    data = json.loads(record.read_text())
    validate_record(data, str(record))
    rows = {r["measure"]: r for r in data["rows"]}
    assert rows["rte acc"]["m0"] == 100.0 and rows["rte acc"]["d1"] == pytest.approx(-20.0)
    assert rows["rte acc"]["d1_high"] < 0 and rows["rte acc"]["v1"] == "lower, as the paper"
    assert rows["cola mcc"]["d1"] == rows["cola mcc"]["d1_low"] == rows["cola mcc"]["d1_high"] == 0.0  # paired
    assert rows["cola mcc"]["v1"] == "no clear change (paper: lower)"
    glue = next(r for m, r in rows.items() if m.startswith("GLUE average"))
    assert glue["d1"] == pytest.approx(-20.0 / 3) and glue["paper_bert"] is None
    paper = next(r for m, r in rows.items() if m.startswith("average of the paper"))
    assert paper["paper_bert"] == pytest.approx((40.7 + 81.8 + 73.8) / 3)


def test_the_report_refuses_runs_of_other_examples(tmp_path, capsys):
    from grounding.vgbert.glue_report import main as report_main

    labels = np.arange(10) % 2
    a = write_predictions(tmp_path / "a", {"rte": (labels, labels)})
    b = write_predictions(tmp_path / "b", {"rte": (labels, 1 - labels)})
    c = write_predictions(tmp_path / "c", {"wnli": (labels, labels)})
    for argv, expected in (([f"A={a}", f"B={b}"], "examples differ"), ([f"A={a}", f"C={c}"], "same tasks"),
                           ([f"A={a}", f"D={tmp_path / 'none'}"], "no "), ([f"A={a}", f"A={a}"], "share a name")):
        with pytest.raises(SystemExit) as e:
            report_main([x for r in argv for x in ("--run", r)] + ["--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and expected in err and len(err.strip().splitlines()) <= 3, err


def test_the_probes_test_writes_every_dev_prediction(tmp_path, glue_root):
    from grounding.vgbert.glue_probe import PREDICTIONS_FILE

    model, dm = probe_fit(glue_root, tmp_path, ["RTE", "STS-B"], steps=2)
    model.trainer.test(model, dm, verbose=False)
    import csv

    with (tmp_path / "run" / PREDICTIONS_FILE).open() as f:
        rows = list(csv.DictReader(f))
    sizes = {s.name: len(s) for s in dm.datasets["test"].splits}
    assert {name: sum(r["eval_set"] == name for r in rows) for name in sizes} == sizes
    rte = [r for r in rows if r["eval_set"] == "rte"]
    assert [int(r["row"]) for r in rte] == list(range(len(rte))) and {r["prediction"] for r in rte} <= {"0.0", "1.0"}


def test_the_probe_trains_on_its_threads_and_restores_torchs(tmp_path, glue_root):
    from lightning.pytorch import Callback

    seen = []

    class Threads(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        dm = datamodule(glue_root, tasks=["RTE"])
        model = GlueProbe(GlueProbeNet("tiny-random", proj_dim=8, tasks=["RTE"]), cache_dir=str(tmp_path / "states"))
        Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                default_root_dir=str(tmp_path / "run"), num_sanity_val_steps=0, limit_val_batches=0,
                callbacks=[Threads()]).fit(model, dm)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_readme_claim_is_the_glue_records():
    """The claims table's GLUE row (papers_claims) says what docs/records/glue_table12.json holds."""
    import json

    from grounding.paths import REPO_ROOT

    records = REPO_ROOT / "docs" / "records"
    glue = json.loads((records / "glue_table12.json").read_text(encoding="utf-8"))
    claim = next(r for r in json.loads((records / "papers_claims.json").read_text(encoding="utf-8"))["rows"]
                 if r["command"] == "make glue-table12")
    row = next(r for r in glue["rows"] if r["measure"].startswith("average of the paper's tasks here"))
    assert claim["value"] == round(row["d1"], 1)
    assert claim["interval"] == [round(row["d1_low"], 1), round(row["d1_high"], 1)]
    assert glue["labels"]["m1"] == "Grounded (6,000 photos)" and claim["commit"] == glue["commit"]
    holds = row["d1_high"] < 0  # the paper: a small loss
    assert claim["verdict"] == ("holds" if holds else "does not hold")
