"""Operators, host synchronisations and CPU time of one training step, every cross-encoder side by side on one batch.

    python benchmarks/bench_step_operators.py [--configs A.yaml ...] [--repeats 5] [--batches 3] [--record NAME]

Each config's model and DataModule are built as ``python -m grounding fit`` builds them (``grounding.cli.build_stage``);
the first ``--batches`` training batches are drawn once and their images put through the frozen backbone once (as the
feature cache gives them to a fit). A step is ``compute_losses`` + backward. Counted under
:class:`grounding.host_sync.SyncCounter` (one pass, seed 0): the ATen operators the step dispatches (forward, backward)
and the host-synchronising ones among them (``.item()``, ``nonzero``, ``unique``, boolean-mask indexing,
``repeat_interleave`` without ``output_size``, ...; 0 is the target: tests/test_host_sync.py). Timed: the steps of all
models interleaved, ``--repeats`` rounds after one untimed round, median seconds a step (a ratio that holds on a loaded
machine). The last column is each model's operators and time over ViLBERT-style's (COMPOSER's target: ≤ 1.5x,
Table 6's "50 % less efficient"). Dropout on, as in training; the hard negatives as each config sets them.

Defaults: the world configs of ViLBERT-style (the reference row), COMPOSER (also with ``image_stream_once``: a config
``A.yaml+image_stream_once`` turns that switch on), ViLBERT + MVSA and VSE (`make world` makes the data).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch
from table_record import add_record_option, write_table_record

from grounding.cli import build_stage
from grounding.host_sync import SyncCounter
from grounding.paths import resolve_path

WORLD = ["experiments/composer/vilbert_world.yaml", "experiments/composer/composer_world.yaml",
         "experiments/composer/composer_world.yaml+image_stream_once", "experiments/composer/vilbert_mvsa_world.yaml",
         "experiments/composer/vse_world.yaml"]


# a row NAME=CONFIG+SWITCH: the config with one of COMPOSER's composition switches on
SWITCHES = {"image_stream_once": {"model": {"init_args": {"net": {"init_args": {"composition": {"image_stream_once": True}}}}}}}


def prepare(config: str, n_batches: int):
    """The config's training module and its first training batches, images through the frozen backbone."""
    config, _, switch = config.partition("+")
    overrides = [{"trainer": {"logger": False}}] + ([SWITCHES[switch]] if switch else [])
    with tempfile.TemporaryDirectory() as tmp:
        cli = build_stage(resolve_path(config), overrides, workdir=tmp)
    module, dm = cli.model, cli.datamodule
    dm.setup("fit")
    batches = list(islice(dm.train_dataloader(), n_batches))
    backbone = module.frozen_backbone()
    with torch.no_grad():
        for batch in batches:
            if backbone is not None and "images" in batch and batch["images"].shape[1] == 3:
                batch["images"] = backbone(batch["images"])  # the cached maps a fit reads
    module.train()
    return module, batches


def row_name(config: str) -> str:
    path, _, switch = config.partition("+")
    return Path(path).stem + (f" + {switch}" if switch else "")


def step(module, batch) -> None:
    module.zero_grad(set_to_none=True)
    module.compute_losses(batch)["loss"].backward()


def count(module, batch) -> dict:
    """Operators (forward, backward) and host synchronisations of one step."""
    torch.manual_seed(0)
    module.zero_grad(set_to_none=True)
    with SyncCounter(stack=True) as forward:
        loss = module.compute_losses(batch)["loss"]
    with SyncCounter(stack=True) as backward:
        loss.backward()
    return {"forward": forward.operators, "backward": backward.operators,
            "syncs": forward.total + backward.total, "where": (forward.summary(), backward.summary())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=WORLD, help="training configs; the first is the reference row")
    ap.add_argument("--batches", type=int, default=3, help="training batches a round")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (after one untimed)")
    add_record_option(ap)
    args = ap.parse_args(argv)
    models = {row_name(c): prepare(c, args.batches) for c in args.configs}
    counts = {name: count(module, batches[0]) for name, (module, batches) in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(args.repeats + 1):
        for name, (module, batches) in models.items():
            torch.manual_seed(round_)
            start = time.perf_counter()
            for batch in batches:
                step(module, batch)
            if round_:
                times[name].append((time.perf_counter() - start) / len(batches))
    reference = next(iter(models))
    ref_ops = counts[reference]["forward"] + counts[reference]["backward"]
    ref_time = statistics.median(times[reference])
    b = len(models[reference][1][0]["image_index"])
    print(f"\none training step (compute_losses + backward), batch {b}, {torch.get_num_threads()} threads; time: median of "
          f"{args.repeats} interleaved rounds of {args.batches} batches")
    print(f"{'config':44s} {'fwd ops':>8s} {'bwd ops':>8s} {'ops':>7s} {'syncs':>6s} {'s/step':>8s}  ops / {reference}, "
          f"time / {reference}")
    rows = []
    for name in models:
        c = counts[name]
        ops = c["forward"] + c["backward"]
        sec = statistics.median(times[name])
        print(f"{name:44s} {c['forward']:8d} {c['backward']:8d} {ops:7d} {c['syncs']:6d} {sec:8.3f}  "
              f"{ops / ref_ops:5.2f}x ops, {sec / ref_time:5.2f}x time")
        rows.append({"config": name, "forward_ops": c["forward"], "backward_ops": c["backward"], "ops": ops,
                     "syncs": c["syncs"], "seconds_per_step": sec, "ops_ratio": ops / ref_ops, "time_ratio": sec / ref_time,
                     "sync_sites": f"forward {c['where'][0]}; backward {c['where'][1]}" if c["syncs"] else None})
    for name in models:
        if counts[name]["syncs"]:
            print(f"  {name}: forward {counts[name]['where'][0]}; backward {counts[name]['where'][1]}")
    table = [("config", "config"), ("forward_ops", "fwd ops"), ("backward_ops", "bwd ops"), ("ops", "ops"), ("syncs", "syncs"),
             ("seconds_per_step", "s/step"), ("ops_ratio", f"ops / {reference}"), ("time_ratio", f"time / {reference}")]
    write_table_record(args.record, f"one training step (compute_losses + backward), batch {b}: operators, host "
                       f"synchronisations, median time of {args.repeats} interleaved rounds", table, rows,
                       config=list(dict.fromkeys(c.partition("+")[0] for c in args.configs)),
                       seeds=list(range(args.repeats + 1)), batch=b, threads=torch.get_num_threads(),
                       batches=args.batches, repeats=args.repeats, reference=reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
