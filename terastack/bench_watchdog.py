"""The benchmarks' RSS watchdog: the memory of a process tree, from ``/proc``, held below a limit.

Scale claims are measured on processes that run under a watchdog set below the machine's RAM, so that the
kernel's OOM killer never decides a result. Two benchmarks use it:

- ``terastack bench dist --model``: a system runs as child processes of the benchmark (torchrun's elastic agent
  starts its ranks from this process). The watchdog samples every descendant of this process, keeps each one's
  peak (``VmHWM``, the kernel's own high-water mark of its resident set, so a peak between two samples is not
  missed) and adds them up over every process the job ever had. When that sum passes the limit it kills every
  descendant (``on_exceed="kill"``): the system "does not fit".
- ``terastack bench gnn``: a contender runs in a child process of its own and watches itself (``include_self``:
  its resident set now, plus its descendants as above); past the limit it kills its descendants, says why on
  stderr and ends with :data:`EXIT_STATUS` (``on_exceed="exit"``), which its parent reports naming it.

[Note: a sum of peaks]
The figure is the sum of each process's own peak, not the peak of the sum: the processes need not reach their
peaks at the same moment, so this over-counts what the machine held at once, never under-counts it. Shared pages
(the libraries every Python process maps) count in every process. Both make the figure the conservative one,
and it is the figure a watchdog can read without missing a short peak.

A process is counted from the program it runs: between ``fork`` and ``exec`` a child is a copy-on-write view of
its parent, whose whole RSS it reports, and ``exec`` starts its peak anew, so a process's peak is kept per
command line and a new command line replaces the old one's. A child of the watcher's own process that has not
run ``exec`` yet carries the watcher's command line: it is a copy of the benchmark itself, whose RSS is not the
job's (and can alone pass the limit once the benchmark has grown), so it is not counted until it runs its program.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass

from terastack.memory import current_rss
from terastack.units import format_bytes

#: the exit status of a process that stopped itself past its limit (``on_exceed="exit"``)
EXIT_STATUS = 3
ON_EXCEED = ("kill", "exit")


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's list in ``/proc/PID/task/*/children``)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def descendants_of(pid: int) -> list[int]:
    seen: list[int] = []
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        if child not in seen:
            seen.append(child)
            todo.extend(children_of(child))
    return seen


def peak_rss_bytes(pid: int) -> int | None:
    """``pid``'s peak resident set (``VmHWM``) in bytes; None once it is gone (or a zombie, which has none)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes (``VmRSS``, now) of ``pid`` and every descendant; 0 for processes that are gone."""
    total = 0
    for p in [pid, *descendants_of(pid)]:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        except (OSError, ValueError):
            continue
    return total


def program_of(pid: int) -> bytes | None:
    """``pid``'s command line: what tells a forked copy of its parent from the program it then runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def rank_of(pid: int) -> int | None:
    """The ``RANK`` torchrun gave process ``pid`` (None for a process that has none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"RANK="):
                    return int(entry[5:])
    except (OSError, ValueError):
        return None
    return None


class RssWatchdog:
    """Watches the descendants of this process (and with ``include_self`` the process itself) while a system
    runs ([Note: a sum of peaks]); a context manager.

    After the ``with`` block: ``peak_total`` (bytes, the descendants' peaks summed), ``peaks`` (pid -> peak
    bytes), ``max_sampled`` (the largest figure a sample read, this process included when it is watched) and
    ``exceeded`` (whether it stopped the system)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: the most bytes the watched processes may hold, summed over their peaks
        limit_bytes: int
        #: seconds between two readings of /proc
        interval_s: float = 0.05
        #: count this process too (its resident set at each reading): a process that runs what is measured
        include_self: bool = False
        #: past the limit: "kill" every descendant, or "exit": kill them, say why on stderr and end this process
        #: with EXIT_STATUS (a process that watches itself)
        on_exceed: str = "kill"
        #: who is stopped, in the message on stderr
        label: str = "terastack bench"

        def __post_init__(self) -> None:
            if self.limit_bytes <= 0:
                raise ValueError(f"limit_bytes: must be > 0, got {self.limit_bytes}")
            if not self.interval_s > 0:
                raise ValueError(f"interval_s: must be > 0, got {self.interval_s}")
            if self.on_exceed not in ON_EXCEED:
                raise ValueError(f"on_exceed: must be one of {', '.join(ON_EXCEED)}; got {self.on_exceed!r}")

    def __init__(self, config: "RssWatchdog.Config", *, root: int | None = None):
        self.config = config
        self.root = os.getpid() if root is None else root
        self.peaks: dict[int, int] = {}
        self.ranks: dict[int, int | None] = {}
        self._programs: dict[int, bytes] = {}
        self._root_program = program_of(self.root)
        # processes already running when the watch begins are not the run's: a helper an earlier run left behind
        # (a fork server holding its imports) would otherwise count against this run's limit
        self._before = {pid: program_of(pid) for pid in descendants_of(self.root)}
        self.max_sampled = 0
        self.exceeded = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rss-watchdog", daemon=True)

    @property
    def peak_total(self) -> int:
        return sum(self.peaks.values())

    def peaks_by_rank(self) -> list[tuple[int | None, int]]:
        """(rank or None, peak bytes) of every process seen, in rank order."""
        return sorted(((self.ranks.get(pid), peak) for pid, peak in self.peaks.items()),
                      key=lambda x: (x[0] is None, x[0] or 0))

    def sample(self) -> int:
        """Read every descendant's peak once; the sum over every process seen so far (with ``include_self``,
        plus this process's resident set now)."""
        for pid in descendants_of(self.root):
            program, peak = program_of(pid), peak_rss_bytes(pid)
            if peak is None or program is None or program == self._root_program:
                continue
            if pid in self._before and self._before[pid] == program:
                continue
            if self._programs.get(pid) != program:   # new, or it has run exec since: its peak starts anew
                self._programs[pid] = program
                self.peaks[pid] = 0
                self.ranks[pid] = rank_of(pid)
            self.peaks[pid] = max(self.peaks[pid], peak)
        total = self.peak_total + (current_rss() if self.config.include_self else 0)
        self.max_sampled = max(self.max_sampled, total)
        return total

    def kill_all(self, *, every: bool = False) -> None:
        """SIGKILL every descendant the run started (``every``: every descendant, as a process that ends itself
        must leave none behind), the deepest first (a parent that restarts children finds none)."""
        for pid in reversed(descendants_of(self.root)):
            if not every and pid in self._before and self._before[pid] == program_of(pid):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _watch(self) -> None:
        cfg = self.config
        while not self._stop.is_set():
            total = self.sample()
            if total > cfg.limit_bytes:
                self.exceeded = True
                self.kill_all(every=cfg.on_exceed == "exit")
                if cfg.on_exceed == "exit":
                    print(f"{cfg.label}: resident memory {format_bytes(total)} passed --rss-limit "
                          f"{format_bytes(cfg.limit_bytes)}; stopping", file=sys.stderr, flush=True)
                    os._exit(EXIT_STATUS)
            self._stop.wait(cfg.interval_s)

    def __enter__(self) -> "RssWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
