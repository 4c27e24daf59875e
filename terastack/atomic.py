"""Atomic commit points: write to a temporary name, fdatasync, rename, fsync the directory.

A crash at any moment leaves either the previous file or the new one, never a
torn mix. Used for every manifest, checkpoint index and cached result.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def safe_relative(root: str | os.PathLike, relative: str) -> Path:
    """``root / relative`` after checking that a manifest-supplied path cannot escape ``root``."""
    root = Path(root).resolve()
    if os.path.isabs(relative):
        raise ValueError(f"path {relative!r} in manifest must be relative to {root}")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"path {relative!r} in manifest escapes its directory {root}")
    return target


def replace_dir(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Rename the complete directory ``src`` to ``dst``, replacing what ``dst`` holds, and fsync the parent.

    A directory cannot be renamed over a non-empty one, so an existing ``dst`` is first moved aside (to
    ``.old-NAME-PID`` beside it), ``src`` takes its name, and only then is the old one removed: at every moment
    ``dst`` is either the old directory or the new one (or, between the two renames, absent, with the old one
    complete beside it under the aside name).
    """
    import shutil

    src, dst = Path(src), Path(dst)
    if dst.exists():
        aside = dst.parent / f".old-{dst.name}-{os.getpid()}"
        os.replace(dst, aside)
        os.replace(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(src, dst)
    fsync_dir(dst.parent)
    return dst
