"""The scaling curve (grounding.leaderboard.scaling): the train_subset override per DataModule, the fits it runs
for the missing sizes, and its table and plot."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from run_helpers import same_json
from test_leaderboard import _tiny_vse_and_vilbert

from grounding.leaderboard import load_leaderboard
from grounding.leaderboard.board import Leaderboard, LeaderboardError, ModelEntry, TestSet, semclip_bank
from grounding.leaderboard.scaling import (
    COLUMNS,
    RECORD_LABELS,
    markdown,
    merge_recorded,
    plot_scaling,
    read_recorded,
    record_rows,
    scaling_entries,
    semclip_vlm,
    slug,
    subset_override,
    train_photo_names,
    validation_every,
    with_first_stages,
)
from grounding.leaderboard.scaling import main as scaling_main
from grounding.paths import EXPERIMENTS_DIR
from grounding.semclip.alignment import AlignmentTransform, save_transform
from grounding.training_images import checkpoint_training_keys


def test_subset_override_reaches_each_datamodules_reader():
    """COMPOSER's DataModule wraps a caption DataModule: its subsets.train sits one level down."""
    assert subset_override(str(EXPERIMENTS_DIR / "vgbert" / "baseline_flickr8k_full.yaml"), 750) == \
        {"data": {"init_args": {"subsets": {"train": 750}}}}
    assert subset_override(str(EXPERIMENTS_DIR / "composer" / "vse_flickr8k_full.yaml"), 750) == \
        {"data": {"init_args": {"captions": {"init_args": {"subsets": {"train": 750}}}}}}
    assert slug("CLIP-style dual encoder") == "clip-style_dual_encoder" and slug("ViLBERT + MVSA") == "vilbert_+_mvsa"


def test_table_and_plot_of_fake_rows(tmp_path):
    rows = [{"model": "A", "photos": n, "rsum": r, "rsum_low": r - 5, "rsum_high": r + 5, "t2i_r1": 1.0, "i2t_r1": 2.0,
             "train_minutes": 1.5, "epochs": 3, "status": "ok", "command": "c"} for n, r in ((750, 100.0), (1500, 150.0))]
    rows.append({"model": "B", "photos": 750, "status": "skipped: no run for 750 photos", "command": "fit B"})
    rows.append({**rows[0], "model": "C", "first_stage": "A @ 750, R@20 41.0"})
    md = markdown(rows)
    assert "| A | 1500 | 150.0 [145.0, 155.0] | 1.0 | 2.0 | – | 1.5 | 3 |" in md and "`fit B`" in md
    assert "| C | 750 | 100.0 [95.0, 105.0] | 1.0 | 2.0 | A @ 750, R@20 41.0 | 1.5 | 3 |" in md
    assert plot_scaling(rows, tmp_path / "s.png", "t").stat().st_size > 1000


def test_recorded_rows_fill_what_this_run_did_not_test_and_redraw_alone(tmp_path):
    """--recorded: an earlier run's tested rows join the table for every (model, size) this run did not test (a
    skipped row of this run is replaced, a tested one wins); with no --models the record is only redrawn. The
    committed record of the Flickr8k curve reads as one."""
    def row(model, n, rsum, **kw):
        return {"model": model, "photos": n, "rsum": rsum, "rsum_low": rsum - 5, "rsum_high": rsum + 5, "t2i_r1": None,
                "i2t_r1": None, "status": "ok", "command": "c", **kw}
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"source": "b.yaml", "rows": [
        row("A", 750, 100.0, commit="aaaaaaa"), row("A", 1500, 150.0, commit="aaaaaaa"),
        row("B", 750, 90.0, commit="aaaaaaa"), {"model": "B", "photos": 1500, "status": "skipped: no run", "command": "x"}]}))
    recorded = read_recorded(record)
    assert [(r["model"], r["photos"]) for r in recorded] == [("A", 750), ("A", 1500), ("B", 750)]  # tested rows only
    assert all(r["recorded_in"] == str(record) for r in recorded)
    this_run = [row("A", 1500, 160.0, commit="bbbbbbb"), {"model": "B", "photos": 750, "status": "skipped: no run",
                                                           "command": "fit B"}, row("C", 750, 80.0, commit="bbbbbbb")]
    merged = merge_recorded(this_run, recorded)
    assert [(r["model"], r["photos"], r["rsum"], r["commit"]) for r in merged] == [
        ("A", 750, 100.0, "aaaaaaa"), ("A", 1500, 160.0, "bbbbbbb"), ("B", 750, 90.0, "aaaaaaa"), ("C", 750, 80.0, "bbbbbbb")]
    md = markdown(merged)
    assert "| A | 750 | 100.0 [95.0, 105.0] | – | – | – | – | – | aaaaaaa (recorded) |" in md
    assert "| A | 1500 | 160.0 [155.0, 165.0] | – | – | – | – | – | bbbbbbb |" in md
    out = tmp_path / "redrawn"
    assert scaling_main(["--config", str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml"), "--recorded", str(record),
                         "--out", str(out)]) == 0
    assert [r["rsum"] for r in json.loads((out / "scaling.json").read_text())["rows"]] == [100.0, 150.0, 90.0]
    assert (out / "scaling.png").stat().st_size > 1000
    committed = read_recorded(Path(__file__).resolve().parents[1] / "docs" / "records" / "scaling_flickr8k_full.json")
    assert {r["photos"] for r in committed if r["model"] == "VSE"} == {750, 1500, 3000, 6000}
    assert all(r["commit"] and r["rsum_low"] <= r["rsum"] <= r["rsum_high"] for r in committed)


SCALING_RECORD = Path(__file__).resolve().parents[1] / "docs" / "records" / "scaling_flickr8k_full.json"


def test_record_rows_are_the_committed_records_rows(tmp_path):
    """The committed record's table is what record_rows derives from its rows' data (columns, labels, every row), and
    `--recorded <the record> --record ...` (make scaling-plot SCALING_RECORD_OUT=...) writes the record again: its
    provenance, rows (their recorded_in as the record has them) and table."""
    record = json.loads(SCALING_RECORD.read_text())
    assert record["columns"] == list(COLUMNS) and record["labels"] == RECORD_LABELS
    rows = record_rows(record["rows"])
    assert len(rows) == len(record["rows"]) and all(same_json(a, b) for a, b in zip(rows, record["rows"]))
    again = tmp_path / "r.json"
    assert scaling_main(["--config", str(EXPERIMENTS_DIR / "leaderboard" / "flickr8k_full.yaml"), "--recorded",
                         str(SCALING_RECORD), "--out", str(tmp_path / "out"), "--record", str(again)]) == 0
    assert json.loads(again.read_text()) == record


def test_scaling_writes_its_record_and_reads_it_back(tmp_path, capsys):
    """--record: the table as a docs record (this command's provenance, the YAML as config and source) that --recorded
    reads as an earlier run; the record redrawn alone keeps its provenance and is itself; a bad name is one line,
    exit 2."""
    from grounding.docs_tables import PROVENANCE, load_record

    world = str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml")
    rows = [{"model": "A", "photos": n, "rsum": r, "rsum_low": r - 5, "rsum_high": r + 5, "t2i_r1": 1.0, "i2t_r1": 2.0,
             "status": "ok", "command": "c", "commit": "aaaaaaa"} for n, r in ((750, 100.0), (1500, float("nan")))]
    (tmp_path / "scaling.json").write_text(json.dumps({"source": "b.yaml", "rows": rows[:1]}))  # an earlier run's
    first = tmp_path / "records" / "first.json"
    assert scaling_main(["--config", world, "--recorded", str(tmp_path / "scaling.json"), "--out", str(tmp_path / "o1"),
                         "--record", str(first)]) == 0
    record = load_record(first, "test")  # the schema
    assert record["config"] == world and record["source"] == world and record["seeds"] is None and record["commit"]
    assert record["rows"] == json.loads((tmp_path / "o1" / "scaling.json").read_text())["rows"]
    assert record["rows"][0]["recorded_in"] == str(tmp_path / "scaling.json")
    assert record_rows(rows)[1]["rsum"] is None  # no NaN in JSON
    assert [(r["model"], r["photos"]) for r in read_recorded(first)] == [("A", 750)]  # --recorded reads the record
    again = tmp_path / "again.json"
    assert scaling_main(["--config", world, "--recorded", str(first), "--out", str(tmp_path / "o2"), "--record",
                         str(again)]) == 0
    assert json.loads(again.read_text()) == record
    assert {k: json.loads(again.read_text())[k] for k in PROVENANCE} == {k: record[k] for k in PROVENANCE}
    capsys.readouterr()
    for bad in ("two words", str(tmp_path)):
        assert scaling_main(["--config", world, "--recorded", str(first), "--out", str(tmp_path / "o3"),
                             "--record", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "o3").exists()  # refused before anything is written


@pytest.mark.parametrize("max_epochs, every, expected", [
    (15, 1, 5), (8, 1, 4), (8, 2, 4), (10, 1, 5), (7, 1, 7), (20, 1, 10),  # at most 3, the last at the last epoch
    (8, 4, None), (15, 5, None), (1, 1, None), (3, 1, None),  # the config's own schedule already does that
])
def test_scaled_fits_validate_at_most_three_times_ending_at_the_last_epoch(max_epochs, every, expected):
    assert validation_every(max_epochs, every, 3) == expected
    d = expected or every
    assert max_epochs % d == 0 and max_epochs // d <= 3


def _board(tmp_path) -> Leaderboard:
    composer = EXPERIMENTS_DIR / "composer"
    vse = ModelEntry("VSE", "make vse", config=str(composer / "vse_flickr8k_full.yaml"), ckpt=str(tmp_path / "vse.ckpt"),
                     other_seeds=[str(tmp_path / "vse1.ckpt")])
    rerank = dict(first_stage="VSE", rerank_top_k=20)
    models = [vse, ModelEntry("ViLBERT-style", "make vilbert", config=str(composer / "vilbert_flickr8k_full.yaml"),
                              ckpt=str(tmp_path / "vilbert.ckpt"), **rerank),
              ModelEntry("fused", "make", ensemble=["VSE"])]
    return Leaderboard(TestSet(name="t", captions={}), models, str(tmp_path / "out"), "board.yaml")


def test_a_cross_encoder_at_n_photos_reranks_its_first_stage_at_n_photos(tmp_path):
    """The first stage is planned first (added when not named); at N photos the reranker's first stage is the
    first stage's own N-photo run, or the whole-split run with --first-stage full; one seed at every size."""
    board = _board(tmp_path)
    assert with_first_stages(board, ["ViLBERT-style"]) == ["VSE", "ViLBERT-style"]
    assert with_first_stages(board, ["ViLBERT-style", "VSE"]) == ["VSE", "ViLBERT-style"]
    with pytest.raises(LeaderboardError, match="--models fused: not a model .* trained by one config"):
        with_first_stages(board, ["fused"])
    plan = scaling_entries(board, ["ViLBERT-style"], [750, 6000, 9000], tmp_path / "runs", 6000, fit=False)
    assert [(name, n) for name, n, _, _ in plan] == [("VSE", 750), ("VSE", 6000), ("ViLBERT-style", 750),
                                                     ("ViLBERT-style", 6000)]
    by = {(name, n): (entry, cmd) for name, n, entry, cmd in plan}
    assert by[("VSE", 750)][0] is None and by[("ViLBERT-style", 750)][0] is None  # no runs yet: skipped rows
    # VSE: 8 epochs validated each -> at 4 and 8; ViLBERT-style: every 2nd of 8 -> at 4 and 8
    assert "--trainer.check_val_every_n_epoch 4" in by[("VSE", 750)][1]
    assert "subsets: {train: 750}" in by[("ViLBERT-style", 750)][1]
    whole = by[("VSE", 6000)][0]
    assert whole.other_seeds == [] and whole.ckpt == str(tmp_path / "vse.ckpt")
    assert by[("ViLBERT-style", 6000)][0].first_stage == "VSE @ 6000"
    # planned entries whose runs exist: the N-photo reranker names the N-photo first stage (or the whole split's)
    for name in ("vse", "vilbert-style"):
        (tmp_path / "runs" / name / "n750" / "checkpoints").mkdir(parents=True)
        (tmp_path / "runs" / name / "n750" / "checkpoints" / "best-epoch007-step8.ckpt").write_bytes(b"x")
    for first_stage, expected in (("same", "VSE @ 750"), ("full", "VSE @ 6000")):
        plan = scaling_entries(board, ["ViLBERT-style"], [750], tmp_path / "runs", 6000, fit=False,
                               first_stage=first_stage)
        reranker = next(entry for name, n, entry, _ in plan if (name, n) == ("ViLBERT-style", 750))
        assert reranker.first_stage == expected and reranker.name == "ViLBERT-style @ 750"
    # --first-stage full plans the first stage's whole-split point even when the sizes leave it out
    plan = scaling_entries(board, ["ViLBERT-style"], [750], tmp_path / "runs", 6000, fit=False, first_stage="full")
    assert [(name, n) for name, n, _, _ in plan] == [("VSE", 750), ("VSE", 6000), ("ViLBERT-style", 750)]
    with pytest.raises(LeaderboardError, match="--first-stage half"):
        scaling_entries(board, ["VSE"], [750], tmp_path / "runs", 6000, fit=False, first_stage="half")


def _semclip_board(tmp_path) -> Leaderboard:
    """A dual encoder and SemCLIP on it (its Γ_t config named), as experiments/leaderboard/flickr8k_full.yaml has them."""
    de = ModelEntry("DE", "make de", config=str(EXPERIMENTS_DIR / "vgbert" / "baseline_flickr8k_full.yaml"),
                    ckpt=str(tmp_path / "de_full" / "checkpoints" / "best-*.ckpt"))
    semclip = ModelEntry("SemCLIP", "make semclip", config=str(EXPERIMENTS_DIR / "semclip" / "align_flickr8k_full.yaml"),
                         semclip={"vlm": f"suite:{tmp_path / 'de_full' / 'checkpoints' / 'best.ckpt'}",
                                  "transform": str(tmp_path / "align_full" / "transform.pt"),
                                  "ste": str(tmp_path / "ste" / "embedding")},
                         runs=[str(tmp_path / "de_full"), str(tmp_path / "ste"), str(tmp_path / "align_full")])
    return Leaderboard(TestSet(name="t", captions={}), [de, semclip], str(tmp_path / "out"), "board.yaml")


def test_semclip_at_n_photos_refits_gamma_t_on_its_vlm_at_n_photos(tmp_path):
    """A SemCLIP row is planned after its VLM (added when not named); at N photos its Γ_t is refit through the VLM's
    N-photo run on those photos' captions (caption_images), and the store's bank is the same captions; the STE
    stays the row's. Until the VLM's run exists, the row is skipped with the commands that make it."""
    board = _semclip_board(tmp_path)
    assert semclip_vlm(board, board.models[1]) == "DE"
    assert with_first_stages(board, ["SemCLIP"]) == ["DE", "SemCLIP"]
    elsewhere = replace(board.models[1], semclip={**board.models[1].semclip, "vlm": "suite:/elsewhere/c/best.ckpt"})
    with pytest.raises(LeaderboardError, match="its VLM suite:/elsewhere/c/best.ckpt is the checkpoint of no suite row"):
        with_first_stages(replace(board, models=[board.models[0], elsewhere]), ["SemCLIP"])
    runs = tmp_path / "runs"
    plan = scaling_entries(board, ["SemCLIP"], [750], runs, 6000, fit=False)
    by = {(name, n): (entry, cmd) for name, n, entry, cmd in plan}
    assert list(by) == [("DE", 750), ("SemCLIP", 750)]
    assert by[("SemCLIP", 750)][0] is None
    assert f"first its VLM, DE at 750 photos (this command with --fit makes it in {runs / 'de' / 'n750'})" \
        in by[("SemCLIP", 750)][1]
    ckpt = runs / "de" / "n750" / "checkpoints" / "best-epoch004-step10.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x")
    entry, cmd = scaling_entries(board, ["SemCLIP"], [750, 6000], runs, 6000, fit=False)[-2][2:]
    assert entry is None  # the VLM's run exists, Γ_t's not yet: the command fits Γ_t through it
    folder = runs / "semclip" / "n750"
    args = shlex.split(cmd)
    assert args[:5] == ["python", "-m", "grounding", "fit", "--config"] and args[5].endswith("align_flickr8k_full.yaml")
    assert yaml.safe_load(args[7]) == {"data": {"init_args": {"vlm": f"suite:{ckpt}",
                                                              "caption_images": str(folder / "train_photos.txt")}},
                                       "model": {"init_args": {"export_path": str(folder / "transform.pt")}}}
    assert args[8:] == ["--trainer.default_root_dir", str(folder)]
    folder.mkdir(parents=True)
    save_transform(AlignmentTransform(4, 3, 8), folder / "transform.pt", vlm=f"suite:{ckpt}")
    plan = scaling_entries(board, ["SemCLIP"], [750, 6000], runs, 6000, fit=False)
    entry = next(e for name, n, e, _ in plan if (name, n) == ("SemCLIP", 750))
    assert entry.name == "SemCLIP @ 750" and entry.semclip == {
        "vlm": f"suite:{ckpt}", "transform": str(folder / "transform.pt"), "ste": str(tmp_path / "ste" / "embedding"),
        "bank_images": str(folder / "train_photos.txt")}
    assert entry.runs == [str(ckpt.parent.parent), str(tmp_path / "ste"), str(folder)]  # VLM, STE, Γ_t
    whole = next(e for name, n, e, _ in plan if (name, n) == ("SemCLIP", 6000))
    assert whole.semclip == board.models[1].semclip  # the whole split: the leaderboard row as it is
    # the VLM's run refit since (another best checkpoint, the old one gone): Γ_t is stale, the row says to refit it
    ckpt.rename(ckpt.with_name("best-epoch009-step20.ckpt"))
    entry, cmd = scaling_entries(board, ["SemCLIP"], [750], runs, 6000, fit=False)[-1][2:]
    assert entry is None and cmd.startswith("refit Γ_t through today's DE @ 750: python -m grounding fit")
    # a VLM run that stopped early is no VLM yet (--fit resumes it first)
    (ckpt.parent.parent / "fit_record.json").write_text('{"epochs": 2}')
    (ckpt.parent.parent / "config.yaml").write_text("trainer: {max_epochs: 15}")
    entry, cmd = scaling_entries(board, ["SemCLIP"], [750], runs, 6000, fit=False)[-1][2:]
    assert entry is None and cmd.startswith("first its VLM, DE at 750 photos")


def test_semclip_bank_keeps_the_named_training_images_captions(tmp_path):
    train = SimpleNamespace(image_paths=[Path("x/a.jpg"), Path("x/b.jpg"), Path("x/c.jpg")],
                            captions=[["a one", "a two"], ["b one"], ["c one"]])
    entry = ModelEntry("S", "make", semclip={"vlm": "v", "transform": "t", "ste": "s"})
    assert semclip_bank(entry, train) == ["a one", "a two", "b one", "c one"]
    (tmp_path / "names.txt").write_text("c.jpg\na.jpg\n\n")
    named = replace(entry, semclip={**entry.semclip, "bank_images": str(tmp_path / "names.txt")})
    assert semclip_bank(named, train) == ["a one", "a two", "c one"]
    (tmp_path / "names.txt").write_text("z.jpg\n")
    with pytest.raises(LeaderboardError, match=r"names none of the test set's 3 training images.*\(e.g. a.jpg\)"):
        semclip_bank(named, train)
    with pytest.raises(LeaderboardError, match="semclip.bank_images .*missing.txt cannot be read"):
        semclip_bank(replace(entry, semclip={**entry.semclip, "bank_images": str(tmp_path / "missing.txt")}), train)


def test_train_photo_names_are_the_vlm_fits_own_sample(tiny_world, tmp_path):
    """The N names SemCLIP's Γ_t and bank use at N photos are the images the VLM's N-photo fit trains on (the caption
    DataModule's seeded ``train_subset``), all of its training split."""
    from data_modules import FlickrDataModule

    reader = {"root": str(tiny_world / "flickr"), "karpathy_file": None, "captions_file": None, "image_dir": "images",
              "loader": {"num_workers": 0}}
    config = tmp_path / "de.yaml"
    config.write_text(yaml.safe_dump({"base": str(EXPERIMENTS_DIR / "vgbert" / "baseline_flickr8k_full.yaml"),
                                      "data": {"init_args": reader}}))
    names = train_photo_names(str(config), 8)
    dm = FlickrDataModule(**{k: v for k, v in reader.items() if k != "loader"}, subsets={"train": 8})
    dm.setup()
    assert names == [Path(p).name for p in dm.train_dataset.image_paths] and len(set(names)) == 8
    every = FlickrDataModule(**{k: v for k, v in reader.items() if k != "loader"})
    every.setup()
    assert set(names) < {Path(p).name for p in every.train_dataset.image_paths}
    composer = str(EXPERIMENTS_DIR / "composer" / "vse_flickr8k_full.yaml")
    with pytest.raises(LeaderboardError, match="is no caption DataModule"):
        train_photo_names(composer, 8)


@pytest.mark.slow
def test_scaling_fits_the_missing_size_and_tests_every_size(tiny_world, tmp_path, monkeypatch):
    """VSE on the tiny world at 8 training photos (fit by --fit with train_subset 8) and at all of them (the
    leaderboard row's own run): both tested on the same test set; the 8-photo run trained on 8 images. ViLBERT-style,
    a cross-encoder, at both sizes reranks VSE's run of the same size (VSE joins the models by itself)."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    flickr, vse, vilbert = _tiny_vse_and_vilbert(tiny_world, tmp_path)
    models, full = [], {}
    for name, config, extra in (("VSE", vse, {}), ("ViLBERT-style", vilbert, {"first_stage": "VSE", "rerank_top_k": 2})):
        cfg = yaml.safe_load(open(config))
        cfg["trainer"].update(max_epochs=1, check_val_every_n_epoch=1, limit_train_batches=2)
        Path(config).write_text(yaml.safe_dump(cfg))
        full[name] = tmp_path / f"full_{slug(name)}"
        subprocess.run([sys.executable, "-m", "grounding", "fit", "--config", config, "--trainer.default_root_dir",
                        str(full[name])], check=True, capture_output=True)
        models.append({"name": name, "config": config, "ckpt": str(full[name] / "checkpoints" / "best-*.ckpt"),
                       "command": f"fit {name}", **extra})
    board = {"test_set": {"name": "tiny", "captions": flickr}, "out": str(tmp_path / "board"), "models": models}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board))
    load_leaderboard(tmp_path / "board.yaml")
    out = tmp_path / "report"
    assert scaling_main(["--config", str(tmp_path / "board.yaml"), "--models", "ViLBERT-style", "--photos", "8", "1000",
                         "--runs", str(tmp_path / "runs"), "--out", str(out), "--fit", "--record",
                         str(tmp_path / "record.json")]) == 0
    rows = json.loads((out / "scaling.json").read_text())["rows"]
    record = json.loads((tmp_path / "record.json").read_text())  # this run's record: its command, config and rows
    assert record["rows"] == rows and record["config"] == str(tmp_path / "board.yaml") and record["command"].startswith("python")
    assert all(r["commit"] == record["commit"] and r["recorded_in"] is None for r in rows)
    assert [(r["model"], r["status"]) for r in rows] == [("VSE", "ok")] * 2 + [("ViLBERT-style", "ok")] * 2
    for row in rows[2:]:  # each size reranks VSE's run of that size, whose recall@2 is the ceiling
        assert row["first_stage"].startswith(f"VSE @ {row['photos']}, R@2 ")
    assert len(set(checkpoint_training_keys(next((tmp_path / "runs" / "vilbert-style" / "n8" / "checkpoints")
                                                 .glob("best-*.ckpt"))).tolist())) == 8
    small, whole = rows[:2]
    assert small["photos"] == 8 and whole["photos"] > 8  # the whole training split, not the 1000 asked for
    small_ckpt = next((tmp_path / "runs" / "vse" / "n8" / "checkpoints").glob("best-*.ckpt"))
    assert len(set(checkpoint_training_keys(small_ckpt).tolist())) == 8  # the images its fit trained on
    assert len(set(checkpoint_training_keys(next((full["VSE"] / "checkpoints").glob("best-*.ckpt"))).tolist())) > 8
    assert (out / "scaling.png").stat().st_size > 1000 and "| VSE | 8 |" in (out / "scaling.md").read_text()
