"""Memory: this process's resident memory (current, peak, a resettable peak) and the machine's
(``/proc/meminfo``, read in one place).

Benchmarks report ``peak RSS - baseline``, where the baseline is the RSS when
the measured work starts (interpreter, torch and numpy already loaded).
"""
from __future__ import annotations

import os


def _status_field(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def meminfo(field: str) -> int:
    """A ``/proc/meminfo`` field in bytes (``"MemTotal"``, ``"MemAvailable"``, ...); 0 where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mem_total() -> int:
    """Physical memory of the machine in bytes (0 if unknown)."""
    return meminfo("MemTotal")


def mem_available() -> int:
    """Memory the kernel could give without swapping, in bytes (0 if unknown)."""
    return meminfo("MemAvailable")


def current_rss() -> int:
    return _status_field("VmRSS")


def peak_rss() -> int:
    return _status_field("VmHWM")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter to the current RSS (Linux clear_refs 5). False if not allowed."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.peak_bytes`` is the peak RSS above the RSS at entry."""

    def __enter__(self) -> "PeakRSS":
        self.reset_ok = reset_peak_rss()
        self.baseline = current_rss()
        self.peak_bytes = 0
        return self

    def sample(self) -> int:
        self.peak_bytes = max(self.peak_bytes, peak_rss() - self.baseline)
        return self.peak_bytes

    def __exit__(self, *exc) -> None:
        self.sample()
