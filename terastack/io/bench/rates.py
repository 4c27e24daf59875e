"""``terastack bench io``: the storage engine against fio on the same file, in the same run.

Four measurements, each terastack / fio (higher is better):
  * 1 MiB sequential write at queue depth 16 over a file that was already
    written (both overwrite real blocks; both fdatasync at the end),
  * 1 MiB sequential read at queue depth 16, page cache dropped first,
  * 4 KiB random read at queue depth 64, page cache dropped first,
plus the batch API's submission rate for 4 KiB reads that hit the page cache
(measures the engine, not the disk). Every disk test uses O_DIRECT on both
sides. Each test runs ``--repeat`` pairs, alternating which side goes first, and the
medians are compared, so drift of a noisy disk (or a host cache warming up)
favours neither side. Both sides have iodepth x bs of buffers with 4 KiB pages
(fio's malloc'd buffers have those where transparent huge pages are in madvise
mode). The sequential tests also run from terastack's own allocator, which asks
for huge pages, reported apart (``seq_*_huge_pages_vs_fio``) with how much of
the buffer the kernel backed with them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from terastack import io
from terastack.constants import BLOCK, SEQ_BLOCK
from terastack.io.buffers import anonymous_map, huge_page_bytes
from terastack.units import format_bytes, parse_bytes

HEADLINE = ["backend", "seq_read_vs_fio", "seq_write_vs_fio", "rand4k_read_vs_fio", "batch_submit_ops_per_s",
            "seq_read_huge_pages_vs_fio", "seq_write_huge_pages_vs_fio"]
PRESETS = {
    "smoke": ["--size", "32MiB", "--repeat", "1", "--rand-seconds", "0.3", "--batch-ops", "20000"],
    "small": ["--quick"],
    "full": [],
}

#: queue depths of the sequential (SEQ_BLOCK requests) and random (BLOCK requests) tests, both sides
SEQ_DEPTH = 16
RAND_DEPTH = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="smaller file, two repetitions (under a minute)")
    p.add_argument("--dir", default=None, help="directory on the disk to test (default: the system temp dir)")
    p.add_argument("--size", default=None, help="test file size (default 2GiB, --quick 512MiB)")
    p.add_argument("--repeat", type=int, default=None, help="pairs per test, alternating who goes first (default 4, --quick 2)")
    p.add_argument("--rand-seconds", type=float, default=None, help="seconds per random-read run (default 4)")
    p.add_argument("--batch-ops", type=int, default=None, help="requests in the page-cache-hot batch test")
    p.add_argument("--backend", default="auto", help="terastack I/O backend (default auto)")


def best_fio_engine() -> str:
    """fio's fastest ``--ioengine`` that works here (io_uring, then libaio, then psync). Needs fio on PATH."""
    for engine in ("io_uring", "libaio"):
        probe = subprocess.run(["fio", "--name=probe", "--filename=/dev/null", "--size=4k", "--rw=read",
                                f"--ioengine={engine}", "--output-format=json"], capture_output=True, text=True)
        if probe.returncode == 0:
            return engine
    return "psync"


def run_fio(path: str, size: int, rw: str, bs: int, depth: int, engine: str, runtime: float | None = None) -> float:
    """Run fio once on ``path``; bytes per second (``rw`` "read" or "write") or IOPS ("randread") as fio reports them.

    ``size`` bytes of the file in requests of ``bs`` bytes at queue depth ``depth`` through
    ``--ioengine=engine`` (see :func:`best_fio_engine`), O_DIRECT, page cache invalidated first; a
    write overwrites real blocks (no fallocate) and fsyncs at the end; ``runtime`` seconds makes the
    run time-based. Raises RuntimeError with fio's message if fio fails.
    """
    cmd = ["fio", "--name=terastack-bench", f"--filename={path}", f"--size={size}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={depth}", "--direct=1", f"--ioengine={engine}", "--invalidate=1", "--output-format=json",
           "--randrepeat=0"]
    if rw == "write":
        cmd += ["--end_fsync=1", "--fallocate=none"]
    if runtime is not None:
        cmd += [f"--runtime={runtime}", "--time_based"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed ({' '.join(cmd)}): {out.stderr.strip() or out.stdout.strip()}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    return float(side["iops"] if rw == "randread" else side["bw_bytes"])


def _prepare(path: str, size: int) -> None:
    """Write the whole file with pseudo-random data so no test reads holes or unwritten extents."""
    rng = np.random.default_rng(12345)
    chunk = io.aligned_empty(64 << 20)
    with io.open(path, "w", direct=True) as f:
        f.allocate(size)
        for off in range(0, size, len(chunk)):
            chunk[:] = rng.integers(0, 256, len(chunk), dtype=np.uint8)
            f.write(chunk, off, min(len(chunk), size - off))
        f.sync()
    blocks = os.stat(path).st_blocks * 512
    if blocks < size:
        raise RuntimeError(f"{path} is sparse ({blocks} of {size} bytes allocated); refusing to benchmark it")


def _ring_offsets(n: int, block: int, ring_bytes: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) * block) % ring_bytes


def _ours_seq(engine: io.IOEngine, path: str, size: int, write: bool, ring: np.ndarray) -> float:
    n = size // SEQ_BLOCK
    offsets = np.arange(n, dtype=np.int64) * SEQ_BLOCK
    buf_offsets = _ring_offsets(n, SEQ_BLOCK, len(ring))
    with engine.open(path, "r+" if write else "r", direct=True) as f:
        if not write:
            f.drop_cache()
        start = time.perf_counter()
        if write:
            f.pwrite_many(ring, offsets, SEQ_BLOCK, buf_offsets).result()
            f.sync()
        else:
            f.pread_many(ring, offsets, SEQ_BLOCK, buf_offsets).result()
        return n * SEQ_BLOCK / (time.perf_counter() - start)


def _ours_rand(engine: io.IOEngine, path: str, size: int, seconds: float, iops_guess: float,
               target: np.ndarray) -> float:
    n = max(2000, int(iops_guess * seconds))
    offsets = np.random.default_rng().integers(0, size // BLOCK, n) * BLOCK
    slots = len(target) // BLOCK
    with engine.open(path, "r", direct=True) as f:
        f.drop_cache()
        start = time.perf_counter()
        f.pread_many(target, offsets, BLOCK, (np.arange(n) % slots) * BLOCK).result()
        return n / (time.perf_counter() - start)


def _batch_submit_rate(engine: io.IOEngine, path: str, size: int, ops: int, hot: int) -> tuple[float, float]:
    """4 KiB reads of a page-cache-hot region: (ops/s through one batch call, ops/s with one call per request).

    [Note: what the batch figure measures]
    The region is small (8 MiB by default) so that its pages also stay in the
    CPU caches: the figure is then the engine's per-request cost (queueing,
    submission, completion), which is what the batch API has to keep low. A
    region of hundreds of MiB adds a DRAM-bound 4 KiB copy per request; that
    variant is reported as well.
    """
    hot = min(size, hot)
    with engine.open(path, "r", direct=False) as f:
        warm = io.aligned_empty(min(hot, 16 << 20))
        for off in range(0, hot, len(warm)):  # pull the region into the page cache
            f.read(warm, off, min(len(warm), hot - off))
        target = io.aligned_empty(1 << 20)
        offsets = np.random.default_rng(1).integers(0, hot // BLOCK, ops) * BLOCK
        buf_offsets = _ring_offsets(ops, BLOCK, len(target))
        f.pread_many(target, offsets[:1000], BLOCK, buf_offsets[:1000]).result()
        start = time.perf_counter()
        f.pread_many(target, offsets, BLOCK, buf_offsets).result()
        batch = ops / (time.perf_counter() - start)
        single_ops = min(ops, 20000)
        start = time.perf_counter()
        futures = [f.pread(target[b:b + BLOCK], o) for o, b in zip(offsets[:single_ops].tolist(),
                                                                  buf_offsets[:single_ops].tolist())]
        for fut in futures:
            fut.result()
        single = single_ops / (time.perf_counter() - start)
    return batch, single


def _alternate(tests: dict, samples: dict, repeat: int) -> None:
    """Each test's contenders ``repeat`` times, alternating who goes first, so a disk that drifts (or a cache
    that warms) favours no one; each pair's figures on stderr."""
    for test, runners in tests.items():
        for rep in range(repeat):
            order = list(runners.items())
            for who, run in (order if rep % 2 == 0 else order[::-1]):
                samples[f"{who}_{test}"].append(run())
            unit, scale = ("k IOPS", 1e3) if test == "rand" else ("GB/s", 1e9)
            huge = (f" (terastack, huge-page buffers: {samples[f'ours_huge_{test}'][-1] / scale:.2f})"
                    if "ours_huge" in runners else "")
            print(f"  {test} {rep + 1}/{repeat}: terastack {samples[f'ours_{test}'][-1] / scale:.2f} vs fio "
                  f"{samples[f'fio_{test}'][-1] / scale:.2f} {unit}{huge}", file=sys.stderr)


def _ratios(samples: dict) -> dict:
    """The headline ratios and rates from the medians of ``samples``."""
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "seq_read_vs_fio": med["ours_read"] / med["fio_read"],
        "seq_write_vs_fio": med["ours_write"] / med["fio_write"],
        "rand4k_read_vs_fio": med["ours_rand"] / med["fio_rand"],
        "seq_read_huge_pages_vs_fio": med["ours_huge_read"] / med["fio_read"],
        "seq_write_huge_pages_vs_fio": med["ours_huge_write"] / med["fio_write"],
        "seq_read_bytes_per_s": {"terastack": med["ours_read"], "terastack_huge_pages": med["ours_huge_read"],
                                 "fio": med["fio_read"]},
        "seq_write_bytes_per_s": {"terastack": med["ours_write"], "terastack_huge_pages": med["ours_huge_write"],
                                  "fio": med["fio_write"]},
        "rand4k_read_iops": {"terastack": med["ours_rand"], "fio": med["fio_rand"]},
    }


def _buffers(size: int):
    """The sequential ring twice (4 KiB pages, and terastack's allocator), and the random reads' target.

    Buffers of fio's footprint (iodepth x bs): on a virtual disk the host copies guest memory and a larger ring
    measurably slows both directions. The headline ratios use 4 KiB pages, as fio's malloc'd buffers have; the
    same transfers from terastack's own allocator (huge pages, [Note: huge pages for I/O buffers] in io.buffers)
    are measured beside them as what the engine's buffers add."""
    ring_bytes = min(size, SEQ_DEPTH * SEQ_BLOCK)
    ring = np.frombuffer(anonymous_map(ring_bytes, huge_pages=False), np.uint8)
    ring_huge = io.aligned_empty(ring_bytes)
    ring[:] = 7
    ring_huge[:] = 7
    target = np.frombuffer(anonymous_map(RAND_DEPTH * BLOCK * 16, huge_pages=False), np.uint8)
    return ring, ring_huge, target


def measure(args: argparse.Namespace) -> dict:
    if shutil.which("fio") is None:
        raise RuntimeError("fio is not installed; `apt-get install fio` (the baseline is measured in the same run)")
    size = parse_bytes(args.size or ("512MiB" if args.quick else "2GiB"), field="--size")
    size = max(SEQ_BLOCK, size // SEQ_BLOCK * SEQ_BLOCK)
    repeat = args.repeat or (2 if args.quick else 4)
    rand_seconds = args.rand_seconds or (1.5 if args.quick else 4.0)
    batch_ops = args.batch_ops or (200_000 if args.quick else 1_000_000)
    directory = args.dir or tempfile.gettempdir()
    os.makedirs(directory, exist_ok=True)
    fio_engine = best_fio_engine()
    path = os.path.join(directory, f".terastack-bench-io-{os.getpid()}.bin")
    print(f"bench io: {format_bytes(size)} test file in {directory}, fio engine {fio_engine}, "
          f"{repeat} pairs per test", file=sys.stderr)
    seq_engine = io.IOEngine(backend=args.backend, queue_depth=SEQ_DEPTH)
    rand_engine = io.IOEngine(backend=args.backend, queue_depth=RAND_DEPTH)
    ring, ring_huge, target = _buffers(size)
    huge_bytes = huge_page_bytes(ring_huge)
    print(f"  buffers: {format_bytes(ring.nbytes)} of 4 KiB pages; {format_bytes(ring.nbytes)} from terastack's "
          f"allocator, {format_bytes(huge_bytes)} of it in huge pages", file=sys.stderr)
    sides = {"write": ("fio", "ours", "ours_huge"), "read": ("fio", "ours", "ours_huge"), "rand": ("fio", "ours")}
    samples: dict[str, list[float]] = {f"{who}_{test}": [] for test, whos in sides.items() for who in whos}
    try:
        _prepare(path, size)
        _alternate({
            "write": {"fio": lambda: run_fio(path, size, "write", SEQ_BLOCK, SEQ_DEPTH, fio_engine),
                      "ours": lambda: _ours_seq(seq_engine, path, size, True, ring),
                      "ours_huge": lambda: _ours_seq(seq_engine, path, size, True, ring_huge)},
            "read": {"fio": lambda: run_fio(path, size, "read", SEQ_BLOCK, SEQ_DEPTH, fio_engine),
                     "ours": lambda: _ours_seq(seq_engine, path, size, False, ring),
                     "ours_huge": lambda: _ours_seq(seq_engine, path, size, False, ring_huge)},
            "rand": {"fio": lambda: run_fio(path, size, "randread", BLOCK, RAND_DEPTH, fio_engine, rand_seconds),
                     "ours": lambda: _ours_rand(rand_engine, path, size, rand_seconds,
                                                samples["fio_rand"][-1] if samples["fio_rand"] else 50_000, target)},
        }, samples, repeat)
        hot_engine = io.IOEngine(backend=args.backend)  # default queue depth: hits complete inline
        batch_rate, single_rate = _batch_submit_rate(hot_engine, path, size, batch_ops, 8 << 20)
        batch_rate_large, _ = _batch_submit_rate(hot_engine, path, size, batch_ops, 256 << 20)
        hot_engine.close()
    finally:
        seq_engine.close()
        rand_engine.close()
        if os.path.exists(path):
            os.unlink(path)
    return {
        "backend": rand_engine.backend, "backend_reason": rand_engine.backend_reason,
        "seq_buffer_bytes": ring.nbytes, "seq_buffer_huge_page_bytes": huge_bytes,
        **_ratios(samples),
        "batch_submit_ops_per_s": batch_rate, "single_request_ops_per_s": single_rate,
        "batch_submit_ops_per_s_256mib_region": batch_rate_large,
        "samples": samples, "file_bytes": size, "directory": os.path.abspath(directory), "direct": True,
        "fio_engine": fio_engine, "seq_block_bytes": SEQ_BLOCK, "seq_queue_depth": SEQ_DEPTH,
        "rand_queue_depth": RAND_DEPTH, "repeat": repeat,
    }
