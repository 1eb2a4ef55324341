"""Atomic result files: whole or absent, and readable like the reports beside them (the umask's
mode, not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from replay.atomic import atomic_text
from replay.corpus.sharegpt import convert_sharegpt
from replay.results import write_json_atomic


@pytest.fixture
def umask():
    def set_to(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_to
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_results_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    write_json_atomic(tmp_path / "sweep.json", {"a": 1})
    assert mode(tmp_path / "sweep.json") == expected
    # What open() gives a new file, as report.md and the plots get.
    (tmp_path / "report.md").write_text("x")
    assert mode(tmp_path / "report.md") == expected


def test_a_converted_corpus_follows_the_umask(tmp_path, umask):
    src = tmp_path / "sharegpt.json"
    src.write_text('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]')
    convert_sharegpt(src, tmp_path / "corpus.jsonl")
    assert mode(tmp_path / "corpus.jsonl") == 0o644


def test_an_error_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_text(path) as f:
        f.write("half of the new")
        raise RuntimeError("stop")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
