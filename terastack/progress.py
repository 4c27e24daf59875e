"""Progress lines for long work: done/total, rate, ETA and any extra fields (loss, traffic...).

Writes to stderr at most a few times a second; on a terminal it redraws one
line, elsewhere (CI logs, pipes) it prints a line every ``log_every`` seconds.
"""
from __future__ import annotations

import sys
import time


def _fmt_seconds(s: float) -> str:
    if s != s or s == float("inf"):
        return "?"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    def __init__(self, total: float | None, *, label: str, unit: str = "it", enabled: bool = True,
                 stream=None, log_every: float = 10.0, initial: float = 0.0):
        # ``initial``: work done before this run (a resumed job at step 50 of 120 shows 51/120); the rate and
        # the ETA count only what this run does
        self.total = total
        self.initial = initial
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.25 if self.tty else log_every
        self.done = float(initial)
        self.start = time.perf_counter()
        self._last = 0.0

    def update(self, n: float = 1, **fields) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last >= self.interval or (self.total and self.done >= self.total)):
            self._last = now
            self._write(now, fields)

    def _write(self, now: float, fields: dict) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = (self.done - self.initial) / elapsed
        parts = [f"{self.label}: {self.done:g}" + (f"/{self.total:g}" if self.total else "") + f" {self.unit}",
                 f"{rate:.3g} {self.unit}/s"]
        if self.total:
            parts.append(f"ETA {_fmt_seconds((self.total - self.done) / rate if rate else float('inf'))}")
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        line = " | ".join(parts)
        if self.tty:
            self.stream.write("\r" + line[:200].ljust(100))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
