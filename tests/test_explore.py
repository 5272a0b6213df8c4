"""The retrieval explorer (grounding/explore): its answers are each model's own scores, its explanations are drawn
from the model, bad input is a message or one line, and (slow tier) the page works in a real headless browser."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from semclip_helpers import tiny_world_ste

from grounding.cli import main as cli_main
from grounding.cli import run_test_subcommand
from grounding.explore.__main__ import load_explorer
from grounding.explore.__main__ import main as explore_main
from grounding.explore.app import QueryError
from grounding.explore.models import CrossModel, Gallery, MatchMapModel, SemCLIPModel, VectorModel
from grounding.leaderboard import load_leaderboard
from grounding.paths import EXPERIMENTS_DIR
from grounding.semclip.alignment import AlignmentTransform, save_transform
from grounding.semclip.ste import STEEmbedding
from grounding.semclip.vlm import SuiteVLM
from grounding.stage_config import expand_config_bases

OFFLINE = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None}


def _config(folder: Path, name: str, base: str, net: dict, data: dict) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "base": str(EXPERIMENTS_DIR / base), "model": {"init_args": {"net": {"init_args": net}}},
        "data": {"init_args": data},
        "trainer": {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False}}))
    return str(path)


def _fit(config: str, out: Path, *extra: str) -> str:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli_main(["fit", "--config", config, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                  "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={out}", *extra])
    return str(out / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def board(tiny_world, tmp_path_factory):
    """A leaderboard YAML over the tiny world's Flickr test split: VG-BERT stage 1, the dual encoder, COMPOSER and
    SemCLIP on the dual encoder, each trained for 2 steps, and one row whose files are missing."""
    folder = tmp_path_factory.mktemp("explore")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GROUNDING_CACHE", str(folder / "cache"))
        flickr = {"class_path": "data_modules.FlickrDataModule",
                  "init_args": {"root": str(tiny_world / "flickr"), "karpathy_file": None, "captions_file": None}}
        coco = {"root": str(tiny_world / "coco"), "batch_size": 8, "eval_batch_size": 8}
        configs = {
            "stage1": _config(folder, "stage1", "vgbert/stage1_tiny.yaml", {**OFFLINE, "visual_heads": 4}, coco),
            "dual": _config(folder, "dual", "vgbert/baseline_tiny.yaml", {**OFFLINE, "visual_heads": 2}, coco),
            "composer": _config(folder, "composer", "composer/composer_world.yaml",
                                {**OFFLINE, "image_size": 64, "sizes": {"heads": 2, "co_heads": 2, "co_dim": 16, "dim": 32}},
                                {"captions": flickr, "world_meta": str(tiny_world / "world.json"), "batch_size": 8,
                                 "transform": {"resize_size": 64}}),
        }
        ckpts = {name: _fit(cfg, folder / f"run_{name}") for name, cfg in configs.items()}
        ste = STEEmbedding.load(tiny_world_ste(folder / "ste"))
        transform = save_transform(AlignmentTransform(SuiteVLM(ckpts["dual"]).dim, ste.dim, hidden=16),
                                   folder / "transform.pt")
        rows = [{"name": "stage 1", "config": configs["stage1"], "ckpt": ckpts["stage1"], "command": "make stage1"},
                {"name": "dual", "config": configs["dual"], "ckpt": ckpts["dual"], "command": "make baseline"},
                {"name": "COMPOSER", "config": configs["composer"], "ckpt": ckpts["composer"], "command": "make composer"},
                {"name": "SemCLIP", "command": "make semclip", "semclip": {"vlm": f"suite:{ckpts['dual']}",
                 "transform": str(transform), "ste": str(folder / "ste"), "query_mode": "ste"}},
                {"name": "ViLBERT-style", "config": configs["composer"], "ckpt": str(folder / "none.ckpt"),
                 "command": "make vilbert"}]
        path = folder / "board.yaml"
        path.write_text(yaml.safe_dump({"test_set": {"name": "tiny", "captions": flickr}, "out": str(folder / "out"),
                                        "models": rows}))
        explorer = load_explorer(str(path), rerank_top_k=3, log=lambda line: None)
        yield {"path": path, "configs": configs, "ckpts": ckpts, "folder": folder, "explorer": explorer}


def _own_scores(config: str, ckpt: str, workdir: Path, flickr_root: Path, caption_data: bool) -> torch.Tensor:
    """The stage's own test loop on the tiny world's Flickr test split: its kept score matrix (images, captions)."""
    flickr = {"class_path": "data_modules.FlickrDataModule",
              "init_args": {"root": str(flickr_root), "karpathy_file": None, "captions_file": None}}
    override = {"data": flickr} if caption_data else {"data": {"init_args": {"captions": flickr}}}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_test_subcommand(config, ckpt, workdir, [override])
    return cli.model.scored["test"].scores.float()


def test_answers_are_each_models_own_test_scores(board, tiny_world, tmp_path):
    """A test caption as the query: every model scores the gallery exactly as its own `test` loop scores that
    caption's column, and the caption's photo is marked as the ground truth."""
    explorer = board["explorer"]
    kinds = {name: type(m) for name, m in explorer.models.items()}
    assert kinds == {"stage 1": MatchMapModel, "dual": VectorModel, "COMPOSER": CrossModel, "SemCLIP": SemCLIPModel}
    assert [m[0] for m in explorer.report.missing] == ["ViLBERT-style"] and not explorer.report.failed
    captions = explorer.gallery.flat_captions
    picks = [0, len(captions) // 2, len(captions) - 1]
    for name, caption_data in (("stage 1", True), ("dual", True), ("COMPOSER", False)):
        key = {"stage 1": "stage1", "dual": "dual", "COMPOSER": "composer"}[name]
        own = _own_scores(board["configs"][key], board["ckpts"][key], tmp_path / key, tiny_world / "flickr", caption_data)
        assert own.shape == (len(explorer.gallery.image_paths), len(captions))
        for j in picks:
            ours = explorer.models[name].text_scores(captions[j])
            # the dual encoder's own loop scores dot products of unit vectors, the explorer cosines: equal
            torch.testing.assert_close(ours, own[:, j], rtol=2e-3, atol=2e-3, msg=f"{name}, caption {j}")
        # the scores depend on the query: two captions do not score the gallery alike
        assert not torch.allclose(explorer.models[name].text_scores(captions[0]),
                                  explorer.models[name].text_scores(captions[-1]))
    truth = int(explorer.gallery.caption_image[picks[1]])
    result = explorer.search(captions[picks[1]].upper() + " ", k=3)
    assert result.truth == {truth} and set(result.ranked) == set(explorer.models) and not result.errors
    assert all(len(r.rows) == 3 for r in result.ranked.values())
    # COMPOSER reranked the first stage's top 3 (the dual encoder, the first vector model): its photos are among them
    first = explorer.models["dual"].rank_images(result.query, 3).rows
    assert result.first_stage == "dual" and set(result.ranked["COMPOSER"].rows) <= set(first)
    items = explorer.result_items(result, "dual")
    assert items[0][1].startswith("1. ") and any("✓" in c for _, c in items) == (truth in result.ranked["dual"].rows)
    # image -> captions: each model's top captions, a ✓ on the photo's own
    own_captions = int((explorer.gallery.caption_image == truth).sum())
    page = explorer.captions(truth, k=len(captions))  # every caption ranked: each model lists the photo's own
    assert page.count("<ol>") == len(explorer.models) and page.count("✓") == len(explorer.models) * own_captions


def test_explanations_come_from_the_models(board):
    explorer = board["explorer"]
    caption = explorer.gallery.flat_captions[0]
    # VG-BERT: the counted words' match maps (no [CLS]/[SEP]), drawn over the photo
    tokens, maps = explorer.words(caption, 1)
    assert tokens and not {"[CLS]", "[SEP]"} & set(tokens) and maps.shape[0] == len(tokens)
    heat = explorer.heat_map(caption, 1, 0)
    assert heat.shape == (256, 256, 3) and heat.dtype == np.uint8 and heat.std() > 0
    # COMPOSER: the CRG's root is the sentence, its score the sentence's score on that photo
    composer = explorer.models["COMPOSER"]
    tree = composer.concept_tree(caption, 1)
    assert tree.children and tree.score == pytest.approx(float(composer.text_scores(caption, torch.tensor([1]))[0]),
                                                         abs=1e-4)
    page = explorer.crg_html(caption, 1)
    assert 'class="crg-tree"' in page and page.count("<li>") >= 3
    assert "score θᵀv on photo" in page  # the board's COMPOSER has the paper's linear head
    # SemCLIP: "a red car" asked with car's WordNet synonyms; the query itself overlaps its own top-k fully
    rows = explorer.models["SemCLIP"].synonyms("a red car", 3)
    assert rows[0].query == "a red car" and rows[0].semclip_overlap == 1.0
    assert {"a red auto", "a red automobile"} <= {r.query for r in rows[1:]}
    assert all(0 <= r.semclip_overlap <= 1 and 0 <= r.vlm_overlap <= 1 and len(r.semclip_top) == 3 for r in rows)
    html_table, sheet = explorer.synonyms("a red car", 3)
    assert "overlap@3" in html_table and sheet.size[1] == len(rows) * 100


def test_bad_queries_are_messages(board):
    explorer = board["explorer"]
    for query in ("", "   ", "x" * 301):
        with pytest.raises(QueryError):
            explorer.search(query)
    for query in ("?!...", "🙂🙂", " - ! "):  # no word: every model would still rank, on nothing (the page shows this)
        with pytest.raises(QueryError, match="has no words"):
            explorer.search(query)
    with pytest.raises(QueryError):
        explorer.captions(10_000)


def test_wrong_checkpoint_is_listed_not_served(board, tmp_path):
    """Another model's checkpoint under a row's config is refused with both classes named, the other rows load."""
    rows = yaml.safe_load(board["path"].read_text())
    rows["models"] = [{"name": "stage 1", "config": board["configs"]["stage1"], "ckpt": board["ckpts"]["dual"],
                       "command": "make stage1"},
                      {"name": "dual", "config": board["configs"]["dual"], "ckpt": board["ckpts"]["dual"],
                       "command": "make baseline"}]
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(rows))
    explorer = load_explorer(str(path), log=lambda line: None)
    assert list(explorer.models) == ["dual"]
    (name, reason), = explorer.report.failed
    assert name == "stage 1" and "is a checkpoint of" in reason and "GroundingPretrain" in reason


def test_a_row_not_made_yet_shows_the_demos_checkpoint(board, tmp_path):
    """`make demo` trains COMPOSER under outputs/composer/world, the world leaderboard's row reads `make
    composer-compare`'s: until that exists the explorer shows the demo's (`demo_ckpt`) and says so."""
    rows = yaml.safe_load(board["path"].read_text())
    rows["models"] = [{"name": "COMPOSER", "config": board["configs"]["composer"], "ckpt": str(tmp_path / "none.ckpt"),
                       "demo_ckpt": board["ckpts"]["composer"], "command": "make composer-compare"}]
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(rows))
    said = []
    explorer = load_explorer(str(path), log=said.append)
    assert list(explorer.models) == ["COMPOSER"] and not explorer.report.missing
    assert any("not made yet" in line and "showing" in line for line in said)
    rows["models"][0]["demo_ckpt"] = str(tmp_path / "neither.ckpt")  # neither made: listed as not trained yet
    path.write_text(yaml.safe_dump(rows))
    explorer = load_explorer(str(path), log=said.append)
    assert not explorer.models and [m[0] for m in explorer.report.missing] == ["COMPOSER"]


def test_a_run_fit_with_overrides_is_rebuilt_from_its_own_config(board, tmp_path, monkeypatch):
    """A stage fit with a command-line override of its network (as `make stage3` gives the search heads their stage-2
    checkpoint) loads: the explorer builds it from the run's config.yaml, not from the row's config alone."""
    monkeypatch.setenv("GROUNDING_CACHE", str(board["folder"] / "cache"))
    ckpt = _fit(board["configs"]["dual"], tmp_path / "run", "--model.init_args.net.init_args.projection_dim=24")
    rows = yaml.safe_load(board["path"].read_text())
    rows["models"] = [{"name": "dual, 24 wide", "config": board["configs"]["dual"], "ckpt": ckpt, "command": "make baseline"}]
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(rows))
    explorer = load_explorer(str(path), log=lambda line: None)
    assert not explorer.report.failed and explorer.models["dual, 24 wide"].images.shape[1] == 24
    # a run recorded before the DataModules' options moved into groups (flat in its config.yaml) loads too
    run_config = tmp_path / "run" / "config.yaml"
    recorded = yaml.safe_load(run_config.read_text())
    data = recorded["data"]["init_args"]
    data["num_workers"] = data.pop("loader")["num_workers"]
    data.update(data.pop("transform"))
    run_config.write_text(yaml.safe_dump(recorded))
    explorer = load_explorer(str(path), log=lambda line: None)
    assert not explorer.report.failed and explorer.models["dual, 24 wide"].images.shape[1] == 24


def test_a_long_inline_config_is_not_taken_for_a_file_name():
    """build_stage passes the run's config sections as one inline YAML string, longer than a file name may be."""
    inline = yaml.safe_dump({"model": {"init_args": {f"key_{i}": "x" * 20 for i in range(40)}}})
    assert len(inline) > 1000 and expand_config_bases(["--config", inline]) == ["--config", inline]


@pytest.mark.parametrize("case", ["missing photos", "bad yaml", "bad option", "no model"])
def test_start_up_errors_are_one_line_and_exit_2(board, tmp_path, capsys, case):
    cfg = yaml.safe_load(board["path"].read_text())
    args = []
    if case == "missing photos":
        cfg["test_set"]["captions"]["init_args"]["root"] = str(tmp_path / "nowhere")
    if case == "no model":
        cfg["models"] = [cfg["models"][-1]]  # only the row whose checkpoint is missing
    if case == "bad option":
        args = ["--top-k", "0"]
    path = tmp_path / "board.yaml"
    path.write_text("test_set: [unclosed" if case == "bad yaml" else yaml.safe_dump(cfg))
    assert explore_main(["--config", str(path), "--check", "a ball", *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    if case == "no model":
        assert "make vilbert" in err[0]


def test_check_answers_in_the_terminal(board, capsys, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(board["folder"] / "cache"))
    assert explore_main(["--config", str(board["path"]), "--check", "a red car"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert {line.split(" (")[0] for line in out} == {"stage 1", "dual", "COMPOSER", "SemCLIP"}
    # --gallery all: every photo of the data (train, val and test), each answer drawn from all of them
    board_cfg = load_leaderboard(board["path"])
    test, every = Gallery.from_test_set(board_cfg.test_set), Gallery.from_test_set(board_cfg.test_set, "all")
    assert len(every.image_paths) > len(test.image_paths) and set(test.image_paths) <= set(every.image_paths)
    assert len(every.flat_captions) == len(every.caption_image) and every.caption_image.max() == len(every.image_paths) - 1
    assert explore_main(["--config", str(board["path"]), "--check", "a red car", "--gallery", "all"]) == 0


def test_check_record_holds_each_models_time(board, tmp_path, capsys, monkeypatch):
    """``--check QUERY --record``: a record of the schema, a row per loaded model with the time --check prints (ms),
    the gallery and the query beside it; a bad --record (or one without --check) is one line and exit 2, before any
    model loads."""
    import json

    from grounding.docs_tables import validate_record

    monkeypatch.setenv("GROUNDING_CACHE", str(board["folder"] / "cache"))
    path = tmp_path / "records" / "explorer.json"
    capsys.readouterr()
    assert explore_main(["--config", str(board["path"]), "--check", "a red car", "--record", str(path)]) == 0
    printed = {line.split(" (")[0]: line.split(" (")[1].split(" ms")[0] for line in capsys.readouterr().out.splitlines()}
    record = json.loads(path.read_text())
    validate_record(record, str(path))
    assert record["columns"] == ["model", "kind", "ms", "note"] and record["config"] == str(board["path"])
    assert [r["model"] for r in record["rows"]] == list(printed) == ["stage 1", "dual", "COMPOSER", "SemCLIP"]
    for row in record["rows"]:
        assert isinstance(row["ms"], float) and f"{row['ms']:.0f}" == printed[row["model"]] and row["error"] is None
    assert [r["kind"] for r in record["rows"]] == ["match map", "vector", "cross-encoder", "SemCLIP"]
    assert record["rows"][2]["note"].endswith("of dual") and record["query"] == "a red car"
    assert record["photos"] == len(board["explorer"].gallery.image_paths) and record["missing"] == ["ViLBERT-style"]
    assert record["start_up_seconds"] > 0 and record["seeds"] is None
    (tmp_path / "file").write_text("x")
    for argv in (["--check", "a ball", "--record", "bad name!"], ["--check", "a ball", "--record", str(tmp_path)],
                 ["--check", "a ball", "--record", str(tmp_path / "file" / "x.json")], ["--record", str(path)]):
        assert explore_main(["--config", str(tmp_path / "nowhere.yaml"), *argv]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and ("--record " in err[0] or "record name " in err[0]) and "nowhere" not in err[0], err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser() -> str | None:
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow
def test_the_page_in_a_headless_browser(board):
    """`python -m grounding.explore` serves the page; Chromium types a query, waits for every model's photos, clicks
    one, and finds the match-map heat map and COMPOSER's CRG tree drawn."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium: `apt-get install chromium` (the browser test drives it headless)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install -e '.[explore]'")
    pytest.importorskip("gradio", reason="no Gradio: pip install -e '.[explore]'")
    port = _free_port()
    env = {**os.environ, "GROUNDING_CACHE": str(board["folder"] / "cache")}
    server = subprocess.Popen([sys.executable, "-m", "grounding.explore", "--config", str(board["path"]),
                               "--port", str(port), "--rerank-top-k", "3"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    pytest.fail(f"the explorer did not start: {server.stderr.read()[-2000:]}")
                time.sleep(1)
        with sync_api.sync_playwright() as p:
            chrome = p.chromium.launch(executable_path=browser, headless=True, args=["--no-sandbox"])
            page = chrome.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(url)
            assert "Not trained yet: ViLBERT-style" in page.inner_text("#status", timeout=60_000)
            page.fill("#query textarea", "a red car")
            page.click("#search")
            for i in range(4):  # every model's photos
                page.wait_for_selector(f"#results-{i} img", timeout=120_000)
            assert "times:" in page.inner_text("#summary")
            page.locator("#results-0 img").first.click()
            page.wait_for_selector("#heatmap img", timeout=120_000)
            page.wait_for_selector("#crg .crg-tree li", timeout=120_000)
            assert page.locator("#crg .crg-tree li").count() >= 2
            page.fill("#query textarea", "")
            page.click("#search")
            page.wait_for_function("document.querySelector('#summary').innerText.includes('Type a query')",
                                   timeout=60_000)
            chrome.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
