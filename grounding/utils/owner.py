"""Which process owns a file or folder (a feature-cache build, a run folder's lock), and whether it still runs.

An owner record is ``{"pid", "host", "pid_start", "started"}``; ``pid_start`` (the kernel's start time of the
process, Linux ``/proc``) tells the owner from a later process that was given the same pid.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def process_start(pid: int) -> int | None:
    """The kernel's start time of process ``pid`` (Linux ``/proc``; None elsewhere or when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_record() -> dict:
    """This process as an owner."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "pid_start": process_start(pid), "started": time.time()}


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False  # os.kill(0, ...) would address our own process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OSError, OverflowError):
        return False
    return True


def same_host(owner: object) -> bool:
    """``owner`` is a record written on this host (only then can its pid be checked)."""
    return isinstance(owner, dict) and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int)


def owner_gone(owner: dict) -> str | None:
    """Why the owner (a record from this host) no longer runs, or None while it may."""
    pid = owner["pid"]
    if not pid_alive(pid):
        return f"pid {pid} is gone"
    start = process_start(pid)
    if owner.get("pid_start") is not None and start is not None and start != owner["pid_start"]:
        return f"pid {pid} is gone (the pid now names another process)"
    return None
