"""Where the suite looks for things by default.

``../shared/data`` (beside the repository) holds small real datasets during development and CI;
a user points the same code at their own copy with ``GROUNDING_SHARED_DATA`` or explicit paths.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = REPO_ROOT / "experiments"


def shared_data_dir() -> Path:
    """The real-data folder: ``$GROUNDING_SHARED_DATA`` or ``<repo>/../shared/data``.

    The folder may not exist (a user's fresh clone); callers check and explain.
    """
    env = os.environ.get("GROUNDING_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def cache_dir() -> Path:
    """Root for derived caches (feature maps, parses, embeddings): ``$GROUNDING_CACHE`` or ``<repo>/.cache``."""
    env = os.environ.get("GROUNDING_CACHE")
    return Path(env) if env else REPO_ROOT / ".cache"
