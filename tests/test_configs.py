"""Every LightningCLI config under experiments/ parses and runs a fast_dev_run.

Paper configs name weights that are not available offline (bert-base-uncased, VGG16); for the
run they are swapped for the tiny offline encoders and pointed at the generated world, so every
other key of the config (model, data, optimizer, scheduler, trainer) is exercised as written.
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
import yaml

from grounding.cli import main
from grounding.paths import EXPERIMENTS_DIR

# Where each DataModule finds its layout inside the generated world, and what else to override
# so the run stays on tiny offline data.
WORLD_DATA = {
    "CocoCaptionsDataModule": {"root": "coco", "layout": "official", "karpathy_file": None, "exclude_eval_images": None},
    "FlickrDataModule": {"root": "flickr", "captions_file": None, "karpathy_file": None, "image_dir": None,
                         "exclude_eval_images": None},
    "VisualGenomeDataModule": {"root": "visual_genome", "label_mapping": None, "split.split_file": None,
                               "filters.min_triplets": 1, "exclude_eval_images": None},
    "SimilarityListsDataModule": {"subtree_of": ["dog.n.01", "chair.n.01"]},
}
OFFLINE_MODEL = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None,
                 "visual_heads": 4, "init_from": None, "visual_init_from": None}


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def stage_config(path):
    """A stage config as the CLI sees it: its `base:` chain merged under it."""
    cfg = yaml.safe_load(path.read_text())
    if isinstance(cfg, dict) and "base" in cfg:
        cfg = _merge(stage_config((path.parent / cfg.pop("base")).resolve()), cfg)
    return cfg


# COMPOSER's attention widths must divide the tiny text encoder's (32)
COMPOSER_OFFLINE = {"sizes.heads": 2, "sizes.co_heads": 2, "sizes.co_dim": 16, "sizes.dim": 32}
# the ViLBERT-style baseline's image stream and co-attention at test size (its paper configs are 1024 wide)
VILBERT_OFFLINE = {"sizes.image_dim": 32, "sizes.image_heads": 2, "sizes.image_ffn_dim": 64, "sizes.co_dim": 16,
                   "sizes.co_heads": 2}


def world_region_files(world, out, dim: int):
    """One ``.npz`` of 3 random detector regions per world image (data_modules.regions' folder layout)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for image in sorted((world / "flickr").rglob("*.jpg")):
        np.savez(out / f"{image.stem}.npz", features=rng.random((3, dim), dtype=np.float32),
                 boxes=np.array([[0, 0, 32, 32], [16, 16, 64, 64], [0, 0, 64, 64]], dtype=np.float32), image_h=64, image_w=64)
    return out


def lightning_configs():
    out = []
    for path in sorted(EXPERIMENTS_DIR.rglob("*.yaml")):
        cfg = stage_config(path)
        if isinstance(cfg, dict) and isinstance(cfg.get("model"), dict) and "class_path" in cfg["model"]:
            out.append(path)
    return out


CONFIGS = lightning_configs()
IDS = [str(p.relative_to(EXPERIMENTS_DIR)) for p in CONFIGS]


def test_every_stage_has_configs():
    stems = {p.parent.name + "/" + p.stem for p in CONFIGS}
    for expected in ("vgbert/stage1_paper", "vgbert/stage1_tiny", "vgbert/stage2_paper", "vgbert/stage2_tiny",
                     "semclip/ste_wordnet", "semclip/ste_tiny"):
        assert expected in stems


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_config_parses_with_print_config(path):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(buf.getvalue())
    source = stage_config(path)
    assert printed["model"]["class_path"].endswith(source["model"]["class_path"].split(".")[-1])
    assert printed["data"]["class_path"].endswith(source["data"]["class_path"].split(".")[-1])
    # the shared trainer config was loaded underneath the stage config
    assert printed["trainer"]["logger"]["class_path"] == "grounding.loggers.WandbLogger" or "logger" in source.get("trainer", {})


def offline_overrides(path, world, tmp_path):
    cfg = stage_config(path)
    args = ["--config", str(EXPERIMENTS_DIR / "trainer" / "csv_logger.yaml"), "--trainer.fast_dev_run=true",
            "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    model_args = (cfg["model"].get("init_args") or {})
    net_args = ((model_args.get("net") or {}).get("init_args") or {}) if isinstance(model_args.get("net"), dict) else {}
    for key, value in OFFLINE_MODEL.items():
        if key in model_args:
            args.append(f"--model.init_args.{key}={'null' if value is None else value}")
        if key in net_args:
            args.append(f"--model.init_args.net.init_args.{key}={'null' if value is None else value}")
    for key in ("export_dir", "export_path"):
        if key in model_args:
            args.append(f"--model.init_args.{key}={tmp_path / key}")
    data_name = cfg["data"]["class_path"].split(".")[-1]
    if data_name == "AlignmentPairsDataModule":  # SemCLIP Γ_t: a fresh tiny suite VLM and a world STE
        from semclip_helpers import tiny_baseline_ckpt, tiny_world_ste

        args += [f"--data.init_args.vlm=suite:{tiny_baseline_ckpt(tmp_path / 'vlm')}",
                 f"--data.init_args.ste={tiny_world_ste(tmp_path / 'ste')}",
                 f"--data.init_args.captions={world / 'coco' / 'annotations' / 'captions_train2017.json'}",
                 "--data.init_args.lexical_variants=false", "--data.init_args.caption_images=null"]
    data_args = cfg["data"].get("init_args") or {}
    if data_name == "ComposerDataModule":  # COMPOSER: the world's Flickr layout under the caption reader
        # (an inline YAML: jsonargparse reads `null` of a nested subclass flag as the string "None")
        reader = {"class_path": "data_modules.FlickrDataModule",
                  "init_args": {"root": str(world / "flickr"), "karpathy_file": None, "captions_file": None,
                                "image_dir": None}}
        args += ["--config", yaml.safe_dump({"data": {"init_args": {"captions": reader}}}),
                 f"--data.init_args.world_meta={world / 'world.json'}"]
        net_class = str((model_args.get("net") or {}).get("class_path", ""))
        widths = COMPOSER_OFFLINE if net_class.endswith(".Composer") else VILBERT_OFFLINE if net_class.endswith(".ViLBERT") else {}
        args += [f"--model.init_args.net.init_args.{k}={v}" for k, v in widths.items()]  # VSE has no attention widths
        regions = data_args.get("region_inputs") or {}
        if regions.get("region_boxes"):  # object boxes: the world's Visual Genome layout
            args.append(f"--data.init_args.region_inputs.region_boxes={world / 'visual_genome' / 'objects.json'}")
        if regions.get("region_files"):  # detector regions as the paper's files: random ones for every image
            files = world_region_files(world, tmp_path / "regions", net_args["region_dim"])
            args.append(f"--data.init_args.region_inputs.region_files={files}")
    if data_name == "GlueDataModule":  # the GLUE probe: a tiny generated glue_data folder, every task's layout
        from glue_helpers import write_tiny_glue

        args.append(f"--data.init_args.root={write_tiny_glue(tmp_path / 'glue')}")
    if data_name == "ImageFolderDataModule":  # VG-BERT stage 0: the world's object boxes as class folders
        from data_modules.object_crops import crop_objects

        crop_objects(world / "visual_genome", tmp_path / "object_crops", min_size=4)
        args.append(f"--data.init_args.root={tmp_path / 'object_crops'}")
    for key, value in WORLD_DATA.get(data_name, {}).items():
        if key == "root":
            value = str(world / value)
        elif key.split(".")[0] not in data_args:  # (a group's field: its group)
            continue
        args.append(f"--data.init_args.{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}")
    if "text_encoder" in data_args:
        args.append("--data.init_args.text_encoder=tiny-random")
    return args


# The slowest fast_dev_runs (WordNet's similarity lists) and the COMPOSER configs that only vary another one's
# data or a switch (Flickr8k, COCO / C30K, + MVSA, Table 2's test settings, Table 7's degraded parses) run in the full
# tier (`make test-full`); `make test` still instantiates every one (test_config_parses_with_print_config) and
# runs one fast_dev_run per region source and hard-negative mode (world grid, world boxes, F30K files + pool).
SLOW_RUNS = {"semclip/ste_wordnet.yaml", "vgbert/baseline_flickr8k.yaml", "vgbert/baseline_flickr8k_full.yaml",
             "vgbert/stage1_flickr8k_full.yaml", "vgbert/stage1_flickr8k_753.yaml",
             *(f"composer/{m}_{d}.yaml" for m in ("composer", "vse", "vilbert", "vilbert_mvsa")
               for d in ("flickr8k", "flickr8k_full", "coco_paper", "c30k_paper")),
             "composer/vilbert_mvsa_f30k_paper.yaml"}
SLOW_FOLDERS = ("composer/table2/", "composer/table7/")
RUNS = [pytest.param(p, marks=pytest.mark.slow) if i in SLOW_RUNS or i.startswith(SLOW_FOLDERS) else p
        for p, i in zip(CONFIGS, IDS)]


@pytest.mark.parametrize("path", RUNS, ids=IDS)
def test_config_runs_fast_dev_run(path, tiny_world, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    cli = main(["fit", "--config", str(path), *offline_overrides(path, tiny_world, tmp_path)])
    # the fit ran to its end and trained: at least one optimizer step, its logged losses finite
    assert cli.trainer.state.finished and cli.trainer.global_step >= 1, (path, cli.trainer.state)
    losses = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "loss" in k}
    assert all(math.isfinite(v) for v in losses.values()), losses


# ---- the other YAMLs under experiments/: sweeps and COMPOSER commands ----------------------------
SWEEPS = sorted((EXPERIMENTS_DIR / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.name for p in SWEEPS])
def test_sweep_expands_to_valid_cli_runs(path):
    """Every grid point of a wandb sweep is a command whose overrides the CLI accepts."""
    from grounding.sweep import build_command, expand_grid, fit_arguments

    sweep = yaml.safe_load(path.read_text())
    grid = expand_grid(sweep, str(path))
    assert len(grid) >= 2
    for params in grid:
        cmd = build_command(sweep, params)
        args = fit_arguments(cmd)  # the fit it runs: `python -m grounding fit ...` (itself, or `grounding.sweep run`'s)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exit_info:
            main([*args, "--print_config"])
        assert exit_info.value.code in (0, None), (path, params)
        printed = yaml.safe_load(buf.getvalue())
        for key, value in params.items():  # the override reached the resolved config
            node = printed
            for part in key.split("."):
                node = node[part]
            assert node == value, (key, node, value)


COMPOSER_CONFIGS = sorted(set((EXPERIMENTS_DIR / "composer").glob("*.yaml")) - set(CONFIGS))  # the CRG / MCD commands


@pytest.mark.parametrize("path", COMPOSER_CONFIGS, ids=[p.name for p in COMPOSER_CONFIGS])
def test_composer_config_names_only_known_options(path):
    from grounding.composer.__main__ import _apply_config, build_argparser

    command = next(iter(yaml.safe_load(path.read_text())))
    parser = build_argparser()
    args = _apply_config(parser.parse_args([command, "--config", str(path)]), parser)
    assert args.command == command and (args.out or command == "stats")
