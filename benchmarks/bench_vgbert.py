"""VG-BERT stage-1 benchmarks, side by side from one run.

1. Match-map scoring (Eq. 1) of every image against every caption: the chunked, einsum-vectorised
   evaluation (grounding.vgbert.match_map.chunked_match_scores) versus a per-pair Python loop on the
   same tensors, and versus this machine's dense matmul rate for the same FLOPs.
2. Stage-1 training steps per second with the frozen-backbone feature cache (features read from a
   numpy memmap) versus recomputing the frozen backbone on pixels every step.

    python benchmarks/bench_vgbert.py [--images 48 --captions 240 --batch 16 --steps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere
from grounding import feature_cache as fcache
from grounding.vgbert import GroundingPretrain, MatchMapGrounding
from grounding.vgbert.match_map import chunked_match_scores, match_map_flops, pair_loop_scores


def timed(fn, repeat: int = 1) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat


def bench_match_map(n_img: int, n_cap: int, locations: int, tokens: int, width: int) -> None:
    g = torch.Generator().manual_seed(0)
    v = torch.randn(n_img, locations, width, generator=g)
    w = torch.randn(n_cap, tokens, width, generator=g)
    mask = torch.ones(n_cap, tokens, dtype=torch.bool)
    mask[:, tokens * 3 // 4:] = False  # a quarter padding, as in real batches
    flops = match_map_flops(n_img, n_cap, locations, tokens, width)
    t_chunk = timed(lambda: chunked_match_scores(v, w, mask, image_chunk=32, text_chunk=128), repeat=2)
    t_loop = timed(lambda: pair_loop_scores(v, w, mask))
    assert torch.allclose(chunked_match_scores(v, w, mask), pair_loop_scores(v, w, mask), atol=1e-3)
    # Dense matmul with the same FLOP count: (m x k) @ (k x n) with m*n*k = flops / 2.
    side = int(round((flops / 2) ** (1 / 3)))
    a, b = torch.randn(side, side), torch.randn(side, side)
    t_mm = timed(lambda: a @ b, repeat=2) * (flops / (2.0 * side ** 3))
    print(f"\n[match-map scoring] {n_img} images x {n_cap} captions, {locations} locations, {tokens} tokens, d={width}"
          f" ({flops / 1e9:.2f} GFLOP)")
    print(f"{'method':<28}{'seconds':>10}{'GFLOP/s':>10}{'vs chunked':>12}")
    for name, t in (("chunked einsum (eval)", t_chunk), ("per-pair loop", t_loop), ("dense matmul, same FLOPs", t_mm)):
        print(f"{name:<28}{t:>10.3f}{flops / t / 1e9:>10.1f}{t / t_chunk:>11.2f}x")


def bench_feature_cache(text_encoder: str, backbone: str, batch: int, steps: int, image_size: int) -> None:
    torch.manual_seed(0)
    heads = 12 if text_encoder != "tiny-random" else 4
    weights = "default" if backbone == "efficientnet_lite0" else None
    module = GroundingPretrain(MatchMapGrounding(text_encoder=text_encoder, backbone=backbone, backbone_weights=weights,
                                                 visual_heads=heads, trainable_layers=2, dropout=0.1,
                                                 image_size=image_size))
    module.log = lambda *a, **k: None
    opt = torch.optim.Adam(module.trainable_parameters(), 1e-4)

    class Pixels:  # a dataset of deterministic "images" in the contract-B shape
        def __init__(self, n):
            self.image_paths = [f"synthetic_{i}" for i in range(n)]
            self.transform = "synthetic"

        def load_image(self, index):
            return torch.randn(3, image_size, image_size, generator=torch.Generator().manual_seed(int(index)))

    n = batch * steps
    data = Pixels(n)
    ids = torch.randint(1000, 2000, (batch, 16))
    ids[:, 0], ids[:, -1] = 101, 102
    att = torch.ones_like(ids)
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        loader = fcache.build_or_load(module.model.visual.backbone, data, root, batch_size=batch)
        t_build = time.perf_counter() - t0

        def run(use_cache: bool) -> float:
            t = time.perf_counter()
            for s in range(steps):
                idx = torch.arange(s * batch, (s + 1) * batch)
                images = loader.lookup(idx) if use_cache else torch.stack([data.load_image(int(i)) for i in idx])
                loss = module.training_step({"images": images, "input_ids": ids, "attention_mask": att,
                                             "image_index": idx}, s)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return steps / (time.perf_counter() - t)

        run(True)  # warm-up
        cached, recompute = run(True), run(False)
    print(f"\n[stage-1 training] {text_encoder} + {backbone} ({image_size}px), batch {batch}, {steps} steps; "
          f"cache build for {n} images: {t_build:.2f}s")
    print(f"{'variant':<32}{'steps/s':>10}{'speed-up':>10}")
    print(f"{'recompute frozen backbone':<32}{recompute:>10.3f}{1.0:>9.2f}x")
    print(f"{'feature cache (memmap fp16)':<32}{cached:>10.3f}{cached / recompute:>9.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=48)
    p.add_argument("--captions", type=int, default=240)
    p.add_argument("--locations", type=int, default=49)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--text-encoder", default="minilm")
    p.add_argument("--backbone", default="efficientnet_lite0")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}")
    bench_match_map(args.images, args.captions, args.locations, args.tokens, args.width)
    bench_feature_cache(args.text_encoder, args.backbone, args.batch, args.steps, args.image_size)


if __name__ == "__main__":
    main()
