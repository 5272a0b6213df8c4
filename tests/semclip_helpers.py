"""Tiny offline SemCLIP inputs for tests: suite VLM checkpoints and a world STE export.

The VLMs are freshly initialised suite models (tiny random text encoder, tiny CNN) saved as
Lightning-style checkpoints; the STE gives every world object synset one random direction, its
lemmas (synonyms) and the synsets of the world's synonyms small perturbations of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_VLM = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=2, image_size=64)


def save_module(module, path: Path, class_path: str, run_config: dict | None = None) -> Path:
    """A checkpoint as the CLI writes it (state_dict + hyper_parameters with _class_path) and,
    optionally, the run's config.yaml beside its checkpoints/ folder."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": module.state_dict(),
                "hyper_parameters": {**dict(module.hparams), "_class_path": class_path}}, path)
    if run_config is not None:
        (path.parent.parent / "config.yaml").write_text(yaml.safe_dump({"data": {"init_args": run_config}}))
    return path


def tiny_baseline_ckpt(folder: Path, seed: int = 0) -> Path:
    from grounding.vgbert.dual_encoder import DualEncoder, DualEncoderBaseline

    torch.manual_seed(seed)
    module = DualEncoderBaseline(DualEncoder(**TINY_VLM), feature_cache=False).eval()
    return save_module(module, Path(folder) / "checkpoints" / "last.ckpt", "grounding.vgbert.DualEncoderBaseline",
                       {"transform": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "image_size": 64, "resize_size": 64}})


def world_objects() -> list[dict]:
    from data_modules.synthetic import load_vocabulary

    return load_vocabulary()["objects"]


def tiny_world_ste(folder: Path, dim: int = 16, seed: int = 0) -> Path:
    """An exported STE over the world's object lemmas: synonyms near their object's direction."""
    from grounding.lexicon import wordnet
    from grounding.semclip.ste import STEEmbedding

    wn = wordnet()
    g = torch.Generator().manual_seed(seed)
    keys, vecs = [], []
    for obj in world_objects():
        base = torch.randn(dim, generator=g)
        for name in dict.fromkeys([obj["synset"]] + [s["synset"] for s in obj.get("synonyms", [])]):
            for lemma in wn.synset(name).lemma_names():
                key = f"{name}.{lemma}"
                if key not in keys:
                    keys.append(key)
                    vecs.append(base + 0.05 * torch.randn(dim, generator=g))
    return STEEmbedding(keys, torch.stack(vecs)).save(Path(folder))


def world_vocabulary_json(world: Path) -> dict:
    return json.loads((Path(world) / "world.json").read_text())["vocabulary"]


def markdown_tables(text: str) -> list[list[str]]:
    """The Markdown tables of a report in order, each as its lines (header, separator, rows)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def table_cells(line: str) -> list[str]:
    """The cells of one Markdown table line, stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]
