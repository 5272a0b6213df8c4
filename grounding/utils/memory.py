"""Keep a long evaluation's peak memory where its arrays put it, not where glibc's heap drifts.

glibc serves a freed block back to the heap unless it was mmapped, and its *dynamic* mmap threshold rises to the
size of the largest freed mmapped block: after a few large temporary tensors are freed, later ones of that size are
carved from the heap, where a freed one can stay as a hole the next, slightly larger, allocation cannot reuse. The
stage-1 test loop at COCO 5K x 25K peaked at 3.7, 4.8 or 5.1 GB in three fresh runs for that reason alone
(docs/benchmarks.md). Fixing the threshold (what ``MALLOC_MMAP_THRESHOLD_`` does, here by ``mallopt`` at start-up)
returns every block above it to the system when freed, so every run peaks at the same, lower value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
ENV = "MALLOC_MMAP_THRESHOLD_"
DEFAULT_THRESHOLD = 4 << 20  # 4 MiB: above the per-item buffers, below every score block and feature batch


def fix_mmap_threshold(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (which also turns its dynamic adjustment off), unless the
    user set ``MALLOC_MMAP_THRESHOLD_`` (theirs wins) or the C library is not glibc. True when it was set here."""
    if ENV in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS, Windows: no mallopt, nothing to fix
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))
