"""Grid sweeps: one program per run (fit -> test -> semantic-space or STE report), an offline runner, a summary.

Three commands::

    python -m grounding.sweep experiments/sweeps/stage1_layers.yaml            # the offline runner: every grid point
    python -m grounding.sweep experiments/sweeps/stage1_layers.yaml --dry-run  # print the commands only
    python -m grounding.sweep experiments/sweeps/stage1_layers_world.yaml --set trainer.max_epochs=1   # a rehearsal
    python -m grounding.sweep run --sweep NAME --config STAGE.yaml [--report REPORT.yaml] --key=value ...
    python -m grounding.sweep summarize outputs/sweeps/NAME [--record NAME]   # every run's sweep_result.json -> one table

**One run** (``run``; what a sweep YAML's ``command`` names, so ``wandb agent``, which only substitutes
``${args}``, and the offline runner run the same program):

1. the run's folder is ``<root>/<sweep>/<run name>`` (root ``outputs/sweeps``): the run name is derived from the
   run's parameters alone (the ``--key=value`` options after the program's own, i.e. ``${args}``; sorted by key,
   short names, values normalised, so ``True`` from wandb and ``true`` from the runner agree). The same parameters
   give the same folder whoever launches the run; different parameters never share one. ``--append-run-id`` adds
   ``WANDB_RUN_ID`` (one folder per wandb run instead);
2. ``python -m grounding fit --config STAGE.yaml <parameters> <--set overrides> --trainer.default_root_dir <folder>``;
   a failed fit ends the run with its non-zero exit status: nothing after it runs;
3. ``python -m grounding test`` of the run's best checkpoint (``--ckpt_path best``: the newest ``best-*.ckpt`` of
   the stage's monitored metric) -> ``<folder>/metrics.test.json`` (``--no-test`` skips it);
4. the semantic-space report (``python -m grounding.semantic_space``) of the report config with ``${checkpoint}``
   (the run's best checkpoint) and ``${text_encoder}`` (the stage's plain text encoder, read from the run's
   ``config.yaml``: every report holds the ungrounded reference's row) filled in, into ``<folder>/semantic_space/``;
   or, with ``--report-kind ste`` (SemCLIP's STE), the STE report (``python -m grounding.semclip report``: Table 1
   synonym coverage on all queries unless ``--report-sample N``, Table 2 word similarity) of the embedding the fit
   exported into ``<folder>/embedding`` (``model.init_args.export_dir`` set per run), into ``<folder>/ste_report/``;
   an STE run has no test step;
5. ``<folder>/sweep_result.json`` (atomic): parameters, checkpoint, training time, learnable parameter count,
   test metrics and the report's headline numbers per model; the same numbers go to the wandb run (the fit's own
   run: ``WANDB_RUN_ID`` as wandb agent sets it, else one made here) unless ``WANDB_MODE=disabled``.

``--skip-if trainable_layers=0,freeze_query_key=false`` ends a grid point at once (exit 0) when its parameters
match: a run that would train the same model as another one of the grid.

**The offline runner** expands ``method: grid`` (``parameters`` with ``values`` or ``value``) and runs the
``command`` list with the ``${env}``, ``${interpreter}``, ``${program}``, ``${args}`` and ``${args_no_hyphens}``
macros, WANDB_MODE=offline unless set. ``--config`` / ``--report`` replace the files named in the command,
``--set KEY=VALUE`` adds an override to every run (not part of the run's name), ``--only KEY=VALUE`` keeps the
matching grid points, ``--root`` moves the output root. A command that is a plain ``python -m grounding fit``
gets ``--trainer.default_root_dir=<root>/<sweep file stem>/<run name>``. Before anything runs (``--dry-run`` too), the
sweep file's keys and every parameter's ``values`` (a non-empty list) are checked, and each value is parsed with the
stage config as ``python -m grounding fit`` parses it (:func:`check_parameter_values`): a value of the wrong type or
a parameter that is no option of the config is one line naming the sweep file and the parameter, exit 2.

**The summary** (``summarize``) reads every ``<folder>/*/sweep_result.json`` and writes ``summary.md``,
``summary.csv`` (one row per run) and one CSV per table it recognises, laid out as the paper's: Fig. 3 (rows k,
columns Q/K frozen / trainable per dropout, cells i2t / t2i R@1 and learnable parameters), Fig. 12 (the same grid,
cells the mean category silhouette; k = 0 is the plain encoder), Table 2 (loss terms) and Table 5 (stage-2 losses);
STE runs give SemCLIP's Table 2 (``ste_table2``): a row per run (Spearman per benchmark, their mean, Table 1's
coverage), best first, beside the paper's STE columns. Each paper's tables live in its package
(:mod:`grounding.vgbert.sweep_tables`, :mod:`grounding.semclip.sweep_tables`; the table type in
:mod:`grounding.summary_tables`); this entry point gathers them. ``summarize ... --record NAME`` also writes the
every-run table as a record of :mod:`grounding.docs_tables` (``docs/records/NAME.json``, or a path ending in ``.json``):
a row per run (summary.csv's keys, parameters as their values, every headline number unrounded, and the run's seed),
its columns summary.md's; its config the runs' stage and report configs, its seeds the runs' ``seed_everything``
(null unless every run's is known).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import hashlib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from grounding.docs_tables import provenance, record_option, write_record
from grounding.errors import UserInputError, user_errors_exit
from grounding.run_folder import best_checkpoint
from grounding.semclip.sweep_tables import ste_table
from grounding.summary_tables import Table, finite_float, param
from grounding.utils.io import atomic_write_csv, atomic_write_json, atomic_write_text
from grounding.vgbert.sweep_tables import layer_tables, loss_table, relation_table

PROG = "python -m grounding.sweep"
DEFAULT_ROOT = "outputs/sweeps"
RESULT_FILE = "sweep_result.json"
REPORT_CONFIG = "semantic_space.yaml"
REPORT_FOLDER = "semantic_space"
REPORT_KINDS = ("semantic_space", "ste")
STE_EMBEDDING = "embedding"      # the STE run's export (model.init_args.export_dir), under its folder
STE_REPORT_FOLDER = "ste_report"
CHECKPOINT = "${checkpoint}"
TEXT_ENCODER = "${text_encoder}"
RUN_COMMAND = ("-m", "grounding.sweep", "run")
NAME_CHARS = re.compile(r"[^A-Za-z0-9._=+,-]")
MAX_NAME = 150


class SweepError(UserInputError, ValueError):
    """A sweep file, run option or sweep folder that cannot be used (one line, exit 2)."""


# --------------------------------------------------------------------------------------------
# Values, grids, commands
# --------------------------------------------------------------------------------------------
def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def parse_value(text: str):
    """A command-line value as YAML reads it (``True`` / ``true`` -> True, ``0.3`` -> 0.3; wandb writes Python's
    ``None`` for null); text YAML cannot read stays text."""
    if text == "None":
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# a wandb sweep YAML's keys (https://docs.wandb.ai/guides/sweeps/sweep-config-keys)
SWEEP_KEYS = ("program", "method", "metric", "parameters", "command", "name", "description", "project", "entity",
              "early_terminate", "run_cap", "job", "image_uri")


def load_sweep(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist; give a wandb sweep YAML (experiments/sweeps/*.yaml)")
    try:
        sweep = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(sweep, dict):
        raise SweepError(f"{path}: expected a mapping with program / method / parameters / command")
    stray = [k for k in sweep if k not in SWEEP_KEYS]
    if stray:  # `paramters:` would otherwise be a sweep of one run with no parameters
        close = difflib.get_close_matches(str(stray[0]), SWEEP_KEYS, n=1)
        raise SweepError(f"{path}: unknown key `{stray[0]}`" + (f" (did you mean `{close[0]}`?)" if close else "")
                         + f"; a sweep's keys are {', '.join(SWEEP_KEYS)}")
    return sweep


def expand_grid(sweep: dict, path: str = "<sweep>") -> list[dict]:
    method = sweep.get("method", "grid")
    if method != "grid":
        raise SweepError(f"{path}: the offline runner expands method: grid only (got {method!r}); "
                         "use `wandb sweep` + `wandb agent` for random/bayes search.")
    params = sweep.get("parameters") or {}
    if not isinstance(params, dict):
        raise SweepError(f"{path}: `parameters` must be a mapping of option -> {{values: [...]}}")
    names, choices = [], []
    for name, spec in params.items():
        if not isinstance(spec, dict) or not ("values" in spec or "value" in spec):
            raise SweepError(f"{path}: parameter {name!r} needs `values: [...]` or `value: x`; got {spec!r}")
        if "values" in spec and not (isinstance(spec["values"], list) and spec["values"]):
            raise SweepError(f"{path}: parameter {name!r}: `values` must be a non-empty list (`values: [a, b]`, or "
                             f"`value: x` for one); got {spec['values']!r}")
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def stage_fit_arguments(cmd: list[str]) -> list[str] | None:
    """The ``python -m grounding fit ...`` arguments a sweep command trains with (:func:`fit_arguments`), or None when
    it runs another program."""
    if is_run_command(cmd):
        return fit_arguments(cmd)
    at = next((i for i in range(len(cmd) - 1) if cmd[i] == "-m" and cmd[i + 1] == "grounding"), None)
    return cmd[at + 2:] if at is not None and cmd[at + 2:at + 3] == ["fit"] else None


def _parse_problem(fit_args: list[str]) -> str | None:
    """What ``python -m grounding`` says when it cannot parse ``fit_args`` (nothing is built), or None."""
    # here, not at the top: the stages' parser loads torch and Lightning (a sweep's other commands stay light)
    from grounding import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), cli.quiet_cli():
        try:
            cli.main([*fit_args, "--print_config"])
        except SystemExit as e:
            if e.code:
                text = " ".join(err.getvalue().split())
                return text.split(": error: ", 1)[-1] or f"exit status {e.code}"
    return None


TYPE_WORDS = {"float": "a number", "int": "a whole number", "str": "a string", "bool": "true or false", "NoneType": "null"}


def _unknown_option(problem: str, key: str) -> bool:
    """Whether the parser's message says ``key`` is no option of the config."""
    return f"Option '{key.split('.')[-1]}' is not accepted" in problem or f"nrecognized arguments: --{key}" in problem


def _expected(problem: str, key: str) -> str:
    """What the parser expected of ``key``, read from its message (``Parser key "lr": ... Expected a <class 'float'>``)."""
    at = max(problem.rfind(f'Parser key "{key.split(".")[-1]}"'), problem.rfind(f'Parser key "{key}"'))
    tail = re.split(r"Got value|Given value", problem[at:] if at >= 0 else problem)[0]
    classes = list(dict.fromkeys(re.findall(r"Expected an? <class '([\w.]+)'>", tail)))
    if classes:
        return " or ".join(TYPE_WORDS.get(c, f"a {c}") for c in classes)
    literal = re.search(r"Literal\[([^\]]*)\]", tail)
    if literal:
        return f"one of {literal.group(1)}"
    found = re.search(r"Expected an? ([^;]+)", tail)
    return found.group(1).strip().rstrip(".")[:160] if found else " ".join(tail.split())[:200]


def check_parameter_values(sweep: dict, grid: list[dict], path: str, config: str | None = None, extra: list[str] = (),
                           report: str | None = None) -> None:
    """Every value of every parameter as ``python -m grounding`` parses it (nothing built or read): a value of the
    wrong type for the option it sets (a string for the learning rate) or a parameter that is no option of the config
    is one :class:`SweepError` naming the sweep file, the parameter and what its option expects, before anything runs.
    The config with the ``--set`` overrides is parsed first, then once per (parameter, value) of ``grid``; a value
    refused alone is accepted when a grid point holding it parses (an option that another parameter brings in).
    Commands of another program are not checked."""
    def fit_args(params: dict) -> list[str] | None:
        return stage_fit_arguments(build_command(sweep, params, config, list(extra), report))

    base = fit_args({})
    if base is None or not grid:
        return
    config_file = base[base.index("--config") + 1] if "--config" in base else "its config"
    problem = _parse_problem(base)
    if problem:
        raise SweepError(f"{path}: the stage config {config_file} (with the --set overrides) does not parse: {problem[:300]}")
    checked = set()
    for params in grid:
        for name, value in params.items():
            if (name, _fmt(value)) in checked:
                continue
            checked.add((name, _fmt(value)))
            problem = _parse_problem(fit_args({name: value}))
            if problem is None or _parse_problem(fit_args(params)) is None:
                continue
            if _unknown_option(problem, name):
                raise SweepError(f"{path}: parameter {name} is not an option of {config_file}; check its spelling and "
                                 "section (`python -m grounding fit --config CONFIG --print_config` lists them)")
            raise SweepError(f"{path}: parameter {name}: value {value!r} is not accepted by {config_file}: expected "
                             f"{_expected(problem, name)}; fix its values")


def is_run_command(cmd: list[str]) -> bool:
    """Whether a command runs this module's ``run`` program (``python -m grounding.sweep run ...``)."""
    return any(tuple(cmd[i:i + 3]) == RUN_COMMAND for i in range(len(cmd)))


def _replace_option(cmd: list[str], option: str, value: str) -> None:
    for i, token in enumerate(cmd):
        if token == option and i + 1 < len(cmd):
            cmd[i + 1] = value
            return
        if token.startswith(option + "="):
            cmd[i] = f"{option}={value}"
            return
    raise SweepError(f"{option} given but the sweep's command has no {option} to replace")


def build_command(sweep: dict, params: dict, config: str | None = None, extra: list[str] = (),
                  report: str | None = None, root: str | None = None) -> list[str]:
    """The command of one grid point, as ``wandb agent`` builds it (with ``sys.executable`` as the interpreter),
    ``config`` / ``report`` replacing the files the command names, and ``extra`` overrides (``KEY=VALUE``) added:
    as ``--set KEY=VALUE`` to a ``run`` command (not part of the run's name), appended as ``--KEY=VALUE`` to a plain
    ``fit``. ``root`` goes to a ``run`` command as ``--root``."""
    args = [f"--{k}={_fmt(v)}" for k, v in params.items()]
    template = sweep.get("command") or ["${env}", "${interpreter}", "${program}", "${args}"]
    cmd: list[str] = []
    for item in template:
        if item == "${env}":
            continue
        if item in ("${interpreter}", "python"):
            cmd.append(sys.executable)
        elif item == "${program}":
            cmd.append(str(sweep["program"]))
        elif item == "${args}":
            cmd += args
        elif item == "${args_no_hyphens}":
            cmd += [a[2:] for a in args]
        else:
            cmd.append(str(item))
    if config is not None:
        _replace_option(cmd, "--config", config)
    if report is not None:
        _replace_option(cmd, "--report", report)
    if is_run_command(cmd):
        at = cmd.index("run", cmd.index("grounding.sweep")) + 1
        cmd[at:at] = [f"--set={e.removeprefix('--')}" for e in extra] + ([f"--root={root}"] if root else [])
        return cmd
    return cmd + [f"--{e}" if not e.startswith("--") else e for e in extra]


def parse_overrides(tokens: list[str], what: str = "parameter") -> dict[str, str]:
    """``--key=value`` / ``--key value`` tokens (wandb's ``${args}``) -> {key: value text}, in order."""
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise SweepError(f"unexpected argument {token!r}: the run's {what}s are --key=value options")
        key, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise SweepError(f"--{key} has no value (the run's {what}s are --key=value options)")
            value, i = tokens[i + 1], i + 1
        if key in out:
            raise SweepError(f"{what} --{key} given twice")
        out[key] = value
        i += 1
    return out


def run_name(params: dict) -> str:
    """The run's folder name: ``leaf=value`` of every parameter sorted by key (a leaf that two keys share is
    written in full), values normalised as YAML reads them; characters outside ``[A-Za-z0-9._=+,-]`` become
    ``-``, and a name that had to change or is long gets a hash of the parameters, so two parameter sets never
    share a name."""
    if not params:
        return "default"
    values = {k: (parse_value(v) if isinstance(v, str) else v) for k, v in params.items()}
    keys = sorted(values)
    leaves = [k.split(".")[-1] for k in keys]
    parts = [f"{leaf if leaves.count(leaf) == 1 else key}={_fmt(values[key])}" for key, leaf in zip(keys, leaves)]
    raw = "_".join(parts)
    name = NAME_CHARS.sub("-", raw)
    if name != raw or len(name) > MAX_NAME:
        digest = hashlib.sha1(json.dumps({k: values[k] for k in keys}, sort_keys=True, default=str).encode()).hexdigest()
        name = f"{name[:MAX_NAME]}_{digest[:8]}"
    return name


def run_folder(sweep: str, params: dict, root: str | os.PathLike = DEFAULT_ROOT, run_id: str | None = None) -> Path:
    """``<root>/<sweep>/<run name>`` (``__<run_id>`` appended when given)."""
    name = run_name(params)
    return Path(root) / sweep / (f"{name}__{run_id}" if run_id else name)


def matches(params: dict, spec: str) -> bool:
    """Whether ``params`` ({key: value}) match every ``KEY=VALUE`` of ``spec`` (comma-separated; a key by its full
    name or its last component; values compared as YAML reads them)."""
    values = {k: (parse_value(v) if isinstance(v, str) else v) for k, v in params.items()}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise SweepError(f"{spec!r}: expected KEY=VALUE[,KEY=VALUE...]")
        found = [k for k in values if k == key or k.split(".")[-1] == key]
        if not found or any(values[k] != parse_value(value) for k in found):
            return False
    return True


def fit_arguments(cmd: list[str]) -> list[str]:
    """The ``python -m grounding`` arguments (``fit ...``) a sweep command trains with: for a ``run`` command, the
    fit it starts (its folder under the default root); for a plain ``fit`` command, the command's own."""
    if is_run_command(cmd):
        args = run_parser().parse_known_args(cmd[cmd.index("grounding.sweep") + 2:])
        plan = RunPlan(*args)
        return plan.fit_args
    return cmd[cmd.index("grounding") + 1:]


# --------------------------------------------------------------------------------------------
# One run: fit -> test -> report -> sweep_result.json
# --------------------------------------------------------------------------------------------
def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} run", allow_abbrev=False,
                                description="One sweep run: fit, test the best checkpoint, the semantic-space "
                                            "report on it, sweep_result.json. Options it does not know are the "
                                            "run's parameters (wandb's ${args}: --key=value).")
    p.add_argument("--sweep", required=True, help="the sweep's name: the runs go to <root>/<sweep>/<run name>")
    p.add_argument("--config", required=True, help="the stage config (python -m grounding fit --config ...)")
    p.add_argument("--report", default=None,
                   help="semantic-space report config with ${checkpoint} / ${text_encoder} (none: no report)")
    p.add_argument("--report-kind", choices=REPORT_KINDS, default="semantic_space",
                   help="semantic_space: the --report config on the best checkpoint; ste: the STE's Table 1 / Table 2 "
                        "report (python -m grounding.semclip report) on the run's exported embedding (the fit exports to "
                        f"<folder>/{STE_EMBEDDING}; no test step: the STE has no test split)")
    p.add_argument("--report-encoders", nargs="*", default=[], metavar="NAME",
                   help="with --report-kind ste: text encoders the report compares (default none: the paper's columns "
                        "are the reference)")
    p.add_argument("--report-sample", type=int, default=None, metavar="N",
                   help="with --report-kind ste: Table 1 on a seeded sample of N queries (default: all, the full protocol)")
    p.add_argument("--root", default=DEFAULT_ROOT, help=f"output root (default {DEFAULT_ROOT})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of every run that is not one of its parameters (repeatable)")
    p.add_argument("--skip-if", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="end at once (exit 0) when the parameters match: a duplicate of another grid point")
    p.add_argument("--no-test", action="store_true", help="do not test the best checkpoint")
    p.add_argument("--append-run-id", action="store_true", help="one folder per wandb run: <run name>__<WANDB_RUN_ID>")
    p.add_argument("--dry-run", action="store_true", help="print the folder and the commands only")
    return p


class RunPlan:
    """What one ``run`` does: its folder and the commands of its steps."""

    def __init__(self, args: argparse.Namespace, rest: list[str], env: dict | None = None):
        env = os.environ if env is None else env
        if not re.fullmatch(r"[A-Za-z0-9._-]+", args.sweep) or args.sweep in (".", ".."):
            raise SweepError(f"--sweep {args.sweep!r}: a sweep name is one folder name ([A-Za-z0-9._-])")
        self.args = args
        self.params = parse_overrides(rest)
        sets = [s.removeprefix("--") for s in args.set]
        bad = [s for s in sets if "=" not in s]
        if bad:
            raise SweepError(f"--set {bad[0]!r}: expected KEY=VALUE")
        self.sets = dict(s.split("=", 1) for s in sets)
        both = sorted(set(self.params) & set(self.sets))
        if both:
            raise SweepError(f"--set {both[0]} is also a parameter of the run; give it once")
        owned = [k for k in (*self.params, *self.sets) if k.endswith("default_root_dir")]
        if owned:
            raise SweepError(f"--{owned[0]}: the run's folder is derived from the sweep and its parameters "
                             "(use --root to move the output root)")
        self.kind = args.report_kind
        if args.report_sample is not None and args.report_sample < 1:
            raise SweepError(f"--report-sample {args.report_sample}: expected a whole number of queries >= 1 (leave it out "
                             "for all queries, the full protocol)")
        if self.kind != "ste" and (args.report_encoders or args.report_sample is not None):
            raise SweepError("--report-encoders / --report-sample are the STE report's options (--report-kind ste)")
        if self.kind == "ste":
            if args.report not in (None, "", "none", "null"):
                raise SweepError("--report names a semantic-space report config; --report-kind ste runs the STE report "
                                 "(its options: --report-encoders, --report-sample)")
            exported = [k for k in (*self.params, *self.sets) if k.endswith("export_dir")]
            if exported:
                raise SweepError(f"--{exported[0]}: an STE run exports into its own folder (<folder>/{STE_EMBEDDING})")
        self.run_id = env.get("WANDB_RUN_ID") or None
        if args.append_run_id and not self.run_id:
            self.run_id = uuid.uuid4().hex[:8]
        self.folder = run_folder(args.sweep, self.params, args.root, self.run_id if args.append_run_id else None)
        self.name = self.folder.name
        norm = [f"--{k}={_fmt(parse_value(v))}" for k, v in self.params.items()]
        norm += [f"--{k}={v}" for k, v in self.sets.items()]
        root_dir = f"--trainer.default_root_dir={self.folder}"
        if self.kind == "ste":  # every run its own export, never the config's shared one
            norm.append(f"--model.init_args.export_dir={self.folder / STE_EMBEDDING}")
        self.fit_args = ["fit", "--config", args.config, *norm, root_dir]
        # one device: the test split exactly once (DDP would pad it), without a logger (its numbers go to the
        # run's wandb run with the report's below)
        self.test_args = ["test", "--config", args.config, *norm, root_dir, "--ckpt_path", "best",
                          "--trainer.logger=false", "--trainer.devices=1", "--trainer.num_nodes=1",
                          "--trainer.strategy=auto"]
        self.skip = next((s for s in args.skip_if if matches(self.params, s)), None)
        self.report = None if args.report in (None, "", "none", "null") else args.report
        self.no_test = args.no_test or self.kind == "ste"
        self.embedding = self.folder / STE_EMBEDDING
        self.ste_report_args = ["report", "--ste", str(self.embedding), "--out", str(self.folder / STE_REPORT_FOLDER),
                                "--encoders", *args.report_encoders, "--cap-statistics", "false"]
        if args.report_sample is not None:
            self.ste_report_args += ["--sample", str(args.report_sample)]

    def python(self, module: str, args: list[str]) -> list[str]:
        return [sys.executable, "-m", module, *args]


def stage_text_encoder(folder: str | os.PathLike) -> str | None:
    """The text encoder of the run's model, from the ``config.yaml`` its fit wrote (the first ``text_encoder``
    under ``model``)."""
    try:
        config = yaml.safe_load((Path(folder) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None

    def find(node):
        if isinstance(node, dict):
            if isinstance(node.get("text_encoder"), str):
                return node["text_encoder"]
            for value in node.values():
                found = find(value)
                if found:
                    return found
        return None

    return find((config or {}).get("model")) if isinstance(config, dict) else None


def resolved_report_config(report: str | os.PathLike, checkpoint: Path, text_encoder: str | None,
                           out: Path) -> tuple[dict, str, str]:
    """The report config of one run: ``${checkpoint}`` / ``${text_encoder}`` filled in (a config without
    ``${checkpoint}`` gets the checkpoint as its last model), ``out`` set. Returns it with the reference's and the
    run's model names."""
    try:
        data = yaml.safe_load(Path(report).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise SweepError(f"--report {report}: not a readable YAML report config ({' '.join(str(e).split())})") from None
    section = data.get("semantic_space", data) if isinstance(data, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("models"), list) or not section["models"]:
        raise SweepError(f"--report {report}: expected `semantic_space: {{models: [...], ...}}`")
    models, run_model = [], None
    for m in section["models"]:
        m = dict(m) if isinstance(m, dict) else {"source": m}
        if m.get("source") == TEXT_ENCODER:
            if text_encoder is None:
                raise SweepError(f"--report {report} names {TEXT_ENCODER}, but the run's config.yaml has no text_encoder")
            m["source"] = text_encoder
        elif m.get("source") == CHECKPOINT:
            m["source"] = str(checkpoint)
            m.setdefault("prefix", "auto")
            m.setdefault("name", "Grounded")
            run_model = m
        models.append(m)
    if run_model is None:
        run_model = {"source": str(checkpoint), "name": "Grounded", "prefix": "auto"}
        models.append(run_model)
    names = [m.get("name") or m["source"] for m in models]
    section = {**section, "models": models, "out": str(out)}
    return section, names[0], run_model.get("name") or run_model["source"]


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def report_headline(folder: str | os.PathLike, names: list[str]) -> dict[str, dict]:
    """The semantic-space report's headline numbers per model (the parts it ran): mean / median category
    silhouette and its one-sided Wilcoxon p against the reference (§4.3, Fig. 5 / Fig. 12), PC1-concreteness
    Pearson r at word and category level (§4.1, Table 1), mean cosine and median rank of the compositional
    queries' targets (§4.4, Table 2), mean property-norm F1 (§4.2)."""
    folder = Path(folder)
    out = {n: {} for n in names}
    for row in _read_csv(folder / "silhouette_summary.csv"):
        if row.get("model") in out:
            out[row["model"]].update(silhouette_mean=finite_float(row.get("mean")), silhouette_median=finite_float(row.get("median")),
                                     silhouette_p_vs_reference=finite_float(row.get("p_greater_than_first")))
    for row in _read_csv(folder / "concreteness_stats.csv"):
        if row.get("model") in out:
            out[row["model"]].update(concreteness_word_r=finite_float(row.get("word_r")),
                                     concreteness_category_r=finite_float(row.get("category_r")))
    for row in _read_csv(folder / "property_norms_summary.csv"):
        if row.get("model") in out and row.get("feature_type") == "all":
            out[row["model"]].update(property_norms_mean_f1=finite_float(row.get("mean")))
    rows = _read_csv(folder / "table2_composition.csv")
    for n in names:
        cos = [finite_float(r.get(f"{n} cosine")) for r in rows]
        ranks = sorted(v for v in (finite_float(r.get(f"{n} rank")) for r in rows) if v is not None)
        cos = [c for c in cos if c is not None]
        if cos:
            out[n]["composition_mean_cosine"] = sum(cos) / len(cos)
        if ranks:
            mid = len(ranks) // 2
            out[n]["composition_median_rank"] = ranks[mid] if len(ranks) % 2 else (ranks[mid - 1] + ranks[mid]) / 2
    return out


def ste_report_numbers(folder: str | os.PathLike) -> dict:
    """The STE report's numbers (``python -m grounding.semclip report``): Table 1 of the STE row (coverage, synonym
    recall, queries) and per word-similarity dataset the Spearman on the WordNet-filtered pairs (the paper's STE
    column) and on all pairs, with the pairs each covers."""
    folder = Path(folder)
    out: dict = {"report": str(folder), "coverage": {}, "word_similarity": {}}
    meta = _read_json(folder / "meta.json") or {}
    out["protocol"] = meta.get("protocol")
    if meta.get("paper"):  # the paper's STE columns, as the report recorded them
        out["paper"] = meta["paper"]
    for row in _read_csv(folder / "synonym_coverage.csv"):
        if row.get("embedding") == "STE":
            out["coverage"] = {k: finite_float(row.get(k)) for k in ("queries", "queries_in_vocabulary", "synonyms_in_top10",
                                                               "coverage", "synonym_recall")}
    for row in _read_csv(folder / "word_similarity.csv"):
        if row.get("model") == "STE":
            out["word_similarity"][row["dataset"]] = {k: finite_float(row.get(k)) for k in (
                "pairs", "wordnet_filtered", "covered_wordnet", "spearman_wordnet", "covered_full", "spearman_full")}
    return out


def learnable_parameters(checkpoint: str | os.PathLike) -> int | None:
    """The number of parameters the run's optimizer updated (Fig. 3's x axis), from the checkpoint's optimizer
    state (one moment tensor per updated parameter, e.g. Adam's ``exp_avg``); None when it holds none."""
    try:
        import torch  # heavy: only to read the checkpoint's optimizer state

        from grounding.checkpoints import load_checkpoint_file  # heavy (torch): only to read that checkpoint

        ckpt = load_checkpoint_file(checkpoint, "sweep run checkpoint", mmap=True)
    except Exception as e:  # noqa: BLE001 - a count the result can go without
        print(f"[sweep] learnable parameters: cannot read {checkpoint} ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    total, found = 0, False
    for optimizer in ckpt.get("optimizer_states") or []:
        state = optimizer.get("state") or {}
        for group in optimizer.get("param_groups") or []:
            for index in group.get("params") or []:
                moments = [v for v in (state.get(index) or {}).values() if torch.is_tensor(v) and v.dim() > 0]
                if moments:
                    total += moments[0].numel()
                    found = True
    return total if found else None


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def headline(result: dict) -> dict[str, float]:
    """The flat numbers of a result that go to wandb: test metrics as logged, ``semantic_space/<metric>`` of the
    run's model and ``semantic_space/reference/<metric>``, learnable parameters, training seconds."""
    flat: dict[str, float] = {}
    for key, value in (result.get("test") or {}).items():
        if finite_float(value) is not None:
            flat[key] = float(value)
    space = result.get("semantic_space") or {}
    for role, prefix in (("run", "semantic_space/"), ("reference", "semantic_space/reference/")):
        for key, value in (space.get(role) or {}).items():
            if key != "name" and finite_float(value) is not None:
                flat[prefix + key] = float(value)
    ste = result.get("ste_report") or {}
    for key, value in (ste.get("coverage") or {}).items():
        if key in ("coverage", "synonym_recall") and value is not None:
            flat[f"ste/{key}"] = float(value)
    for dataset, numbers in (ste.get("word_similarity") or {}).items():
        if finite_float(numbers.get("spearman_wordnet")) is not None:
            flat[f"ste/{dataset}"] = float(numbers["spearman_wordnet"])
    for key in ("learnable_parameters",):
        if result.get(key) is not None:
            flat[key] = float(result[key])
    if (result.get("fit") or {}).get("seconds") is not None:
        flat["fit_seconds"] = float(result["fit"]["seconds"])
    return flat


def log_to_wandb(result: dict, folder: Path, run_id: str, env: dict) -> bool:
    """The result's headline numbers into the wandb run ``run_id`` (the fit's), as its summary; offline without
    network (WANDB_MODE=offline). Skipped when WANDB_MODE=disabled or wandb is not installed."""
    if env.get("WANDB_MODE", "").lower() == "disabled":
        return False
    try:
        import wandb  # optional: the result file is the record, wandb a copy
    except ImportError:
        return False
    try:
        run = wandb.init(id=run_id, resume="allow", project=env.get("WANDB_PROJECT", "grounding"), dir=str(folder),
                         group=env.get("WANDB_RUN_GROUP"), config={"sweep_params": result["params"]})
        numbers = headline(result)
        run.log({f"sweep/{k}": v for k, v in numbers.items()})
        run.summary.update({f"sweep/{k}": v for k, v in numbers.items()})
        run.finish()
        return True
    except Exception as e:  # noqa: BLE001 - the result file is written already; wandb is a copy
        print(f"[sweep] wandb: the numbers were not logged ({type(e).__name__}: {e})", file=sys.stderr)
        return False


def _step(label: str, cmd: list[str], env: dict) -> tuple[int, float]:
    print(f"[sweep] {label}: {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, env=env)
    return rc, round(time.perf_counter() - t0, 1)


def run_main(argv: list[str]) -> int:
    args, rest = run_parser().parse_known_args(argv)
    plan = RunPlan(args, rest)
    folder = plan.folder
    if plan.report is not None and not Path(plan.report).is_file():
        raise SweepError(f"--report {plan.report}: no such report config (experiments/semantic_space/*.yaml)")
    if plan.skip is not None:
        print(f"[sweep] {plan.name}: skipped (--skip-if {plan.skip}: the same model as another run of the grid)")
        return 0
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    # the fit's WandbLogger and the numbers logged below share one wandb run (wandb agent sets WANDB_RUN_ID)
    run_id = plan.run_id or uuid.uuid4().hex[:8]
    env["WANDB_RUN_ID"] = run_id
    env.setdefault("WANDB_RUN_GROUP", args.sweep)
    env.setdefault("WANDB_NAME", plan.name)
    fit_cmd = plan.python("grounding", plan.fit_args)
    test_cmd = plan.python("grounding", plan.test_args)
    ste_cmd = plan.python("grounding.semclip", plan.ste_report_args)
    print(f"[sweep] {args.sweep}/{plan.name} -> {folder}", flush=True)
    if args.dry_run:
        print(f"  fit:    {shlex.join(fit_cmd)}")
        if not plan.no_test:
            print(f"  test:   {shlex.join(test_cmd)}")
        if plan.kind == "ste":
            print(f"  report: {shlex.join(ste_cmd)}")
        elif plan.report:
            print(f"  report: {PROG.replace('sweep', 'semantic_space')} --config {folder / REPORT_CONFIG} "
                  f"({plan.report} on the best checkpoint)")
        return 0
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    rc, seconds["fit"] = _step("fit", fit_cmd, env)
    if rc != 0:
        print(f"[sweep] {plan.name}: the fit failed (exit {rc}); no test or report", file=sys.stderr)
        return rc
    checkpoint = best_checkpoint(folder)
    if plan.kind == "ste" and not (plan.embedding / "vectors.npy").is_file():
        print(f"[sweep] {plan.name}: the fit exported no STE to {plan.embedding} (a fast_dev_run?); no report",
              file=sys.stderr)
        return 1
    if checkpoint is None and plan.kind != "ste":
        print(f"[sweep] {plan.name}: the fit wrote no best-*.ckpt in {folder / 'checkpoints'} (a fast_dev_run?); "
              "no test or report", file=sys.stderr)
        return 1
    result: dict = {"sweep": args.sweep, "run": plan.name, "folder": str(folder), "config": args.config,
                    "params": {k: parse_value(v) for k, v in plan.params.items()},
                    "overrides": {k: parse_value(v) for k, v in plan.sets.items()},
                    "wandb": {"run_id": run_id, "sweep_id": env.get("WANDB_SWEEP_ID")},
                    "checkpoint": None if checkpoint is None else str(checkpoint),
                    "fit": _read_json(folder / "fit_record.json")}
    if not plan.no_test:
        rc, seconds["test"] = _step("test", test_cmd, env)
        if rc != 0:
            print(f"[sweep] {plan.name}: the test failed (exit {rc}); no report", file=sys.stderr)
            return rc
        result["test"] = _read_json(folder / "metrics.test.json")
    if plan.kind == "ste":
        rc, seconds["report"] = _step("report", ste_cmd, env)
        if rc != 0:
            print(f"[sweep] {plan.name}: the STE report failed (exit {rc})", file=sys.stderr)
            return rc
        result["ste_report"] = ste_report_numbers(folder / STE_REPORT_FOLDER)
    elif plan.report:
        section, reference, model = resolved_report_config(plan.report, checkpoint, stage_text_encoder(folder),
                                                           folder / REPORT_FOLDER)
        config_path = folder / REPORT_CONFIG
        atomic_write_text(config_path, yaml.safe_dump({"semantic_space": section}, sort_keys=False))
        rc, seconds["report"] = _step("report", plan.python("grounding.semantic_space", ["--config", str(config_path)]),
                                      env)
        if rc != 0:
            print(f"[sweep] {plan.name}: the semantic-space report failed (exit {rc})", file=sys.stderr)
            return rc
        numbers = report_headline(folder / REPORT_FOLDER, [reference, model])
        result["semantic_space"] = {"report": str(folder / REPORT_FOLDER), "source_config": plan.report,
                                    "reference": {"name": reference, **numbers[reference]},
                                    "run": {"name": model, **numbers[model]}}
    count = None if checkpoint is None else learnable_parameters(checkpoint)
    last = folder / "checkpoints" / "last.ckpt"
    if count is None and last.is_file():  # a weights-only best checkpoint (the STE's) keeps no optimizer state
        count = learnable_parameters(last)
    result["learnable_parameters"] = count
    seconds["total"] = round(time.perf_counter() - t_start, 1)
    result["seconds"] = seconds
    atomic_write_json(folder / RESULT_FILE, result, indent=2)
    result["wandb"]["logged"] = log_to_wandb(result, folder, run_id, env)
    atomic_write_json(folder / RESULT_FILE, result, indent=2)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in headline(result).items() if not k.startswith("semantic_space/reference"))
    print(f"[sweep] {plan.name}: {shown}\n[sweep] wrote {folder / RESULT_FILE}", flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# The summary: every run's sweep_result.json -> tables laid out as the paper's
# --------------------------------------------------------------------------------------------
def collect_results(folder: str | os.PathLike) -> list[dict]:
    folder = Path(folder)
    if not folder.is_dir():
        raise SweepError(f"{folder}: no such sweep folder (outputs/sweeps/<sweep>)")
    results = []
    for path in sorted(folder.glob(f"*/{RESULT_FILE}")):
        result = _read_json(path)
        if result is None:
            raise SweepError(f"{path}: not a readable sweep result (JSON object)")
        results.append(result)
    if not results:
        raise SweepError(f"{folder}: no */{RESULT_FILE} yet (run the sweep first: {PROG} <sweep.yaml>)")
    return results


def long_rows(results: list[dict]) -> tuple[list[dict], list[str]]:
    """One row per run: its name, parameters (by last key component) and every headline number."""
    params = list(dict.fromkeys(k.split(".")[-1] for r in results for k in (r.get("params") or {})))
    numbers = list(dict.fromkeys(k for r in results for k in headline(r)))
    rows = []
    for r in results:
        row = {"run": r.get("run"), **{p: _fmt(param(r, p)) if param(r, p) is not None else "" for p in params}}
        row.update(headline(r))
        rows.append(row)
    return rows, ["run", *params, *numbers]


# The numbers of the summary's one-line-per-run Markdown table (summary.csv has every one).
MD_NUMBERS = ("test/i2t_r1", "test/t2i_r1", "test/rsum", "test/object_top1", "test/relation_top1", "test/relation_top10",
              "semantic_space/silhouette_mean", "semantic_space/reference/silhouette_mean",
              "semantic_space/concreteness_word_r", "ste/coverage", "ste/EN-SIMLEX-999-N", "ste/EN-SIMLEX-999",
              "ste/EN-MEN-TR-3k", "learnable_parameters", "fit_seconds")


def summarize(folder: str | os.PathLike, record: str | os.PathLike | None = None) -> list[Path]:
    """``summary.md`` (every table this sweep's parameters make, and one line per run), ``summary.csv`` (one row
    per run) and ``<table>.csv`` per table, in the sweep folder; every file written atomically. With ``record`` (a
    path), also the every-run table as a record there (:func:`write_summary_record`)."""
    folder = Path(folder)
    results = collect_results(folder)
    tables: list[Table] = []
    if any(param(r, "trainable_layers") is not None for r in results):
        tables += layer_tables(results)
    if any(param(r, "loss_terms") is not None for r in results):
        tables.append(loss_table(results))
    if any(param(r, "drop_loss") is not None for r in results):
        tables.append(relation_table(results))
    if any(r.get("ste_report") for r in results):
        tables.append(ste_table(results))
    rows, columns = long_rows(results)
    numbers = list(dict.fromkeys(k for r in results for k in headline(r)))
    written = []
    md = [f"# Sweep {folder.name}: {len(results)} runs\n",
          f"From `{folder}/*/{RESULT_FILE}` (`{PROG} summarize {folder}`).\n"]
    for t in tables:
        md.append(t.markdown())
        written.append(atomic_write_csv(folder / f"{t.name}.csv", t.csv_rows(), t.csv_columns()))
    shown = columns[:len(columns) - len(numbers)] + [c for c in MD_NUMBERS if c in numbers]
    md += ["## Every run\n", "The main numbers; all of them: `summary.csv`.\n",
           "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    md += ["| " + " | ".join(_cell(row.get(c, "")) for c in shown) + " |" for row in rows]
    written.append(atomic_write_csv(folder / "summary.csv", rows, columns))
    written.append(atomic_write_text(folder / "summary.md", "\n".join(md) + "\n"))
    if record is not None:
        written.append(write_summary_record(record, folder, results, shown))
    return written


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _record_value(value):
    """A parameter as a record's cell: a number, text, true / false or null as it is; a list or mapping as its text."""
    return _fmt(value) if isinstance(value, (list, dict)) else value


def _int_seed(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_seed(result: dict, folder: Path) -> int | None:
    """The seed a run was fitted with: a ``seed_everything`` parameter or override, else the ``seed_everything`` of
    the ``config.yaml`` its fit wrote (``<folder>/<run>/`` or the result's ``folder``); None when none says."""
    for given in (result.get("params") or {}, result.get("overrides") or {}):
        seeds = [_int_seed(v) for k, v in given.items() if k.split(".")[-1] == "seed_everything"]
        if seeds and seeds[0] is not None:
            return seeds[0]
    run_dirs = [folder / str(result["run"])] if result.get("run") else []
    run_dirs += [Path(result["folder"])] if result.get("folder") else []
    for run_dir in run_dirs:
        try:
            config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue
        if isinstance(config, dict) and _int_seed(config.get("seed_everything")) is not None:
            return config["seed_everything"]
    return None


def summary_record_rows(results: list[dict], folder: Path) -> list[dict]:
    """The record's rows: a row per run, as summary.csv's (its name, parameters by last key component, every headline
    number) with parameters as values (numbers as numbers, null when the run has none) and unrounded numbers, and the
    run's ``seed`` (:func:`run_seed`)."""
    params = list(dict.fromkeys(k.split(".")[-1] for r in results for k in (r.get("params") or {})))
    return [{"run": r.get("run"), **{p: _record_value(param(r, p)) for p in params}, **headline(r),
             "seed": run_seed(r, folder)} for r in results]


def write_summary_record(path: str | os.PathLike, folder: Path, results: list[dict], columns: list[str]) -> Path:
    """The summary's every-run table as a record (:mod:`grounding.docs_tables`) at ``path``: ``columns`` (summary.md's),
    :func:`summary_record_rows`; config: the runs' stage and report configs; seeds: every run's (null unless all are
    known)."""
    rows = summary_record_rows(results, folder)
    configs = list(dict.fromkeys(c for r in results for c in (r.get("config"), (r.get("semantic_space") or {}).get(
        "source_config")) if isinstance(c, str) and c))
    seeds = [row["seed"] for row in rows]
    keys = provenance(config=configs[0] if len(configs) == 1 else configs or None,
                      seeds=None if None in seeds else sorted(set(seeds)))
    return write_record(path, columns, rows, keys, title=f"Sweep {folder.name}: {len(results)} runs",
                        labels={c: c for c in columns}, sweep=folder.name, summary=str(folder / "summary.csv"))


def summarize_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} summarize", allow_abbrev=False,
                                description="Collect every run's sweep_result.json of a sweep folder into tables "
                                            "laid out as the paper's (summary.md, summary.csv, <table>.csv).")
    p.add_argument("folder", help="the sweep folder, outputs/sweeps/<sweep>")
    p.add_argument("--record", metavar="NAME",
                   help="also write the every-run table as docs/records/NAME.json (or this path ending in .json)")
    args = p.parse_args(argv)
    record = record_option(args.record)
    written = summarize(args.folder, record)
    print((Path(args.folder) / "summary.md").read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


# --------------------------------------------------------------------------------------------
# The offline runner
# --------------------------------------------------------------------------------------------
def launch_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="a wandb sweep YAML (method: grid); or `run ...` / `summarize FOLDER`")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--config", help="replace the stage config named after --config in the command")
    p.add_argument("--report", help="replace the report config named after --report in the command")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra CLI override for every run, e.g. trainer.max_epochs=2 (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="run only the grid points whose parameters match (repeatable: any of them)")
    p.add_argument("--root", default=None, help=f"output root (default {DEFAULT_ROOT})")
    p.add_argument("--max-runs", type=int, default=None)
    args = p.parse_args(argv)
    if args.max_runs is not None and args.max_runs < 1:
        raise SweepError(f"--max-runs {args.max_runs}: expected a whole number >= 1 (leave it out for every grid point)")
    bad = [s for s in args.set if "=" not in s]
    if bad:
        raise SweepError(f"--set {bad[0]!r}: expected KEY=VALUE (e.g. --set trainer.max_epochs=1)")
    path = Path(args.sweep)
    sweep = load_sweep(path)
    grid = expand_grid(sweep, str(path))
    if args.only:
        grid = [g for g in grid if any(matches(g, spec) for spec in args.only)]
        if not grid:
            raise SweepError(f"--only {' / '.join(args.only)}: no grid point of {path} matches")
    grid = grid[:args.max_runs]
    check_parameter_values(sweep, grid, str(path), args.config, list(args.set), args.report)
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    results = []
    t0 = time.perf_counter()
    for i, params in enumerate(grid):
        name = run_name(params)
        extra = list(args.set)
        cmd = build_command(sweep, params, args.config, extra, args.report, args.root)
        if not is_run_command(cmd):  # a plain fit: its folder given here
            cmd.append(f"--trainer.default_root_dir={run_folder(path.stem, params, args.root or DEFAULT_ROOT)}")
        print(f"[{i + 1}/{len(grid)}] {name}\n  {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            if is_run_command(cmd):  # the run's folder and steps, planned here
                run_main(cmd[cmd.index("grounding.sweep") + 2:] + ["--dry-run"])
            continue
        results.append((name, subprocess.call(cmd, env=env)))
    if results:
        print(f"\nsweep summary ({time.perf_counter() - t0:.0f} s):")
        for name, rc in results:
            print(f"  {'ok  ' if rc == 0 else f'FAIL({rc})'} {name}")
    return int(any(rc for _, rc in results))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "run":
        return run_main(argv[1:])
    if argv and argv[0] == "summarize":
        return summarize_main(argv[1:])
    return launch_main(argv)


if __name__ == "__main__":
    with user_errors_exit(PROG):
        sys.exit(main())
