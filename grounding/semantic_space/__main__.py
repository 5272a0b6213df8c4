"""``python -m grounding.semantic_space``: the VG-BERT semantic-space report for any number of models.

    python -m grounding.semantic_space --models minilm runs/vgbert/best.ckpt --names Bert Grounded \
        --data-root ../shared/data --out reports/semantic_space
    python -m grounding.semantic_space --config experiments/semantic_space/minilm.yaml [--out ...]

``--config`` takes a report config (experiments/semantic_space/*.yaml: the options of
``grounding.semantic_space.report.DEFAULTS``, under ``semantic_space:`` or at the top level);
options given on the command line win, and every nested option has a flag too
(``--embedding.batch_size 128``). Parsed by jsonargparse: an unknown option or key is one error
line and exit status 2. ``--record NAME`` also writes the paired bootstrap intervals (the report's
``intervals.csv``) as ``docs/records/NAME.json`` (a path ending in ``.json``: there), the record the docs
render a table from (:mod:`grounding.docs_tables`).
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, DefaultHelpFormatter, get_loader, set_loader

from grounding.docs_tables import provenance, record_path
from grounding.errors import user_errors_exit
from grounding.semantic_space.report import DEFAULTS, INTERVAL_PARTS, merge_config, run_report
from grounding.stage_config import config_options_first

PROG = "python -m grounding.semantic_space"
CONFIG_SECTION = "semantic_space"
PARSER_MODE = "semantic-space-report"
# Short flags of nested options (kept from the hand-written parser).
ALIASES = {"property_norms_part.n_jobs": "--n-jobs", "property_norms_part.loo": "--loo",
           "property_norms_part.n_components": "--n-components", "embedding.vocabulary_sample": "--vocabulary-sample",
           "intervals_part.n_resamples": "--bootstrap"}
TYPES = {"property_norms_part.n_jobs": int, "property_norms_part.loo": Literal["approx", "exact"],
         "property_norms_part.n_components": Optional[int], "embedding.vocabulary_sample": Optional[int],
         "intervals_part.n_resamples": int, "intervals_part.confidence": float, "intervals_part.seed": int}
HELP = {
    "property_norms_part.n_jobs": "processes for the property-norm fits",
    "property_norms_part.loo": "leave-one-out for the lambda choice: approx or exact",
    "property_norms_part.n_components": "PCA dimensions the property-norm classifiers see (default: all)",
    "embedding.vocabulary_sample": "standardise with the statistics of a seeded sample of this many token ids "
                                   "(default: all, App. B)",
    "intervals_part.n_resamples": "paired bootstrap resamples of the evaluation items for every measure's interval "
                                  "(0: no intervals)",
}


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, the description printed as written."""


def _report_section(text: str):
    """jsonargparse's YAML loader, keeping only the ``semantic_space:`` section when the file has one."""
    value = get_loader("yaml")(text)
    return value[CONFIG_SECTION] if isinstance(value, dict) and CONFIG_SECTION in value else value


def build_parser() -> ArgumentParser:
    set_loader(PARSER_MODE, _report_section, (yaml.YAMLError,))
    p = ArgumentParser(allow_abbrev=False, prog=PROG, description=__doc__, exit_on_error=False, formatter_class=_HelpFormatter,
                       parser_mode=PARSER_MODE)
    p.add_argument("--config", action=ActionConfigFile, help="YAML report config (see experiments/semantic_space/)")
    p.add_argument("--models", type=Union[str, dict], nargs="+", default=DEFAULTS["models"],
                   help="text encoder names ('minilm', 'bert-base-uncased', a directory) or Lightning .ckpt paths "
                        "(config: also {source, name, prefix, text_encoder, tokenizer}); the first is the reference")
    p.add_argument("--names", type=str, nargs="+", default=None, help="display name of each model, in order")
    p.add_argument("--prefix", type=str, nargs="+", default=None,
                   help="state_dict prefix of the BERT in each checkpoint ('auto' = detect)")
    p.add_argument("--text-encoder", type=str, nargs="+", default=None, dest="text_encoder",
                   help="architecture of each checkpoint's BERT (default: the checkpoint hparams' text_encoder)")
    p.add_argument("--data-root", type=Optional[str], default=DEFAULTS["data_root"], dest="data_root",
                   help="folder with semcat/, concreteness/, cslb/, word-similarity/ (default ../shared/data)")
    for key in ("semcat", "concreteness", "cslb"):
        p.add_argument(f"--{key}", type=Optional[str], default=DEFAULTS[key])
    p.add_argument("--word-similarity", type=Optional[str], default=DEFAULTS["word_similarity"], dest="word_similarity",
                   help="folder of w1<TAB>w2<TAB>score word-similarity sets (default: <data-root>/word-similarity)")
    p.add_argument("--vocabulary", type=Optional[str], default=DEFAULTS["vocabulary"],
                   help="word list for composition and neighbours (default: unique SemCat words)")
    p.add_argument("--out", type=str, default=DEFAULTS["out"], help="report folder (default reports/semantic_space)")
    p.add_argument("--parts", type=str, nargs="+", default=DEFAULTS["parts"],
                   help="subset of: concreteness property_norms clustering composition word_similarity")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    p.add_argument("--record", type=Optional[str], default=None,
                   help="also write the intervals table with its provenance to docs/records/RECORD.json (or this path "
                        "ending in .json)")
    for group, options in DEFAULTS.items():
        if not isinstance(options, dict):
            continue
        for name, default in options.items():
            key = f"{group}.{name}"
            flags = [f"--{key}"] + ([ALIASES[key]] if key in ALIASES else [])
            p.add_argument(*flags, type=TYPES.get(key, Any), default=default,
                           help=HELP.get(key, f"{name} of the {group} options"))
    return p


def config_from_args(args: argparse.Namespace) -> dict:
    """The report config (``run_report``'s argument) of parsed arguments: ``--names`` / ``--prefix`` /
    ``--text-encoder`` (one value per model) set those fields of the models, ``--no-cache`` turns the
    embedding cache off."""
    options = args.as_dict() if hasattr(args, "as_dict") else vars(args)
    cfg = copy.deepcopy({key: options[key] for key in DEFAULTS})
    models = [dict(m) if isinstance(m, dict) else {"source": m} for m in cfg["models"] or []]
    for flag, field in (("names", "name"), ("prefix", "prefix"), ("text_encoder", "text_encoder")):
        values = options.get(flag)
        if values:
            if len(values) != len(models):
                raise ValueError(f"--{flag.replace('_', '-')} needs one value per model ({len(models)}), got {values}")
            for model, value in zip(models, values):
                model[field] = value
    cfg["models"] = models
    if options.get("no_cache"):
        cfg["embedding"] = {**cfg["embedding"], "cache": False}
    return cfg


def config_paths(argv: list[str]) -> list[str]:
    """The ``--config`` files of a command line, in order."""
    return [v for k, v in zip(["", *argv], argv) if k == "--config"] + \
        [a.partition("=")[2] for a in argv if a.startswith("--config=")]


def named_seed(argv: list[str], cfg: dict) -> list[int] | None:
    """``[intervals_part.seed]`` when a ``--config`` file or the command line names it, else None (the record's
    ``seeds``: a default is not a seed anyone chose)."""
    named = any(a == "--intervals_part.seed" or a.startswith("--intervals_part.seed=") for a in argv)
    for path in config_paths(argv):
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        section = data.get(CONFIG_SECTION, data) if isinstance(data, dict) else None
        part = section.get("intervals_part") if isinstance(section, dict) else None
        named = named or (isinstance(part, dict) and "seed" in part)
    return [int(cfg["intervals_part"]["seed"])] if named else None


def record_of(args, argv: list[str], cfg: dict) -> tuple[Path | None, dict | None]:
    """``--record``'s path and the record's provenance (this command line, its config files, the named seed), or
    (None, None); a bad name or a report without intervals is a ValueError, before any work."""
    if not args.record:
        return None, None
    record = record_path(args.record)
    if cfg["intervals_part"]["n_resamples"] <= 0 or not set(cfg["parts"]) & set(INTERVAL_PARTS):
        raise ValueError(f"--record {args.record} writes the intervals table: give --bootstrap N > 0 and one of the "
                         f"parts {list(INTERVAL_PARTS)}")
    configs = config_paths(argv)
    keys = provenance(command=shlex.join([*PROG.split(), *argv]), config=configs[0] if len(configs) == 1 else configs or None,
                      seeds=named_seed(argv, cfg))
    return record, keys


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(config_options_first(argv))
        cfg = config_from_args(args)
        # unknown parts, models without a source, no models, a bad --record: before any work
        record, record_keys = record_of(args, argv, merge_config(cfg))
    except (ArgumentError, KeyError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        configs = config_paths(argv)
        where = f"config {', '.join(configs)}; " if configs else ""
        print(f"{PROG}: error: {' '.join(str(message).split())} ({where}see {PROG} --help)", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    run_report(cfg, record, record_keys)
    print(f"[semantic_space] total: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.semantic_space"):
        sys.exit(main())
