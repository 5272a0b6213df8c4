"""Every model of the suite trained for a few steps at the papers' shapes: steps/s, peak memory, host synchronisations
a step, and the GPU-hours each paper table needs at that rate. `make gpu-check` runs it.

    python benchmarks/gpu_check.py [--accelerator auto|gpu|cpu] [--steps 20] [--warmup 3] [--models NAME ...]
        [--precision bf16-mixed] [--batch-size N] [--no-feature-cache] [--out reports/gpu_check] [--record NAME]

Each model is built as ``python -m grounding fit`` builds it (``grounding.cli.build_stage``): the *model* section of
its paper config (``experiments/*/*_paper.yaml``, ``ste_wordnet.yaml``, ``align_paper.yaml``: the paper's widths,
depths and per-device batch), the *data* section of its world config (the embedded world in the same dataset layout;
`make world` makes it), and Lightning's Trainer on one device under ``--precision`` (the papers' GPUs: ``bf16-mixed``).
Where the paper's weights are not on this machine the shapes are kept with random weights, and the table says so:
``bert-base-uncased`` becomes a random BERT-base (768 wide, 12 layers, 12 heads, the same uncased vocabulary), VGG16's
ImageNet weights random VGG16 weights, and Bottom-Up Attention's detector regions random 36 × 2048 features with
boxes (one ``.npz`` an image, written once under the cache folder). The alignment transform trains on random
(VLM text embedding, STE target) pairs at the paper's widths (512 → 300), its data being cached embeddings.

Per model, over the ``--steps`` steps after ``--warmup``: steps/s (every step's end waits for the GPU's queued work),
the peak memory the device allocator held, the host synchronisations a step (on a GPU ``torch.cuda.set_sync_debug_mode
("warn")`` over the whole step; on a CPU :class:`grounding.host_sync.SyncCounter` over the forward and backward),
and the GPU-hours of the paper's schedule at that rate: epochs × training items ÷ per-device batch ÷ steps/s (one
GPU; n GPUs take 1/n of the hours at the same per-device batch, DDP's overhead aside). The schedules and their sources
(paper section, config, authors' code) are in :data:`ROWS`. The report goes to ``--out``: a Markdown table and a JSON
record named after the device; ``--record NAME_OR_PATH`` (`make gpu-check`: ``reports/bench/gpu_check.json``) also
writes the table as a record of ``grounding/docs_tables.py``'s schema, a row a model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from lightning.pytorch import Callback, LightningDataModule, Trainer
from table_record import add_record_option, write_table_record
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import grounding.cli as grounding_cli  # noqa: E402
from grounding.cli import build_stage  # noqa: E402
from grounding.encoders import BERT_BASE_RANDOM, MissingWeightsError, load_text_encoder, load_visual_backbone  # noqa: E402
from grounding.host_sync import SyncCounter  # noqa: E402
from grounding.nets import class_of  # noqa: E402
from grounding.paths import cache_dir  # noqa: E402
from grounding.semclip.alignment import AlignmentTransform  # noqa: E402
from grounding.semclip.alignment_training import SemCLIPAlignment  # noqa: E402
from grounding.stage_config import expand_config_bases, read_config_yaml  # noqa: E402


@dataclass(frozen=True)
class Schedule:
    """The paper's training schedule: ``epochs`` over ``items`` training items (``item`` says what one is)."""

    items: int
    item: str
    epochs: int
    source: str


@dataclass(frozen=True)
class Row:
    name: str
    paper_config: str
    world_config: str | None  # whose data section the check trains on; None: synthetic pairs (the alignment)
    tables: str
    schedule: Schedule
    notes: str = ""
    extra: dict = field(default_factory=dict)


C = "experiments/composer"
F30K = Schedule(145_000, "Flickr30K Karpathy train captions, every caption an epoch", 20,
                "App. C: 20 epochs, mini-batch 64; 29,000 images x 5 captions (§5.1)")
ROWS = [
    Row("VG-BERT stage 1", "experiments/vgbert/stage1_paper.yaml", "experiments/vgbert/stage1_tiny.yaml",
        "VG-BERT Tables 1-2, Figs. 3-6 (the grounded space)",
        Schedule(118_287, "COCO train2017 images, one caption each an epoch", 100,
                 "App. A.2: 118,287 images, 100 epochs, batch 180 (3 GPUs x 60)")),
    Row("VG-BERT stage 2", "experiments/vgbert/stage2_paper.yaml", "experiments/vgbert/stage2_tiny.yaml",
        "VG-BERT App. Table 5, §3.3",
        Schedule(93_512, "Visual Genome training images", 150, "App. A.3: 93,512 samples; A.3.2: 150 epochs, batch 180")),
    Row("VG-BERT stage 3 (search heads)", "experiments/vgbert/search_paper.yaml", "experiments/vgbert/search_tiny.yaml",
        "VG-BERT Fig. 7",
        Schedule(118_287, "COCO train2017 images, one caption each an epoch", 150,
                 "the authors' code: 150 epochs, batch 300 (the paper gives none)")),
    Row("dual encoder (CLIP-style)", "experiments/vgbert/baseline_paper.yaml", "experiments/vgbert/baseline_tiny.yaml",
        "the suite's comparison (no paper table)",
        Schedule(113_287, "COCO Karpathy train+restval images, one caption each an epoch", 100,
                 "the config: stage 1's 100 epochs")),
    Row("VSE", f"{C}/vse_f30k_paper.yaml", f"{C}/vse_world.yaml", "COMPOSER Table 2(a), Table 5", F30K),
    Row("ViLBERT-style", f"{C}/vilbert_f30k_paper.yaml", f"{C}/vilbert_world.yaml", "COMPOSER Table 2(a), Fig. 4", F30K),
    Row("ViLBERT + MVSA", f"{C}/vilbert_mvsa_f30k_paper.yaml", f"{C}/vilbert_mvsa_world.yaml", "COMPOSER Table 5", F30K),
    Row("COMPOSER", f"{C}/composer_f30k_paper.yaml", f"{C}/composer_world.yaml",
        "COMPOSER Table 2(a), Tables 3-6, Fig. 4", F30K),
    Row("SemCLIP STE", "experiments/semclip/ste_wordnet.yaml", "experiments/semclip/ste_world.yaml",
        "SemCLIP Tables 1-2",
        Schedule(145_220, "WordNet noun anchors with a similarity list (the suite's lists)", 10,
                 "§3: at most 10 epochs, batch 800"),
        notes="the world's noun subset: the embedding table is smaller than the paper's 146,347 lemmas"),
    Row("SemCLIP alignment", "experiments/semclip/align_paper.yaml", None, "SemCLIP Tables 3-4",
        Schedule(760_000, "captions (about 800,000, 95 % trained on)", 200, "§4: ~800,000 captions, 200 epochs, batch 512"),
        notes="random (VLM, STE) pairs at the paper's widths 512 -> 300"),
]
REGIONS, REGION_DIM = 36, 2048  # Bottom-Up Attention's fixed 36 regions (ViLBERT's and COMPOSER's inputs)
DATA_LOADER_KEYS = ("batch_size", "eval_batch_size", "caption_batch_size", "num_workers")


# ---------------------------------------------------------------------------------------------- configs
def resolved(config: str) -> dict:
    """A config file with its ``base:`` chain merged (a later mapping's keys over an earlier one's; a class spec naming
    another class replaces the earlier one)."""
    out: dict = {}
    args = expand_config_bases(["--config", config])
    for value in args[1::2]:
        inline = "\n" in value or len(value) > 255  # a YAML string of the chain, not a file name
        part = yaml.safe_load(value) if inline else read_config_yaml(Path(value))
        part.pop("base", None)
        out = _merge(out, part)
    return out


def _merge(a, b):
    if not isinstance(a, dict) or not isinstance(b, dict):
        return copy.deepcopy(b)
    if "class_path" in b and a.get("class_path") not in (None, b["class_path"]):
        return copy.deepcopy(b)
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(a.get(k), v) if k in a else copy.deepcopy(v)
    return out


def _walk(node, fn, key=None):
    """Apply ``fn(key, value) -> value`` to every (key, value) of a nested mapping, depth first."""
    if isinstance(node, dict):
        return {k: fn(k, _walk(v, fn, k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, fn, key) for v in node]
    return node


def text_encoder_available(name: str) -> bool:
    try:
        load_text_encoder(name, num_hidden_layers=1)
        return True
    except (MissingWeightsError, OSError, ValueError):
        return False


def vgg16_weights_available() -> bool:
    try:
        load_visual_backbone("vgg16", "default", freeze=True)
        return True
    except (MissingWeightsError, OSError, RuntimeError):
        return False


def offline_model(model: dict, stand_ins: list[str]) -> dict:
    """The paper's model section, with what this machine lacks replaced at the same shapes (noted in ``stand_ins``),
    and no earlier stage's checkpoint to start from."""
    cache: dict[str, bool] = {}

    def fix(key, value):
        if key == "text_encoder" and isinstance(value, str) and value not in ("minilm", "tiny-random", BERT_BASE_RANDOM):
            if value not in cache:
                cache[value] = text_encoder_available(value)
            if not cache[value]:
                stand_ins.append(f"{value} -> random BERT-base")
                return BERT_BASE_RANDOM
        if key in ("init_from", "visual_init_from") and value:
            stand_ins.append(f"{key}: none (no earlier stage here)")
            return None
        return value

    model = _walk(model, fix)

    def weights(node):
        if isinstance(node, dict):
            if node.get("backbone") == "vgg16" and node.get("backbone_weights") == "default":
                if "vgg16" not in cache:
                    cache["vgg16"] = vgg16_weights_available()
                if not cache["vgg16"]:
                    stand_ins.append("VGG16 ImageNet weights -> random")
                    node = {**node, "backbone_weights": None}
            return {k: weights(v) for k, v in node.items()}
        return node

    return weights(model)


@contextlib.contextmanager
def random_linked_backbone(config: dict, stand_ins: list[str]):
    """A stage whose CNN weights follow ``init_from`` (the CLI's link: ImageNet's without a checkpoint) gets a random
    VGG16 when ImageNet's file is not on this machine, as the rows that name their weights do."""
    net = config["model"].get("init_args", {}).get("net", {}).get("init_args", {})
    linked = "init_from" in config["model"].get("init_args", {}) and "backbone_weights" not in net
    if not (linked and net.get("backbone") == "vgg16" and not vgg16_weights_available()):
        yield
        return
    original = grounding_cli.weights_unless_init_from
    grounding_cli.weights_unless_init_from = lambda init_from: None
    stand_ins.append("VGG16 ImageNet weights -> random")
    try:
        yield
    finally:
        grounding_cli.weights_unless_init_from = original


def region_files(world: Path, images: list[Path]) -> Path:
    """Random Bottom-Up-Attention-shaped regions (36 x 2048 features, boxes in pixels) for every image, written once."""
    out = cache_dir() / "gpu_check" / f"regions_{REGIONS}x{REGION_DIM}_{len(images)}"
    if (out / ".complete").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for path in images:
        xy = rng.uniform(0, 100, size=(REGIONS, 2))
        wh = rng.uniform(8, 28, size=(REGIONS, 2))
        np.savez(out / f"{path.stem}.npz", features=np.abs(rng.normal(size=(REGIONS, REGION_DIM))).astype(np.float16),
                 boxes=np.concatenate([xy, xy + wh], 1).astype(np.float32), image_h=128, image_w=128)
    (out / ".complete").touch()
    return out


def check_config(row: Row, args, stand_ins: list[str]) -> dict:
    """The config the check trains: the paper's model, the world's data at the paper's per-device batch."""
    paper = resolved(str(REPO / row.paper_config))
    world = resolved(str(REPO / row.world_config))
    model = offline_model(paper["model"], stand_ins)
    data = copy.deepcopy(world["data"])
    paper_data = paper.get("data", {}).get("init_args", {})
    for key in ("batch_size",):
        if key in paper_data:
            data["init_args"][key] = paper_data[key]
    if args.batch_size:
        data["init_args"]["batch_size"] = args.batch_size
    if "num_workers" in inspect.signature(class_of(data["class_path"])).parameters:  # a DataModule without a loader group
        data["init_args"]["num_workers"] = args.num_workers
    else:
        data["init_args"].setdefault("loader", {})["num_workers"] = args.num_workers
    net = model.get("init_args", {}).get("net", {}).get("init_args", {})
    if net.get("region_source") == "files":
        root = REPO / data["init_args"]["captions"]["init_args"]["root"]
        images = sorted((root / "images").glob("*.jpg"))
        data["init_args"].setdefault("region_inputs", {})["region_files"] = str(region_files(root, images))
        stand_ins.append(f"detector regions -> random {REGIONS} x {REGION_DIM}")
    if args.no_feature_cache and "feature_cache" in model.get("init_args", {}):
        model["init_args"]["feature_cache"] = False
    if row.notes:
        stand_ins.append(row.notes)
    return {"model": model, "data": data}


class PairsDataModule(LightningDataModule):
    """Random (VLM text embedding, STE target) pairs: the alignment transform's training data at the paper's widths."""

    def __init__(self, batch_size: int, vlm_dim: int = 512, ste_dim: int = 300, batches: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        n = batch_size * batches
        self.data = TensorDataset(torch.randn(n, vlm_dim, generator=g),
                                  torch.nn.functional.normalize(torch.randn(n, ste_dim, generator=g), dim=1))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True, drop_last=True)


def alignment_check(row: Row, args):
    """SemCLIP's alignment transform as its paper config builds it (hidden width, optimizer), on random pairs at
    CLIP ViT-B/32's text width (512) and the STE's (300): (module, DataModule, batch)."""
    paper = resolved(str(REPO / row.paper_config))
    hidden = paper["model"]["init_args"]["net"]["init_args"].get("hidden", 4096)
    optimizer = paper["model"]["init_args"].get("optimizer", {})
    kwargs = optimizer.get("init_args", {})
    cls = {"torch.optim.AdamW": torch.optim.AdamW, "torch.optim.Adam": torch.optim.Adam}[optimizer.get("class_path",
                                                                                                      "torch.optim.AdamW")]
    module = SemCLIPAlignment(AlignmentTransform(in_dim=512, out_dim=300, hidden=hidden),
                              optimizer=lambda params: cls(params, **kwargs))
    batch = args.batch_size or paper["data"]["init_args"]["batch_size"]
    return module, PairsDataModule(batch), batch


# ---------------------------------------------------------------------------------------------- measuring
class StepMeter(Callback):
    """Wall time of each training step (the device's queued work included), the peak allocator memory of the timed
    steps, and the host synchronisations each step makes."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.times: list[float] = []
        self.syncs: list[int] = []
        self.sites: dict[str, int] = {}
        self._start = 0.0
        self._counter: SyncCounter | None = None
        self._caught: list | None = None
        self._catcher = None

    def _cuda(self, trainer) -> bool:
        return trainer.strategy.root_device.type == "cuda"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        timed = trainer.global_step >= self.warmup
        if self._cuda(trainer):
            torch.cuda.synchronize()
            if timed and self._caught is None:
                torch.cuda.reset_peak_memory_stats()
            if timed:
                self._catcher = warnings.catch_warnings(record=True)
                self._caught = self._catcher.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
        elif timed:
            self._counter = SyncCounter()
            self._counter.__enter__()
        self._start = time.perf_counter()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self._counter is not None:  # a CPU's count: the forward and backward (the optimizer's own reads are host)
            self._counter.__exit__(None, None, None)
            self.syncs.append(self._counter.total)
            for site, n in self._counter.where.items():
                self.sites[site] = self.sites.get(site, 0) + n
            self._counter = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._cuda(trainer):
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self._start
        if trainer.global_step > self.warmup:
            self.times.append(elapsed)
        if self._catcher is not None:
            caught = [w for w in self._caught if "synchroniz" in str(w.message)]
            self._catcher.__exit__(None, None, None)
            self._catcher, self._caught = None, []
            self.syncs.append(len(caught))
            for w in caught:
                site = f"{Path(w.filename).name}:{w.lineno}"
                self.sites[site] = self.sites.get(site, 0) + 1


def run_row(row: Row, args, device_name: str) -> dict:
    stand_ins: list[str] = []
    result = {"model": row.name, "paper_config": row.paper_config, "tables": row.tables, "status": "ok"}
    start = time.perf_counter()
    try:
        trainer_cfg = {"max_steps": args.warmup + args.steps, "max_epochs": -1, "accelerator": args.accelerator,
                       "devices": 1, "precision": args.precision, "limit_val_batches": 0, "num_sanity_val_steps": 0,
                       "enable_checkpointing": False}
        with tempfile.TemporaryDirectory() as tmp:
            if row.world_config is None:  # the model alone, on random pairs
                module, dm, batch = alignment_check(row, args)
            else:
                config = check_config(row, args, stand_ins)
                with random_linked_backbone(config, stand_ins):
                    cli = build_stage(yaml.safe_dump(config), workdir=tmp)
                dm, module = cli.datamodule, cli.model
                batch = config["data"]["init_args"]["batch_size"]
            meter = StepMeter(args.warmup)
            trainer = Trainer(**trainer_cfg, logger=False, callbacks=[meter], default_root_dir=tmp, enable_progress_bar=False,
                              enable_model_summary=False)
            trainer.fit(module, dm)
        if not meter.times:
            raise RuntimeError("no timed step ran (fewer training batches than --warmup + --steps?)")
        step = statistics.median(meter.times)
        per_device_steps = row.schedule.epochs * -(-row.schedule.items // batch)
        result.update({
            "batch": batch, "steps_timed": len(meter.times), "s_per_step": step, "steps_per_s": 1 / step,
            "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if torch.cuda.is_available()
            and args.accelerator != "cpu" else None,
            "syncs_per_step": statistics.mean(meter.syncs) if meter.syncs else None,
            "sync_sites": dict(sorted(meter.sites.items(), key=lambda kv: -kv[1])[:6]),
            "params_m": sum(p.numel() for p in module.parameters()) / 1e6,
            "paper_steps_one_gpu": per_device_steps, "gpu_hours": per_device_steps * step / 3600,
            "schedule": vars(row.schedule), "stand_ins": stand_ins,
        })
    except Exception as e:  # one model's failure is a row of the report, not the end of the check
        result.update({"status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                       "traceback": traceback.format_exc()[-3000:], "stand_ins": stand_ins})
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.empty_cache()
    result["wall_s"] = time.perf_counter() - start
    return result


def device_name(accelerator: str) -> str:
    if accelerator != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def markdown(results: list[dict], meta: dict) -> str:
    unit = "CPU" if meta["device"].startswith("CPU") else "GPU"
    lines = [f"# gpu-check on {meta['device']}", "",
             f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, precision {meta['precision']}, "
             f"{meta['steps']} timed steps after {meta['warmup']} (median step).", "",
             f"| model | paper table(s) | batch | steps/s | peak memory | syncs/step | paper schedule (1 device) | {unit}-hours | "
             "stand-ins |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['tables']} | | {r['status']} | | | | | {'; '.join(r['stand_ins'])} |")
            continue
        mem = f"{r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else "—"
        syncs = f"{r['syncs_per_step']:.1f}" if r["syncs_per_step"] is not None else "—"
        lines.append(f"| {r['model']} | {r['tables']} | {r['batch']} | {r['steps_per_s']:.2f} | {mem} | {syncs} | "
                     f"{r['paper_steps_one_gpu']:,} steps ({r['schedule']['epochs']} epochs) | {r['gpu_hours']:.1f} | "
                     f"{'; '.join(r['stand_ins']) or '—'} |")
    lines += ["", "Schedules: " + "; ".join(f"{r['model']}: {r['schedule']['source']}" for r in results
                                            if r["status"] == "ok"), ""]
    return "\n".join(lines)


def record_table(unit: str) -> list[tuple[str, str]]:
    """The record's columns and their headers (``unit``: CPU or GPU, the hours' device)."""
    return [("model", "model"), ("tables", "paper table(s)"), ("status", "status"), ("batch", "batch"),
            ("steps_per_s", "steps/s"), ("peak_memory_gib", "peak memory (GiB)"), ("syncs_per_step", "syncs/step"),
            ("paper_steps_one_gpu", "paper schedule (1 device, steps)"), ("epochs", "epochs"),
            ("gpu_hours", f"{unit}-hours"), ("stand_ins", "stand-ins")]


def record_rows(results: list[dict]) -> list[dict]:
    """The report's rows as a record's (``--record``): the Markdown table's columns as numbers, a failed model's row
    with its status and nulls."""
    keys = ("model", "tables", "batch", "steps_per_s", "s_per_step", "peak_memory_gib", "syncs_per_step", "paper_steps_one_gpu",
            "gpu_hours", "params_m", "steps_timed", "wall_s", "paper_config")
    return [{**{k: r.get(k) for k in keys}, "status": r["status"], "epochs": (r.get("schedule") or {}).get("epochs"),
             "stand_ins": "; ".join(r.get("stand_ins") or []) or None, "schedule": (r.get("schedule") or {}).get("source"),
             "sync_sites": r.get("sync_sites") or None} for r in results]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accelerator", default="auto", choices=("auto", "gpu", "cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per model")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--precision", default=None,
                    help="the Trainer's precision (default: bf16-mixed on a GPU, as the papers' GPUs; 32-true on a CPU)")
    ap.add_argument("--models", nargs="+", default=None, metavar="NAME",
                    help=f"a subset, by name or a word of it (default: all of {[r.name for r in ROWS]})")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="every model's per-device batch (default: the paper's on a GPU; 4 on a CPU, the CPU form)")
    ap.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    ap.add_argument("--feature-cache", choices=("auto", "on", "off"), default="auto",
                    help="cache the frozen CNN's maps before training, as the paper configs do (auto: on a GPU; on a CPU "
                         "the CNN runs on each small batch instead of on every world image first)")
    ap.add_argument("--out", default="reports/gpu_check", help="folder of the Markdown and JSON report")
    add_record_option(ap)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    on_cpu = args.accelerator == "cpu" or (args.accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu:  # the CPU form: the papers' widths and depths at a batch a CPU steps through in seconds
        args.accelerator = "cpu"
        args.batch_size = args.batch_size or 4
    args.precision = args.precision or ("32-true" if on_cpu else "bf16-mixed")
    args.no_feature_cache = args.feature_cache == "off" or (args.feature_cache == "auto" and on_cpu)
    if args.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        print("gpu-check: --accelerator gpu but torch sees no CUDA device; run with --accelerator cpu for the CPU form",
              file=sys.stderr)
        return 2
    if not (REPO / "data/world/world.json").is_file():
        print("gpu-check: no embedded world at data/world: run `make world` first", file=sys.stderr)
        return 2
    rows = ROWS if not args.models else [r for r in ROWS if any(m.lower() in r.name.lower() for m in args.models)]
    if not rows:
        ap.error(f"--models matched none of {[r.name for r in ROWS]}")
    name = device_name(args.accelerator)
    unit = "CPU" if args.accelerator == "cpu" else "GPU"
    print(f"gpu-check on {name}: {len(rows)} models, {args.warmup} + {args.steps} steps each, {args.precision}",
          flush=True)
    results = []
    for row in rows:
        r = run_row(row, args, name)
        results.append(r)
        if r["status"] == "ok":
            mem = f", peak {r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else ""
            syncs = f", {r['syncs_per_step']:.1f} syncs/step" if r["syncs_per_step"] is not None else ""
            print(f"  {row.name}: batch {r['batch']}, {r['steps_per_s']:.2f} steps/s{mem}{syncs}; "
                  f"{row.tables}: {r['gpu_hours']:.1f} {unit}-hours ({r['wall_s']:.0f} s)", flush=True)
        else:
            print(f"  {row.name}: {r['status']}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    meta = {"device": name, "date": datetime.date.today().isoformat(), "commit": commit or "unknown",
            "torch": torch.__version__, "precision": args.precision, "steps": args.steps, "warmup": args.warmup,
            "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    out = REPO / args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()[:60]
    for path, text in ((out / f"{stem}.json", json.dumps({**meta, "results": results}, indent=1)),
                       (out / f"{stem}.md", markdown(results, meta))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    print(f"report: {out / (stem + '.md')}")
    configs = [c for r in rows for c in (r.paper_config, r.world_config) if c]
    write_table_record(args.record, f"gpu-check on {name}: {args.steps} timed steps after {args.warmup} (median step), "
                       f"{args.precision}", record_table(unit), record_rows(results), config=configs, device=name,
                       precision=args.precision, steps=args.steps, warmup=args.warmup, torch=torch.__version__)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
