"""Caption file formats, read in one place and without torch (the DataModules, COMPOSER's caption
sets and SemCLIP's caption lists all build on these readers).

* COCO captions JSON (``captions_train2017.json``): ``{"images": [{"id", "file_name"}], "annotations":
  [{"image_id", "caption"}]}``.
* Karpathy split JSON (``dataset_coco.json`` / ``dataset_flickr30k.json`` / ``dataset_flickr8k.json``):
  ``{"images": [{"filename", "filepath", "split", "sentences": [{"raw", "tokens"}]}]}``.
* Flickr token files (Flickr8k ``Flickr8k.token.txt``, Flickr30K ``results_20130124.token``):
  ``<image file>#<caption number><TAB><caption>`` lines.
* Plain text: one caption a line.

Every reader returns :class:`CaptionRecords`: the captions in file order, each with the row of its
image in ``images`` (:class:`CaptionImage`: file name, Karpathy split, dataset ids, captions). Bad
input raises the caller's error class (``error``) with one message naming the file (and the line
or JSON element), what was expected and how to fix it (``hint``); ``dataset`` prefixes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from grounding.errors import UserInputError

FORMATS = ("coco", "karpathy", "flickr_token", "text")

COCO_SCHEMA = ('{"images": [{"id": int, "file_name": str, ...}], '
               '"annotations": [{"image_id": int, "caption": str, ...}]}')
KARPATHY_SCHEMA = ('{"images": [{"filename": str, "filepath": str (COCO only), "split": "train"|"val"|"test"|'
                   '"restval", "sentences": [{"raw": str, "tokens": [str]}], ...}], "dataset": str}')
KARPATHY_KEYS = ("filename", "split", "sentences")
FLICKR_TOKEN_FORMAT = ("'<image file>#<caption number><TAB><caption>', e.g. "
                       "'1000268201_693b08cb0e.jpg#0\\tA child in a pink dress ...'")
TEXT_FORMAT = "UTF-8 text, one caption a line"
CAPTION_FILE_FORMATS = (f"a COCO captions JSON {COCO_SCHEMA}, a Karpathy split JSON {KARPATHY_SCHEMA}, a Flickr token "
                        f"file ({FLICKR_TOKEN_FORMAT}) or a text file with one caption a line")

ErrorClass = Callable[[str], Exception]


class CaptionFormatError(UserInputError, ValueError):
    """A caption file does not parse as its format (the default ``error`` of the readers)."""


@dataclass
class CaptionImage:
    """One image of a caption file. ``captions`` are as written in the file (not stripped), in file order."""

    file_name: str
    captions: list[str] = field(default_factory=list)
    filepath: str = ""            # Karpathy's sub-folder (dataset_coco.json: train2014 / val2014)
    split: str | None = None      # Karpathy's split: train / val / test / restval
    image_id: Any = None          # COCO "id"; Karpathy "cocoid"
    imgid: Any = None             # Karpathy "imgid"

    @property
    def key(self) -> str:
        """The image's name in the file: ``filepath/filename`` when Karpathy gives a filepath."""
        return str(Path(self.filepath) / self.file_name) if self.filepath else self.file_name


@dataclass
class CaptionRecords:
    """A caption file read: ``pairs`` = (row in ``images`` or None for plain text, caption) in file
    order (COCO: annotation order); ``caption_ids`` = COCO annotation ids (0 where absent)."""

    path: Path
    format: str
    images: list[CaptionImage]
    pairs: list[tuple[int | None, str]]
    caption_ids: list[Any] | None = None
    dataset: str = ""             # Karpathy's "dataset" field

    @property
    def captions(self) -> list[str]:
        return [c for _, c in self.pairs]

    def key_pairs(self) -> list[tuple[str | None, str]]:
        """(image key, caption) in file order."""
        return [(None if row is None else self.images[row].key, c) for row, c in self.pairs]


# --------------------------------------------------------------------------------------------
# Errors: one message shape, the caller's class
# --------------------------------------------------------------------------------------------
def format_error(error: ErrorClass, dataset: str, subject: str | Path, problem: str, expected: str,
                 hint: str = "") -> Exception:
    """``error("<dataset>: <subject> <problem>.\\nExpected: <expected>\\nFix: <hint>.")``."""
    prefix = f"{dataset}: " if dataset else ""
    return error(f"{prefix}{subject} {problem}.\nExpected: {expected}" + (f"\nFix: {hint}." if hint else ""))


def expect_keys(obj: Any, keys: Sequence[str], where: str, path: Path, error: ErrorClass, dataset: str, schema: str,
                hint: str) -> None:
    """``obj`` must be a dict holding every key in ``keys``; ``where`` says which element it is."""
    if not isinstance(obj, dict):
        raise format_error(error, dataset, path, f"has {type(obj).__name__} at {where} where an object was expected",
                           schema, hint)
    missing = [k for k in keys if k not in obj]
    if missing:
        raise format_error(error, dataset, path, f"lacks key(s) {missing} at {where} (keys present: {sorted(obj)[:12]})",
                           schema, hint)


def _line_of(data: bytes, offset: int) -> int:
    """1-based line (universal newlines) of byte ``offset``; the bytes before it are valid UTF-8."""
    text = data[:offset].decode("utf-8", errors="replace")
    return text.count("\n") + text.count("\r") - text.count("\r\n") + 1


def read_text(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
              expected: str = TEXT_FORMAT) -> str:
    """The file decoded as UTF-8; other bytes raise ``error`` naming the file and line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise format_error(error, dataset, f"{path}:{_line_of(data, e.start)}",
                           f"is not UTF-8 text (byte {data[e.start:e.start + 1]!r} at offset {e.start}: {e.reason})",
                           expected, hint or "save the file as UTF-8") from e


def split_lines(text: str) -> list[str]:
    """Lines as reading the file in text mode gives them (universal newlines), without line ends."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def load_json(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
              schema: str = "JSON") -> Any:
    """Parse a JSON file once; a syntax error names the file, line, column and the expected schema."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        fix = f"{hint} (the file may be truncated: download it again)" if hint else \
            "the file may be truncated: download it again"
        raise format_error(error, dataset, path, f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})",
                           schema, fix) from e
    except UnicodeDecodeError as e:
        raise format_error(error, dataset, path, f"is not UTF-8 JSON (line {_line_of(data, e.start)}: {e})", schema,
                           hint or "save the file as UTF-8") from e


def json_format(obj: Any) -> str | None:
    """``"karpathy"`` / ``"coco"`` for a parsed caption JSON, None for anything else."""
    if not isinstance(obj, dict):
        return None
    images = obj.get("images")
    if isinstance(images, list) and images and isinstance(images[0], dict) and "sentences" in images[0]:
        return "karpathy"
    if isinstance(obj.get("annotations"), list):
        return "coco"
    return None


# --------------------------------------------------------------------------------------------
# Line formats
# --------------------------------------------------------------------------------------------
def parse_token_line(line: str) -> tuple[str, str] | None:
    """``<file>#<i><TAB><caption>`` -> (file, caption), both stripped; None if the line is not one."""
    key, sep, caption = line.partition("\t")
    name, hash_, idx = key.rpartition("#")
    if not sep or not hash_ or not name.strip() or not idx.strip().isdigit():
        return None
    return name.strip(), caption.strip()


def read_flickr_token_pairs(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "",
                            dataset: str = "Flickr", text: str | None = None) -> list[tuple[str, str]]:
    """(image file, caption) pairs in file order (blank lines skipped); a malformed line raises ``error``
    naming the file and line, the expected format and ``hint`` (how to fix it)."""
    path = Path(path)
    text = read_text(path, error, hint, dataset, FLICKR_TOKEN_FORMAT) if text is None else text
    pairs = []
    for lineno, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        pair = parse_token_line(line)
        if pair is None:
            raise error(f"{dataset}: {path}:{lineno} is malformed: {line[:120]!r}.\n"
                        f"Expected: {FLICKR_TOKEN_FORMAT}." + (f"\nFix: {hint}." if hint else ""))
        pairs.append(pair)
    return pairs


def read_flickr_tokens(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "",
                       dataset: str = "Flickr", text: str | None = None) -> CaptionRecords:
    """A Flickr token file as records: images in first-seen order."""
    path = Path(path)
    rows: dict[str, int] = {}
    images: list[CaptionImage] = []
    pairs: list[tuple[int | None, str]] = []
    for name, caption in read_flickr_token_pairs(path, error, hint, dataset, text):
        row = rows.get(name)
        if row is None:
            row = rows[name] = len(images)
            images.append(CaptionImage(name))
        images[row].captions.append(caption)
        pairs.append((row, caption))
    return CaptionRecords(path, "flickr_token", images, pairs)


def read_text_captions(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
                       text: str | None = None) -> CaptionRecords:
    """One caption a line (``str.splitlines``), stripped; blank lines skipped; no images."""
    path = Path(path)
    text = read_text(path, error, hint, dataset, TEXT_FORMAT) if text is None else text
    return CaptionRecords(path, "text", [], [(None, s) for line in text.splitlines() if (s := line.strip())])


# --------------------------------------------------------------------------------------------
# JSON formats
# --------------------------------------------------------------------------------------------
def read_coco_json(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "",
                   dataset: str = "COCO captions", obj: Any = None, captions_only: bool = False) -> CaptionRecords:
    """Official COCO captions: images in file order (each with its captions in annotation order), pairs
    in annotation order. ``captions_only``: only ``annotations[].caption`` is needed (no images)."""
    path = Path(path)
    data = load_json(path, error, hint, dataset, COCO_SCHEMA) if obj is None else obj
    top = ["annotations"] if captions_only else ["images", "annotations"]
    expect_keys(data, top, "the top level", path, error, dataset, COCO_SCHEMA, hint)
    for key in top:
        if not isinstance(data[key], list):
            raise format_error(error, dataset, path, f'has a non-list "{key}"', COCO_SCHEMA, hint)
    images: list[CaptionImage] = []
    rows: dict[Any, int] = {}
    for i, img in enumerate([] if captions_only else data["images"]):
        expect_keys(img, ["id", "file_name"], f"images[{i}]", path, error, dataset, COCO_SCHEMA, hint)
        rows[img["id"]] = len(images)
        images.append(CaptionImage(img["file_name"], image_id=img["id"]))
    pairs: list[tuple[int | None, str]] = []
    ids = []
    for i, ann in enumerate(data["annotations"]):
        expect_keys(ann, ["caption"] if captions_only else ["image_id", "caption"], f"annotations[{i}]", path, error,
                    dataset, COCO_SCHEMA, hint)
        caption = ann["caption"]
        if not isinstance(caption, str):
            raise format_error(error, dataset, path, f"has a {type(caption).__name__} caption at annotations[{i}]",
                               COCO_SCHEMA, hint)
        row = None
        if not captions_only:
            row = rows.get(ann["image_id"])
            if row is None:
                raise format_error(error, dataset, path,
                                   f"has annotations[{i}] for image_id {ann['image_id']} that is not in \"images\"",
                                   COCO_SCHEMA, hint)
            images[row].captions.append(caption)
        pairs.append((row, caption))
        ids.append(ann.get("id", 0))
    return CaptionRecords(path, "coco", images, pairs, ids)


def karpathy_caption(sentence: Any) -> str:
    """One Karpathy sentence: its ``raw`` text, else its tokens joined (a plain string as is)."""
    if isinstance(sentence, dict):
        return sentence.get("raw") or " ".join(sentence.get("tokens", []))
    return str(sentence)


def read_karpathy_json(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
                       obj: Any = None, required: Sequence[str] = KARPATHY_KEYS) -> CaptionRecords:
    """Karpathy split file: images in file order with split, ids and captions. ``required``: the keys
    every image must have (COMPOSER's MCD files need no split; a caption list needs only sentences)."""
    path = Path(path)
    data = load_json(path, error, hint, dataset, KARPATHY_SCHEMA) if obj is None else obj
    expect_keys(data, ["images"], "the top level", path, error, dataset, KARPATHY_SCHEMA, hint)
    if not isinstance(data["images"], list):
        raise format_error(error, dataset, path, '"images" is not a list', KARPATHY_SCHEMA, hint)
    images: list[CaptionImage] = []
    pairs: list[tuple[int | None, str]] = []
    for i, entry in enumerate(data["images"]):
        expect_keys(entry, list(required), f"images[{i}]", path, error, dataset, KARPATHY_SCHEMA, hint)
        sentences = entry.get("sentences", [])
        if not isinstance(sentences, list):
            raise format_error(error, dataset, path, f'has a non-list "sentences" at images[{i}]', KARPATHY_SCHEMA, hint)
        captions = [karpathy_caption(s) for s in sentences]
        images.append(CaptionImage(entry.get("filename", ""), captions, entry.get("filepath") or "", entry.get("split"),
                                   entry.get("cocoid"), entry.get("imgid")))
        pairs.extend((i, c) for c in captions)
    return CaptionRecords(path, "karpathy", images, pairs, dataset=data.get("dataset", ""))


# --------------------------------------------------------------------------------------------
# Any format
# --------------------------------------------------------------------------------------------
def _load(path: Path, error: ErrorClass, hint: str, dataset: str, plain_text: bool) -> tuple[str, Any]:
    """(format, parsed JSON or decoded text) of a caption file."""
    if path.suffix.lower() == ".json":
        obj = load_json(path, error, hint, dataset, CAPTION_FILE_FORMATS)
        fmt = json_format(obj)
        if fmt is None:
            raise format_error(error, dataset, path, "holds neither a Karpathy split JSON nor a COCO captions JSON",
                               f'a Karpathy split JSON {KARPATHY_SCHEMA} or a COCO captions JSON {COCO_SCHEMA}', hint)
        return fmt, obj
    text = read_text(path, error, hint, dataset, CAPTION_FILE_FORMATS)
    if not plain_text:
        return "flickr_token", text
    first = next((line for line in split_lines(text) if line.strip()), "")
    return ("flickr_token" if parse_token_line(first) is not None else "text"), text


def detect_format(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
                  plain_text: bool = True) -> str:
    """One of :data:`FORMATS`: a ``.json`` file by its keys (Karpathy: ``images[0].sentences``; COCO:
    ``annotations``), any other file by its first non-blank line (a Flickr token line, else plain text;
    ``plain_text=False``: always a token file)."""
    return _load(Path(path), error, hint, dataset, plain_text)[0]


def read_caption_file(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "", dataset: str = "",
                      plain_text: bool = True, captions_only: bool = False, missing: ErrorClass = FileNotFoundError,
                      karpathy_keys: Sequence[str] | None = None) -> CaptionRecords:
    """Any supported caption file (format from :func:`detect_format`), parsed once. ``captions_only``:
    accept files that hold captions without image information (COCO ``annotations`` only, Karpathy
    images without filename or split). ``karpathy_keys``: the keys every Karpathy image must have
    (default :data:`KARPATHY_KEYS`, none with ``captions_only``). A missing file raises ``missing``."""
    path = Path(path)
    if not path.is_file():
        raise format_error(missing, dataset, f"caption file {path}", "does not exist", CAPTION_FILE_FORMATS, hint)
    fmt, content = _load(path, error, hint, dataset, plain_text)
    if fmt == "coco":
        return read_coco_json(path, error, hint, dataset, content, captions_only)
    if fmt == "karpathy":
        if karpathy_keys is None:
            karpathy_keys = () if captions_only else KARPATHY_KEYS
        return read_karpathy_json(path, error, hint, dataset, content, karpathy_keys)
    if fmt == "flickr_token":
        return read_flickr_tokens(path, error, hint, dataset or "Flickr", content)
    return read_text_captions(path, error, hint, dataset, content)


def read_caption_texts(path: str | Path, error: ErrorClass = CaptionFormatError, hint: str = "",
                       missing: ErrorClass = FileNotFoundError) -> list[str]:
    """Every caption of one file of any supported format, in file order (COCO: annotation order;
    Karpathy: image by image), as the file writes them (Flickr token and plain-text lines stripped,
    blank lines skipped). Only captions are needed: COCO ``{"annotations": [{"caption": str}]}``,
    Karpathy ``{"images": [{"sentences": [...]}]}``. A missing file raises ``missing``, anything else
    that does not read (bad JSON, no known layout, a malformed token line, non-UTF-8 bytes) ``error``;
    both messages name the file (and line or element) and what was expected."""
    return read_caption_file(path, error, hint, plain_text=True, captions_only=True, missing=missing).captions
