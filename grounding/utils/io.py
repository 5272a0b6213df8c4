"""Atomic file writing and content hashing.

Every cache, dataset file and checkpoint-like artefact of the suite is written through these
helpers: data goes to a temporary name in the destination folder and is renamed into place only
when complete, so an interrupted run never leaves a half-written file that a later run would
mistake for a valid cache.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    Works for files and for directories (the caller creates whatever it needs at the yielded
    path). On an exception the temporary is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # the caller decides whether it is a file or a directory
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            if not tmp.is_dir():  # a file never replaces a folder (and all it holds)
                raise IsADirectoryError(errno.EISDIR, "is a folder; a file cannot replace it", str(path))
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        raise


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporaries :func:`atomic_path` left in ``folder`` when its process was killed mid-write (call only
    where no other process writes, e.g. under a run folder's lock). Returns what was removed."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp*"):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False))


def atomic_write_csv(path: str | os.PathLike, rows: Iterable[dict], columns: Sequence[str], digits: int = 4) -> Path:
    """A table of ``rows`` (dicts; keys beyond ``columns`` ignored) as CSV, floats rounded to ``digits``."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: round(v, digits) if isinstance(v, float) else v for k, v in row.items()})
    return atomic_write_text(path, buf.getvalue())


def sha1_of_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk_size), b""):
            h.update(block)
    return h.hexdigest()


def state_dict_sha1(module) -> str:
    """Hash of a module's weights and buffers, names included (random-init and pretrained alike): the
    identity of a frozen encoder in cache keys. Takes any object with ``state_dict()`` of tensors."""
    h = hashlib.sha1()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def sha1_of_json(obj: Any) -> str:
    """Stable hash of a JSON-serialisable object (keys sorted): used to key caches by config."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
