"""The suite's user-input errors and how its commands report them.

Every error about what a user gave (a data file or folder, a config value, a checkpoint, missing weights, a
caption file, a query image) derives from :class:`UserInputError`, whatever else it is (``FileNotFoundError``,
``ValueError``). The command-line entry points run inside :func:`user_errors_exit`: such an error prints its
message alone (it names the file, what was expected and the fix) and exits with status 2; ``GROUNDING_DEBUG=1``
shows the traceback instead. So does a write the machine refused (a full disk, an exceeded quota, a read-only
file system: :func:`find_write_refusal`): every file the suite writes goes through a temporary name and a rename,
so what was already written stays whole. Anything else is a bug and keeps its traceback.

:func:`offline_hub_by_default` makes the entry points offline unless the user says otherwise
(``HF_HUB_OFFLINE=0``): nothing here is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

EXIT_BAD_INPUT = 2
DEBUG_ENV = "GROUNDING_DEBUG"


class UserInputError(Exception):
    """Something the user gave is missing or wrong; the message says which file or value, what was expected and
    how to fix it. Commands print it alone and exit 2."""


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def find_user_error(error: BaseException | None) -> UserInputError | None:
    """``error`` or the first :class:`UserInputError` it was explicitly raised from (``raise ... from``: how
    jsonargparse re-raises an instantiation error). Not an error merely raised *while handling* one
    (``__context__``): a bug in a fallback must keep its traceback."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserInputError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


WRITE_REFUSALS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EROFS: "the file system is read-only"}


def find_write_refusal(error: BaseException | None) -> OSError | None:
    """``error`` or an error it was raised from / while handling that is an ``OSError`` of :data:`WRITE_REFUSALS`
    (the machine, not the code: a full disk during a checkpoint save)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in WRITE_REFUSALS:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error: BaseException) -> str:
    """The message as printed: the error's own text (its lines kept: Expected / Fix). An error re-raised from a
    DataLoader worker carries the worker's traceback in its text; only the original message is kept."""
    text = str(error).strip()
    if "Original Traceback" in text:
        marker = f"{type(error).__name__}: "
        text = text.rsplit(marker, 1)[-1].strip() if marker in text else text
    return text or type(error).__name__


MAX_MESSAGE_LINES = 3


def at_most_three_lines(text: str) -> str:
    """An error as the user reads it: what (with where), what was expected, how to fix it — at most
    :data:`MAX_MESSAGE_LINES` lines. A longer message (a layout block, a library's nested report) keeps its first
    line and its ``Fix:`` line; everything between is joined into one line, runs of blanks collapsed."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= MAX_MESSAGE_LINES:
        return "\n".join(lines)
    fix_at = next((i for i, line in enumerate(lines) if line.startswith("Fix:")), len(lines))
    return "\n".join(part for part in (lines[0], _joined(lines[1:fix_at]), _joined(lines[fix_at:])) if part)


def _joined(lines: list[str]) -> str:
    out = ""
    for line in (" ".join(line.split()) for line in lines):
        out += ("" if not out else " " if out.endswith(":") else "; ") + line
    return out


@contextlib.contextmanager
def user_errors_exit(prog: str):
    """Run a command: a :class:`UserInputError` (also one wrapped by a library) prints ``<prog>: error: <message>``
    to stderr and exits 2 (``GROUNDING_DEBUG=1``: re-raised with its traceback)."""
    try:
        yield
    except Exception as e:  # KeyboardInterrupt and SystemExit pass through
        found, refused = find_user_error(e), find_write_refusal(e)
        if (found is None and refused is None) or debug_enabled():
            raise
        if found is None:
            where = f" {refused.filename}" if refused.filename else ""
            message = (f"could not write{where}: {WRITE_REFUSALS[refused.errno]} ({refused.strerror}). Files already "
                       "written are whole (each is written under a temporary name, then renamed); free space or "
                       "choose another output folder and run the command again (a fit resumes with --ckpt_path last).")
        else:
            message = one_line(found)
        message = at_most_three_lines(f"{prog}: error: {message}")
        if not os.environ.get(DEBUG_ENV) and message.count("\n") < MAX_MESSAGE_LINES - 1:
            message += f"\n(set {DEBUG_ENV}=1 for the traceback)"
        print(message, file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def offline_hub_by_default() -> None:
    """``HF_HUB_OFFLINE=1`` unless the user set it (call before transformers / huggingface_hub are imported: they
    read it once). ``HF_HUB_OFFLINE=0`` lets a command fetch weights it lacks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


class MissingInputError(UserInputError, FileNotFoundError):
    """A file or folder the user named (or a previous step should have written) does not exist."""
