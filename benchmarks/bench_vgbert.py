"""VG-BERT stage-1 benchmarks, side by side from one run.

1. **Match-map loss, training** (Eq. 1-2, fwd + bwd) at the paper's shapes (14x14 locations, T = 16,
   d = 768), batch 32 and 64: the suite (:class:`grounding.vgbert.match_map.MaxMatchScores`, sparse backward)
   against a re-statement of the authors' loss (``benchmarks/official_vgbert_loss.py``) and against the
   dense-``amax`` einsum the suite used before, interleaved repeats (medians), losses checked equal first;
   GFLOP/s count the forward's useful FLOPs, next to a dense GEMM of those FLOPs timed in the same run.
2. **Match-map scoring, evaluation**: the block scorer (``chunked_match_scores``) against the same dense GEMM rate.
3. **Evaluation memory**: peak RSS of a fresh process running the stage-1 LightningModule's real test loop
   (``trainer.test``: ``test_step`` collection, ``on_test_epoch_end`` scoring and ranking) on random features
   of the paper's shapes, at 1K images x 5K captions and 5K x 25K (COCO 5K). On a CPU the full scoring is
   10^14-10^15 FLOPs, so the scorer runs for real on one image chunk x one caption chunk (its transient
   memory is the same for every block) and the rest of the score matrix is filled at random before ranking.
4. **Feature cache**: stage-1 training steps through ``trainer.fit`` on the Flickr8k photos with the frozen
   backbone recomputed (JPEG decoding included) vs read from the cache, with BERT on real tokens only
   (``packed_tokens``, the paper configs) and padded (before), and the cached steps' top operators.

    python benchmarks/bench_vgbert.py [--sections loss scoring memory cache] [--device cuda] [--record NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))
from official_vgbert_loss import official_match_map_loss  # noqa: E402
from table_record import add_record_option, write_table_record  # noqa: E402

from grounding.contrastive import cross_modal_contrastive_loss  # noqa: E402
from grounding.paths import resolve_path  # noqa: E402
from grounding.utils.memory import fix_mmap_threshold  # noqa: E402
from grounding.vgbert import GroundingPretrain, MatchMapGrounding  # noqa: E402
from grounding.vgbert.match_map import (  # noqa: E402
    chunked_match_scores,
    einsum_match_scores,
    match_map_flops,
    match_map_scores,
)
from grounding.vgbert.pretrain import EVAL_BLOCKS  # noqa: E402

SIDE, TOKENS, WIDTH = 14, 16, 768  # the paper's VGG16 grid, caption length, BERT-base width
# the record's columns (--record): every section's rows in one table, a section's own columns null in the others' rows
TABLE = [("section", "section"), ("table", "table"), ("method", "method"), ("status", "status"), ("seconds", "seconds"),
         ("gflop_per_s", "GFLOP/s"), ("ratio", "the reference row's seconds / this row's"), ("reference", "reference row"),
         ("peak_gpu_gib", "peak GPU memory (GiB)"), ("features_gib", "features (GiB)"), ("scores_gib", "scores (GiB)"),
         ("before_test_gib", "RSS before test (GiB)"), ("peak_rss_gib", "peak RSS, the suite (GiB, each run)"),
         ("peak_rss_gib_dynamic", "peak RSS, glibc dynamic threshold (GiB, each run)"), ("cache_build_s", "cache build (s)"),
         ("recompute_s", "recompute (s/step)"), ("cached_s", "cached (s/step)"), ("speedup", "speed-up"),
         ("padded_recompute_s", "padded text: recompute (s/step)"), ("padded_cached_s", "padded text: cached (s/step)"),
         ("padded_speedup", "padded text: speed-up")]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each function, run in turn ``repeats`` times after one warm-up each."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            _sync(device)
            t = time.perf_counter()
            f()
            _sync(device)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _table(title: str, rows: list[tuple[str, float, float]], reference: int = 0, label: str = "speed-up",
           section: str = "loss") -> list[dict]:
    """Rows (name, seconds, useful FLOPs); the last column is rows[reference]'s time over each row's. Printed; returns
    the record's rows."""
    print(f"\n[{title}]")
    print(f"{'method':<60}{'seconds':>10}{'GFLOP/s':>10}{label:>12}")
    ref = rows[reference][1]
    out = []
    for name, t, flops in rows:
        print(f"{name:<60}{t:>10.3f}{flops / t / 1e9:>10.1f}{ref / t:>11.2f}x")
        out.append({"section": section, "table": title, "method": name, "status": "ok", "seconds": t,
                    "gflop_per_s": flops / t / 1e9, "ratio": ref / t, "reference": rows[reference][0]})
    return out


def bench_training_loss(batches: list[int], repeats: int, device: torch.device, temperature: float = 0.1) -> list[dict]:
    """Eq. 1-2 forward + backward: official re-statement vs the suite's sparse backward vs the dense einsum."""
    return [row for b in batches for row in _training_loss_at(b, repeats, device, temperature)]


def _training_loss_at(b: int, repeats: int, device: torch.device, temperature: float) -> list[dict]:
    n = SIDE * SIDE
    g = torch.Generator().manual_seed(b)
    image = (0.1 * torch.randn(b, WIDTH, SIDE, SIDE, generator=g)).to(device).requires_grad_()
    words = (0.1 * torch.randn(b, TOKENS, WIDTH, generator=g)).to(device).requires_grad_()
    nwords = torch.randint(TOKENS // 2, TOKENS + 1, (b,), generator=g)  # [CLS] + words + [SEP], then padding
    mask = (torch.arange(TOKENS) < nwords[:, None]).to(device)

    # each implementation in its own layout: the official visual stream's (B, d, h, w), the suite's (B, h*w, d)
    native = image.detach().flatten(2).transpose(1, 2).contiguous().requires_grad_()

    def loss_of(scorer):
        def run():
            native.grad = words.grad = None
            s = scorer(native, words, mask, "mean")
            loss = cross_modal_contrastive_loss(s, temperature)["loss"]
            loss.backward()
            return loss.detach(), native.grad.transpose(1, 2).reshape(image.shape), words.grad
        return run

    def official():
        image.grad = words.grad = None
        loss = official_match_map_loss(image, words, nwords, temperature)
        loss.backward()
        return loss.detach(), image.grad, words.grad

    suite, dense = loss_of(match_map_scores), loss_of(einsum_match_scores)
    methods = {"official re-statement (loops, dense max)": official,
               "suite before: einsum, dense amax backward": dense,
               "suite: MaxMatchScores (sparse backward)": suite}
    reference, peak, runnable, failed = None, {}, {}, []
    for name, f in methods.items():  # same loss and gradients as the first that fits in memory
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            out = [x.clone() for x in f()]
            if device.type == "cuda":
                peak[name] = torch.cuda.max_memory_allocated(device) / 2**30
        except torch.OutOfMemoryError:
            image.grad = words.grad = native.grad = None
            print(f"  {name}: out of memory at batch {b}")
            failed.append({"section": "loss", "method": name, "status": f"out of memory at batch {b}"})
            continue
        runnable[name] = f
        if reference is None:
            reference = out
        else:
            assert torch.allclose(out[0], reference[0], rtol=1e-5), (out[0], reference[0])
            assert torch.allclose(out[1], reference[1], atol=1e-5) and torch.allclose(out[2], reference[2], atol=1e-5)
    visual, flat_words = native.detach().reshape(-1, WIDTH), words.detach().reshape(-1, WIDTH)
    runnable["one dense GEMM of the forward's FLOPs"] = lambda: visual @ flat_words.t()  # (B*N, d) @ (d, B*T)
    t = interleaved(runnable, repeats, device)
    flops = match_map_flops(b, b, n, TOKENS, WIDTH)
    rows = _table(f"match-map loss fwd+bwd, batch {b}, {SIDE}x{SIDE} locations, T={TOKENS}, d={WIDTH}, {device.type} "
                  f"({flops / 1e9:.1f} GFLOP forward)", [(k, v, flops) for k, v in t.items()])
    for name, gib in peak.items():
        print(f"  peak GPU memory, {name}: {gib:.2f} GiB")
    for row in rows:
        row["peak_gpu_gib"] = peak.get(row["method"])
    return rows + [{**row, "table": rows[0]["table"]} for row in failed]


def bench_scoring(n_img: int, n_cap: int, blocks: list[tuple[int, int]], repeats: int, device: torch.device) -> list[dict]:
    """Evaluation blocks (fp16 features stored, fp32 blocks) of several sizes vs a dense GEMM of the same FLOPs."""
    g = torch.Generator().manual_seed(0)
    n = SIDE * SIDE
    v = (0.1 * torch.randn(n_img, n, WIDTH, generator=g)).half()
    w = (0.1 * torch.randn(n_cap, TOKENS, WIDTH, generator=g)).half()
    mask = torch.arange(TOKENS) < torch.randint(TOKENS // 2, TOKENS + 1, (n_cap, 1), generator=g)
    flops = match_map_flops(n_img, n_cap, n, TOKENS, WIDTH)
    ic, tc = blocks[0]
    a = v[:ic].float().reshape(-1, WIDTH).to(device)
    b = w[:tc].float().reshape(-1, WIDTH).to(device)
    repeat = round((n_img / ic) * (n_cap / tc))
    fns = {f"block scorer, {ic} x {tc} blocks ({ic * tc * n * TOKENS * 4 / 2**20:.0f} MiB maps)": (
        lambda ic=ic, tc=tc: chunked_match_scores(v, w, mask, "sum", image_chunk=ic, text_chunk=tc, device=device))
        for ic, tc in blocks}
    fns[f"dense GEMM, same FLOPs ({repeat} x {ic * n} x {WIDTH} x {tc * TOKENS})"] = lambda: [b @ a.t() for _ in range(repeat)]
    t = interleaved(fns, repeats, device)
    return _table(f"match-map scoring (evaluation), {n_img} images x {n_cap} captions, {device.type} ({flops / 1e9:.0f} GFLOP)",
                  [(k, s, flops) for k, s in t.items()], reference=len(t) - 1, label="vs GEMM", section="scoring")


class RandomFeatureGrounding(GroundingPretrain):
    """Stage 1 whose encoders return seeded random features of the paper's shapes (memory benchmark only):
    everything else (test_step collection, on_test_epoch_end, the block scorer, ranking) is the suite's."""

    def encode_images(self, images):
        g = torch.Generator().manual_seed(int(images[0, 0, 0, 0]))
        return (0.1 * torch.randn(len(images), SIDE * SIDE, WIDTH, generator=g))

    def encode_texts(self, input_ids, attention_mask):
        g = torch.Generator().manual_seed(int(input_ids[0, 0]) + 1)
        return 0.1 * torch.randn(*input_ids.shape, WIDTH, generator=g), attention_mask.bool()

    def eval_scores(self, img, txt, mask):
        # The real scorer on one (image chunk x caption chunk) corner of the full-size result; every other
        # block allocates the same transient memory, so the peak is the same. The rest is random for ranking.
        ic, tc = EVAL_BLOCKS["cpu"]
        out = torch.empty(img.shape[0], txt.shape[0]).normal_()
        chunked_match_scores(img[:ic], txt[:tc], mask[:tc], self.hparams.word_reduction, ic, tc, out=out[:ic, :tc])
        return out


class _TestItems(torch.utils.data.Dataset):
    def __init__(self, images: int, captions_per_image: int):
        self.images, self.per = images, captions_per_image

    def __len__(self):
        return self.images

    def __getitem__(self, i):
        return i


def _collate(per: int):
    def collate(items):
        ix = torch.tensor(items)
        ids = (ix.repeat_interleave(per) * 7 + 1000).unsqueeze(1).repeat(1, TOKENS)
        lengths = torch.arange(len(ids)) % (TOKENS // 2) + TOKENS // 2
        return {"images": ix.float().view(-1, 1, 1, 1).expand(-1, 3, 1, 1).contiguous(), "image_index": ix,
                "input_ids": ids, "attention_mask": (torch.arange(TOKENS) < lengths[:, None]).long(),
                "caption_image_index": ix.repeat_interleave(per)}
    return collate


def _peak_rss_gib() -> float:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux carries the parent's peak
    across fork + exec into it, so a child started after a large benchmark would report the parent's."""
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return kib / 2**20


def memory_child(images: int, captions_per_image: int, batch: int, suite_start: int = 1) -> None:
    """Runs in a fresh process: the test loop of stage 1 on random paper-shape features; prints JSON.
    ``suite_start``: 1 starts as ``python -m grounding test`` does (glibc's mmap threshold fixed,
    grounding.utils.memory), 0 keeps glibc's dynamic threshold."""
    if suite_start:
        fix_mmap_threshold()
    warnings.filterwarnings("ignore")
    net = MatchMapGrounding(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=4,
                            trainable_layers=1, image_size=32)
    module = RandomFeatureGrounding(net, feature_cache=False)
    loader = torch.utils.data.DataLoader(_TestItems(images, captions_per_image), batch_size=batch,
                                         collate_fn=_collate(captions_per_image))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    before = _peak_rss_gib()
    t = time.perf_counter()
    metrics = trainer.test(module, loader, verbose=False)[0]
    peak = _peak_rss_gib()
    print(json.dumps({"peak_gib": peak, "before_gib": before, "seconds": time.perf_counter() - t,
                      "rsum": metrics["test/rsum"]}))


def _memory_run(images: int, per: int, batch: int, suite_start: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}  # nothing set by hand
    out = subprocess.run([sys.executable, __file__, "--memory-child", str(images), str(per), str(batch),
                          str(int(suite_start))], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_eval_memory(sizes: list[tuple[int, int]], batch: int, runs: int = 3) -> list[dict]:
    """Peak RSS of fresh processes running the test loop, no environment variable set: ``runs`` processes started
    as ``python -m grounding test`` starts (glibc's mmap threshold fixed at 4 MiB by grounding.utils.memory, so
    every large freed tensor returns to the system), and ``runs`` with glibc's dynamic threshold (which lets some
    runs keep freed fp32 model outputs as heap holes)."""
    title = ("evaluation memory: stage-1 test loop, random features 14x14x768 / T=16 stored fp16; peak RSS of fresh "
             "processes, no environment variable")
    print(f"\n[{title}]")
    print(f"{'images x captions':<20}{'features':>10}{'scores':>8}{'before test':>13}"
          f"{f'peak RSS, {runs} runs (the suite)':>34}{f'{runs} runs (glibc dynamic threshold)':>38}")
    rows = []
    for images, captions in sizes:
        per = captions // images
        suite = [_memory_run(images, per, batch) for _ in range(runs)]
        dynamic = [_memory_run(images, per, batch, suite_start=False) for _ in range(runs)]
        rows.append(memory_row(title, images, captions, suite, dynamic))
    return rows


def memory_row(title: str, images: int, captions: int, suite: list[dict], dynamic: list[dict]) -> dict:
    """Print one evaluation size's line and return its record row: ``suite`` / ``dynamic``, the child processes' JSON
    (``memory_child``)."""
    features = (images * SIDE * SIDE + captions * TOKENS) * WIDTH * 2 / 2**30
    peaks = " / ".join(f"{r['peak_gib']:.2f}" for r in suite)
    other = " / ".join(f"{r['peak_gib']:.2f}" for r in dynamic)
    print(f"{f'{images:,} x {captions:,}':<20}{features:>8.2f} G{images * captions * 4 / 2**30:>6.2f} G"
          f"{suite[0]['before_gib']:>11.2f} G{peaks + ' G':>34}{other + ' G':>38}")
    return {"section": "memory", "table": title, "method": f"{images:,} x {captions:,}", "status": "ok",
            "images": images, "captions": captions, "features_gib": features,
            "scores_gib": images * captions * 4 / 2**30, "before_test_gib": suite[0]["before_gib"],
            "peak_rss_gib": [r["peak_gib"] for r in suite], "peak_rss_gib_dynamic": [r["peak_gib"] for r in dynamic],
            "test_seconds": [r["seconds"] for r in suite + dynamic]}


def cache_row(title: str, backbone: str, build: float, packed: tuple[float, float], padded: tuple[float, float],
              profiles: tuple[str, str]) -> dict:
    """Print one backbone's line of the feature-cache table and return its record row: seconds a step (recomputed,
    cached) with BERT on real tokens (``packed``) and padded, the cached steps' profile tables (packed, padded)."""
    name = backbone + (" (random weights)" if backbone == "vgg16" else "")
    print(f"{name:<34}{build:>11.1f}s{packed[0]:>10.3f}s{packed[1]:>8.3f}s{packed[0] / packed[1]:>9.2f}x"
          f"{padded[0]:>23.3f}s{padded[1]:>8.3f}s{padded[0] / padded[1]:>9.2f}x")
    return {"section": "cache", "table": title, "method": name, "status": "ok", "cache_build_s": build,
            "recompute_s": packed[0], "cached_s": packed[1], "speedup": packed[0] / packed[1], "padded_recompute_s": padded[0],
            "padded_cached_s": padded[1], "padded_speedup": padded[0] / padded[1], "profile_packed": profiles[0] or None,
            "profile_padded": profiles[1] or None}


class _StepClock(Callback):
    """Wall time between consecutive training-batch ends: a whole step, the batch's loading included."""

    def __init__(self):
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ends.append(time.perf_counter())

    def step_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.ends, self.ends[1:])]  # the first step (warm-up) is not counted


def _stage1_fit(data, backbone: str, cache: bool, cache_dir: str, steps: int, profile_top: int = 0,
                visual_dropout: float | None = 0.0, packed_tokens: bool = True):
    """Fit stage 1 (MiniLM, top 4 layers trained, as the Flickr8k config) for ``steps`` + 1 batches; the median
    seconds of the steps after the first, and the profile's top operators when asked. ``visual_dropout``: the
    visual attention's dropout on attention probabilities and inside its FFN (0: the paper config's official
    layout; None: = dropout, the tiny / Flickr8k configs'). ``packed_tokens``: BERT on real tokens only (the paper
    configs) or padded to the batch's longest caption."""
    torch.manual_seed(0)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    weights = "default" if backbone == "efficientnet_lite0" else None  # VGG16's ImageNet file is not offline
    with contextlib.redirect_stderr(io.StringIO()):  # the weight-loading progress bar
        net = MatchMapGrounding(text_encoder="minilm", backbone=backbone, backbone_weights=weights, trainable_layers=4,
                                dropout=0.1, normalize=True, visual_heads=12, visual_attention_dropout=visual_dropout,
                                visual_ffn_dropout=visual_dropout, packed_tokens=packed_tokens)
    module = GroundingPretrain(net, word_reduction="sum", feature_cache=cache, feature_cache_dir=cache_dir)
    clock = _StepClock()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps + 1, limit_val_batches=0, num_sanity_val_steps=0,
                             logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[clock],
                             default_root_dir=root)
        table = ""
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # fit's own lines
            if profile_top:
                with torch.profiler.profile() as prof:
                    trainer.fit(module, data())
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile_top)
            else:
                trainer.fit(module, data())
    timed = clock.step_seconds()
    return (statistics.median(timed) if timed else float("nan")), table


def bench_feature_cache(backbones: list[str], steps: int, batch: int, profile_top: int) -> list[dict]:
    """Stage-1 training steps through the real fit loop (DataLoader, JPEG decoding, Lightning, Adam) on Flickr8k
    photos: the frozen backbone recomputed on pixels vs its maps read from the cache, per backbone."""
    from data_modules import FlickrDataModule  # noqa: PLC0415 - data modules are needed by this section only
    from data_modules.options import SplitSubsets  # noqa: PLC0415 - as above

    root = resolve_path("../shared/data/flickr8k")
    title = (f"stage-1 training through trainer.fit, Flickr8k photos (JPEG, 224px crops), MiniLM with its top 4 layers "
             f"trained, batch {batch}, median of {steps} steps after one")
    if not (Path(root) / "Flickr8k.token.1000img.txt").is_file():
        print(f"\n[stage-1 training, feature cache] skipped: the Flickr8k photos are not in {root}")
        return [{"section": "cache", "table": title, "status": f"skipped: the Flickr8k photos are not in {root}"}]
    images = batch * (steps + 1)  # the training photos the timed fit reads (the cache holds them and the dev split)

    def data():  # a fresh DataModule per fit: the cache swaps the image loading of the datasets it is given
        return FlickrDataModule(root=str(root), captions_file="Flickr8k.token.1000img.txt", batch_size=batch,
                                eval_batch_size=batch, subsets=SplitSubsets(train=images, test=batch))

    print(f"\n[{title}]")
    print(f"{'backbone':<34}{'cache build':>12}{'recompute':>11}{'cached':>9}{'speed-up':>10}"
          f"{'padded text: recompute':>24}{'cached':>9}{'speed-up':>10}")
    profiles, rows = [], []
    for backbone in backbones:
        with tempfile.TemporaryDirectory() as cache_dir:
            t = time.perf_counter()
            _stage1_fit(data, backbone, True, cache_dir, 0)  # builds the cache (train subset, dev, test subset)
            build = time.perf_counter() - t
            recompute, _ = _stage1_fit(data, backbone, False, cache_dir, steps)
            cached, after = _stage1_fit(data, backbone, True, cache_dir, steps, profile_top)
            padded_recompute, _ = _stage1_fit(data, backbone, False, cache_dir, steps, packed_tokens=False)
            padded, before = _stage1_fit(data, backbone, True, cache_dir, steps, profile_top, packed_tokens=False)
        profiles += [(backbone, "BERT on real tokens (packed_tokens, paper configs)", after),
                     (backbone, "BERT padded to the longest caption (before)", before)]
        rows.append(cache_row(title, backbone, build, (recompute, cached), (padded_recompute, padded), (after, before)))
    print("(seconds per step; every column uses the paper config's visual dropout)")
    for backbone, variant, profile in profiles:
        if profile:
            print(f"\ntop {profile_top} operators of the cached steps, {backbone}, {variant} (self CPU time):\n{profile}")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", default=["loss", "scoring", "memory", "cache"],
                   choices=["loss", "scoring", "memory", "cache"])
    p.add_argument("--device", default="cpu", help="cpu or cuda (loss and scoring sections)")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64], help="training batch sizes (loss section)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval-images", type=int, default=128)
    p.add_argument("--eval-captions", type=int, default=1024)
    p.add_argument("--memory-sizes", nargs="+", default=["1000x5000", "5000x25000"])
    p.add_argument("--backbones", nargs="+", default=["efficientnet_lite0", "vgg16"],
                   help="frozen backbones of the cache section (vgg16 = the paper's, random weights)")
    p.add_argument("--batch", type=int, default=64, help="training batch (cache section; the Flickr8k config's)")
    p.add_argument("--steps", type=int, default=4, help="timed training steps per variant (cache section)")
    p.add_argument("--profile-top", type=int, default=6, help="operators listed from the cached steps' profile")
    p.add_argument("--memory-child", type=int, nargs=4, help=argparse.SUPPRESS)
    add_record_option(p, help="also write the tables as one record (a row per printed row, its section in the "
                      "'section' column): docs/records/NAME.json, or this path ending in .json")
    args = p.parse_args(argv)
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    rows = []
    if "loss" in args.sections:
        rows += bench_training_loss(args.batches, args.repeats, device)
    if "scoring" in args.sections:
        rows += bench_scoring(args.eval_images, args.eval_captions, [(64, 256), (128, 512), (32, 128)], args.repeats, device)
    if "memory" in args.sections:
        rows += bench_eval_memory([tuple(int(x) for x in s.split("x")) for s in args.memory_sizes], batch=100)
    if "cache" in args.sections:
        rows += bench_feature_cache(args.backbones, args.steps, args.batch, args.profile_top)
    seeds = sorted({0, *(args.batches if "loss" in args.sections else [])})  # the loss section seeds each batch size
    write_table_record(args.record, "VG-BERT stage-1 benchmarks: match-map loss and scoring, evaluation memory, feature "
                       "cache", TABLE, rows, seeds=seeds, sections=args.sections, device=str(device), repeats=args.repeats,
                       torch=torch.__version__, threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
