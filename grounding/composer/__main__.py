"""CRG and MCD command line.

    python -m grounding.composer crg   --captions FILE --out DIR [--backend spacy] [--workers N] [--degrade P] [--record NAME]
    python -m grounding.composer stats --graph DIR/crg.npz | --captions FILE
    python -m grounding.composer mcd   --train FILE --candidates FILE --out DIR [--k 1000] [--captions-per-image 5]
                                       [--record NAME]
    python -m grounding.composer crg   --captions dataset_coco.json --captions-subset c30k --out DIR   # C30K (§5.1)
    python -m grounding.composer show  --graph DIR/crg.npz --caption 0
    python -m grounding.composer check-parser [--backend NAME]
    python -m grounding.composer evaluate-splits --config MODEL.yaml --ckpt CKPT --splits MCD_DIR [--out DIR]
                                                 [--rerank-top-k K] [--limit N] [--record NAME]   # Fig. 4: runs
                                                 # python -m grounding.leaderboard.evaluate_splits (same options)
    python -m grounding.composer cost --config MODEL.yaml [--regions N] [--caption TEXT] [--table6] [--out FILE]
                                      [--record NAME]  # Table 6 (cost.py)
    python -m grounding.composer fit-check [--score-head image_gated] [--composition-scale G] [--seeds 0 1 2] [--steps 30]
                                           [--precision bf16-mixed] [--record NAME]
                                           # does COMPOSER fit 16 training images? (diagnostics.py)

``--config experiments/composer/<name>.yaml`` fills any option of crg / stats / mcd from a YAML file
(keys are the option names with underscores, at the top level or under the command's name, as in
``crg: {captions: ..., out: ...}``); options given on the command line win. Parsed by jsonargparse:
an unknown option or key is one error line and exit status 2.

``--record NAME`` (crg, mcd, cost, fit-check) also writes what the command prints as a record of
:mod:`grounding.docs_tables`, ``docs/records/NAME.json`` (a path ending in ``.json``: there), with its provenance
(this command line, the ``--config`` file(s), commit, date, machine; ``seeds``: fit-check's ``--seeds``, ``--seed``
where crg / mcd draw with it, for ``--degrade`` or the random splits): crg the Table 1 row of ``stats.json``, mcd a row per
split of ``summary.json`` (the MCD split, all candidates, the random splits' mean, each graded split), cost the
per-part table (with ``--table6``: the Table 6 rows), fit-check a row per seed (train recall, first / last loss; the
init diagnostics on the first seed's row). A bad name or a folder is one error line, exit status 2, before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import yaml
from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, DefaultHelpFormatter, get_loader, set_loader

from grounding.docs_tables import DocsTableError, provenance, record_option, write_record
from grounding.errors import UserInputError, user_errors_exit
from grounding.paths import shared_data_dir
from grounding.stage_config import config_options_first
from grounding.utils.io import atomic_write_json, atomic_write_text

from .captions import C30K_IMAGES, C30K_SEED, C30K_SPLITS, MCD_CAPTIONS_PER_IMAGE, CaptionFileError, c30k, read_captions
from .concept_graph import STATS_COLUMNS, STATS_LABELS, ConceptGraph, format_stats, stats_record_row
from .graph_build import build_concept_graph
from .mcd import SUMMARY_KEYS, SUMMARY_LABELS, make_mcd_splits, summary_record_rows
from .parsing import BACKENDS, DEFAULT_BACKEND, ParserUnavailableError, backend_available

PROG = "python -m grounding.composer"
CONFIG_COMMANDS = ("crg", "stats", "mcd")


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, descriptions printed as written."""


class UsageError(UserInputError):
    """A command line or config the commands cannot run with (exit status 2)."""


def _command_section(command: str, text: str):
    """jsonargparse's YAML loader, keeping only the ``<command>:`` section when the file has one."""
    value = get_loader("yaml")(text)
    return value[command] if isinstance(value, dict) and command in value else value


def _subparser(command: str, config: bool) -> ArgumentParser:
    p = ArgumentParser(allow_abbrev=False, prog=f"{PROG} {command}", exit_on_error=False, formatter_class=_HelpFormatter)
    if config:
        p.add_argument("--config", action=ActionConfigFile,
                       help="YAML file with option values (experiments/composer/*.yaml), options under the command's "
                            "name or at the top level")
    return p


def _caption_args(p: ArgumentParser, prefix: str, what: str):
    p.add_argument(f"--{prefix}", type=Optional[str], default=None,
                   help=f"{what}: Flickr token file, Karpathy JSON or COCO captions JSON")
    p.add_argument(f"--{prefix}-split", type=str, nargs="*", default=None,
                   help="keep only these Karpathy splits (e.g. train restval)")
    p.add_argument(f"--{prefix}-images", type=str, nargs="*", default=None,
                   help="keep only the images listed in these files (one file name a line; union of all files)")
    p.add_argument(f"--{prefix}-subset", type=Optional[Literal["c30k"]], default=None,
                   help=f"named image subset: c30k = {C30K_IMAGES:,} images drawn with --{prefix}-sample-seed "
                        f"(default {C30K_SEED}) from Karpathy COCO {' + '.join(C30K_SPLITS)} (the paper's C30K, §5.1)")
    p.add_argument(f"--{prefix}-sample-images", type=Optional[int], default=None,
                   help="keep a seeded random subset of this many images (after split / image-list selection)")
    p.add_argument(f"--{prefix}-sample-seed", type=int, default=C30K_SEED, help="seed of --*-sample-images and --*-subset")


def _record_arg(p: ArgumentParser, what: str):
    p.add_argument("--record", type=Optional[str], default=None, metavar="NAME",
                   help=f"also write {what} as a record, docs/records/NAME.json (or this path ending in .json; "
                        "grounding/docs_tables.py)")


def _common(p: ArgumentParser):
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
    p.add_argument("--workers", type=int, default=1, help="parser processes")
    p.add_argument("--degrade", type=float, default=0.0, help="Table 7: remove each parse branch with this probability")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="re-parse even if a cached parse exists")


def build_argparser() -> ArgumentParser:
    ap = ArgumentParser(allow_abbrev=False, prog=PROG, description=__doc__, exit_on_error=False, formatter_class=_HelpFormatter)
    sub = ap.add_subcommands(dest="command", required=True)
    crg = _subparser("crg", config=True)
    _caption_args(crg, "captions", "caption file")
    crg.add_argument("--out", type=Optional[str], default=None, help="output folder (crg.npz, stats.json)")
    _common(crg)
    _record_arg(crg, "the Table 1 statistics (stats.json)")
    st = _subparser("stats", config=True)
    st.add_argument("--graph", type=Optional[str], default=None, help="a crg.npz written by `crg`")
    _caption_args(st, "captions", "caption file (parsed and extracted if no --graph)")
    _common(st)
    mcd = _subparser("mcd", config=True)
    _caption_args(mcd, "train", "training captions")
    _caption_args(mcd, "candidates", "candidate evaluation captions")
    mcd.add_argument("--out", type=Optional[str], default=None, help="output folder")
    mcd.add_argument("--k", type=int, default=1000, help="images per split (all their captions)")
    mcd.add_argument("--stride", type=Optional[int], default=None, help="sliding-window stride (default k/20)")
    mcd.add_argument("--levels", type=int, default=16, help="graded splits to write (Fig. 4 uses 16)")
    mcd.add_argument("--random-baselines", type=int, default=20, help="random splits of size k to compare against")
    mcd.add_argument("--captions-per-image", type=Optional[int], default=MCD_CAPTIONS_PER_IMAGE,
                     help="candidate captions kept per image, first in file order (§5.1: 5; COCO images have up to 7); "
                          "null keeps all")
    _common(mcd)
    _record_arg(mcd, "the divergences of the MCD, random and graded splits (summary.json)")
    show = _subparser("show", config=False)
    show.add_argument("--graph", type=str, required=True)
    show.add_argument("--caption", type=int, default=0)
    chk = _subparser("check-parser", config=False)
    chk.add_argument("--backend", default=None, choices=BACKENDS)
    ev = _subparser("evaluate-splits", config=False)
    ev.add_argument("--config", type=str, required=True,
                    help="the COMPOSER model config the checkpoint was trained with (experiments/composer/composer_*.yaml)")
    ev.add_argument("--ckpt", type=str, required=True, help="the trained checkpoint (outputs/<run>/checkpoints/last.ckpt)")
    ev.add_argument("--splits", type=str, required=True, help="the --out folder of `mcd` (mcd.json, graded/, summary.json)")
    ev.add_argument("--out", type=Optional[str], default=None, help="output folder (default <splits>/eval)")
    ev.add_argument("--rerank-top-k", type=Optional[int], default=None,
                    help="compose each caption with its top-K first-stage images only (default: the config's)")
    ev.add_argument("--limit", type=Optional[int], default=None, help="test the first N images of each split only")
    _record_arg(ev, "the table of each split's metrics (splits.csv)")
    cost = _subparser("cost", config=False)
    cost.add_argument("--config", type=str, required=True,
                      help="a COMPOSER model config (experiments/composer/composer_*.yaml; its base: chain is followed)")
    cost.add_argument("--regions", type=Optional[int], default=None,
                      help="regions of the image (detector files / boxes: default 100, App. C; a grid has its cells)")
    cost.add_argument("--caption", type=str, default=None, help="the caption whose CRG is composed (default: App. A's example)")
    cost.add_argument("--backend", default=None, choices=BACKENDS, help="parser of the caption (default: the config's)")
    cost.add_argument("--table6", action="store_true", help="also every (PT, CT) row of Table 6, next to the paper's")
    cost.add_argument("--out", type=Optional[str], default=None, help="also write the counts as JSON to this file")
    _record_arg(cost, "the printed table (the parts; with --table6 the Table 6 rows)")
    fit = _subparser("fit-check", config=False)
    fit.add_argument("--seeds", type=int, nargs="+", default=[0], help="one fit per seed (init diagnostics: the first)")
    fit.add_argument("--steps", type=int, default=30, help="training batches of 16")
    fit.add_argument("--score-head", default="linear", choices=["linear", "image_gated"], help="Composer's score_head")
    fit.add_argument("--composition-scale", type=Optional[float], default=None, help="Composer's composition_scale")
    fit.add_argument("--text-encoder", default="minilm", help="the Predicate Transformer's encoder")
    fit.add_argument("--out", type=str, default=".cache/composer/fit_check_world", help="where the generated world goes")
    fit.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"],
                     help="the fits' precision (bf16-mixed: the forward under bfloat16 autocast, as Lightning's)")
    _record_arg(fit, "a row per seed (train recall, first / last loss; init diagnostics on the first)")
    for name, p, help_ in [
        ("crg", crg, "parse captions, build the Concept & Relation Graph, print Table 1 stats"),
        ("stats", st, "Table 1 columns of a saved graph or of a caption file"),
        ("mcd", mcd, "maximum compound divergence split + graded splits (Fig. 4)"),
        ("show", show, "print one caption's bottom-up concept tree"),
        ("check-parser", chk, "say whether a parser backend is usable here (and how to install it)"),
        ("evaluate-splits", ev, "test a trained checkpoint on the MCD split and every graded split; table + Fig. 4 "
                                "(runs python -m grounding.leaderboard.evaluate_splits)"),
        ("cost", cost, "Table 6: parameters per part and FLOPs per (image, caption) pair of a model config"),
        ("fit-check", fit, "init diagnostics and train text→image R@1 after a short fit on 16 generated images, per seed"),
    ]:
        sub.add_subcommand(name, p, help=help_)
        if name in CONFIG_COMMANDS:  # after add_subcommand, which gives a subcommand its parent's mode
            mode = f"composer-{name}"
            set_loader(mode, functools.partial(_command_section, name), (yaml.YAMLError,))
            p.parser_mode = mode
    return ap


def _config_first(argv: list[str]) -> list[str]:
    """``<command> ... --config FILE ...`` -> ``<command> --config FILE ...`` (options on the command line win)."""
    if not argv or argv[0] not in CONFIG_COMMANDS:
        return list(argv)
    return [argv[0], *config_options_first(list(argv[1:]))]


def _apply_config(args: argparse.Namespace, parser: ArgumentParser | None = None) -> argparse.Namespace:
    """The parsed command's options as one flat namespace (``args.command``, ``args.out``, ...). The
    ``--config`` file was applied by jsonargparse while parsing; ``parser`` is not needed any more."""
    options = args[args.command].as_dict() if args.get(args.command) is not None else {}
    config_files = []
    if args.command in CONFIG_COMMANDS:  # evaluate-splits' --config is its model config, an option of its own
        config_files = [str(p) for p in options.pop("config", None) or []]
    return argparse.Namespace(command=args.command, config_files=config_files, **options)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line (``--config`` files applied, command-line options winning) to a flat namespace."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return _apply_config(build_argparser().parse_args(_config_first(argv)))


def _expand(path: str | None) -> str | None:
    """``{shared_data}`` in a path is the real-data folder (``grounding.paths.shared_data_dir``)."""

    return path.replace("{shared_data}", str(shared_data_dir())) if isinstance(path, str) else path


def _need(args, *names):
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) in (None, "")]
    if missing:
        raise UsageError(f"`{args.command}` needs {', '.join(missing)}")


# whole-number options -> (lowest value, what they count); checked right after parsing, before anything is read
LOWEST = {"workers": (1, "parser processes"), "k": (1, "images per split"),
          "stride": (1, "the sliding-window stride (leave it out for k/20)"), "levels": (0, "graded splits to write"),
          "random_baselines": (0, "random splits to compare against"),
          "captions_per_image": (1, "candidate captions kept per image (null keeps all)"),
          **{f"{prefix}_sample_images": (1, "images to sample") for prefix in ("captions", "train", "candidates")},
          "seed": (0, "a random seed"),
          **{f"{prefix}_sample_seed": (0, "a random seed") for prefix in ("captions", "train", "candidates")},
          "regions": (1, "regions of the image"), "rerank_top_k": (1, "first-stage images each caption is composed with"),
          "limit": (1, "images of each split to test"), "steps": (1, "training batches")}


def check_numbers(args) -> None:
    """Refuse a count below its lowest value (``--k 0``, ``--workers -1``) and ``--degrade`` outside [0, 1]: one
    line naming the option, before any caption is parsed."""
    for name, (lowest, what) in LOWEST.items():
        value = getattr(args, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < lowest:
            option = f"--{name.replace('_', '-')}"
            raise UsageError(f"{option} {value}: expected {what}, a whole number >= {lowest}; give {option} {lowest} "
                             "or more")
    degrade = getattr(args, "degrade", None)
    if isinstance(degrade, float) and not 0.0 <= degrade <= 1.0:
        raise UsageError(f"--degrade {degrade}: expected the probability of removing each parse branch, in [0, 1] "
                         "(Table 7: 0.1 ... 0.5); give e.g. --degrade 0.1")


def output_folder(option: str, value: str, create: bool = True) -> Path:
    """The folder ``option`` names, created when missing (``create``); a file in the way (the folder or one of its
    parents) or a folder that cannot be made is one line, before any caption is parsed or model built."""
    path = Path(value).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{option} {path}: {folder} is a file, not a folder; choose another {option} or move "
                             "the file")
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path} cannot be created ({e.strerror or e}); choose a writable {option}") from None
    return path


def output_file(option: str, value: str, example: str) -> Path:
    """The file ``option`` names: not a folder (a file written over it would replace the folder), its parents folders."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name (e.g. {path / example}); nothing was written")
    output_folder(option, str(path.parent), create=False)
    return path


def record_target(args) -> Path | None:
    """``--record NAME``'s file (``docs/records/NAME.json``, or the path ending in ``.json`` as given), or None without
    ``--record``: a bad name, a folder or a file in the way of its folder is one line, before anything is parsed."""
    try:
        return record_option(getattr(args, "record", None))
    except DocsTableError as e:
        raise UsageError(str(e)) from None


def _config_value(files: list[str]) -> str | list[str] | None:
    """A record's ``config``: the one ``--config`` file, the list of several, or None."""
    return None if not files else files[0] if len(files) == 1 else list(files)


def _write_record(args, path: Path, columns, labels: dict, rows: list[dict], title: str, config=None, seeds=None,
                  **extra) -> None:
    """Write a command's record (:func:`grounding.docs_tables.write_record`): this command line, ``config``, commit,
    date, machine, ``seeds``, then ``title``, ``labels``, ``extra``, ``columns`` and ``rows``."""
    keys = provenance(command=getattr(args, "command_line", None), config=config, seeds=seeds)
    write_record(path, list(columns), rows, keys, title=title, labels=dict(labels), **extra)
    print(f"wrote the record {path}")


def _select(args, prefix: str):
    """The captions a command reads: file, Karpathy splits, image lists, then a seeded image subset."""
    path = _expand(getattr(args, prefix))
    splits, subset = getattr(args, f"{prefix}_split"), getattr(args, f"{prefix}_subset")
    n_sample, seed = getattr(args, f"{prefix}_sample_images"), getattr(args, f"{prefix}_sample_seed")
    if subset == "c30k" and (n_sample is not None or splits and set(splits) != set(C30K_SPLITS)):
        raise UsageError(f"--{prefix}-subset c30k picks its own images ({C30K_IMAGES:,} of Karpathy COCO "
                         f"{' + '.join(C30K_SPLITS)}); drop --{prefix}-sample-images / --{prefix}-split")
    cs = read_captions(path, splits, [_expand(f) for f in getattr(args, f"{prefix}_images") or []] or None)
    if subset == "c30k":
        cs = c30k(cs, seed)
    elif n_sample is not None:
        cs = cs.sample_images(n_sample, seed)
    return path, cs


def _write_image_list(args, prefix: str, cs, out: Path):
    """A sampled subset is also written as an image list (``--<prefix>-images`` reads it back)."""
    if getattr(args, f"{prefix}_subset") or getattr(args, f"{prefix}_sample_images") is not None:
        atomic_write_text(out / f"{prefix}_images.txt", "".join(f"{n}\n" for n in cs.image_names))


def _build(args, prefix: str, captions_per_image: int | None = None):
    path, cs = _select(args, prefix)
    full = read_captions(path)
    if captions_per_image is not None:
        cs = cs.first_captions(captions_per_image)
    # the whole file is parsed (and cached) once; splits and image lists select from it
    graph, report = build_concept_graph(cs, backend=args.backend, workers=args.workers, degrade_prob=args.degrade,
                                        seed=args.seed, cache=not args.no_cache, file_captions=full.captions)
    print(f"[{prefix}] {len(cs):,} captions / {cs.n_images:,} images from {cs.source}: parse {report.parse_seconds:.1f}s "
          f"({'cached' if report.parse_from_cache else args.backend + f', {args.workers} worker(s)'}), "
          f"extract {report.extract_seconds:.1f}s, graph {report.graph_seconds:.1f}s; "
          f"unparsed {report.parse_failed}, undecomposable {report.extraction_failed}", flush=True)
    return cs, graph, report


def _crg(args, record: Path | None = None) -> int:
    """``crg``: the Concept & Relation Graph of a caption file (crg.npz) and its Table 1 statistics (stats.json);
    ``record``: also the statistics as a record."""
    _need(args, "captions", "out")
    t0 = time.perf_counter()
    out = output_folder("--out", _expand(args.out))
    cs, g, report = _build(args, "captions")
    g.save(out / "crg.npz")
    _write_image_list(args, "captions", cs, out)
    stats = g.stats()
    atomic_write_json(out / "stats.json", {"source": cs.source, "backend": args.backend, "degrade": args.degrade,
                                           "seed": args.seed, **stats, "parse_seconds": report.parse_seconds,
                                           "extract_seconds": report.extract_seconds, "graph_seconds": report.graph_seconds,
                                           "parse_cache": report.parse_cache,
                                           "unparsed_examples": report.failed_examples}, indent=2)
    name = Path(_expand(args.captions)).stem
    print(format_stats(stats, name))
    print(f"wrote {out / 'crg.npz'} and {out / 'stats.json'} in {time.perf_counter() - t0:.1f}s")
    if record is not None:
        row = stats_record_row(stats, name, backend=args.backend, degrade=args.degrade, seed=args.seed)
        _write_record(args, record, STATS_COLUMNS, STATS_LABELS, [row], f"Table 1: Concept & Relation Graph statistics of {name}",
                      config=_config_value(args.config_files), seeds=[args.seed] if args.degrade else None, source=cs.source)
    return 0


def _mcd(args, record: Path | None = None) -> int:
    """``mcd``: the maximum-compound-divergence split and the graded splits (mcd.json, graded/, summary.json);
    ``record``: also a row per split as a record."""
    _need(args, "train", "candidates", "out")
    out = output_folder("--out", _expand(args.out))
    train_cs, train_g, _ = _build(args, "train")
    # App. B counts an image's compounds over the captions the split keeps (5 per image)
    cand_cs, cand_g, _ = _build(args, "candidates", args.captions_per_image)
    train_g.save(out / "train_crg.npz")
    cand_g.save(out / "candidates_crg.npz")
    _write_image_list(args, "train", train_cs, out)
    _write_image_list(args, "candidates", cand_cs, out)
    s = make_mcd_splits(train_g, cand_g, cand_cs, out, k=args.k, stride=args.stride, levels=args.levels,
                        random_baselines=args.random_baselines, seed=args.seed, captions_per_image=args.captions_per_image)
    rnd = s["random_splits"]
    print(f"candidates kept {s['candidates_kept']:,} of {s['candidates']:,} (dropped {s['candidates_dropped']:,} "
          f"with primitives unseen in training or no predicates)")
    print(f"MCD split ({s['k']} images): compound divergence {s['mcd']['compound_divergence']:.4f}, "
          f"atom divergence {s['mcd']['atom_divergence']:.4f}; all candidates {s['cd_all_candidates']:.4f}")
    if rnd["n"]:
        cd = np.asarray(rnd["compound_divergence"])
        print(f"{rnd['n']} random splits: compound divergence {cd.mean():.4f} ± {cd.std():.4f} (max {cd.max():.4f}); "
              f"MCD beats all: {s['mcd_beats_all_random']}")
    print(f"{s['windows']['n']} sliding windows span CD {s['windows']['compound_divergence_min']:.4f}–"
          f"{s['windows']['compound_divergence_max']:.4f}; wrote {len(s['graded'])} graded splits under {out / 'graded'}")
    if record is not None:
        title = (f"The MCD split ({s['k']} of {s['candidates_kept']:,} candidate images), {rnd['n']} random and "
                 f"{len(s['graded'])} graded splits: compound and atom divergence from the training captions")
        seeds = [args.seed] if args.random_baselines or args.degrade else None
        _write_record(args, record, list(SUMMARY_LABELS), SUMMARY_LABELS, summary_record_rows(s), title,
                      config=_config_value(args.config_files), seeds=seeds, train_source=train_cs.source,
                      candidates_source=cand_cs.source, **{k: s[k] for k in SUMMARY_KEYS})
    return 0


def _cost(args, record: Path | None = None) -> int:
    """``cost``: Table 6's parameters and FLOPs of the network a model config builds (grounding/composer/cost.py);
    ``record``: also the printed table (the parts; with ``--table6`` the Table 6 rows) as a record."""
    # here, not at the top: torch, transformers and the network load only for this command (crg / mcd stay light)
    from grounding.encoders import MissingWeightsError

    # (the same: torch and transformers)
    from .cost import (
        APP_A_CAPTION,
        PARTS_LABELS,
        TABLE6_LABELS,
        config_cost,
        cost_record_rows,
        format_cost,
        format_table6,
        table6_costs,
        table6_record_rows,
    )

    config, caption = _expand(args.config), args.caption or APP_A_CAPTION
    if args.out:
        output_file("--out", _expand(args.out), "cost.json")
    try:
        report = config_cost(config, caption, args.regions, args.backend)
        print(format_cost(report, config))
        rows = table6_costs(config, caption, args.regions, args.backend) if args.table6 else {}
    except (MissingWeightsError, ArgumentError) as e:
        raise UsageError(f"{config}: {' '.join(str(e).split()) if isinstance(e, ArgumentError) else e}") from e
    if rows:
        print(format_table6(rows))
    if args.out:
        atomic_write_json(args.out, {"config": config, **report.as_dict(),
                                     "table6": [{"pt_layers": pt, "ct_layers": ct, **r.as_dict()} for (pt, ct), r in rows.items()]},
                          indent=2)
        print(f"wrote {args.out}")
    if record is not None:
        labels, table, title = ((TABLE6_LABELS, table6_record_rows(rows), "Table 6: parameters and FLOPs per (image, caption) "
                                 f"pair at each (PT, CT) layers of {config}, {report.n_regions} regions") if rows else
                                (PARTS_LABELS, cost_record_rows(report), f"COMPOSER cost of {config}: one (image, caption) "
                                 f"pair, forward, {report.n_regions} regions"))
        _write_record(args, record, list(labels), labels, table, title, config=config, cost=report.as_dict())
    return 0


def _fit_check(args, record: Path | None = None) -> int:
    """``fit-check``: :func:`~grounding.composer.diagnostics.init_diagnostics` (first seed) and ``fit_small``'s train
    text→image R@1 for every seed, composer_world.yaml's network and training options (new layers at 5 × lr 1e-4,
    ℓ_MVSA / ℓ_order averaged per caption) with the given switches (docs/composer.md, "Does it learn?")."""
    import torch  # here, not at the top: torch and the network load only for this command

    # (the same: these load torch, transformers and Lightning)
    from .diagnostics import FIT_CHECK_LABELS, WORLD_FIT_COMPOSITION, WORLD_FIT_NET, fit_check_rows, fit_small, fit_world, init_diagnostics

    # (the same)
    from .model import Composer

    # (the same)
    from .training import ComposerTraining

    composition = dataclasses.replace(WORLD_FIT_COMPOSITION, score_head=args.score_head,
                                      composition_scale=args.composition_scale)
    net_args = {**WORLD_FIT_NET, "composition": composition, "text_encoder": args.text_encoder}
    dm = fit_world(_expand(args.out), n_images=16, text_encoder=args.text_encoder, image_size=net_args["image_size"])
    fits, init = [], {}
    for i, seed in enumerate(args.seeds):
        torch.manual_seed(seed)
        net = Composer(**net_args)
        if i == 0:
            init = init_diagnostics(net, dm)
            print(f"init (seed {seed}): " + ", ".join(f"{k} {v:.3f}" for k, v in init.items()), flush=True)
        module = ComposerTraining(net, concept_reduction="mean", new_layer_lr_scale=5.0, feature_cache=False)
        fits.append(fit_small(module, dm, steps=args.steps, lr=1e-4, seed=seed, precision=args.precision))
    recall = [f["t2i_r1"] for f in fits]
    sd = float(np.std(recall, ddof=1)) if len(recall) > 1 else 0.0
    losses = " / ".join(f"{f['loss'][0]:.3f} → {f['loss'][-1]:.3f}" if f["loss"] else "–" for f in fits)
    print(f"train text→image R@1 after {args.steps} steps: {' / '.join(f'{r:.1f}' for r in recall)} "
          f"(seeds {' '.join(map(str, args.seeds))}): {np.mean(recall):.1f} ± {sd:.1f}; loss (first → last step) {losses}")
    if record is not None:
        scale = "off" if args.composition_scale is None else args.composition_scale
        title = (f"fit-check: train text→image R@1 after {args.steps} steps on 16 generated images (score head "
                 f"{args.score_head}, composition scale {scale}, {args.text_encoder}, {args.precision})")
        _write_record(args, record, list(FIT_CHECK_LABELS), FIT_CHECK_LABELS, fit_check_rows(args.seeds, fits, init, args.steps),
                      title, seeds=args.seeds)
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "evaluate-splits":
        # runs the CLI's test loop, so it lives on the top floor (grounding/leaderboard/evaluate_splits.py): started as a
        # process, never imported from this paper package
        return subprocess.run([sys.executable, "-m", "grounding.leaderboard.evaluate_splits", *argv[1:]]).returncode
    try:
        args = parse_args(argv)
        args.command_line = shlex.join(["python", "-m", "grounding.composer", *argv])
    except ArgumentError as e:  # unknown option or config key, bad value, unreadable config: one line
        configs = [v for k, v in zip(["", *argv], argv) if k == "--config"] + \
            [a.partition("=")[2] for a in argv if a.startswith("--config=")]
        where = f"config {', '.join(configs)}; " if configs else ""
        print(f"{PROG}: error: {' '.join(str(e).split())} ({where}see {PROG} <command> --help)", file=sys.stderr)
        return 2
    try:
        check_numbers(args)
        record = record_target(args)
        if args.command == "check-parser":
            ok_any = False
            for b in [args.backend] if args.backend else BACKENDS:
                ok, why = backend_available(b)
                ok_any |= ok
                print(f"{b:<13} {'available' if ok else 'NOT available: ' + why}")
            return 0 if ok_any else 1
        if args.command == "show":
            g = ConceptGraph.load(args.graph)
            if not 0 <= args.caption < g.n_captions:
                raise UsageError(f"--caption {args.caption}: {args.graph} holds {g.n_captions} captions; give an index "
                                 + (f"from 0 to {g.n_captions - 1} (a caption's row in the file `crg` read)"
                                    if g.n_captions else "of a graph built from a non-empty caption file"))
            print(json.dumps(g.caption_tree(args.caption), indent=2, ensure_ascii=False))
            return 0
        if args.command == "stats":
            if args.graph:
                g = ConceptGraph.load(args.graph)
                name = Path(args.graph).parent.name
            else:
                _need(args, "captions")
                _, g, _ = _build(args, "captions")
                name = Path(_expand(args.captions)).stem
            print(format_stats(g.stats(), name))
            return 0
        if args.command == "cost":
            return _cost(args, record)
        if args.command == "fit-check":
            return _fit_check(args, record)
        if args.command == "crg":
            return _crg(args, record)
        if args.command == "mcd":
            return _mcd(args, record)
    except (UsageError, CaptionFileError, ParserUnavailableError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.composer"):
        sys.exit(main())
