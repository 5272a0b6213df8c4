"""Shared test fixtures: a tiny stage-1 config on the tiny world, fake images for the feature cache, JSON compared with a tolerance."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from grounding.paths import EXPERIMENTS_DIR

TINY_STAGE1_NET = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None, "visual_heads": 4}


def tiny_stage1_config(path: Path, tiny_world: Path, root: Path | None = None, net: dict | None = None,
                       **trainer) -> Path:
    """``stage1_tiny.yaml`` with tiny networks on the tiny world's COCO layout, no logger or extra callbacks, into
    ``root`` (None: the command line gives it); ``trainer`` adds or overrides trainer keys, ``net`` network keys."""
    path.write_text(yaml.safe_dump({
        "base": str(EXPERIMENTS_DIR / "vgbert" / "stage1_tiny.yaml"),
        "model": {"init_args": {"net": {"init_args": {**TINY_STAGE1_NET, **(net or {})}}}},
        "data": {"init_args": {"root": str(tiny_world / "coco"), "batch_size": 8, "eval_batch_size": 8}},
        "trainer": {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False,
                    **({"default_root_dir": str(root)} if root is not None else {}), **trainer}}))
    return path


class FakeImages:
    """Tiny 'images' (files that exist, so they have sizes and mtimes) and seeded pixels: a dataset for the cache."""

    def __init__(self, folder: Path, n: int = 5):
        self.image_paths = []
        for i in range(n):
            p = folder / f"img{i}.bin"
            p.write_bytes(bytes([i]))
            self.image_paths.append(p)
        self.transform = "deterministic"

    def load_image(self, index):
        g = torch.Generator().manual_seed(int(index))
        return torch.randn(3, 32, 32, generator=g)


def same_json(a, b) -> bool:
    """Equal JSON values, numbers within 1e-9 (and a mapping's keys the same)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-9
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return a == b
