"""Atomic writes: nothing half-written is ever left under the final name."""

from __future__ import annotations

import json

import pytest

from grounding.utils.io import atomic_path, atomic_write_json, sha1_of_json


def test_atomic_json_roundtrip(tmp_path):
    p = atomic_write_json(tmp_path / "a" / "x.json", {"b": 1})
    assert json.loads(p.read_text()) == {"b": 1}
    assert [f.name for f in p.parent.iterdir()] == ["x.json"]


def test_failure_leaves_no_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "cache.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == ["cache.bin"]


def test_directories_are_replaced_whole(tmp_path):
    target = tmp_path / "world"
    for content in ("first", "second"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "f.txt").write_text(content)
    assert (target / "f.txt").read_text() == "second"
    with pytest.raises(KeyError):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "f.txt").write_text("third")
            raise KeyError
    assert (target / "f.txt").read_text() == "second" and len(list(tmp_path.iterdir())) == 1


def test_config_hash_ignores_key_order():
    assert sha1_of_json({"a": 1, "b": [1, 2]}) == sha1_of_json({"b": [1, 2], "a": 1})
    assert sha1_of_json({"a": 1}) != sha1_of_json({"a": 2})
