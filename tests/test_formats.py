"""The torch-free caption-format module: each format read from a tiny file, detection, and errors
that name the file (malformed content, non-UTF-8 bytes, a missing file)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_modules import formats
from data_modules.formats import (
    CaptionFormatError,
    detect_format,
    read_caption_file,
    read_caption_texts,
    read_coco_json,
    read_flickr_token_pairs,
    read_flickr_tokens,
    read_karpathy_json,
    read_text_captions,
)

COCO = {"images": [{"id": 7, "file_name": "b.jpg"}, {"id": 3, "file_name": "a.jpg"}],
        "annotations": [{"id": 12, "image_id": 3, "caption": "A cat sits ."},
                        {"id": 10, "image_id": 7, "caption": " A dog runs . "},
                        {"id": 11, "image_id": 3, "caption": "A cat sleeps ."}]}
KARPATHY = {"dataset": "coco", "images": [
    {"filepath": "val2014", "filename": "x.jpg", "cocoid": 42, "imgid": 0, "split": "restval",
     "sentences": [{"raw": "A man rides a horse .", "tokens": ["a", "man"]}, {"raw": "", "tokens": ["a", "horse"]}]},
    {"filename": "y.jpg", "imgid": 1, "split": "test", "sentences": [{"raw": "Two birds .", "tokens": []}]}]}
TOKENS = "a.jpg#0\tA dog runs .\na.jpg#1\t A dog . \n\nb.jpg#0\tA cat .\n"


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "captions.json").write_text(json.dumps(COCO))
    (tmp_path / "dataset_coco.json").write_text(json.dumps(KARPATHY))
    (tmp_path / "Flickr8k.token.txt").write_text(TOKENS)
    (tmp_path / "captions.txt").write_text("A red fruit .\n\n  A striped horse  \r\nlast line")
    return tmp_path


def test_coco_json(files):
    rec = read_coco_json(files / "captions.json")
    assert rec.format == "coco" and [im.file_name for im in rec.images] == ["b.jpg", "a.jpg"]
    assert [im.image_id for im in rec.images] == [7, 3]
    assert rec.captions == ["A cat sits .", " A dog runs . ", "A cat sleeps ."]  # annotation order, as written
    assert [row for row, _ in rec.pairs] == [1, 0, 1] and rec.caption_ids == [12, 10, 11]
    assert rec.images[1].captions == ["A cat sits .", "A cat sleeps ."]
    assert rec.key_pairs()[0] == ("a.jpg", "A cat sits .")
    only = read_coco_json(files / "captions.json", obj={"annotations": [{"caption": "x"}]}, captions_only=True)
    assert only.images == [] and only.pairs == [(None, "x")]


def test_karpathy_json(files):
    rec = read_karpathy_json(files / "dataset_coco.json")
    assert rec.format == "karpathy" and rec.dataset == "coco"
    x, y = rec.images
    assert (x.key, x.split, x.image_id, x.imgid) == ("val2014/x.jpg", "restval", 42, 0)
    assert x.captions == ["A man rides a horse .", "a horse"]  # empty raw: the tokens joined
    assert (y.key, y.split, y.image_id, y.imgid) == ("y.jpg", "test", None, 1)
    assert rec.pairs == [(0, "A man rides a horse ."), (0, "a horse"), (1, "Two birds .")]


def test_flickr_tokens_and_plain_text(files):
    rec = read_flickr_tokens(files / "Flickr8k.token.txt")
    assert [im.file_name for im in rec.images] == ["a.jpg", "b.jpg"] and rec.images[0].captions == ["A dog runs .", "A dog ."]
    assert rec.key_pairs() == read_flickr_token_pairs(files / "Flickr8k.token.txt")
    text = read_text_captions(files / "captions.txt")
    assert text.format == "text" and text.captions == ["A red fruit .", "A striped horse", "last line"]
    assert text.images == [] and text.key_pairs()[0] == (None, "A red fruit .")


def test_detection_and_any_format(files):
    assert detect_format(files / "captions.json") == "coco"
    assert detect_format(files / "dataset_coco.json") == "karpathy"
    assert detect_format(files / "Flickr8k.token.txt") == "flickr_token"
    assert detect_format(files / "captions.txt") == "text"
    assert detect_format(files / "captions.txt", plain_text=False) == "flickr_token"
    (files / "UPPER.JSON").write_text(json.dumps(COCO))
    assert detect_format(files / "UPPER.JSON") == "coco"
    for name, fmt in [("captions.json", "coco"), ("dataset_coco.json", "karpathy"), ("Flickr8k.token.txt", "flickr_token"),
                      ("captions.txt", "text")]:
        assert read_caption_file(files / name).format == fmt
    assert read_caption_texts(files / "captions.json") == [a["caption"] for a in COCO["annotations"]]
    assert read_caption_texts(files / "dataset_coco.json") == ["A man rides a horse .", "a horse", "Two birds ."]
    assert read_caption_texts(files / "Flickr8k.token.txt") == ["A dog runs .", "A dog .", "A cat ."]
    assert read_caption_texts(files / "captions.txt") == ["A red fruit .", "A striped horse", "last line"]
    (files / "annotations_only.json").write_text(json.dumps({"annotations": [{"caption": "only captions"}]}))
    assert read_caption_texts(files / "annotations_only.json") == ["only captions"]
    with pytest.raises(CaptionFormatError, match=r"lacks key\(s\) \['images'\] at the top level"):
        read_caption_file(files / "annotations_only.json")  # full records need the images


def test_malformed_files_name_the_file(files):
    bad = files / "captions.json"
    text = bad.read_text()
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(CaptionFormatError, match=r"captions\.json is not valid JSON .* at line 1, column") as e:
        read_caption_texts(bad)
    assert "Expected:" in str(e.value) and "truncated" in str(e.value)
    data = json.loads(json.dumps(COCO))
    del data["annotations"][1]["caption"]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"COCO: .*captions\.json lacks key\(s\) \['caption'\] at annotations\[1\]") as e:
        read_coco_json(bad, ValueError, "download the annotations again", "COCO")
    assert str(e.value).endswith("Fix: download the annotations again.")
    data["annotations"][1] = {"image_id": 99, "caption": "x"}
    bad.write_text(json.dumps(data))
    with pytest.raises(CaptionFormatError, match=r"annotations\[1\] for image_id 99 that is not in \"images\""):
        read_coco_json(bad)
    (files / "other.json").write_text('{"foo": 1}')
    with pytest.raises(CaptionFormatError, match=r"other\.json holds neither a Karpathy split JSON nor a COCO"):
        detect_format(files / "other.json")
    k = json.loads(json.dumps(KARPATHY))
    del k["images"][1]["split"]
    (files / "dataset_coco.json").write_text(json.dumps(k))
    with pytest.raises(CaptionFormatError, match=r"lacks key\(s\) \['split'\] at images\[1\]"):
        read_karpathy_json(files / "dataset_coco.json")
    assert read_karpathy_json(files / "dataset_coco.json", required=("filename", "sentences")).images[1].split is None
    (files / "Flickr8k.token.txt").write_text(TOKENS + "c.jpg no tab here\n")
    with pytest.raises(CaptionFormatError, match=r"Flickr8k\.token\.txt:5 is malformed") as e:
        read_caption_texts(files / "Flickr8k.token.txt")
    assert formats.FLICKR_TOKEN_FORMAT in str(e.value)


@pytest.mark.parametrize("name", ["Flickr8k.token.txt", "captions.txt", "captions.json"])
def test_non_utf8_names_the_file_and_line(files, name):
    path = files / name
    path.write_bytes(path.read_bytes().replace(b"A", b"\xe9", 3))  # Latin-1 bytes
    with pytest.raises(CaptionFormatError, match=rf"{name}(:1)? .*is not UTF-8") as e:
        read_caption_texts(path)
    assert "line 1" in str(e.value) or f"{name}:1" in str(e.value)

    class Mine(Exception):
        pass

    with pytest.raises(Mine, match=name):
        read_caption_file(path, Mine)


def test_non_utf8_line_number_counts_every_newline_style(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"one\r\ntwo\rthree\n\xff four\n")
    with pytest.raises(CaptionFormatError, match=r"t\.txt:4 is not UTF-8 text"):
        read_caption_texts(path)


def test_missing_file_raises_the_missing_class(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"caption file .*nope\.json does not exist"):
        read_caption_texts(tmp_path / "nope.json")

    class Missing(Exception):
        pass

    with pytest.raises(Missing, match="nope.txt"):
        read_caption_texts(tmp_path / "nope.txt", missing=Missing)


def test_the_module_needs_no_torch():
    code = "import sys, data_modules.formats; sys.exit(any(m in sys.modules for m in ('torch', 'lightning', 'numpy')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
