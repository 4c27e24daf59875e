"""Fixtures for stores over one directory or several (one per SSD)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

#: How a test's store spreads over directories: "one" is the layout every store had before it could span
#: SSDs; "two" is two subdirectories of the test's tmp_path standing in for two SSDs (same disk).
STORE_DIRS = ("one", "two")


def store_root(kind: str, tmp_path: Path) -> str:
    """The ``root`` of a store over ``kind`` directories below ``tmp_path`` (the same path for the same
    arguments, so a test can reopen its store)."""
    if kind == "one":
        return str(tmp_path / "s")
    if kind == "two":
        return f"{tmp_path / 'a'},{tmp_path / 'b'}"
    raise ValueError(f"kind: one of {STORE_DIRS}; got {kind!r}")


@pytest.fixture(params=STORE_DIRS)
def store_dirs(request) -> Callable[[Path], str]:
    """A callable ``make_root(tmp_path) -> str``: a store root over one directory, or over two. Tests that take
    this fixture run once per layout."""
    kind = request.param

    def make_root(tmp_path: Path) -> str:
        return store_root(kind, tmp_path)
    make_root.kind = kind  # type: ignore[attr-defined]
    return make_root
