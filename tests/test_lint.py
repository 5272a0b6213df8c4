"""``ruff`` (configured in pyproject.toml) is clean over the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_is_clean():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (`make install` installs it with the dev extra)")
    run = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"ruff found problems (fix them, or `ruff check --fix`):\n{run.stdout}{run.stderr}"
