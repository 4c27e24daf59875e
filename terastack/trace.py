"""Chrome-trace (Perfetto) recording of compute, I/O and transfer spans.

Tracing is off unless :func:`start` is called (the CLI's ``--trace FILE``).
Spans that may overlap on the same track (several I/O batches in flight) are
spread over lanes ``io``, ``io#2``, ... so the viewer shows them side by side.
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path


class Tracer:
    def __init__(self) -> None:
        self.enabled = False
        self._events: list[dict] = []
        self._lanes: dict[str, list[float]] = {}  # track -> end time of each lane
        self._tids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def start(self) -> None:
        with self._lock:
            self._events.clear()
            self._lanes.clear()
            self._tids.clear()
            self._t0 = time.perf_counter()
            self.enabled = True

    def _tid(self, lane: str) -> int:
        tid = self._tids.get(lane)
        if tid is None:
            tid = self._tids[lane] = len(self._tids) + 1
        return tid

    def interval(self, name: str, start: float, end: float, *, track: str, cat: str = "", **args) -> None:
        """Record a finished span from perf_counter times ``start`` to ``end``."""
        if not self.enabled:
            return
        with self._lock:
            lanes = self._lanes.setdefault(track, [])
            for k, lane_end in enumerate(lanes):
                if lane_end <= start:
                    lanes[k] = end
                    break
            else:
                lanes.append(end)
                k = len(lanes) - 1
            lane = track if k == 0 else f"{track}#{k + 1}"
            self._events.append({
                "name": name, "cat": cat or track, "ph": "X", "pid": os.getpid(), "tid": self._tid(lane),
                "ts": (start - self._t0) * 1e6, "dur": max(0.0, end - start) * 1e6, "args": args,
            })

    @contextmanager
    def span(self, name: str, *, track: str, cat: str = "", **args):
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.interval(name, start, time.perf_counter(), track=track, cat=cat, **args)

    def events(self) -> list[dict]:
        with self._lock:
            meta = [{"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": tid, "args": {"name": lane}}
                    for lane, tid in self._tids.items()]
            return meta + list(self._events)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"traceEvents": self.events(), "displayTimeUnit": "ms"}))
        os.replace(tmp, path)
        return path

    def stop(self) -> None:
        self.enabled = False

    def clear(self) -> None:
        """Drop the recorded events (a long run that read what it needed out of them)."""
        with self._lock:
            self._events.clear()


#: The process-wide tracer every component records into.
tracer = Tracer()
span = tracer.span
interval = tracer.interval
