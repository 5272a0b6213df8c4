"""Shared fixtures: the real-data folder (skipped when absent) and a tiny generated world."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub from tests
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker a core: one intra-op thread each (set before torch is imported, and
    # inherited by the CLI subprocesses some tests start), so workers do not oversubscribe the cores (two workers of
    # two threads on 2 cores ran the leaderboard and COMPOSER-learns tests ~9 % slower)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_data():
    """``../shared/data`` (or $GROUNDING_SHARED_DATA); the test is skipped when it is absent."""
    from grounding.paths import shared_data_dir

    root = shared_data_dir()
    if not (root / "README.md").is_file():
        pytest.skip(f"real data folder {root} is absent (set GROUNDING_SHARED_DATA to a copy of shared/data)")
    return root


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """A small embedded world (48 scenes at 64 px) in all four real dataset layouts."""
    from data_modules.synthetic import generate_world

    out = tmp_path_factory.mktemp("world")
    generate_world(out, n_images=48, seed=0, image_size=64)
    return out


@pytest.fixture(autouse=True)
def _cached_tokenizer_unchanged():
    """``grounding.encoders.load_tokenizer`` hands every caller one cached tokenizer: a test that changes it (its
    padding side, say) changes how every later test in the process tokenizes (a left-padded batch shifts BERT's
    position ids), which passes under xdist's shuffled order and fails `make test-full`'s single process. A test that
    needs another setting works on ``copy.deepcopy`` of it."""
    yield
    import sys

    encoders = sys.modules.get("grounding.encoders")
    if encoders is None or not encoders.load_tokenizer.cache_info().currsize:
        return
    tok = encoders.load_tokenizer(encoders.TINY_TEXT_ENCODER)
    assert (tok.padding_side, tok.truncation_side) == ("right", "right"), \
        "this test changed the cached tiny tokenizer; change a copy.deepcopy of it instead"
