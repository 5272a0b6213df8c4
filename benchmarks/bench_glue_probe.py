"""The GLUE probe's training step from cached token states: every token's state padded and pooled each step vs each
example's mean state computed once (``summarise_states``), side by side in one run.

The GLUE tasks of ``--root`` (``../shared/data/glue``: their real token lengths, at most ``--examples`` training
rows a task), random float16 states of the encoder's width stored as the probe stores them (``TokenStates``: the step
cost does not depend on the values), the probe's own batches (one task each, batch 32) through its collate function,
then forward + backward + Adam of the shared pooler and the task heads. Outputs are checked equal on every task's
first batch, then the two paths run in interleaved rounds over the same batches; medians.

    python benchmarks/bench_glue_probe.py [--root ../shared/data/glue] [--width 384] [--steps 200] [--rounds 5]
        [--record NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere
from table_record import add_record_option, write_table_record  # noqa: E402

from data_modules.glue import TASKS_BY_KEY, GlueDataModule  # noqa: E402
from grounding.vgbert.glue_probe import SharedPooler, TokenStates, task_loss  # noqa: E402


def attach_random_states(dm: GlueDataModule, width: int, folder: Path, summary: str | None) -> None:
    rng = np.random.default_rng(0)
    for i, file in enumerate(dm.split_files("train")):
        out = folder / f"{file.task.key}-{i}"
        if not out.is_dir():
            out.mkdir(parents=True)
            np.save(out / "states.npy", rng.standard_normal((int(file.offsets[-1]), width)).astype(np.float16))
            np.save(out / "offsets.npy", file.offsets)
        file.states = TokenStates(out, "random", summary)


class Probe(torch.nn.Module):
    def __init__(self, width: int, tasks: list[str]):
        super().__init__()
        self.pooler = SharedPooler(width, 512, "mean")
        self.heads = torch.nn.ModuleDict({t: torch.nn.Linear(512, TASKS_BY_KEY[t].num_outputs) for t in tasks})

    def forward(self, batch: dict) -> torch.Tensor:
        if "summary_states" in batch:
            pooled = self.pooler.forward_summary(batch["summary_states"])
        else:
            pooled = self.pooler(batch["states"], batch["attention_mask"])
        out = self.heads[batch["task"]](pooled)
        return out.squeeze(-1) if TASKS_BY_KEY[batch["task"]].regression else out


def train(probe: Probe, batches: list[dict]) -> float:
    """Seconds for one pass: collate already done by the loader; forward, backward and Adam a batch."""
    optimizer = torch.optim.Adam(probe.parameters(), lr=1e-4)
    start = time.perf_counter()
    for batch in batches:
        loss = task_loss(TASKS_BY_KEY[batch["task"]], probe(batch), batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def load(dm: GlueDataModule, steps: int) -> tuple[list[dict], float]:
    start = time.perf_counter()
    batches = [b for _, b in zip(range(steps), dm.train_dataloader())]
    return batches, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="../shared/data/glue")
    p.add_argument("--width", type=int, default=384, help="the encoder's hidden size (MiniLM 384, BERT-base 768)")
    p.add_argument("--examples", type=int, default=4000, help="training rows a task at most")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    add_record_option(p)
    args = p.parse_args(argv)
    if not Path(args.root).is_dir():
        print(f"no GLUE folder at {args.root}: skipped (give --root <glue_data>)", file=sys.stderr)
        return 0
    torch.manual_seed(0)
    dm = GlueDataModule(args.root, text_encoder="minilm", batch_size=32, train_limit=args.examples)
    dm.setup()
    tasks = [s.task.key for s in dm.datasets["train"].splits]
    with tempfile.TemporaryDirectory() as tmp:
        attach_random_states(dm, args.width, Path(tmp), "mean")
        started = time.perf_counter()
        for file in dm.split_files("train"):
            len(file.states)  # the summaries, once
        summarise_s = time.perf_counter() - started
        summary_batches, summary_load = load(dm, args.steps)
        attach_random_states(dm, args.width, Path(tmp), None)
        padded_batches, padded_load = load(dm, args.steps)
        probe = Probe(args.width, tasks).eval()
        with torch.no_grad():  # the same outputs on each task's first batch
            seen = set()
            for a, b in zip(summary_batches, padded_batches):
                if a["task"] not in seen:
                    seen.add(a["task"])
                    assert torch.allclose(probe(a), probe(b), atol=1e-4), a["task"]
        probe.train()
        times = {"padded token states": [], "summaries": []}
        for _ in range(args.rounds):
            times["padded token states"].append(train(probe, padded_batches))
            times["summaries"].append(train(probe, summary_batches))
    base = statistics.median(times["padded token states"])
    print(f"GLUE probe steps on {', '.join(tasks)} (width {args.width}, batch 32, {args.steps} steps, median of "
          f"{args.rounds} interleaved rounds; summaries computed once in {summarise_s:.2f} s)")
    table = [("path", "path"), ("load_ms_per_step", "batches loaded (ms/step)"), ("step_ms", "step (ms)"),
             ("step_vs_padded", "step × padded")]
    print("| " + " | ".join(label for _, label in table) + " |")
    print("|---|---|---|---|")
    rows = []
    for name, load_s in (("padded token states", padded_load), ("summaries", summary_load)):
        median = statistics.median(times[name])
        print(f"| {name} | {1e3 * load_s / args.steps:.2f} | {1e3 * median / args.steps:.2f} | {median / base:.2f}× |")
        rows.append({"path": name, "load_ms_per_step": 1e3 * load_s / args.steps, "step_ms": 1e3 * median / args.steps,
                     "step_vs_padded": median / base})
    write_table_record(args.record, f"GLUE probe steps from cached token states (width {args.width}, batch 32, {args.steps} "
                       f"steps, median of {args.rounds} interleaved rounds)", table, rows, seeds=[0], tasks=tasks,
                       width=args.width, steps=args.steps, rounds=args.rounds, examples=args.examples,
                       summaries_seconds=summarise_s, glue_root=str(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
