"""Room to write: whether this process can write where a job will write, and whether the disk holds what it puts
there.

[Note: room to write]
A write that fails after hours of training, with an errno and no path, loses the hours. So every place a job
writes is checked before the work starts, and the error names the place:

    writable    the nearest directory of the path that exists (the job makes the rest) is a directory in which
                this process can create a file: tried, not read from permission bits (root ignores them; a
                read-only mount does not)
    room        the bytes planned for each file system are free on it (``os.statvfs``'s ``f_bavail``: what an
                unprivileged writer may use); paths on one file system share its free space

The offloaded engine's store (:mod:`terastack.llm.engine.store_layout`), the job's output, checkpoints and
metrics (:mod:`terastack.training.job_runner`) and the checkpoint manager's snapshots
(:mod:`terastack.training.checkpoint`) all check here.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from terastack.units import format_bytes


def free_bytes(path: str | os.PathLike) -> int:
    """The bytes an unprivileged writer may still write on the file system of ``path`` (which exists)."""
    return shutil.disk_usage(path).free


def nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` itself if it exists, else its nearest ancestor that does (where its file system is known)."""
    p = Path(os.path.abspath(os.path.expanduser(path)))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: str | os.PathLike, *, what: str, beside: bool = False) -> None:
    """Refuse (``PermissionError`` naming ``what`` and ``path``) a path this process could not make and write in
    or to: its nearest existing directory must take a new file (one is made and removed), and an existing file
    must open for appending (nothing is written to it). ``beside``: the path is made beside it and renamed over
    it (an export), so its directory is what must take new files."""
    full = Path(os.path.abspath(os.path.expanduser(path)))
    where = nearest_existing(full.parent if beside else full)
    if where.is_file() and where == full:
        try:
            open(where, "ab").close()
        except OSError as exc:
            raise PermissionError(f"{what} {path}: cannot be written ({exc.strerror or exc})") from None
        where = where.parent
    if not where.is_dir():
        raise PermissionError(f"{what} {path}: cannot be written ({where} is not a directory)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".terastack-write-check-", dir=where)
    except OSError as exc:
        raise PermissionError(f"{what} {path}: cannot be written ({where}: {exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def free_on(paths: Iterable[str | os.PathLike]) -> int:
    """The free bytes of the distinct file systems ``paths`` are on, added up (each file system once)."""
    free, seen = 0, set()
    for p in paths:
        where = nearest_existing(p)
        dev = os.stat(where).st_dev
        if dev not in seen:
            seen.add(dev)
            free += free_bytes(where)
    return free


@dataclass(frozen=True, slots=True)
class Need:
    """``nbytes`` that ``what`` (a flag, a setting) will write under ``path``."""

    what: str
    path: str
    nbytes: int


def check_room(needs: Sequence[Need]) -> None:
    """Refuse (``OSError`` ENOSPC naming the paths, the bytes needed and the bytes free) a file system that cannot
    hold what ``needs`` put on it together."""
    by_dev: dict[int, list[Need]] = {}
    for need in needs:
        by_dev.setdefault(os.stat(nearest_existing(need.path)).st_dev, []).append(need)
    for group in by_dev.values():
        total = sum(n.nbytes for n in group)
        free = free_bytes(nearest_existing(group[0].path))
        if total > free:
            names = (f"{group[0].what} {group[0].path}: needs" if len(group) == 1 else
                     " and ".join(f"{n.what} {n.path} ({format_bytes(n.nbytes)})" for n in group) + ": need")
            raise OSError(errno.ENOSPC, f"{names} {format_bytes(total)} ({total} bytes), the file system has "
                                        f"{format_bytes(free)} ({free} bytes) free")
