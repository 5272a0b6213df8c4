"""The scaling curve: each model of a leaderboard trained on growing subsets of its training photos, tested on the
same test set, rsum (with its 95 % bootstrap interval) against the number of training photos.

``python -m grounding.leaderboard.scaling --config experiments/leaderboard/flickr8k_full.yaml --models VSE ...
--photos 750 1500 3000 6000 [--fit]``: for every model and size N, the run folder ``<runs>/<model>/n<N>`` holds a
fit of the model's own config with the training split cut to a seeded sample of N photos (the caption DataModule's
``subsets.train``: the same sample for every model); ``--fit`` makes the missing ones (``python -m grounding fit``,
one after another). A size that is the whole training split uses the leaderboard row's own checkpoint. Every run is
then tested by the leaderboard's code on the test set (without the compositional split), and the table
(``scaling.md``, ``.csv``, ``.json``) and the plot (``scaling.png``) are written to ``--out``. A size whose run is
missing is a row naming the command that makes it; a fit that stopped early (killed) is resumed by ``--fit`` from its
``last.ckpt`` and is otherwise a skipped row, never tested as trained.

Cross-encoders (rows with a ``first_stage``) rerank their first stage's top K: at N photos, by default, that first
stage's own run at N photos (``--first-stage same``; it is added to the models when not named), so nothing at N
learned from more than N photos; ``--first-stage full`` reranks the whole-split first stage instead (the reranker's
own learning curve on a fixed candidate list). The table prints the first stage's recall@K, the rerank's ceiling.

Scaled fits validate at most ``--validations`` times (default 3), always at their last epoch: every d epochs, d the
smallest divisor of the config's ``max_epochs`` that allows it (15 epochs: 5, 10, 15; 8: 4, 8), because on 750
photos one evaluation of the full dev split costs more than an epoch; a config that already validates that rarely,
ending at its last epoch, keeps its own schedule. The best of those epochs on dev is tested.

Run folders do not always outlive the machine that made them, so a curve can grow one model at a time:
``--recorded FILE`` (repeatable) merges the rows of an earlier run's ``scaling.json`` (e.g. the committed
``docs/records/scaling_flickr8k_full.json``) for every (model, size) this run does not test; a row this run tests
replaces the recorded one. Every row carries the ``commit`` it was measured at and, when merged, the file it came
from (``recorded_in``). Write the merged ``scaling.json`` back over the record to keep it, or give ``--record``.

``--record NAME`` also writes the table as ``docs/records/NAME.json`` (a path ending in ``.json``: there), a record of
:mod:`grounding.docs_tables`: the provenance (this command line, ``--config``, this commit, date and machine; no seeds,
the runs name none), the YAML as ``source``, ``labels``, ``columns`` and :func:`record_rows` (the rows of
``scaling.json``). Redrawing one record alone (no ``--models``, one ``--recorded`` record) keeps its provenance, source
and each row's ``recorded_in`` as it has them, so ``--recorded docs/records/X.json --record X`` rewrites a record from
itself (``make scaling-plot SCALING_RECORD_OUT=X``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import yaml
from matplotlib.figure import Figure

from grounding.cli import resolved_config
from grounding.docs_tables import PROVENANCE, DocsTableError, provenance, record_path, write_record
from grounding.errors import user_errors_exit
from grounding.leaderboard.board import (
    COMPOSER_DATA,
    Leaderboard,
    LeaderboardError,
    ModelEntry,
    check_output_folder,
    evaluate,
    fit_progress,
    load_leaderboard,
    reference_data,
)
from grounding.nets import class_of
from grounding.paths import resolve_path
from grounding.semclip.alignment import AlignmentMismatchError, check_fitted_vlm, load_transform
from grounding.stage_config import ConfigError
from grounding.utils.io import atomic_path, atomic_write_csv, atomic_write_json, atomic_write_text
from grounding.utils.provenance import source_commit

COLUMNS = ("model", "photos", "rsum", "rsum_low", "rsum_high", "t2i_r1", "i2t_r1", "first_stage", "train_minutes", "epochs",
           "status", "command", "commit", "recorded_in")
FIRST_STAGE_SIZES = ("same", "full")
# the headers of the record's columns (grounding.docs_tables; rsum_ci prints [rsum_low, rsum_high])
RECORD_LABELS = {"photos": "training photos", "rsum_ci": "rsum [95 % CI]", "t2i_r1": "t2i R@1", "i2t_r1": "i2t R@1",
                 "first_stage": "first stage", "train_minutes": "fit min"}


def slug(name: str) -> str:
    """A folder name for a model name ("CLIP-style dual encoder" -> "clip-style_dual_encoder")."""
    return re.sub(r"[^a-z0-9+-]+", "_", name.lower()).strip("_")


def subset_override(config: str, photos: int) -> dict:
    """The config override that trains on a seeded sample of ``photos`` training images: the caption DataModule's
    ``subsets.train`` (inside COMPOSER's DataModule, its ``captions``)."""
    try:
        data_class = str((resolved_config(config).get("data") or {}).get("class_path"))
    except ConfigError as e:
        raise LeaderboardError(str(e)) from None
    if data_class == COMPOSER_DATA:
        return {"data": {"init_args": {"captions": {"init_args": {"subsets": {"train": photos}}}}}}
    return {"data": {"init_args": {"subsets": {"train": photos}}}}


def validation_every(max_epochs: int, every: int, validations: int) -> int | None:
    """``check_val_every_n_epoch`` for a scaled fit: at most ``validations`` dev evaluations, the last at the last
    epoch (d = the smallest divisor of ``max_epochs`` with max_epochs / d <= validations); None when the config's own
    ``every`` already does that."""
    if max_epochs < 1 or validations < 1:
        raise LeaderboardError(f"--validations {validations}: at least 1 (max_epochs {max_epochs})")
    if max_epochs % every == 0 and max_epochs // every <= validations:
        return None
    return next(d for d in range(1, max_epochs + 1) if max_epochs % d == 0 and max_epochs // d <= validations)


def scaled_fit_args(config: str, validations: int | None) -> list[str]:
    """The validation override of :func:`validation_every` for ``config`` (none when ``validations`` is None)."""
    if validations is None:
        return []
    try:
        trainer = resolved_config(config).get("trainer") or {}
    except ConfigError as e:
        raise LeaderboardError(str(e)) from None
    every = validation_every(int(trainer.get("max_epochs") or 1), int(trainer.get("check_val_every_n_epoch") or 1),
                             validations)
    return [] if every is None else ["--trainer.check_val_every_n_epoch", str(every)]


def fit_command(entry: ModelEntry, photos: int, folder: Path, fit_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "grounding", "fit", "--config", entry.config, "--config",
            yaml.safe_dump(subset_override(entry.config, photos), default_flow_style=True).strip(),
            "--trainer.default_root_dir", str(folder), *fit_args]


def check_models(board: Leaderboard, models: list[str]) -> dict[str, ModelEntry]:
    """The named models of ``board`` trained by one config (suite models; cross-encoders rerank a first stage) or
    refit on their VLM by one Γ_t config (SemCLIP rows with a ``config``); else one LeaderboardError."""
    by_name = {m.name: m for m in board.models if not m.ensemble and m.config}
    for name in models:
        if name not in by_name:
            raise LeaderboardError(f"--models {name}: not a model of {board.source} trained by one config; one of "
                                   f"{sorted(by_name)}")
    return by_name


def semclip_vlm(board: Leaderboard, entry: ModelEntry) -> str:
    """The suite row whose run SemCLIP row ``entry`` queries through: ``semclip.vlm`` is ``suite:<ckpt>`` in the
    run folder of that row's ``ckpt``, a model that reranks nothing; else one LeaderboardError."""
    spec = entry.semclip["vlm"]
    if spec.startswith("suite:"):
        folder = resolve_path(spec.removeprefix("suite:")).parent.parent
        for m in board.models:
            if (m.semclip is None and not m.ensemble and m.config and m.ckpt and m.first_stage is None
                    and resolve_path(m.ckpt).parent.parent == folder):
                return m.name
    raise LeaderboardError(f"{entry.name}: its VLM {spec} is the checkpoint of no suite row of {board.source} that "
                           "reranks nothing, so it cannot be refit at each size; expected semclip.vlm "
                           "suite:<that row's run folder>/checkpoints/<file>")


def with_first_stages(board: Leaderboard, models: list[str]) -> list[str]:
    """``models`` with what each needs placed before it (each model once): a cross-encoder's first stage, a SemCLIP
    row's VLM."""
    by_name = check_models(board, models)
    out: list[str] = []
    for name in models:
        entry = by_name[name]
        first = semclip_vlm(board, entry) if entry.semclip is not None else entry.first_stage
        out.extend(n for n in (first, name) if n and n not in out)
    check_models(board, out)
    return out


def train_photo_names(config: str, photos: int) -> list[str]:
    """The file names of the seeded sample of ``photos`` training images that ``config``'s caption DataModule trains
    on (its ``subsets.train``, :func:`subset_override`): the images a SemCLIP at that size may learn from."""
    try:
        data = resolved_config(config).get("data") or {}
    except ConfigError as e:
        raise LeaderboardError(str(e)) from None
    cls = class_of(str(data.get("class_path")))
    init = dict(data.get("init_args") or {})
    if cls is None or data.get("class_path") == COMPOSER_DATA:
        raise LeaderboardError(f"{config}: data.class_path {data.get('class_path')!r} is no caption DataModule "
                               "(a SemCLIP VLM is a dual encoder trained on captions, e.g. data_modules.FlickrDataModule)")
    try:
        dm = cls(**{**init, "train_subset": photos})
        dm.setup()
        return [Path(p).name for p in dm.train_dataset.image_paths]
    except Exception as e:  # noqa: BLE001 - the reader's own error, as one line
        raise LeaderboardError(f"{config}: its training images cannot be listed: {' '.join(str(e).split())[:300]}") \
            from None


def fitted_through(transform: Path, spec: str) -> bool:
    """Whether Γ_t's file ``transform`` was fitted through the VLM ``spec`` (or records none): not when it records
    another checkpoint, nor when the suite checkpoint it records is gone (its run was refit since)."""
    provenance = load_transform(transform)[1]
    fitted = provenance.get("vlm")
    if isinstance(fitted, str) and fitted.startswith("suite:") and not resolve_path(fitted.removeprefix("suite:")).is_file():
        return False
    try:
        check_fitted_vlm(provenance, spec, transform)
    except AlignmentMismatchError:
        return False
    return True


def semclip_at(entry: ModelEntry, vlm: ModelEntry | None, vlm_entry: ModelEntry, photos: int, folder: Path,
               fit: bool, log=print, fit_args: Sequence[str] = ()) -> tuple[ModelEntry | None, str]:
    """SemCLIP row ``entry`` at ``photos`` training photos: its Γ_t refit (``entry.config``, into ``folder``) on the
    captions of those photos (``folder/train_photos.txt``, the sample ``vlm_entry``'s config trains on) through
    ``vlm``, the VLM's run at the same size (None: not made yet); the store's text bank is the same captions.
    (The entry to test or None, the command that makes it.) With ``fit`` a missing Γ_t is fit; the STE is the
    row's own (WordNet's: no photos)."""
    transform, names = folder / "transform.pt", folder / "train_photos.txt"
    ckpt = vlm.checkpoint() if vlm is not None else None
    vlm_run = folder.parent.parent / slug(vlm_entry.name) / f"n{photos}"
    spec = f"suite:{ckpt if ckpt is not None else vlm_run / 'checkpoints' / 'best-<its epoch>.ckpt'}"
    override = {"data": {"init_args": {"vlm": spec, "caption_images": str(names)}},
                "model": {"init_args": {"export_path": str(transform)}}}
    cmd = [sys.executable, "-m", "grounding", "fit", "--config", str(entry.config), "--config",
           yaml.safe_dump(override, default_flow_style=True, width=10_000).strip(), "--trainer.default_root_dir",
           str(folder), *fit_args]
    shown = f"python {shlex.join(cmd[1:])}"
    if ckpt is None:
        return None, f"first its VLM, {vlm_entry.name} at {photos} photos (this command with --fit makes it in " \
                     f"{vlm_run}), then {shown}"
    if transform.is_file() and not fitted_through(transform, spec):  # its VLM run was refit since: Γ_t is stale
        if not fit:
            return None, f"refit Γ_t through today's {vlm_entry.name} @ {photos}: {shown}"
        log(f"{entry.name} @ {photos} photos: Γ_t {transform} was fitted through another VLM checkpoint: refitting")
        transform.unlink()
    if fit and not transform.is_file():
        if not names.is_file():
            atomic_write_text(names, "".join(f"{n}\n" for n in train_photo_names(vlm_entry.config, photos)))
        log(f"{entry.name} @ {photos} photos: fitting Γ_t ({shown})")
        subprocess.run(cmd, check=True)
    if not transform.is_file():
        return None, shown
    replaced = {str(resolve_path(entry.semclip["vlm"].removeprefix("suite:")).parent.parent),
                str(resolve_path(entry.semclip["transform"]).parent)}
    runs = [str(ckpt.parent.parent), *(r for r in entry.runs if str(resolve_path(r)) not in replaced), str(folder)]
    return replace(entry, name=f"{entry.name} @ {photos}", command=shown, other_seeds=[], runs=runs,
                   semclip={**entry.semclip, "vlm": spec, "transform": str(transform), "bank_images": str(names)}), shown


def scaling_entries(board: Leaderboard, models: list[str], photos: list[int], runs: Path, train_photos: int,
                    fit: bool, log=print, fit_args: Sequence[str] = (), first_stage: str = "same",
                    validations: int | None = 3) -> list[tuple[str, int, ModelEntry | None, str]]:
    """(model, N, the entry to test or None when its run is missing, the command that makes it) for every model and
    size, first stages before the cross-encoders that rerank them (named ``<first stage> @ <N>``: the same N, or
    the whole split with ``first_stage="full"``); with ``fit`` the missing runs are fit first and stopped ones
    resumed from their ``last.ckpt``."""
    if first_stage not in FIRST_STAGE_SIZES:
        raise LeaderboardError(f"--first-stage {first_stage}: one of {', '.join(FIRST_STAGE_SIZES)}")
    models = with_first_stages(board, models)
    by_name = check_models(board, models)
    stages = {by_name[m].first_stage for m in models if by_name[m].first_stage}
    out = []
    made: dict[tuple[str, int], ModelEntry | None] = {}  # the scaled runs planned so far (a SemCLIP's VLM among them)
    for name in models:
        entry = by_name[name]
        # with first_stage="full", a first stage is also needed at the whole split, whatever the sizes asked
        extra = [train_photos] if first_stage == "full" and name in stages else []
        for n in sorted({min(n, train_photos) for n in [*photos, *extra]}):
            stage = None if entry.first_stage is None else \
                f"{entry.first_stage} @ {train_photos if first_stage == 'full' else n}"
            if n == train_photos:  # the whole training split: the leaderboard row's own (seed-0) run, one seed like the rest
                out.append((name, n, replace(entry, first_stage=stage, other_seeds=[]), entry.command))
                continue
            folder = runs / slug(name) / f"n{n}"
            if entry.semclip is not None:  # Γ_t on the N photos' captions, through the VLM's N-photo run
                vlm = semclip_vlm(board, entry)
                scaled, shown = semclip_at(entry, made.get((vlm, n)), by_name[vlm], n, folder, fit, log, fit_args)
                out.append((name, n, scaled, shown))
                continue
            cmd = fit_command(entry, n, folder, [*scaled_fit_args(entry.config, validations), *fit_args])
            shown = f"python {' '.join(cmd[1:7])} '{cmd[7]}' {' '.join(cmd[8:])}"
            scaled = replace(entry, name=f"{name} @ {n}", ckpt=str(folder / "checkpoints" / "best-*.ckpt"), runs=[],
                             command=shown, first_stage=stage, other_seeds=[])
            if fit and (folder / "checkpoints" / "last.ckpt").is_file() and (
                    scaled.checkpoint() is None or fit_progress(folder) is not None):
                log(f"{name} @ {n} photos: its fit stopped early: resuming ({shown} --ckpt_path last)")
                subprocess.run([*cmd, "--ckpt_path", "last"], check=True)
            elif scaled.checkpoint() is None and fit:
                log(f"{name} @ {n} photos: fitting ({shown})")
                subprocess.run(cmd, check=True)
            out.append((name, n, scaled if scaled.checkpoint() is not None else None, shown))
            # a SemCLIP's VLM: a finished run only (a stopped one is resumed above with --fit, else not tested)
            made[(name, n)] = out[-1][2] if fit_progress(folder) is None else None
    return out


def run_scaling(board: Leaderboard, models: list[str], photos: list[int], runs: Path, fit: bool = False,
                log=print, fit_args: Sequence[str] = (), first_stage: str = "same",
                validations: int | None = 3) -> list[dict]:
    """The scaling rows: every model at every size, tested on the board's test set (no compositional split)."""
    dm = reference_data(board.test_set)
    train_photos = len(dm.train_dataset)
    planned = scaling_entries(board, models, sorted(set(photos)), runs, train_photos, fit, log, fit_args, first_stage,
                              validations)
    test_set = replace(board.test_set, compositional_split=None)
    present, without_first_stage = [], {}
    for name, n, e, _ in planned:  # in order: a first stage before its rerankers
        if e is None:
            continue
        if e.first_stage is not None and e.first_stage not in {p.name for p in present}:
            without_first_stage[f"{name} @ {n}"] = e.first_stage
            continue
        present.append(replace(e, name=f"{name} @ {n}"))
    tested = {r["model"]: r for r in evaluate(Leaderboard(test_set, present, board.out, board.source), log=log)} \
        if present else {}
    rows = []
    for name, n, entry, command in planned:
        row = tested.get(f"{name} @ {n}") if entry is not None else None
        base = {"model": name, "photos": n, "command": command}
        if f"{name} @ {n}" in without_first_stage:
            rows.append({**base, "status": f"skipped: its first stage {without_first_stage[f'{name} @ {n}']} has no run"})
        elif row is None:
            rows.append({**base, "status": f"skipped: no run for {n} photos"})
        else:
            rows.append({**base, **{k: row.get(k) for k in COLUMNS if k not in base}})
    return rows


def read_recorded(path: Path) -> list[dict]:
    """The rows of an earlier run's ``scaling.json`` that were tested (status ok), each marked ``recorded_in``; a file
    that is not such a record is one LeaderboardError."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
        ok = [r for r in rows if r.get("status") == "ok"]
        for r in ok:
            float(r["rsum"]), float(r["rsum_low"]), float(r["rsum_high"]), int(r["photos"]), str(r["model"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LeaderboardError(f"--recorded {path}: not a scaling.json this command wrote ({type(e).__name__}: {e}); "
                               "expected {\"rows\": [{\"model\", \"photos\", \"rsum\", \"rsum_low\", \"rsum_high\", "
                               "\"status\": \"ok\", ...}]}") from None
    return [{**r, "recorded_in": r.get("recorded_in") or str(path)} for r in ok]


def merge_recorded(rows: list[dict], recorded: list[dict]) -> list[dict]:
    """``rows`` with every recorded row whose (model, photos) this run did not test: it replaces a skipped row of
    this run or joins the table (later files win over earlier ones); rows sorted by model (first seen) and size."""
    tested = {(r["model"], r["photos"]) for r in rows if r.get("status") == "ok"}
    merged = {(r["model"], r["photos"]): r for r in rows}
    for r in recorded:
        if (r["model"], r["photos"]) not in tested:
            merged[(r["model"], r["photos"])] = r
    order = {m: i for i, m in enumerate(dict.fromkeys([*(r["model"] for r in recorded), *(r["model"] for r in rows)]))}
    return sorted(merged.values(), key=lambda r: (order[r["model"]], r["photos"]))


def plot_scaling(rows: list[dict], path: Path, title: str) -> Path:
    """rsum against training photos (log scale), one line per model, the 95 % intervals as error bars."""
    fig = Figure(figsize=(9.0, 4.2), dpi=120)
    ax = fig.add_subplot()
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = sorted((r for r in rows if r["model"] == model and r.get("status") == "ok"), key=lambda r: r["photos"])
        if not ok:
            continue
        x = [r["photos"] for r in ok]
        y = [r["rsum"] for r in ok]
        err = [[r["rsum"] - r["rsum_low"] for r in ok], [r["rsum_high"] - r["rsum"] for r in ok]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=model)
    ax.set_xscale("log", base=2)
    xs = sorted({r["photos"] for r in rows})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("training photos")
    ax.set_ylabel("test rsum (of 600), 95 % interval")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # outside: eight lines would hide the points
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return path


def markdown(rows: list[dict]) -> str:
    def number(value) -> str:
        return "–" if value is None else f"{value:.1f}"

    lines = ["| model | training photos | rsum [95 % CI] | t2i R@1 | i2t R@1 | first stage (its t2i recall@K) | train min "
             "| epochs | commit |", "|" + "---|" * 9]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['photos']} | {r.get('status')}: `{r['command']}` | | | | | | |")
            continue
        commit = (r.get("commit") or "–") + (" (recorded)" if r.get("recorded_in") else "")
        lines.append(f"| {r['model']} | {r['photos']} | {r['rsum']:.1f} [{r['rsum_low']:.1f}, {r['rsum_high']:.1f}] | "
                     f"{number(r.get('t2i_r1'))} | {number(r.get('i2t_r1'))} | {r.get('first_stage') or '–'} | "
                     f"{number(r.get('train_minutes'))} | {r.get('epochs') or '–'} | {commit} |")
    return "\n".join(lines) + "\n"


def record_rows(rows: list[dict]) -> list[dict]:
    """The table's rows as ``scaling.json`` and the record hold them: every key of each row (the keys of
    :data:`COLUMNS` it has, and any other it carries, e.g. a transcribed leaderboard row's ``t2i_r5``), in its order,
    a non-finite number null."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


def rewritten_record(rows: list[dict], recorded: list[Path]) -> tuple[dict, list[dict]] | None:
    """When the table is one ``--recorded`` record's rows alone (this run tested nothing) and that file is a record
    (provenance keys): (its provenance keys with its ``provenance_note`` and ``source``, ``rows`` with each one's
    ``recorded_in`` as the record has it) - a redraw keeps when, where and from which YAML the rows were measured, and
    a record rewritten from itself is itself. Else None."""
    if len(recorded) != 1 or not all(r.get("recorded_in") for r in rows):
        return None
    try:
        written = json.loads(Path(recorded[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(written, dict) or not set(PROVENANCE) <= set(written) or not isinstance(written.get("rows"), list):
        return None
    keys = {k: written[k] for k in (*PROVENANCE, "provenance_note", "source") if k in written}
    own = {(r.get("model"), r.get("photos")): r for r in written["rows"] if isinstance(r, dict)}
    kept = []
    for r in rows:
        was = own.get((r["model"], r["photos"]), r)  # the record's row: with its recorded_in, null or none at all
        kept.append({k: (was.get(k) if k == "recorded_in" else v) for k, v in r.items() if k != "recorded_in" or k in was})
    return keys, kept


def write_scaling(rows: list[dict], out: Path, board: Leaderboard, record: str | Path | None = None,
                  recorded: Sequence[Path] = ()) -> Path:
    """``scaling.md``, ``.csv``, ``.json`` and ``.png`` in ``out``; with ``record``, the record of
    :mod:`grounding.docs_tables` there too (provenance and source: :func:`rewritten_record`'s for a redraw of one
    ``recorded`` record, else this command's with the YAML as its config and source)."""
    out.mkdir(parents=True, exist_ok=True)
    clean = record_rows(rows)
    title = f"Scaling: {board.test_set.name}"
    atomic_write_text(out / "scaling.md", f"# {title}\n\nFrom `{board.source}`.\n\n{markdown(clean)}")
    atomic_write_csv(out / "scaling.csv", clean, COLUMNS)
    atomic_write_json(out / "scaling.json", {"source": board.source, "rows": clean}, indent=2)
    plot_scaling(clean, out / "scaling.png", title)
    if record is not None:
        rewrite = rewritten_record(clean, list(recorded))
        keys, table = rewrite if rewrite is not None else (provenance(config=board.source or None), clean)
        note = {"provenance_note": keys["provenance_note"]} if keys.get("provenance_note") else {}
        write_record(record, list(COLUMNS), table, keys, **note, source=keys.get("source", board.source),
                     labels=RECORD_LABELS)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grounding.leaderboard.scaling", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="experiments/leaderboard/flickr8k_full.yaml", help="a leaderboard YAML")
    p.add_argument("--models", nargs="*", default=[], metavar="NAME",
                   help="leaderboard model names (none: only redraw the --recorded rows)")
    p.add_argument("--photos", nargs="+", type=int, default=[750, 1500, 3000, 6000], help="training-set sizes")
    p.add_argument("--runs", default="outputs/scaling", help="run folders: <runs>/<model>/n<N>")
    p.add_argument("--out", default=None, help="report folder (default: reports/scaling/<test set>)")
    p.add_argument("--fit", action="store_true", help="fit the missing runs first (one after another)")
    p.add_argument("--fit-args", default="", metavar="ARGS", help="more options for those fits, one string")
    p.add_argument("--validations", type=int, default=3, metavar="V",
                   help="a scaled fit evaluates dev at most V times, the last at its last epoch (0: the config's own "
                        "schedule)")
    p.add_argument("--recorded", action="append", default=[], metavar="FILE",
                   help="an earlier run's scaling.json: its rows join the table for every (model, size) this run does "
                        "not test (repeatable)")
    p.add_argument("--first-stage", choices=FIRST_STAGE_SIZES, default="same",
                   help="a cross-encoder at N photos reranks its first stage's run at N photos (same) or at the whole "
                        "split (full)")
    p.add_argument("--record", metavar="NAME",
                   help="also write the table with its provenance to docs/records/NAME.json (or this path ending in .json)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.photos) or args.validations < 0:
        print(f"error: --photos and --validations must be positive; got {args.photos} and {args.validations}",
              file=sys.stderr)
        return 2
    if not args.models and not args.recorded:
        print("error: nothing to draw: name --models to test, or --recorded scaling.json files to redraw", file=sys.stderr)
        return 2
    try:
        fit_args = shlex.split(args.fit_args)
    except ValueError as e:  # an unclosed quote
        print(f"error: --fit-args {args.fit_args!r}: {e}; give the options as one shell-quoted string", file=sys.stderr)
        return 2
    try:
        record = record_path(args.record) if args.record else None
        if record is not None and record.is_dir():
            raise LeaderboardError(f"--record {args.record}: {record} is a folder; name a record or a file ending in .json")
        board = load_leaderboard(args.config)
        out = check_output_folder(args.out or f"reports/scaling/{board.test_set.name}", "--out")
        with_first_stages(board, args.models)  # before the test set is read
        recorded = [row for path in args.recorded for row in read_recorded(resolve_path(path))]  # before any fit
        rows = run_scaling(board, args.models, args.photos, resolve_path(args.runs), args.fit,
                           log=lambda line: print(line, file=sys.stderr, flush=True), fit_args=fit_args,
                           first_stage=args.first_stage, validations=args.validations or None) if args.models else []
    except (LeaderboardError, DocsTableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: a scaling fit failed (exit status {e.returncode}): {' '.join(map(str, e.cmd))}", file=sys.stderr)
        return 1
    commit = source_commit()
    rows = merge_recorded([{**r, "commit": commit} for r in rows], recorded)
    try:
        out = write_scaling(rows, out, board, record, [resolve_path(path) for path in args.recorded])
    except DocsTableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows), end="")
    print(f"wrote {out}/scaling.md, .csv, .json and .png" + (f"; the record {record}" if record else ""), file=sys.stderr)
    return 1 if any(str(r.get("status", "")).startswith("error") for r in rows) else 0


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.leaderboard.scaling"):
        sys.exit(main())
