"""Memory: this process's resident memory (current, peak, a resettable peak) and the machine's
(``/proc/meminfo``, read in one place).

Benchmarks report ``peak RSS - baseline``, where the baseline is the RSS when
the measured work starts (interpreter, torch and numpy already loaded).
"""
from __future__ import annotations

import os

#: glibc's mmap threshold under a memory budget ([Note: a memory budget bounds resident memory])
MMAP_THRESHOLD = 4 << 20


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


def memory_left(whole: int, what: str) -> int:
    """What a budget of ``whole`` bytes for the whole process leaves after what it already holds (a trainer's
    ``memory_budget`` under a process-wide limit); refused naming ``what`` when nothing is left."""
    left = whole - current_rss()
    if left <= 0:
        from terastack.units import format_bytes

        raise ValueError(f"{what}: {format_bytes(whole)} is less than this process already holds "
                         f"({format_bytes(current_rss())})")
    return left


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


def return_freed_memory() -> None:
    """[Note: a memory budget bounds resident memory]

    A memory budget (CPU, ``TrainerConfig.memory_budget``) is a promise about
    resident memory, not only about the ledgers. glibc keeps freed blocks in
    its heaps and per-thread arenas and raises its mmap threshold as large
    blocks are freed, so a process whose tensors come and go keeps growing
    past what it uses. Blocks of 4 MiB and more (weights, their gradients,
    the store's buffers, the activations of a wide batch) are therefore always
    mmapped (returned to the OS when freed) and arenas are capped. Smaller
    blocks -- the many small tensors of a step -- stay in the heap and are
    reused: mmapping them too (the threshold was 256 KiB) made every step fault
    in fresh pages, which cost the in-memory llama-150m step 1.3x (1.9 s ->
    2.45 s, on the 2-core bench machine). A higher threshold keeps too much:
    with 32 MiB, a vertical step of 8 micro-batches at 1.1B (16 MiB hidden
    states, in the heap) peaked at 5.30 GiB RSS under a 4 GiB process budget,
    4.17 GiB with 4 MiB; llama-150m's step was no slower with 4 MiB than with
    32 MiB. Set here with mallopt, the settings miss
    the arenas threads made before; in the environment at process start
    (``terastack.llm.trainer_config.MEMORY_BUDGET_ENV``) they cover everything:
    measured on the bench model, peak RSS 0.84 GB with mallopt only, 0.56 GB
    from the start, for a 0.62 GB budget. The setting is process-wide; the LLM
    trainer makes it only when a memory budget is given.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (also stops the threshold from growing)
        libc.mallopt(-8, 2)          # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: its allocator has its own policy
