"""Where the suite looks for things by default.

``../shared/data`` (beside the repository) holds small real datasets during development and CI;
a user points the same code at their own copy with ``GROUNDING_SHARED_DATA`` or explicit paths.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = REPO_ROOT / "experiments"


def resolve_path(path: str | os.PathLike) -> Path:
    """A user-given path: ``~`` expanded; absolute as is; a relative one as given when it exists
    under the working directory, else under the repository root when it exists there (configs name
    data relative to the repository), else as given (relative to the working directory)."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_absolute() or p.exists() or not (REPO_ROOT / p).exists():
        return p
    return REPO_ROOT / p


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
