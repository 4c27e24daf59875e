"""The ``--output`` directory of a fine-tuning job: nothing there looks finished until the job has finished.

While the job trains, its metrics go to ``DIR.partial/`` beside the output. At the end the model is exported
into a temporary directory, the tokenizer, ``metrics.jsonl`` (and ``tensorboard/``) and ``finetune.yaml`` join
it, and it is renamed to ``DIR`` in one step (:func:`terastack.atomic.replace_dir`). A job that fails or is
interrupted leaves ``DIR`` as it was (absent, or an earlier export) and its metrics in ``DIR.partial/``.

One job writes an output directory at a time ([Note: one writer per output]).
"""
from __future__ import annotations

import fcntl
import gc
import os
import shlex
import shutil
import sys
import time
import weakref
from pathlib import Path

from terastack.atomic import fsync_dir, replace_dir

#: files that mark a directory as a model export, which a new export may replace
EXPORT_MARKERS = ("config.json", "adapter_config.json", "finetune.yaml")


def check_replaceable(path: str | os.PathLike, *, flag: str = "--output") -> None:
    """Refuse to replace ``path`` unless it is absent, empty or an earlier model export (one of
    :data:`EXPORT_MARKERS` in it): every command that writes an output directory replaces it whole, and a user's
    directory of other files must never be the casualty of a mistyped flag. ``flag`` names the setting."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    if any(path.iterdir()) and not any((path / m).exists() for m in EXPORT_MARKERS):
        raise ValueError(f"{flag} {path}: a non-empty directory that is not a model export; "
                         "refusing to replace it (give a new or empty directory)")


def check_apart(output: str | os.PathLike, others: dict[str, str | os.PathLike | None], *,
                flag: str = "--output") -> None:
    """Refuse an output directory that is, or holds, a path of ``others`` (the flag that names it -> the path;
    None: not given): the output is replaced whole when the job ends, so a model it reads there, an adapter it
    starts from, or a checkpoint it keeps there would be lost. Paths are compared resolved (symlinks followed):
    another spelling of a directory is the same directory."""
    out = Path(os.path.realpath(output))
    for what, path in others.items():
        if path is None:
            continue
        real = Path(os.path.realpath(path))
        relation = "is also" if real == out else "holds" if out in real.parents else None
        if relation:
            raise ValueError(f"{flag} {output}: {relation} {what} ({path}); the output is replaced whole when the "
                             f"job ends, which would lose it (give another {flag})")


class OutputInUse(RuntimeError):
    """Another running job writes the same output directory; the message names it."""


class OutputLock:
    """[Note: one writer per output]
    Two jobs with the same ``--output`` would share ``DIR.partial/`` and the export's rename: one job's metrics
    and weights would be lost without a word. So a job holds an exclusive ``fcntl.flock`` on ``.DIR.lock`` beside
    the output from the moment it opens the output until its export is renamed into place, and a second job
    refuses at once, naming the first (pid, start time, command: written into the lock file).

    The lock is the kernel's, held by an open file: every way a process ends, ``kill -9`` included, releases it.
    The lock file is beside the output, not in ``DIR.partial/`` (which a fresh job empties). A job that ends in
    order deletes its lock file while it still holds the lock; one that was killed leaves it, and the next job
    takes the free lock over with a one-line note naming the job that left it. A job that takes the lock checks
    that the file it locked is still the one at the path (another job may have deleted it in between) and tries
    again if not."""

    def __init__(self, output: Path, *, flag: str = "--output", log=None):
        self.path = output.with_name(f".{output.name}.lock")
        self.output, self.flag = output, flag
        log = sys.stderr if log is None else log
        gc_done = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                if holder.get("pid") == os.getpid() and not gc_done:
                    gc.collect()   # an earlier job of this process whose OutputDir is garbage releases it
                    gc_done = True
                    continue
                raise OutputInUse(f"{flag} {output}: another job is writing it ({_describe(holder)}); wait for "
                                  f"it to end or give another {flag}") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)   # deleted by the job that held it while this one waited: lock the new one
        left = _read_holder(fd)
        if left:
            print(f"{flag} {output}: taking over the lock left by a job that no longer runs ({_describe(left)})",
                  file=log)
        record = f"{os.getpid()}\n{time.time():.0f}\n{shlex.join(_command())}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        self._fd = fd
        self._finalizer = weakref.finalize(self, _unlock, fd, str(self.path))

    def release(self) -> None:
        """Delete the lock file and release the lock (also when this object is collected; idempotent)."""
        self._finalizer()


def _unlock(fd: int, path: str) -> None:
    try:
        if _same_file(fd, Path(path)):
            os.unlink(path)   # while still locked: a job waiting on it sees a deleted file and starts over
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _command() -> list[str]:
    argv = list(sys.argv) or ["python"]
    argv[0] = os.path.basename(argv[0])
    return argv


def _read_holder(fd: int) -> dict:
    """What the lock file says of the job that wrote it: pid, start time, command ({} for an empty file)."""
    try:
        lines = os.pread(fd, 8192, 0).decode("utf-8", errors="replace").split("\n", 2)
        return {"pid": int(lines[0]), "started": float(lines[1]), "command": lines[2].rstrip("\n")}
    except (OSError, ValueError, IndexError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "its lock file names no job"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
    return f"pid {holder['pid']}, started {started}: {holder['command']}"


class OutputDir:
    def __init__(self, path: str | os.PathLike, *, log=None):
        """``path`` checked (:func:`check_replaceable`) and locked for this job ([Note: one writer per output]):
        :class:`OutputInUse` if another running job writes it. The lock is released by :meth:`finish`,
        :meth:`close`, or when this object is collected or the process ends."""
        self.path = Path(path)
        check_replaceable(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = OutputLock(self.path, log=log)
        self.partial = self.path.with_name(self.path.name + ".partial")

    def close(self) -> None:
        """Release the output (idempotent)."""
        self.lock.release()

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def metrics_path(self) -> Path:
        return self.partial / "metrics.jsonl"

    def start(self, *, resuming: bool) -> None:
        """A fresh ``DIR.partial/`` (a resumed job keeps the earlier attempt's metrics there)."""
        if not resuming:
            shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True, exist_ok=True)

    def finish(self, trainer, tokenizer, *, max_shard_size, write_job) -> Path:
        """Export ``trainer``'s model with ``tokenizer`` (None: the model's own files, if any), move the
        metrics in, ``write_job(path)`` the job file, and rename the whole to the output directory."""
        staging = self.path.with_name(f".{self.path.name}.export-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            trainer.save_pretrained(staging, max_shard_size=max_shard_size)
            if tokenizer is not None:  # the export loads with transformers on its own, tokenizer too
                tokenizer.save_pretrained(str(staging))
            for entry in self.partial.iterdir() if self.partial.exists() else ():
                copy = shutil.copytree if entry.is_dir() else shutil.copy2
                copy(entry, staging / entry.name)  # copies: a failure here still leaves DIR.partial whole
            write_job(staging / "finetune.yaml")
            fsync_dir(staging)
            replace_dir(staging, self.path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(self.partial, ignore_errors=True)
        self.close()
        return self.path
