"""Bad input gets one clear message (the file or value, what was expected, the fix), exit status 2, and nothing
already written changes: a matrix over the suite's commands, run in-process as their entry points run them."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

# imported at collection, not under a test's capture: Lightning binds its log handler to the stderr of the moment
from grounding.cli import main as grounding_main
from grounding.errors import user_errors_exit
from grounding.paths import EXPERIMENTS_DIR

TINY_NET = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None, "visual_heads": 4}
TRAINER = {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False,
           "max_epochs": 1, "limit_train_batches": 1, "limit_val_batches": 1}


def _entry(module: str):
    """The command's main and its program name, as ``python -m <module>`` runs it."""
    import importlib

    if module == "grounding":
        return grounding_main, "python -m grounding"
    mod = importlib.import_module(module)
    return getattr(mod, "main", None) or importlib.import_module(f"{module}.__main__").main, f"python -m {module}"


def run_entry(module: str, argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of ``python -m <module> <argv>``."""
    main, prog = _entry(module)
    capsys.readouterr()
    code = 0
    handlers = list(logging.root.handlers)  # a command's logging.basicConfig must not outlive this capture
    argv0 = sys.argv
    sys.argv = [prog]  # as the command line holds it (LightningCLI warns about pytest's own arguments)
    try:
        with contextlib.redirect_stdout(io.StringIO()), user_errors_exit(prog):
            result = main(argv)
            code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        logging.root.handlers[:] = handlers
        sys.argv = argv0
    return code, capsys.readouterr().err


def error_block(err: str) -> list[str]:
    """The error as printed: stderr's lines from the ``error:`` line on (progress lines of the work done before it,
    e.g. a feature cache built for the validation images, are not part of the message)."""
    lines = err.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if "error:" in line), 0)
    return lines[start:]


@pytest.fixture(scope="module")
def inputs(tiny_world, tmp_path_factory):
    """Broken copies of the tiny world's files and tiny stage configs pointing at them."""
    d = tmp_path_factory.mktemp("bad")
    world = tiny_world
    # Flickr layouts: a non-UTF-8 token file, a malformed token line, no split lists
    for name in ("latin1", "malformed", "nolists"):
        shutil.copytree(world / "flickr", d / name, ignore=shutil.ignore_patterns("dataset_flickr30k.json"))
    token = (world / "flickr" / "Flickr8k.token.txt").read_bytes()
    (d / "latin1" / "Flickr8k.token.txt").write_bytes(token.replace(b"ball", "bäll".encode("latin-1"), 1))
    lines = token.decode().splitlines()
    (d / "malformed" / "Flickr8k.token.txt").write_text("\n".join([*lines[:3], "no tab or hash here", *lines[3:]]))
    for p in (d / "nolists").glob("Flickr_8k.*Images.txt"):
        p.unlink()
    # COCO: every training image corrupt; an empty root
    shutil.copytree(world / "coco", d / "corrupt_coco")
    for p in (d / "corrupt_coco" / "train2017").iterdir():
        p.write_bytes(b"not a jpeg")
    (d / "empty").mkdir()
    (d / "garbage.ckpt").write_bytes(b"\x00not a checkpoint")
    (d / "other_run" / "checkpoints").mkdir(parents=True)  # a checkpoint of stage 1 from another run's folder
    torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "grounding.vgbert.GroundingPretrain"}},
               d / "other_run" / "checkpoints" / "last.ckpt")
    (d / "syntax.yaml").write_text("model:\n  init_args: [\n  bad: 1\n")  # an unclosed flow sequence
    (d / "tabs.yaml").write_text("trainer:\n\tmax_epochs: 1\n")  # a tab where YAML wants spaces
    (d / "twice.yaml").write_text("model:\n  init_args:\n    temperature: 0.1\n    temperature: 0.5\n")
    (d / "empty.yaml").write_text("")
    (d / "list.yaml").write_text("- model\n- data\n")
    (d / "base_missing.yaml").write_text("base: none_base.yaml\n")
    (d / "cycle_a.yaml").write_text("base: cycle_b.yaml\n")
    (d / "cycle_b.yaml").write_text("base: cycle_a.yaml\n")
    (d / "word_similarity").mkdir()
    (d / "word_similarity" / "pairs.txt").write_text("cat\tdog\t3.5\nnot a pair line\n")

    def stage(name: str, base: str, data: dict, model: dict | None = None) -> Path:
        path = d / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "base": str(EXPERIMENTS_DIR / base),
            "model": {"init_args": {"net": {"init_args": TINY_NET}, **(model or {})}},
            "data": data, "trainer": TRAINER}))
        return path

    coco = {"init_args": {"root": str(world / "coco"), "batch_size": 8, "eval_batch_size": 8}}
    flickr = {"class_path": "data_modules.FlickrDataModule",
              "init_args": {"root": str(world / "flickr"), "karpathy_file": None, "batch_size": 8, "eval_batch_size": 8}}
    from semclip_helpers import tiny_baseline_ckpt, tiny_world_ste

    _command_inputs(d)
    return {"dir": d, "world": world, "vlm": f"suite:{tiny_baseline_ckpt(d / 'vlm')}", "ste": tiny_world_ste(d / "ste"),
            "stage1": stage("stage1", "vgbert/stage1_tiny.yaml", coco),
            "stage1_flickr": stage("stage1_flickr", "vgbert/stage1_tiny.yaml", flickr),
            "stage2": stage("stage2", "vgbert/stage2_tiny.yaml",
                            {"init_args": {"root": str(world / "visual_genome"), "batch_size": 8}})}


@pytest.fixture()
def earlier(tmp_path):
    """A run folder holding an earlier run's files, and a check that they are byte-for-byte unchanged."""
    root = tmp_path / "earlier_run"
    files = {"config.yaml": b"{}\n", "checkpoints/last.ckpt": b"earlier weights", "fit_record.json": b"{\"seconds\": 1}",
             "metrics.test.json": b"{\"test/rsum\": 1.0}", "reports/table.md": b"| earlier |"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)

    def unchanged() -> bool:
        now = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        return now == files

    return root, unchanged


def _cases(i):
    return _training_cli_cases(i) + _command_cases(i)


def _command_inputs(d: Path) -> None:
    """The broken inputs of :func:`_command_cases` (cheap, deterministic): a two-caption concept graph and a truncated
    copy, leaderboard YAMLs with a bad row, sweep YAMLs with bad parameters."""
    from grounding.composer.concept_graph import ConceptGraph
    from grounding.composer.crg_extraction import CaptionCRG, Predicate

    runs = Predicate("[NP] runs on [NP]", ("NP", "NP"), ("a dog", "the grass"), "a dog runs on the grass")
    crg = CaptionCRG(root=runs.result, primitives=["a dog", "the grass"], concepts=[runs.result], predicates=[runs],
                     levels={"a dog": 0, "the grass": 0, runs.result: 1})
    graph = ConceptGraph.build([crg, None], [0, 0], ["img0.jpg"]).save(d / "crg" / "crg.npz")
    whole = graph.read_bytes()
    (d / "truncated_crg.npz").write_bytes(whole[:len(whole) // 2])
    test_set = {"name": "world", "captions": {"class_path": "data_modules.FlickrDataModule",
                                              "init_args": {"root": "data/world/flickr"}}}
    row = {"name": "x", "command": "make x", "config": "experiments/vgbert/baseline_tiny.yaml"}
    for name, change in (("ckpt_int", {"ckpt": 12345}), ("ckpts", {"ckpts": "x.ckpt"}),
                         ("runs_str", {"ckpt": "x.ckpt", "runs": "outputs/x"})):
        (d / f"board_{name}.yaml").write_text(yaml.safe_dump({"test_set": test_set, "out": str(d / "board"),
                                                              "models": [{**row, **change}]}))
    command = ["${env}", "${interpreter}", "-m", "grounding.sweep", "run", "--sweep", "bad", "--config",
               str(EXPERIMENTS_DIR / "semclip" / "ste_world.yaml"), "--report-kind", "ste", "${args}"]
    temperature = "model.init_args.temperature"
    for name, sweep in (("values_int", {"parameters": {temperature: {"values": 3}}}),
                        ("values_empty", {"parameters": {temperature: {"values": []}}}),
                        ("paramters", {"paramters": {temperature: {"values": [0.1]}}}),
                        ("wrong_type", {"parameters": {temperature: {"values": [0.05, "warm"]}}}),
                        ("not_an_option", {"parameters": {"model.init_args.temprature": {"values": [0.1]}}})):
        (d / f"sweep_{name}.yaml").write_text(yaml.safe_dump({"program": "grounding.sweep", "method": "grid", **sweep,
                                                              "command": command}, sort_keys=False))


def _command_cases(i):
    """The other commands: composer, sweep, leaderboard, explore, semclip."""
    d, world = i["dir"], i["world"]
    c, lb, ex, sw, sc = "grounding.composer", "grounding.leaderboard", "grounding.explore", "grounding.sweep", \
        "grounding.leaderboard.scaling"
    tokens = str(world / "flickr" / "Flickr8k.token.txt")
    crg, truncated, garbage = str(d / "crg" / "crg.npz"), str(d / "truncated_crg.npz"), str(d / "garbage.ckpt")
    mcd = ["mcd", "--train", tokens, "--candidates", tokens, "--out", str(d / "mcd")]
    world_board = str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml")
    temperature = "model.init_args.temperature"
    return [
        # composer show / stats: the graph file and the caption index
        ("composer_show_truncated_graph", c, ["show", "--graph", truncated], truncated, "rebuild"),
        ("composer_show_caption_past_the_end", c, ["show", "--graph", crg, "--caption", "999999"], "--caption 999999",
         "from 0 to 1"),
        ("composer_show_caption_negative", c, ["show", "--graph", crg, "--caption", "-1"], "--caption -1", "from 0 to 1"),
        ("composer_show_graph_is_a_folder", c, ["show", "--graph", str(d / "crg")], f"{d / 'crg'} is a folder", crg),
        ("composer_show_graph_missing", c, ["show", "--graph", str(d / "none.npz")], str(d / "none.npz"), "composer crg"),
        ("composer_stats_truncated_graph", c, ["stats", "--graph", truncated], truncated, "rebuild"),
        ("composer_show_graph_not_a_graph", c, ["show", "--graph", garbage], f"concept graph {garbage} cannot be read",
         "rebuild"),
        # composer crg / mcd / cost / evaluate-splits: output folders and files, counts
        ("composer_crg_out_under_a_file", c, ["crg", "--captions", tokens, "--out", str(d / "garbage.ckpt" / "crg")],
         f"{garbage} is a file", "choose another --out"),
        ("composer_crg_out_is_a_file", c, ["crg", "--captions", tokens, "--out", garbage], f"--out {garbage}",
         "choose another --out"),
        ("composer_crg_captions_is_a_folder", c, ["crg", "--captions", str(world / "flickr"), "--out", str(d / "c")],
         f"{world / 'flickr'} is a folder", "Flickr token file"),
        ("composer_crg_workers_zero", c, ["crg", "--captions", tokens, "--out", str(d / "c"), "--workers", "0"],
         "--workers 0", ">= 1"),
        ("composer_crg_degrade_above_one", c, ["crg", "--captions", tokens, "--out", str(d / "c"), "--degrade", "1.5"],
         "--degrade 1.5", "[0, 1]"),
        ("composer_crg_sample_seed_negative", c, ["crg", "--captions", tokens, "--out", str(d / "c"),
                                                  "--captions-sample-images", "3", "--captions-sample-seed", "-1"],
         "--captions-sample-seed -1", ">= 0"),
        ("composer_mcd_k_zero", c, [*mcd, "--k", "0"], "--k 0", ">= 1"),
        ("composer_mcd_k_negative", c, [*mcd, "--k", "-5"], "--k -5", ">= 1"),
        ("composer_mcd_stride_zero", c, [*mcd, "--stride", "0"], "--stride 0", ">= 1"),
        ("composer_mcd_levels_negative", c, [*mcd, "--levels", "-1"], "--levels -1", ">= 0"),
        ("composer_cost_out_is_a_folder", c, ["cost", "--config", str(EXPERIMENTS_DIR / "composer" / "composer_world.yaml"),
                                              "--out", str(d / "crg")], f"--out {d / 'crg'} is a folder", "file name"),
        ("composer_evaluate_splits_limit_zero", "grounding.leaderboard.evaluate_splits",
         ["--config", "c.yaml", "--ckpt", "x.ckpt", "--splits", str(d / "mcd"), "--limit", "0"], "--limit 0", ">= 1"),
        # leaderboard and explorer: the rows of a leaderboard YAML, the output folder, the query
        ("leaderboard_row_ckpt_not_a_path", lb, ["--config", str(d / "board_ckpt_int.yaml")],
         f"{d / 'board_ckpt_int.yaml'}: models[0] (x): `ckpt` must be a path", "quote it"),
        ("leaderboard_row_key_misspelled", lb, ["--config", str(d / "board_ckpts.yaml")],
         f"{d / 'board_ckpts.yaml'}: models[0] (x): unknown key `ckpts`", "did you mean `ckpt`"),
        ("leaderboard_row_runs_not_a_list", lb, ["--config", str(d / "board_runs_str.yaml")], "`runs` must be a list",
         "YAML list"),
        ("leaderboard_out_is_a_file", lb, ["--config", world_board, "--out", garbage], f"{garbage} is a file",
         "choose another --out"),
        ("scaling_out_is_a_file", sc, ["--config", world_board, "--models", "VSE", "--out", garbage],
         f"{garbage} is a file", "choose another --out"),
        ("scaling_fit_args_unclosed_quote", sc, ["--config", world_board, "--models", "VSE", "--fit-args", "--a 'b"],
         "--fit-args", "shell-quoted"),
        ("explore_row_ckpt_not_a_path", ex, ["--config", str(d / "board_ckpt_int.yaml"), "--check", "a dog"],
         "models[0] (x): `ckpt` must be a path", "quote it"),
        ("explore_query_only_punctuation", ex, ["--config", world_board, "--check", "?!..."], "'?!...' has no words",
         "type a caption"),
        ("explore_query_only_emoji", ex, ["--config", world_board, "--check", "🙂🙂"], "has no words", "type a caption"),
        ("explore_top_k_out_of_range", ex, ["--config", world_board, "--top-k", "0"], "--top-k 0", "1..10"),
        # sweeps: the parameters of a sweep YAML, the runner's options
        ("sweep_values_not_a_list", sw, [str(d / "sweep_values_int.yaml"), "--dry-run"],
         f"{d / 'sweep_values_int.yaml'}: parameter '{temperature}'", "non-empty list"),
        ("sweep_values_empty", sw, [str(d / "sweep_values_empty.yaml"), "--dry-run"],
         f"{d / 'sweep_values_empty.yaml'}: parameter '{temperature}'", "non-empty list"),
        ("sweep_parameters_misspelled", sw, [str(d / "sweep_paramters.yaml"), "--dry-run"],
         f"{d / 'sweep_paramters.yaml'}: unknown key `paramters`", "did you mean `parameters`"),
        ("sweep_value_of_the_wrong_type", sw, [str(d / "sweep_wrong_type.yaml"), "--dry-run"],
         f"{d / 'sweep_wrong_type.yaml'}: parameter {temperature}: value 'warm'", "expected a number"),
        ("sweep_parameter_not_an_option", sw, [str(d / "sweep_not_an_option.yaml"), "--dry-run"],
         "parameter model.init_args.temprature is not an option", "spelling"),
        ("sweep_max_runs_zero", sw, [str(EXPERIMENTS_DIR / "sweeps" / "ste_world.yaml"), "--dry-run", "--max-runs", "0"],
         "--max-runs 0", ">= 1"),
        ("sweep_set_without_a_value", sw, [str(EXPERIMENTS_DIR / "sweeps" / "ste_world.yaml"), "--dry-run", "--set",
                                           "trainer.max_epochs"], "--set 'trainer.max_epochs'", "KEY=VALUE"),
        ("sweep_report_sample_zero", sw, ["run", "--sweep", "s", "--config", "c.yaml", "--report-kind", "ste",
                                          "--report-sample", "0"], "--report-sample 0", ">= 1"),
    ]


def _training_cli_cases(i):
    d, world = i["dir"], i["world"]
    s1, s1f, s2 = (str(i[k]) for k in ("stage1", "stage1_flickr", "stage2"))
    g = "grounding"
    return [
        # (id, module, argv, text the message must name, a word of the fix)
        ("root_missing", g, ["fit", "--config", s1, "--data.init_args.root", str(d / "nope")], str(d / "nope"), "Fix:"),
        ("coco_annotations_missing", g, ["fit", "--config", s1, "--data.init_args.root", str(d / "empty")],
         "captions_train2017.json", "Fix:"),
        ("flickr_split_lists_missing", g, ["fit", "--config", s1f, "--data.init_args.root", str(d / "nolists")],
         "Flickr_8k.trainImages.txt", "split_files"),
        ("flickr_captions_file_missing", g, ["fit", "--config", s1f, "--data.init_args.captions_file", "none.token"],
         "none.token", "Fix:"),
        ("flickr_not_utf8", g, ["fit", "--config", s1f, "--data.init_args.root", str(d / "latin1")],
         "Flickr8k.token.txt:1", "UTF-8"),
        ("flickr_malformed_line", g, ["fit", "--config", s1f, "--data.init_args.root", str(d / "malformed")],
         "Flickr8k.token.txt:4", "Expected"),
        ("corrupt_images", g, ["fit", "--config", s1, "--data.init_args.root", str(d / "corrupt_coco")],
         "corrupt_coco", "image"),
        ("corrupt_images_in_a_worker", g, ["fit", "--config", s1, "--data.init_args.root", str(d / "corrupt_coco"),
                                           "--data.init_args.loader.num_workers", "1", "--model.init_args.feature_cache", "false"],
         "corrupt_coco", "image"),
        ("init_from_missing", g, ["fit", "--config", s2, "--model.init_args.init_from", str(d / "none.ckpt")],
         str(d / "none.ckpt"), "train the stage"),
        ("init_from_not_a_checkpoint", g, ["fit", "--config", s2, "--model.init_args.init_from", str(d / "garbage.ckpt")],
         str(d / "garbage.ckpt"), "checkpoint"),
        ("init_from_of_another_stage", g, ["fit", "--config", str(EXPERIMENTS_DIR / "vgbert" / "search_tiny.yaml"),
                                           "--model.init_args.init_from", i["vlm"].removeprefix("suite:")],
         i["vlm"].removeprefix("suite:"), "stage-2"),
        ("ckpt_path_missing", g, ["test", "--config", s1, "--ckpt_path", str(d / "none.ckpt")], str(d / "none.ckpt"),
         "last"),
        ("ckpt_path_last_without_run", g, ["test", "--config", s1, "--ckpt_path", "last", "--trainer.default_root_dir",
                                           str(d / "empty")], "last.ckpt", "train it"),
        ("ckpt_path_of_another_model", g, ["test", "--config", s1, "--ckpt_path", i["vlm"].removeprefix("suite:"),
                                           "--trainer.default_root_dir", str(d / "other_model_test")],
         "DualEncoderBaseline", "GroundingPretrain"),
        ("test_into_another_runs_folder", g, ["test", "--config", s1, "--ckpt_path",
                                              str(d / "other_run" / "checkpoints" / "last.ckpt")],
         "holds another run", "--trainer.default_root_dir"),
        ("ckpt_path_not_a_checkpoint", g, ["test", "--config", s1, "--ckpt_path", str(d / "garbage.ckpt")],
         str(d / "garbage.ckpt"), "Fix:"),
        ("record_on_fit", g, ["fit", "--config", s1, "--record", "board"], "--record board", "drop it"),
        ("record_bad_name", g, ["test", "--config", s1, "--record", "a b"], "a b", "letters"),
        ("option_typo", g, ["fit", "--config", s1, "--trainer.max_epoch", "1"], "--trainer.max_epoch", "--help"),
        ("config_missing", g, ["fit", "--config", str(d / "none.yaml")], "none.yaml", ""),
        ("config_yaml_syntax", g, ["fit", "--config", str(d / "syntax.yaml")], "syntax.yaml:4:1", "fix the file"),
        ("batch_size_zero", g, ["fit", "--config", s1, "--data.init_args.batch_size", "0"], "batch_size 0", ">= 1"),
        ("eval_batch_size_zero", g, ["test", "--config", s1, "--data.init_args.eval_batch_size", "0"],
         "eval_batch_size 0", ">= 1"),
        ("temperature_negative", g, ["fit", "--config", s1, "--model.init_args.temperature", "-1"], "temperature",
         "> 0"),
        ("lr_zero", g, ["fit", "--config", s1, "--model.init_args.optimizer.init_args.lr", "0"], "lr 0.0", "> 0"),
        ("num_workers_negative", g, ["fit", "--config", s1, "--data.init_args.loader.num_workers", "-1"], "num_workers",
         ">= 0"),
        ("max_epochs_zero", g, ["fit", "--config", s1, "--trainer.max_epochs", "0"], "max_epochs 0", ">= 1"),
        ("checkpoint_every_minutes_negative", g, ["fit", "--config", s1, "--checkpoint_every_minutes", "-5"],
         "checkpoint_every_minutes", "-5"),
        ("gpu_without_one", g, ["fit", "--config", s1, "--trainer.accelerator", "gpu"], "accelerator gpu", "cpu"),
        ("output_folder_is_a_file", g, ["fit", "--config", s1, "--trainer.default_root_dir", str(d / "garbage.ckpt")],
         str(d / "garbage.ckpt"), "default_root_dir"),
        ("output_folder_under_a_file", g, ["test", "--config", s1, "--trainer.default_root_dir",
                                           str(d / "garbage.ckpt" / "run")], "is a file", "default_root_dir"),
        ("config_yaml_tab", g, ["test", "--config", s1, "--config", str(d / "tabs.yaml")], "tabs.yaml:2:1",
         "fix the file"),
        ("text_encoder_weights_missing", g,
         ["fit", "--config", s1, "--model.init_args.net.init_args.text_encoder", "bert-base-uncased"],
         "bert-base-uncased", "HF_HUB_OFFLINE"),
        ("world_meta_missing", g, ["fit", "--config", str(EXPERIMENTS_DIR / "composer" / "composer_world.yaml"),
                                   "--config", yaml.safe_dump({"data": {"init_args": {"captions": {
                                       "class_path": "data_modules.FlickrDataModule",
                                       "init_args": {"root": str(world / "flickr"), "karpathy_file": None}}}}}),
                                   "--data.init_args.world_meta", str(d / "none.json")], str(d / "none.json"), "make world"),
        ("ste_missing", g, ["fit", "--config", str(EXPERIMENTS_DIR / "semclip" / "align_flickr8k.yaml"),
                            "--data.init_args.vlm", i["vlm"], "--data.init_args.caption_images", "null",
                            "--data.init_args.captions", str(world / "coco" / "annotations" / "captions_train2017.json"),
                            "--data.init_args.ste", str(d / "no_ste")], str(d / "no_ste"), "train"),
        ("vlm_checkpoint_missing", g, ["fit", "--config", str(EXPERIMENTS_DIR / "semclip" / "align_flickr8k.yaml"),
                                       "--data.init_args.vlm", f"suite:{d / 'none.ckpt'}"], str(d / "none.ckpt"), ""),
        ("semclip_report_word_similarity_malformed", "grounding.semclip",
         ["report", "--ste", str(i["ste"]), "--word-similarity", str(d / "word_similarity"),
          "--out", str(d / "r")], "pairs.txt:2", "fix the file"),
        ("semclip_export_of_another_model", "grounding.semclip",
         ["export", "--ckpt", i["vlm"].removeprefix("suite:"), "--out", str(d / "exported")], "DualEncoderBaseline",
         "make ste"),
        ("semantic_space_checkpoint_of_another_model", "grounding.semantic_space",
         ["--models", "minilm", yaml.safe_dump({"source": i["vlm"].removeprefix("suite:"),
                                                "model_class": "grounding.vgbert.pretrain.GroundingPretrain"},
                                               default_flow_style=True).strip(),
          "--parts", "clustering", "--out", str(d / "semantic")], "DualEncoderBaseline", "GroundingPretrain"),
        ("semclip_report_ste_missing", "grounding.semclip", ["report", "--ste", str(d / "no_ste"), "--out", str(d / "r")],
         str(d / "no_ste"), "make ste"),
        ("search_query_image_missing", "grounding.vgbert.image_search",
         ["--ckpt", str(d / "garbage.ckpt"), "--images", str(world / "images"), "--query-image", str(d / "none.jpg")],
         str(d / "none.jpg"), "image file"),
        ("search_checkpoint_missing", "grounding.vgbert.image_search",
         ["--ckpt", str(d / "none.ckpt"), "--images", str(world / "images"), "--query-text", "a ball"],
         str(d / "none.ckpt"), "make stage3"),
        ("crg_captions_missing", "grounding.composer", ["crg", "--captions", str(d / "none.txt"), "--out", str(d / "crg")],
         str(d / "none.txt"), ""),
        ("scaling_model_unknown", "grounding.leaderboard.scaling",
         ["--config", str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml"), "--models", "Nope", "--out", str(d / "s")],
         "--models Nope", "one of"),
        ("scaling_photos_not_positive", "grounding.leaderboard.scaling",
         ["--config", str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml"), "--models", "VSE", "--photos", "0"],
         "--photos", "positive"),
        ("scaling_record_not_a_record", "grounding.leaderboard.scaling",
         ["--config", str(EXPERIMENTS_DIR / "leaderboard" / "world.yaml"), "--recorded", str(d / "garbage.ckpt"),
          "--out", str(d / "s")], str(d / "garbage.ckpt"), "scaling.json"),
        ("leaderboard_config_missing", "grounding.leaderboard", ["--config", str(d / "none.yaml")], "none.yaml",
         "experiments/leaderboard"),
        # configs: a key given twice, an empty file, a list, a base that is missing or a cycle
        ("config_key_given_twice", g, ["fit", "--config", s1, "--config", str(d / "twice.yaml")], "twice.yaml:4",
         "remove one"),
        ("config_empty", g, ["fit", "--config", str(d / "empty.yaml")], "empty.yaml is empty", "model:"),
        ("config_top_level_list", g, ["fit", "--config", str(d / "list.yaml")], "list.yaml holds a list", "model:"),
        ("config_base_missing", g, ["fit", "--config", str(d / "base_missing.yaml")], "none_base.yaml",
         "existing config"),
        ("config_base_cycle", g, ["fit", "--config", str(d / "cycle_a.yaml")], "cycle of bases", "existing config"),
        # values and names on the command line
        ("subcommand_unknown", g, ["fitt", "--config", s1], "fitt", "--help"),
        ("max_epochs_not_a_number", g, ["fit", "--config", s1, "--trainer.max_epochs", "abc"], "max_epochs", "--help"),
        ("temperature_not_a_number", g, ["fit", "--config", s1, "--model.init_args.temperature", "warm"], "temperature",
         "--help"),
        ("seed_not_a_number", g, ["fit", "--config", s1, "--seed_everything", "abc"], "seed_everything", "--help"),
        ("batch_size_negative", g, ["fit", "--config", s1, "--data.init_args.batch_size", "-3"], "batch_size -3", ">= 1"),
        ("ckpt_path_best_without_run", g, ["test", "--config", s1, "--ckpt_path", "best", "--trainer.default_root_dir",
                                           str(d / "empty")], "best", "train it"),
        # semclip evaluate: its numbers are checked before its files
        ("semclip_evaluate_bootstrap_negative", "grounding.semclip",
         ["evaluate", "--transform", str(d / "none.pt"), "--bootstrap", "-5", "--out", str(d / "ev")], "--bootstrap -5",
         "1 or more"),
        ("semclip_evaluate_confidence_above_1", "grounding.semclip",
         ["evaluate", "--transform", str(d / "none.pt"), "--confidence", "2", "--out", str(d / "ev")], "--confidence 2",
         "between 0 and 1"),
        ("semclip_evaluate_ks_zero", "grounding.semclip",
         ["evaluate", "--transform", str(d / "none.pt"), "--ks", "0", "5", "--out", str(d / "ev")], "--ks 0 5",
         "1 or more"),
        ("semclip_evaluate_tagging_captions_zero", "grounding.semclip",
         ["evaluate", "--transform", str(d / "none.pt"), "--tagging-captions", "0", "--out", str(d / "ev")],
         "--tagging-captions 0", "1 or more"),
        ("semclip_evaluate_transform_not_a_transform", "grounding.semclip",
         ["evaluate", "--transform", str(d / "garbage.ckpt"), "--out", str(d / "ev")], str(d / "garbage.ckpt"), ""),
        ("semclip_export_checkpoint_missing", "grounding.semclip",
         ["export", "--ckpt", str(d / "none.ckpt"), "--out", str(d / "exported")], str(d / "none.ckpt"), ""),
    ]


# Caught before any model is built (python -m grounding checks data files, caption files, checkpoints first).
BEFORE_ANY_MODEL = {
    "batch_size_negative", "batch_size_zero", "checkpoint_every_minutes_negative", "ckpt_path_best_without_run",
    "ckpt_path_last_without_run", "ckpt_path_missing", "ckpt_path_not_a_checkpoint", "ckpt_path_of_another_model",
    "coco_annotations_missing", "config_base_cycle", "config_base_missing", "config_empty", "config_key_given_twice",
    "config_missing", "config_top_level_list", "config_yaml_syntax", "config_yaml_tab",
    "flickr_captions_file_missing", "flickr_malformed_line", "flickr_not_utf8", "flickr_split_lists_missing",
    "gpu_without_one", "init_from_missing", "init_from_not_a_checkpoint", "init_from_of_another_stage", "lr_zero",
    "max_epochs_not_a_number", "max_epochs_zero", "num_workers_negative", "option_typo", "output_folder_is_a_file",
    "output_folder_under_a_file", "root_missing", "seed_not_a_number", "ste_missing", "subcommand_unknown",
    "temperature_negative", "temperature_not_a_number", "test_into_another_runs_folder", "vlm_checkpoint_missing",
    "world_meta_missing"}

CASE_IDS = [c[0] for c in _cases({"dir": Path("."), "world": Path("."), "vlm": "", "ste": "", "stage1": "", "stage1_flickr": "",
                                   "stage2": ""})]


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_input_is_one_message_exit_2_and_loses_nothing(case, inputs, earlier, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("GROUNDING_DEBUG", raising=False)
    _, module, argv, names, fix = next(c for c in _cases(inputs) if c[0] == case)
    if case == "gpu_without_one" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    root, unchanged = earlier
    if case in BEFORE_ANY_MODEL:
        from lightning.pytorch import LightningModule

        def no_model(*args, **kwargs):
            raise AssertionError("a model was built before the bad input was reported")
        monkeypatch.setattr(LightningModule, "__init__", no_model)
    if module == "grounding" and "--trainer.default_root_dir" not in argv:
        argv = [*argv, "--trainer.default_root_dir", str(root)]
    code, err = run_entry(module, argv, capsys)
    assert code == 2, err
    assert names in err and fix in err, err
    assert len(error_block(err)) <= 3, f"more than 3 lines:\n{err}"
    assert "Traceback" not in err and "DataLoader worker" not in err
    assert unchanged(), "an earlier run's file changed"


def test_a_full_disk_is_one_message_exit_2(inputs, capsys, monkeypatch, tmp_path):
    """A checkpoint save refused by the machine (ENOSPC) ends the fit with one line naming the cause, exit 2."""
    import errno

    from lightning.pytorch import Trainer

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GROUNDING_DEBUG", raising=False)

    def full(self, filepath, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(filepath))

    monkeypatch.setattr(Trainer, "save_checkpoint", full)
    code, err = run_entry("grounding", ["fit", "--config", str(inputs["stage1"]), "--trainer.default_root_dir",
                                        str(tmp_path / "run")], capsys)
    assert code == 2 and "Traceback" not in err, err
    message = [line for line in err.splitlines() if "error:" in line]
    assert len(message) == 1 and "the disk is full" in message[0] and "checkpoints" in message[0], err
    assert "--ckpt_path last" in message[0]


def test_debug_env_shows_the_traceback(inputs, capsys, monkeypatch):
    monkeypatch.setenv("GROUNDING_DEBUG", "1")
    with pytest.raises(Exception, match="none.ckpt"):
        with user_errors_exit("python -m grounding"):
            grounding_main(["fit", "--config", str(inputs["stage2"]), "--model.init_args.init_from", str(inputs["dir"] / "none.ckpt")])


def test_metrics_file_is_json(tmp_path):
    from grounding.run_folder import write_run_metrics

    path = write_run_metrics(tmp_path, "test", {"b": 2.0, "a": 1})
    assert json.loads(path.read_text()) == {"a": 1, "b": 2.0}
