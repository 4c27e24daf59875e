"""A job's default store: a scratch directory under the temporary directory that no exit leaves behind.

[Note: a scratch store's owner]
A job given no store directory keeps its training state in a scratch directory under the temporary directory
(at real sizes: the whole training state). The job removes it on every exit it sees -- an exception,
KeyboardInterrupt, SystemExit (a caller that handles SIGTERM turns it into one of these) -- but ``kill -9``, a
power cut or an out-of-memory kill end a process before it sees anything. So the directory's name says who owns
it: ``PREFIX<pid>-<start>-<random>``, where ``<start>`` is the process's start time in clock ticks since boot
(field 22 of ``/proc/<pid>/stat``), and every job that makes one first removes each scratch directory of its
prefix whose owner no longer runs, one line each, with its size. A pid alone is not enough: the kernel reuses
pids, and a directory whose pid now belongs to another process would stay forever; the start time tells the
two apart. The owner is in the name, not in a file inside, so a directory is never seen half made (without its
owner). A directory is claimed for removal by renaming it into a name of the remover's own first, so two jobs
starting together never both remove (or report) the same one, and one killed while removing is removed by the
next. Directories of the prefix whose name holds no owner (made by other programs, or by terastack before it
named owners) are left alone.

Where ``/proc`` is missing (not Linux) the start time is 0 and only the pid is compared.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import uuid
import weakref
from pathlib import Path

from terastack.units import format_bytes


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22); None if no
    such process runs; 0 if it runs and this system has no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass   # it runs, under another user
        return 0
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses: fields 3.. follow the last ')'
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_runs(pid: int, start: int) -> bool:
    """Whether the process that made a directory (its ``pid`` and start time) still runs."""
    now = process_start(pid)
    return now is not None and (now == start or 0 in (now, start))


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class ScratchStore:
    """A scratch directory for one job ([Note: a scratch store's owner])::

        with ScratchStore(prefix="terastack-finetune-") as store_dir:
            ...   # store_dir: a Path, removed on leaving the block however it is left

    :meth:`open` / :meth:`close` do the same without a ``with`` (``close`` is idempotent, and also runs when the
    object is collected or the interpreter exits). ``root``: where to make it (default: the temporary
    directory); ``log``: where the removals of stale directories are said (default: stderr)."""

    def __init__(self, *, prefix: str = "terastack-", root: str | os.PathLike | None = None, log=None):
        if not prefix or os.sep in prefix or re.search(r"\d-?$", prefix):
            raise ValueError(f"prefix: {prefix!r} must be a file name that does not end in a digit")
        self.prefix = prefix
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self.log = log
        self.path: Path | None = None
        self._finalizer = None

    def _owned(self) -> re.Pattern:
        return re.compile(re.escape(self.prefix) + r"(\d+)-(\d+)-")

    def sweep(self) -> list[tuple[Path, int]]:
        """Remove every directory of this prefix whose owner no longer runs; ``(path, bytes)`` of each, also said
        in one line each."""
        me = f"{os.getpid()}-{process_start(os.getpid()) or 0}"
        owned, removed = self._owned(), []
        log = sys.stderr if self.log is None else self.log
        for entry in sorted(self.root.glob(self.prefix + "*")):
            m = owned.match(entry.name)
            if m is None or not entry.is_dir() or entry == self.path:
                continue
            pid, start = int(m.group(1)), int(m.group(2))
            if owner_runs(pid, start):
                continue
            claimed = self.root / f"{self.prefix}{me}-removing-{uuid.uuid4().hex[:8]}"
            try:
                entry.rename(claimed)
            except OSError:
                continue   # another job claimed it first
            size = tree_bytes(claimed)
            shutil.rmtree(claimed, ignore_errors=True)
            print(f"removed {entry}, the default store of a job that no longer runs (pid {pid}): "
                  f"{format_bytes(size)} freed", file=log)
            removed.append((entry, size))
        return removed

    def open(self) -> Path:
        """Remove stale directories (:meth:`sweep`), then make this job's and return it."""
        if self.path is not None:
            return self.path
        self.root.mkdir(parents=True, exist_ok=True)
        self.sweep()
        start = process_start(os.getpid()) or 0
        self.path = Path(tempfile.mkdtemp(prefix=f"{self.prefix}{os.getpid()}-{start}-", dir=self.root))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), ignore_errors=True)
        return self.path

    def close(self) -> None:
        """Remove this job's directory (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Path:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
