"""Where a cross-encoder's training step spends its time: COMPOSER against ViLBERT-style on one schedule.

    python benchmarks/bench_cross_encoder_train.py [--configs A.yaml B.yaml] [--steps 20] [--warmup 3]
        [--train-photos 6000] [--packed both|true|false] [--precision 32-true|bf16-mixed|both]
        [--length-groups 1 8] [--record NAME]

Each config's model and DataModule are built as ``python -m grounding fit`` builds them (``grounding.cli.build_stage``,
the frozen backbone's feature cache included) and trained for ``warmup + steps`` optimizer steps by Lightning in a
temporary folder, both models in one process, one after the other. Timed per step (after the warm-up): the forward
of each part of the network (a forward hook on every direct child of ``net``: the Predicate Transformer, the primitive
encoder, the modulator, the Composition Transformer, ...; the pretrained BERT layers wherever they run, padded or
on real tokens only, as one part; what none of these runs, indexing, embedding look-ups and the losses, is "rest of
the forward"), the backward, the optimizer update and the wait for the next batch (means over the timed steps). The last
columns extrapolate the config's own schedule (its ``max_epochs``, every caption every epoch) to ``--train-photos``
training photos at this step time: the paper-schedule training time on all of Flickr8k on this machine. Each config
runs with its text encoder padded and on real tokens only (``packed_tokens``; ``--packed``), one fit after the other
(so their ratio moves with the machine's load); then COMPOSER's Predicate Transformer alone on the same templates,
padded against real tokens only, interleaved (a ratio that holds under load); and ViLBERT + MVSA's losses (ℓ_match's 4
pairs a caption, ℓ_MVSA's 3 a concept text) with the cross-encoder's pairs padded as the batch (``length_groups`` 1)
against 8 groups of similar length, each cut past its longest text, interleaved. ``--precision both``: each config also
under Lightning's ``bf16-mixed`` (autocast; on a CPU with AVX512-BF16 or AMX, oneDNN runs the matrix products in
bfloat16), one fit after the other. ``--length-groups 1 8``: each ViLBERT config also with each number of length
groups (``ViLBERT.length_groups``), one fit after the other.

On a GPU every timing mark waits for the queued kernels first (``torch.cuda.synchronize``), and the timed steps run
under ``torch.cuda.set_sync_debug_mode("warn")``: the report adds the host-device synchronisations a step, by the
Python line that caused them (a step that waits on the GPU mid-forward cannot queue the next kernels ahead).

Defaults: the 753-photo Flickr8k configs of COMPOSER and ViLBERT-style when ``../shared/data/flickr8k`` is there,
else their world configs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from contextlib import contextmanager
from itertools import islice
from pathlib import Path

import torch
from lightning.pytorch import Callback
from table_record import add_record_option, write_table_record
from torch import nn

from grounding import encoders
from grounding.cli import build_stage
from grounding.paths import resolve_path

FLICKR8K = ["experiments/composer/composer_flickr8k.yaml", "experiments/composer/vilbert_flickr8k.yaml"]
WORLD = ["experiments/composer/composer_world.yaml", "experiments/composer/vilbert_world.yaml"]
MVSA = {"flickr8k": "experiments/composer/vilbert_mvsa_flickr8k.yaml", "world": "experiments/composer/vilbert_mvsa_world.yaml"}
# the record's columns (--record): a row per printed line, its kind in "section"
TABLE = [("section", "section"), ("run", "run"), ("part", "phase / part"), ("seconds", "seconds"),
         ("percent", "% of the step (a forward part: of the forward)"),
         ("ratio", "ratio (step: over the first run's; A/B: the second row's seconds over the first's)"),
         ("hours", "hours for --train-photos photos at this rate")]


class StepTimer(Callback):
    """Wall time of each training step's phases, and of every direct child of ``net`` in the forward."""

    def __init__(self, net, warmup: int):
        self.warmup = warmup
        self.parts: dict[str, list[float]] = defaultdict(list)
        self.phases: dict[str, list[float]] = defaultdict(list)
        self._part_time: dict[str, float] = defaultdict(float)
        self._open: dict[str, float] = {}
        self._marks: dict[str, float] = {}
        self.sync_log: list[warnings.WarningMessage] | None = None  # set by profile() on a GPU
        self.syncs: Counter = Counter()  # host synchronisations of the timed steps, by the Python line causing them
        self._seen = 0
        for name, child in net.named_children():
            if hasattr(child, "embeddings") and hasattr(child, "encoder"):
                continue  # a BERT: timed in grounding.encoders.bert_hidden_states (packed or padded), see below
            # a list of layers has no forward of its own: its layers count under its name
            members = list(child.children()) if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else [child]
            for member in members:
                member.register_forward_pre_hook(self._enter(name))
                member.register_forward_hook(self._leave(name))

    @contextmanager
    def timing_text_encoders(self):
        """Every call of ``bert_hidden_states`` (where the networks run their pretrained BERT layers, on real tokens
        only or padded) timed as one part, in every module that imported it."""
        original = encoders.bert_hidden_states
        name = "text encoder (BERT layers)"

        def timed(*args, **kwargs):
            self._enter(name)(None, None)
            out = original(*args, **kwargs)
            self._leave(name)(None, None, None)
            return out

        users = [m for m in list(sys.modules.values()) if getattr(m, "bert_hidden_states", None) is original]
        for module in users:
            module.bert_hidden_states = timed
        try:
            yield
        finally:
            for module in users:
                module.bert_hidden_states = original

    def _enter(self, name):
        def hook(module, args):
            self._open[name] = _now()
        return hook

    def _leave(self, name):
        def hook(module, args, output):
            self._part_time[name] += _now() - self._open.pop(name)
        return hook

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = _now()
        if "end" in self._marks and trainer.global_step > self.warmup:  # the timed steps' waits only
            self._record("wait for the batch", now - self._marks["end"])
        self._marks = {"start": now}
        self._part_time.clear()
        if self.sync_log is not None:
            self._seen = len(self.sync_log)

    def on_before_backward(self, trainer, pl_module, loss):
        self._marks["forward"] = _now()

    def on_after_backward(self, trainer, pl_module):
        self._marks["backward"] = _now()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = self._marks
        m["end"] = _now()
        if trainer.global_step <= self.warmup:
            return
        forward = m["forward"] - m["start"]
        self._record("forward", forward)
        self._record("backward", m["backward"] - m["forward"])
        self._record("optimizer update", m["end"] - m["backward"])
        self._record("step", m["end"] - m["start"])
        for name, sec in self._part_time.items():
            self.parts[name].append(sec)
        if self.sync_log is not None:
            self.syncs.update(f"{Path(w.filename).name}:{w.lineno}" for w in self.sync_log[self._seen:] if _is_sync_warning(w))
        self.parts["rest of the forward"].append(forward - sum(self._part_time.values()))

    def _record(self, phase: str, sec: float) -> None:
        self.phases[phase].append(sec)


def _now() -> float:
    """The clock after the GPU's queued work: on a GPU, hooks read without it would time kernel launches only."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _is_sync_warning(w: warnings.WarningMessage) -> bool:
    """A warning of ``torch.cuda.set_sync_debug_mode("warn")`` raised by the suite or a library, not by ``_now``."""
    return "synchroniz" in str(w.message) and Path(w.filename).resolve() != Path(__file__).resolve()


def profile(config: str, steps: int, warmup: int, packed: bool, precision: str = "32-true",
            length_groups: int | None = None) -> dict:
    net_args = {"packed_tokens": packed} | ({} if length_groups is None else {"length_groups": length_groups})
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [{"trainer": {"max_steps": warmup + steps, "limit_val_batches": 0, "num_sanity_val_steps": 0,
                                  "precision": precision}},
                     {"model": {"init_args": {"net": {"init_args": net_args}}}}]
        cli = build_stage(resolve_path(config), overrides, workdir=tmp)
        model, dm, trainer = cli.model, cli.datamodule, cli.trainer
        timer = StepTimer(model.net, warmup)
        trainer.callbacks.append(timer)
        max_epochs = int(cli.config.get("trainer", {}).get("max_epochs") or 1)
        on_gpu = torch.cuda.is_available()
        with timer.timing_text_encoders(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            timer.sync_log = caught if on_gpu else None
            if on_gpu:  # every host-device synchronisation warns, with the Python line that caused it
                torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.fit(model, dm)
            finally:
                if on_gpu:
                    torch.cuda.set_sync_debug_mode("default")
        steps_per_epoch = len(dm.train_dataloader())
        photos = len(dm.train_dataset)
    # means, so the phases add up to the step and the parts to the forward
    step = statistics.mean(timer.phases["step"])
    label = f"{Path(config).name}, packed_tokens {str(packed).lower()}, {precision}"
    if length_groups is not None:
        label += f", length_groups {length_groups}"
    return {"config": config, "label": label, "step": step, "phases": {k: statistics.mean(v) for k, v in timer.phases.items()},
            "parts": {k: statistics.mean(v) for k, v in timer.parts.items()}, "steps_per_epoch": steps_per_epoch,
            "syncs": {site: n / steps for site, n in timer.syncs.items()} if on_gpu else None,
            "photos": photos, "max_epochs": max_epochs, "params": sum(p.numel() for p in model.net.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "seed": cli.config.get("seed_everything")}


def predicate_transformer_ab(config: str, n_batches: int = 6, repeats: int = 4) -> dict[bool, float]:
    """COMPOSER's Predicate Transformer alone, forward + backward over the templates of ``n_batches`` training
    batches, padded and on real tokens only, interleaved ``repeats`` times (the first pair untimed): a ratio that
    holds on a loaded machine, where two whole fits one after the other do not."""
    with tempfile.TemporaryDirectory() as tmp:
        batch_negatives = {"init_args": {"hard_negatives": "batch"}}  # the pool needs a Trainer; same templates
        cli = build_stage(resolve_path(config), [{"data": batch_negatives, "model": batch_negatives}], workdir=tmp)
        dm = cli.datamodule
        dm.setup("fit")
        batches = [(b["template_ids"], b["template_mask"].long()) for b in islice(dm.train_dataloader(), n_batches)]
    pt = cli.model.net.predicate_transformer.train()
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats + 1):
        for packed in (False, True):
            start = _now()
            for ids, mask in batches:
                pt.zero_grad(set_to_none=True)
                encoders.bert_hidden_states(pt, ids, mask, packed).sum().backward()
            times[packed].append(_now() - start)
    padding = 1 - sum(float(m.float().mean()) for _, m in batches) / len(batches)
    return {"padding": padding, **{k: statistics.median(v[1:]) for k, v in times.items()}}


def length_groups_ab(config: str, n_batches: int = 3, repeats: int = 3, groups: tuple[int, ...] = (1, 8)) -> dict:
    """ViLBERT + MVSA's training losses, forward + backward over ``n_batches`` training batches (regions computed
    once, the same random negatives for every setting), with ViLBERT.cross's pairs in each number of ``groups``,
    interleaved ``repeats`` times (the first round untimed)."""
    with tempfile.TemporaryDirectory() as tmp:
        batch_negatives = {"init_args": {"hard_negatives": "batch"}}  # the pool needs a Trainer; same texts
        cli = build_stage(resolve_path(config), [{"data": batch_negatives, "model": batch_negatives}], workdir=tmp)
        dm = cli.datamodule
        dm.setup("fit")
        batches = list(islice(dm.train_dataloader(), n_batches))
    module = cli.model.train()
    with torch.no_grad():
        regions = [module.regions(b) for b in batches]
    times: dict[int, list[float]] = {g: [] for g in groups}
    for _ in range(repeats + 1):
        for g in groups:
            module.net.length_groups = g
            start = _now()
            for i, (batch, r) in enumerate(zip(batches, regions)):
                module.zero_grad(set_to_none=True)
                module.regions = lambda _batch, r=r: r  # the frozen backbone's output, computed once above
                torch.manual_seed(i)
                module.compute_losses(batch)["loss"].backward()
            times[g].append(_now() - start)
    mask = torch.cat([b["concept_mask"].flatten() for b in batches]).float()
    return {"concept_padding": 1 - float(mask.mean()), **{g: statistics.median(v[1:]) for g, v in times.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=None, help="cross-encoder configs (default: see above)")
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps per model")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--train-photos", type=int, default=6000, help="photos to extrapolate the schedule to")
    ap.add_argument("--packed", choices=("both", "true", "false"), default="both",
                    help="the text encoder on real tokens only (packed_tokens), padded, or both side by side")
    ap.add_argument("--precision", choices=("32-true", "bf16-mixed", "both"), default="32-true",
                    help="the trainer's precision; both: 32-true and bf16-mixed side by side")
    ap.add_argument("--length-groups", nargs="+", type=int, default=None,
                    help="ViLBERT configs also with each of these length_groups, one fit after the other")
    add_record_option(ap)
    args = ap.parse_args(argv)
    configs = args.configs or (FLICKR8K if resolve_path("../shared/data/flickr8k").is_dir() else WORLD)
    packed = {"both": (False, True), "true": (True,), "false": (False,)}[args.packed]
    precisions = ("32-true", "bf16-mixed") if args.precision == "both" else (args.precision,)
    def groups(config: str) -> list[int | None]:
        return args.length_groups if args.length_groups and "vilbert" in Path(config).name else [None]

    results = [profile(c, args.steps, args.warmup, p, q, g) for c in configs for p in packed for q in precisions
               for g in groups(c)]
    print(f"\ntraining steps through trainer.fit, mean seconds a step over {args.steps} after {args.warmup} untimed")
    rows = [row for r in results for row in report_run(r, args.train_photos, results[0]["step"])]
    composer = next((c for c in configs if "composer_" in Path(c).name), None)
    if composer is not None:
        rows += report_predicate_ab(composer, predicate_transformer_ab(composer))
    mvsa = MVSA["flickr8k" if any("flickr8k" in c for c in configs) else "world"]
    rows += report_length_groups_ab(mvsa, length_groups_ab(mvsa))
    print()
    for a in results:
        print("step time / the first row's: " + f"{a['step'] / results[0]['step']:.2f}x  {a['label']}")
    seeds = sorted({r["seed"] for r in results if isinstance(r["seed"], int) and not isinstance(r["seed"], bool)})
    write_table_record(args.record, f"cross-encoder training steps through trainer.fit, mean of {args.steps} after "
                       f"{args.warmup} untimed: phases, forward parts, A/B checks", TABLE, rows,
                       config=list(dict.fromkeys([*configs, mvsa])), seeds=seeds or None, steps=args.steps,
                       warmup=args.warmup, train_photos=args.train_photos)
    return 0


def report_run(r: dict, train_photos: int, first_step: float) -> list[dict]:
    """Print one fit's step (its phases, its forward's parts, its host synchronisations) and return its record rows:
    the step, then a row a phase, then a row a forward part."""
    scale = train_photos / r["photos"]
    hours = r["step"] * r["steps_per_epoch"] * scale * r["max_epochs"] / 3600
    print(f"\n{r['label']}: {r['step']:.3f} s/step; {r['steps_per_epoch']} steps an epoch on "
          f"{r['photos']} photos, {r['max_epochs']} epochs -> {hours:.1f} h for {train_photos} photos "
          f"at this rate; {r['params'] / 1e6:.1f} M parameters, {r['trainable'] / 1e6:.1f} M trained")
    syncs = None if r["syncs"] is None else sum(r["syncs"].values())
    top = None if r["syncs"] is None else ", ".join(f"{site} {n:.1f}" for site, n in
                                                    sorted(r["syncs"].items(), key=lambda kv: -kv[1])[:8])
    rows = [{"section": "step", "run": r["label"], "part": "step", "seconds": r["step"], "percent": None,
             "ratio": r["step"] / first_step, "hours": hours, "config": r["config"], "steps_per_epoch": r["steps_per_epoch"],
             "photos": r["photos"], "max_epochs": r["max_epochs"], "train_photos": train_photos,
             "params_m": r["params"] / 1e6, "trainable_m": r["trainable"] / 1e6, "syncs_per_step": syncs, "sync_sites": top}]
    for phase in ("forward", "backward", "optimizer update", "wait for the batch"):
        sec = r["phases"].get(phase, 0.0)
        print(f"  {phase:22s} {sec:7.3f} s  {100 * sec / r['step']:5.1f} %")
        rows.append({"section": "phase", "run": r["label"], "part": phase, "seconds": sec, "percent": 100 * sec / r["step"]})
    forward = r["phases"]["forward"]
    for name, sec in sorted(r["parts"].items(), key=lambda kv: -kv[1]):
        print(f"    forward: {name:28s} {sec:7.3f} s  {100 * sec / forward:5.1f} % of the forward")
        rows.append({"section": "forward part", "run": r["label"], "part": name, "seconds": sec, "percent": 100 * sec / forward})
    if r["syncs"] is not None:
        print(f"  host synchronisations a step (torch.cuda sync debug): {syncs:.1f}; {top}")
    return rows


def report_predicate_ab(config: str, ab: dict) -> list[dict]:
    """Print :func:`predicate_transformer_ab`'s result; its two record rows (padded, then real tokens only)."""
    print(f"\nCOMPOSER's Predicate Transformer, fwd + bwd over 6 batches of templates ({100 * ab['padding']:.0f} % "
          f"padding), interleaved: padded {ab[False]:.2f} s, real tokens only {ab[True]:.2f} s: "
          f"{ab[True] / ab[False]:.2f}x")
    run = f"{Path(config).name}: Predicate Transformer, fwd + bwd over 6 batches of templates, interleaved"
    return [{"section": "predicate transformer A/B", "run": run, "part": part, "seconds": ab[key],
             "ratio": ab[True] / ab[False] if key else None, "padding_percent": 100 * ab["padding"]}
            for part, key in (("padded", False), ("real tokens only", True))]


def report_length_groups_ab(config: str, ab: dict) -> list[dict]:
    """Print :func:`length_groups_ab`'s result; its two record rows (length_groups 1, then 8)."""
    print(f"\n{Path(config).name}: ℓ_match + ℓ_MVSA fwd + bwd over 3 batches ({100 * ab['concept_padding']:.0f} % of the "
          f"concept texts' word-piece slots padding), interleaved: length_groups 1 {ab[1]:.2f} s, 8 {ab[8]:.2f} s: "
          f"{ab[8] / ab[1]:.2f}x")
    run = f"{Path(config).name}: ℓ_match + ℓ_MVSA fwd + bwd over 3 batches, interleaved"
    return [{"section": "length groups A/B", "run": run, "part": f"length_groups {g}", "seconds": ab[g],
             "ratio": ab[8] / ab[1] if g == 8 else None, "padding_percent": 100 * ab["concept_padding"]} for g in (1, 8)]


if __name__ == "__main__":
    raise SystemExit(main())
