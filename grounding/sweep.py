"""Run a wandb sweep YAML offline: expand its grid and run every configuration in turn.

    python -m grounding.sweep experiments/sweeps/stage1_layers.yaml            # run the whole grid
    python -m grounding.sweep experiments/sweeps/stage1_layers.yaml --dry-run  # print the commands
    python -m grounding.sweep experiments/sweeps/stage1_losses.yaml \\
        --config experiments/vgbert/stage1_tiny.yaml --set trainer.max_epochs=2   # a tiny rehearsal

The same YAML works with the wandb service (``wandb sweep FILE`` then ``wandb agent ID``): this
runner understands the subset used here — ``method: grid``, ``parameters`` with ``values`` or
``value``, and a ``command`` list with the ``${env}``, ``${interpreter}``, ``${program}``,
``${args}`` and ``${args_no_hyphens}`` macros. Runs log offline (WANDB_MODE=offline unless set)
and each writes under ``outputs/sweeps/<sweep>/<run>``; a summary of exit codes is printed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def expand_grid(sweep: dict, path: str = "<sweep>") -> list[dict]:
    method = sweep.get("method", "grid")
    if method != "grid":
        raise ValueError(f"{path}: the offline runner expands method: grid only (got {method!r}); "
                         "use `wandb sweep` + `wandb agent` for random/bayes search.")
    params = sweep.get("parameters") or {}
    names, choices = [], []
    for name, spec in params.items():
        if not isinstance(spec, dict) or not ("values" in spec or "value" in spec):
            raise ValueError(f"{path}: parameter {name!r} needs `values: [...]` or `value: x`; got {spec!r}")
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def build_command(sweep: dict, params: dict, config: str | None = None, extra: list[str] = ()) -> list[str]:
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
        if "--config" not in cmd:
            raise ValueError("--config given but the sweep's command has no --config to replace")
        cmd[cmd.index("--config") + 1] = config
    return cmd + [f"--{e}" if not e.startswith("--") else e for e in extra]


def run_name(params: dict) -> str:
    return "_".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in params.items()) or "default"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="a wandb sweep YAML (method: grid)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--config", help="replace the stage config named after --config in the command")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra CLI override for every run, e.g. trainer.max_epochs=2 (repeatable)")
    p.add_argument("--max-runs", type=int, default=None)
    args = p.parse_args(argv)
    path = Path(args.sweep)
    if not path.is_file():
        p.error(f"sweep file {path} does not exist")
    sweep = yaml.safe_load(path.read_text())
    if not isinstance(sweep, dict):
        p.error(f"{path}: expected a mapping with program/method/parameters/command")
    grid = expand_grid(sweep, str(path))[:args.max_runs]
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    results = []
    for i, params in enumerate(grid):
        name = run_name(params)
        extra = list(args.set) + [f"trainer.default_root_dir=outputs/sweeps/{path.stem}/{name}"]
        cmd = build_command(sweep, params, args.config, extra)
        print(f"[{i + 1}/{len(grid)}] {name}\n  {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        rc = subprocess.call(cmd, env=env)
        results.append((name, rc))
    if results:
        print("\nsweep summary:")
        for name, rc in results:
            print(f"  {'ok  ' if rc == 0 else f'FAIL({rc})'} {name}")
    return int(any(rc for _, rc in results))


if __name__ == "__main__":
    sys.exit(main())
