"""``terastack bench io-cpu``: the CPU the storage engine spends to keep the disk busy, per GB/s it moves.

Batched random reads of a file written from ``os.urandom`` (no holes, nothing
compressible), the page cache dropped for the file (``posix_fadvise``
DONTNEED) before each run and every block read once, so every byte comes from
the disk. Two batches are kept in flight so the queue never drains between
calls. The process's CPU time (user + system, every thread: the engine's I/O
threads or ring drivers and the submitting thread) is taken from
``resource.getrusage`` around the reads.

Figures: ``read_gb_per_s`` (the rate the disk gave), ``cpu_share_at_disk_rate``
(CPU seconds per wall second while it did: cores kept busy),
``cpu_cores_per_gb_per_s`` (the same per GB/s of traffic, equal to CPU seconds
per GB) and ``cpu_share_of_machine`` (cores busy over the cores present). Each
run is one measurement; the medians are reported.

[Note: what the CPU time leaves out]
Work the kernel does outside the process is not counted: with the io_uring
backend, requests the kernel hands to its own io-wq workers (a file system that
cannot issue a request without blocking) and the block layer's completion
interrupts. The figure is what the engine costs the cores the application runs
on, not every cycle the machine spends on the I/O.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections import deque

import numpy as np

from terastack import io
from terastack.trace import tracer
from terastack.units import parse_bytes

HEADLINE = ["cpu_cores_per_gb_per_s", "cpu_share_at_disk_rate", "read_gb_per_s", "cpu_share_of_machine", "backend"]
PRESETS = {
    "smoke": ["--size", "8MiB", "--block", "16KiB", "--batch", "64", "--repeat", "1"],
    "small": ["--size", "256MiB", "--repeat", "2"],
    "full": ["--size", "2GiB", "--repeat", "3"],
}

#: chunk of os.urandom bytes written at a time while preparing the file
_WRITE_CHUNK = 8 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="directory on the disk to test (default: the system temp dir)")
    p.add_argument("--size", default="512MiB", help="test file size (default 512MiB)")
    p.add_argument("--block", default="64KiB", help="bytes per random read (a multiple of 4 KiB; default 64KiB)")
    p.add_argument("--batch", type=int, default=1024, help="requests per batch call (default 1024)")
    p.add_argument("--queue-depth", type=int, default=64, help="requests the engine keeps in flight (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="runs, each over the whole file (default 3)")
    p.add_argument("--backend", default="auto", help="terastack I/O backend (default auto)")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, every thread counted."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prepare_file(path: str, size: int) -> None:
    """Write ``size`` bytes of ``os.urandom`` to ``path`` and sync them; refuse a file the disk left sparse."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(_WRITE_CHUNK, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    if os.stat(path).st_blocks * 512 < size:
        raise RuntimeError(f"{path} is sparse; refusing to measure reads of holes")


def read_run(engine: io.IOEngine, path: str, size: int, block: int, batch: int, seed: int) -> dict:
    """One cold pass over the file in random order: bytes, wall seconds and CPU seconds of the reads."""
    blocks = size // block
    order = np.random.default_rng(seed).permutation(blocks).astype(np.int64) * block
    buffers = [io.aligned_empty(batch * block) for _ in range(2)]
    packed = np.arange(batch, dtype=np.int64) * block
    with engine.open(path, "r", direct=True) as f:
        f.drop_cache()
        pending: deque = deque()
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        with tracer.span("random reads", track="io", bytes=blocks * block):
            for i, start in enumerate(range(0, blocks, batch)):
                offsets = order[start:start + batch]
                if len(pending) == 2:
                    pending.popleft().result()
                pending.append(f.pread_many(buffers[i % 2], offsets, block, packed[:len(offsets)]))
            while pending:
                pending.popleft().result()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"bytes": blocks * block, "wall_s": wall, "cpu_s": cpu}


def summarize(runs: list[dict], cores: int) -> dict:
    """The per-run ratios and their medians (see the module's docstring for each figure)."""
    for r in runs:
        r["read_gb_per_s"] = r["bytes"] / r["wall_s"] / 1e9
        r["cpu_share_at_disk_rate"] = r["cpu_s"] / r["wall_s"]
        r["cpu_cores_per_gb_per_s"] = r["cpu_s"] / (r["bytes"] / 1e9)
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("read_gb_per_s", "cpu_share_at_disk_rate", "cpu_cores_per_gb_per_s")}
    return {**med, "cpu_share_of_machine": med["cpu_share_at_disk_rate"] / cores, "cores": cores, "runs": runs}


def measure(args: argparse.Namespace) -> dict:
    size, block = parse_bytes(args.size, field="size"), parse_bytes(args.block, field="block")
    if block <= 0 or block % 4096:
        raise ValueError(f"block: must be a positive multiple of 4 KiB, got {args.block}")
    if size < block:
        raise ValueError(f"size: must hold at least one block of {block} bytes, got {args.size}")
    if args.batch < 1 or args.repeat < 1:
        raise ValueError("batch and repeat: must be >= 1")
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="terastack-io-cpu-", dir=args.dir) as tmp:
        path = os.path.join(tmp, "data.bin")
        prepare_file(path, size)
        with io.IOEngine(backend=args.backend, queue_depth=args.queue_depth) as engine:
            runs = [read_run(engine, path, size, block, args.batch, seed) for seed in range(args.repeat)]
            backend = engine.backend
    return {"backend": backend, "block_bytes": block, "file_bytes": size, "batch": args.batch,
            "queue_depth": args.queue_depth, **summarize(runs, cores),
            "note": "CPU time of the whole process (getrusage, user + system) while the engine read the file cold "
                    "in random order; work the kernel does in its own threads is not counted"}
