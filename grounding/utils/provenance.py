"""Where a recorded number came from: the checkout's commit."""

from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit() -> str | None:
    """The checkout's commit (short hash, ``-dirty`` with uncommitted changes), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, check=True, timeout=30)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
