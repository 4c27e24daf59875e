"""``terastack probe``: measure this machine and cache it for the planners.

Measures cores, memory, fp32 matmul FLOP/s, memory copy bandwidth, CPU AdamW
rate, and on a chosen directory (or on each of several, one per SSD) the SSD's sequential read/write bandwidth,
4 KiB random-read IOPS (through the storage engine, O_DIRECT, on a file that
is really written, with its page cache dropped before reading), random reads at a few request sizes
(:func:`measure_random_reads`: what a GNN gather's extents get), the read and write rates it gives a
reader and a writer at once (:func:`measure_mixed`), its free space, and how much
SSD traffic slows the CPU's compute. With CUDA it
adds the accelerator's matmul rate and pinned host<->device bandwidth.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from terastack.plan.hardware import Hardware, aggregate_ssd, load_probe, probe_cache_path, save_probe
from terastack.units import format_bytes


def _timed(fn, min_seconds: float) -> tuple[int, float]:
    """Run ``fn`` until ``min_seconds`` have passed (at least twice, first run discarded)."""
    fn()
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and reps >= 2:
            return reps, elapsed


def measure_cpu_flops(seconds: float = 1.0, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    reps, elapsed = _timed(lambda: torch.matmul(a, b, out=out), seconds)
    return 2 * n**3 * reps / elapsed


def measure_memcpy(seconds: float = 0.5, nbytes: int = 128 << 20) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    reps, elapsed = _timed(lambda: np.copyto(dst, src), seconds)
    return nbytes * reps / elapsed


def measure_cpu_adam(seconds: float = 1.0, params: int = 16 << 20) -> float:
    p = torch.nn.Parameter(torch.randn(params))
    p.grad = torch.randn(params)
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        opt.step()
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    reps, elapsed = _timed(opt.step, seconds)
    return params * reps / elapsed


def measure_cpu_updates(seconds: float = 1.0, params: int = 4 << 20, chunk: int = 1 << 20, *,
                        names: tuple[str, ...] | None = None) -> dict:
    """The CPU update rate of each optimizer format other than AdamW, as a step updates: the format's own
    ``update`` over ``params`` elements of one matrix in optimizer chunks of ``chunk`` elements
    (:func:`format_update`), for every format whose library is installed. [Note: a format's rate as the step
    updates]

    The library's own optimizer on one large matrix (what this measured before) is another computation than the
    step's update: 8-bit AdamW joins the chunks of a run into one library call and copies the result back (each
    chunk's state is a record of its own), and Adafactor's step is torch's functional ``adafactor`` on the whole
    matrix without the optimizer class around it. Measured in one process beside three steps of llama-150m on
    the shared 2-core machine (2026-12-06, load 3-10; the step's update spans less their waits,
    ``update_s`` in terastack.llm.bench.step_timeline), the library's class ran 1.4-3.4x as fast as the step's
    8-bit update (median 2.5x) and this measurement 0.9-1.9x (median 1.3x); for Adafactor 0.3-2.1x (median 1.3x)
    and 0.7-2.1x (median 1.1x). A shared machine's figures say which measurement follows the step, not the
    step's quiet rate. The planner prices a format's update at this rate (``Hardware.update_rate``). ``names``: only these formats."""
    from terastack.plan.optimizer_formats import FORMATS

    rates = {}
    for name, fmt in FORMATS.items():
        if name == "adamw" or (names is not None and name not in names):
            continue   # measure_cpu_adam: torch's fused AdamW, the kernel the step calls over its chunks
        try:
            fmt.require()
        except ImportError:
            continue   # not installed: the planner prices it at AdamW's rate, and the job is refused anyway
        update, numel = format_update(fmt, params, chunk)
        reps, elapsed = _timed(update, seconds)
        rates[name] = numel * reps / elapsed
    return rates


def format_update(fmt, params: int, chunk: int):
    """(one update of ``fmt``, its elements): ``params`` elements of a matrix 1024 wide in the chunks the
    optimizer hands the format (``fmt.chunk_elements(chunk)`` elements each, its master and gradient views of
    whole tensors, each chunk's state parts tensors of their own, a part of the whole matrix with its first chunk),
    updated at the next step count each call."""
    from types import SimpleNamespace

    width = 1024
    shape = (max(1, params // width), width)
    numel = shape[0] * width
    c = fmt.chunk_elements(chunk)
    param, grad = torch.randn(numel), torch.randn(numel)
    chunks = []
    for lo in range(0, numel, c):
        hi = min(lo + c, numel)
        state = {p.key: torch.zeros(p.span(lo, hi)[1] - p.span(lo, hi)[0], dtype=p.dtype) if p.chunked
                 else torch.zeros(p.shape(shape), dtype=p.dtype) for p in fmt.parts(shape) if p.chunked or lo == 0}
        chunks.append(SimpleNamespace(name="w", lo=lo, hi=hi, shape=shape, param=param[lo:hi], grad=grad[lo:hi],
                                      state=state))
    hyper = SimpleNamespace(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    steps = [0]

    def update() -> None:
        fmt.update(chunks, [steps[0]] * len(chunks), lr=1e-3, hyper=hyper, impl={})
        steps[0] += 1
    return update, numel


def measure_ssd(directory: str, file_bytes: int, rand_seconds: float = 2.0) -> dict:
    from terastack import io

    engine = io.get_engine()
    os.makedirs(directory, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=".terastack-probe-", dir=directory)
    os.close(fd)
    chunk = 64 << 20
    buf = io.aligned_empty(chunk)
    buf[:] = np.frombuffer(os.urandom(1 << 20), np.uint8).repeat(1)[np.arange(chunk) % (1 << 20)]
    try:
        with engine.open(path, "w", direct=True) as f:
            f.allocate(file_bytes)
            start = time.perf_counter()
            futures = [f.pwrite(buf, off, min(chunk, file_bytes - off)) for off in range(0, file_bytes, chunk)]
            for fut in futures:
                fut.result()
            f.sync()
            write_bps = file_bytes / (time.perf_counter() - start)
        with engine.open(path, "r", direct=True) as f:
            f.drop_cache()
            start = time.perf_counter()
            futures = [f.pread(buf, off, min(chunk, file_bytes - off)) for off in range(0, file_bytes, chunk)]
            for fut in futures:
                fut.result()
            read_bps = file_bytes / (time.perf_counter() - start)
            f.drop_cache()
            slots = 1024
            target = io.aligned_empty(slots * 4096)
            rng = np.random.default_rng(0)
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < rand_seconds:
                n = 16384
                offsets = rng.integers(0, file_bytes // 4096, n) * 4096
                f.pread_many(target, offsets, 4096, (np.arange(n) % slots) * 4096).result()
                done += n
            iops = done / (time.perf_counter() - start)
            random_reads = measure_random_reads(f, file_bytes, seconds=rand_seconds / 2,
                                                queue_depth=engine.config.queue_depth)
        mixed = measure_mixed(engine, path, file_bytes, buf, seconds=rand_seconds)
        return {"ssd_read_bytes_per_s": read_bps, "ssd_write_bytes_per_s": write_bps, "ssd_rand4k_iops": iops,
                "ssd_random_reads": random_reads, **mixed, "direct": True, "backend": engine.backend}
    finally:
        os.unlink(path)


#: request sizes of :func:`measure_random_reads`: a GNN gather's extents (one to a few 4 KiB blocks per feature row)
#: and a larger one to interpolate towards
RANDOM_READ_SIZES = (4096, 8192, 16384, 65536)


def measure_random_reads(f, file_bytes: int, *, seconds: float, queue_depth: int,
                         sizes: tuple = RANDOM_READ_SIZES) -> list[dict]:
    """Random reads only, of each of ``sizes`` (block-aligned extents) on ``f`` (open O_DIRECT, ``file_bytes`` long,
    already written): whole vectors to ``pread_many`` as a GNN gather issues them, which the engine keeps
    ``queue_depth`` deep; ``seconds`` split over the sizes. Reads per second per size
    (terastack.plan.read_rates [Note: random reads at the gather's own request size])."""
    from terastack import io

    out = []
    rng = np.random.default_rng(1)
    for size in sizes:
        slots = file_bytes // size
        if slots < 1:
            continue
        n = int(min(4096, max(64, (16 << 20) // size)))  # a vector of up to 16 MiB
        target = io.aligned_empty(n * size)
        f.drop_cache()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / len(sizes) or done == 0:
            offsets = np.sort(rng.choice(slots, min(n, slots), replace=False)) * size
            f.pread_many(target, offsets, size, np.arange(len(offsets)) * size).result()
            done += len(offsets)
        out.append({"request_bytes": size, "queue_depth": queue_depth,
                    "reads_per_s": done / (time.perf_counter() - start)})
    return out


#: a training step's writes per byte it reads (the 1.1B step: 12.0 GiB written, 15.7 GiB read): the mix the
#: mixed measurement paces its writes to
MIXED_WRITE_PER_READ = 0.75


def measure_mixed(engine, path: str, file_bytes: int, buf, *, seconds: float = 2.0, depth: int = 4,
                  write_per_read: float = MIXED_WRITE_PER_READ) -> dict:
    """The rates a reader and a writer get at once on ``path`` (already written, ``file_bytes`` long): reads of
    ``buf``'s size stream through the first half, writes through the second, each ``depth`` requests deep, and a
    write is issued only while the bytes written trail ``write_per_read`` of those read (a step's own mix; a disk
    that cannot keep up with that many writes gives fewer). [Note: reads and writes at once] in
    terastack.plan.hardware says how the step model uses them."""
    chunk = min(len(buf) // 2, max(file_bytes // 8, 4096)) // 4096 * 4096
    half = file_bytes // 2 // chunk * chunk
    if half < chunk:
        return {}
    rbuf, wbuf = buf[:chunk], buf[chunk:2 * chunk]
    done = {"read": 0, "write": 0}
    issued = {"read": 0, "write": 0}
    pending: list = []
    with engine.open(path, "r+", direct=True) as f:
        f.drop_cache()

        def issue(op: str) -> None:
            off = issued[op] % half
            fut = f.pread(rbuf, off, chunk) if op == "read" else f.pwrite(wbuf, half + off, chunk)
            issued[op] += chunk
            pending.append((op, fut))

        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            while sum(1 for op, _ in pending if op == "read") < depth:
                issue("read")
            while (sum(1 for op, _ in pending if op == "write") < depth
                   and issued["write"] <= write_per_read * issued["read"]):
                issue("write")
            op, fut = pending.pop(0)
            done[op] += fut.result()
        elapsed = time.perf_counter() - start
        for op, fut in pending:  # in flight at the end: finished, not counted
            fut.result()
        f.sync()
        f.drop_cache()
    return {"ssd_mixed_read_bytes_per_s": done["read"] / elapsed, "ssd_mixed_write_bytes_per_s": done["write"] / elapsed}


def split_dirs(directory: str) -> list[str]:
    """The absolute directories of a ``--dir`` value: one, or several (one per SSD) separated by commas."""
    dirs = [d.strip() for d in directory.split(",")]
    if not all(dirs):
        raise ValueError(f"--dir: {directory!r} names an empty directory")
    return [os.path.abspath(d) for d in dirs]


def measure_ssd_dirs(dirs: list[str], file_bytes: int, rand_seconds: float = 2.0) -> list[dict]:
    """:func:`measure_ssd` of each directory in turn (one at a time, so each has its device to itself): one
    entry per directory with its file system's device number (directories sharing one count once in
    :func:`terastack.plan.hardware.aggregate_ssd`)."""
    out = []
    for d in dirs:
        r = measure_ssd(d, file_bytes, rand_seconds=rand_seconds)
        out.append({"dir": d, "device": os.stat(d).st_dev,
                    **{k: v for k, v in r.items() if k.startswith("ssd_")}})
    return out


def measure_io_slowdown(directory: str, seconds: float = 1.0, file_bytes: int = 256 << 20) -> float:
    """Fraction of the CPU's matmul rate lost per GB/s of SSD traffic beside it.

    A training-shaped matmul runs alone, then while a thread streams 4 MiB reads and writes through the
    storage engine as fast as the SSD takes them, then alone again (the two alone runs are averaged, so a
    drifting machine does not pass for interference)."""
    from terastack import io

    engine = io.get_engine()
    a, w = torch.randn(256, 768), torch.randn(768, 3072)

    def matmul_rate(span: float) -> float:
        reps, elapsed = _timed(lambda: torch.matmul(a, w), span)
        return reps / elapsed

    fd, path = tempfile.mkstemp(prefix=".terastack-probe-io-", dir=directory)
    os.close(fd)
    chunk = 4 << 20
    try:
        with engine.open(path, "w", direct=True) as f:
            f.allocate(file_bytes)
            bufs = [io.aligned_empty(chunk) for _ in range(4)]
            for off in range(0, file_bytes, chunk):
                f.pwrite(bufs[0], off).result()
            alone = matmul_rate(seconds)
            moved, stop = [0], [False]

            def stream() -> None:
                k = 0
                while not stop[0]:
                    half = file_bytes // 2
                    futs = [f.pread(bufs[0], (k * chunk) % half), f.pread(bufs[1], (k * chunk + chunk) % half),
                            f.pwrite(bufs[2], half + (k * chunk) % half),
                            f.pwrite(bufs[3], half + (k * chunk + chunk) % half)]
                    for fut in futs:
                        fut.result()
                    moved[0] += 4 * chunk
                    k += 2
            thread = threading.Thread(target=stream, name="terastack-probe-io", daemon=True)
            start = time.perf_counter()
            thread.start()
            busy = matmul_rate(seconds)
            stop[0] = True
            thread.join()
            io_gbps = moved[0] / (time.perf_counter() - start) / 1e9
            alone = (alone + matmul_rate(seconds)) / 2
    finally:
        os.unlink(path)
    return max(0.0, 1 - busy / alone) / io_gbps if io_gbps > 0 else 0.0


def measure_gpu() -> dict:
    if not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)

    def mm():
        torch.matmul(a, b)
        torch.cuda.synchronize()
    reps, elapsed = _timed(mm, 1.0)
    host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    devbuf = torch.empty_like(host, device=dev)

    def h2d():
        devbuf.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
    reps_c, elapsed_c = _timed(h2d, 0.5)
    return {"gpu_name": torch.cuda.get_device_name(0),
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
            "gpu_flops": 2 * n**3 * reps / elapsed, "pcie_bytes_per_s": host.numel() * reps_c / elapsed_c}


def measure(directory: str, *, quick: bool = False) -> Hardware:
    from terastack.memory import mem_total
    from terastack.reporting import environment

    scale = 0.3 if quick else 1.0
    fields = {
        "name": "this machine (probed)", "measured": True, "cores": os.cpu_count() or 1,
        "host_memory_bytes": mem_total(),
        "cpu_flops": measure_cpu_flops(scale), "memcpy_bytes_per_s": measure_memcpy(0.5 * scale),
        "cpu_adam_params_per_s": measure_cpu_adam(scale),
        "cpu_update_params_per_s": measure_cpu_updates(scale),
        "probed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": environment()["versions"],
    }
    dirs = split_dirs(directory)
    fields["probe_dir"] = ",".join(dirs)
    fields["ssd_dirs"] = measure_ssd_dirs(dirs, (256 << 20) if quick else (1 << 30), rand_seconds=2.0 * scale)
    fields.update(aggregate_ssd(fields["ssd_dirs"]))
    # the store's room: the free space of each distinct file system once
    free = {os.stat(d).st_dev: shutil.disk_usage(d).free for d in dirs}
    fields["disk_bytes"] = sum(free.values())
    fields["cpu_io_slowdown_per_gbps"] = measure_io_slowdown(dirs[0], scale)
    fields.update(measure_gpu())
    return Hardware(**fields)


def load_or_measure(directory: str | None = None, *, quick: bool = True) -> Hardware:
    """The cached probe if there is one, else a fresh (quick) measurement, cached."""
    hw = load_probe()
    if hw is None:
        hw = measure(directory or tempfile.gettempdir(), quick=quick)
        save_probe(hw)
    return hw


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None,
                   help="directory on the SSD to measure, or several (one per SSD) separated by commas: each is "
                        "measured and the planner uses their sum (default: the system temp dir)")
    p.add_argument("--quick", action="store_true", help="smaller files and shorter timings")
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached probe exists")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--cache", default=None, help=f"where to cache the result (default {probe_cache_path()})")


def run(args: argparse.Namespace) -> int:
    hw = None if args.refresh else load_probe(args.cache)
    if hw is not None and args.dir and ",".join(split_dirs(args.dir)) != hw.probe_dir:
        hw = None
    if hw is None:
        print("probing this machine ...", file=sys.stderr)
        hw = measure(args.dir or tempfile.gettempdir(), quick=args.quick)
        path = save_probe(hw, args.cache)
        # the units' calibrated times kept beside the probe were this machine's as it was: time them anew too
        path.with_name("unit_times.json").unlink(missing_ok=True)
        print(f"cached in {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(hw.to_dict(), indent=1))
        return 0
    rows = [
        ("cores", hw.cores), ("host memory", format_bytes(hw.host_memory_bytes)),
        ("fp32 matmul", f"{hw.cpu_flops / 1e9:.1f} GFLOP/s"),
        ("memory copy", f"{hw.memcpy_bytes_per_s / 1e9:.2f} GB/s"),
        ("CPU AdamW", f"{hw.cpu_adam_params_per_s / 1e6:.0f} M params/s"),
        *((f"CPU {name}", f"{rate / 1e6:.0f} M params/s") for name, rate in hw.cpu_update_params_per_s.items()),
        (f"SSD seq read ({hw.probe_dir})" + (" per SSD" if hw.ssds > 1 else ""),
         f"{hw.ssd_read_bytes_per_s / 1e9:.2f} GB/s"),
        ("SSD seq write", f"{hw.ssd_write_bytes_per_s / 1e9:.2f} GB/s"),
        ("SSD 4 KiB random read", f"{hw.ssd_rand4k_iops / 1e3:.0f} k IOPS"),
        *[(f"SSD random read, {e['request_bytes'] // 1024} KiB (QD {e['queue_depth']})",
           f"{e['reads_per_s'] / 1e3:.0f} k reads/s, {e['reads_per_s'] * e['request_bytes'] / 1e9:.2f} GB/s")
          for e in hw.ssd_random_reads],
        ("SSD read + write at once", f"{hw.ssd_mixed_read_bytes_per_s / 1e9:.2f} + "
                                     f"{hw.ssd_mixed_write_bytes_per_s / 1e9:.2f} GB/s"),
        ("free disk", format_bytes(hw.disk_bytes)),
    ]
    if len(hw.ssd_dirs) > 1:
        rows += [(f"  {e['dir']}", f"{e['ssd_read_bytes_per_s'] / 1e9:.2f} GB/s read, "
                                   f"{e['ssd_write_bytes_per_s'] / 1e9:.2f} GB/s write") for e in hw.ssd_dirs]
        rows += [("SSDs (distinct devices)", f"{hw.ssds}: {hw.ssd_read_total / 1e9:.2f} GB/s read together")]
    rows += [
        ("CPU compute lost to SSD traffic", f"{hw.cpu_io_slowdown_per_gbps:.1%} per GB/s"),
    ]
    if hw.has_gpu:
        rows += [("GPU", f"{hw.gpu_name}, {format_bytes(hw.gpu_memory_bytes)}"),
                 ("GPU matmul (bf16)", f"{hw.gpu_flops / 1e12:.0f} TFLOP/s"),
                 ("host->device (pinned)", f"{hw.pcie_bytes_per_s / 1e9:.1f} GB/s")]
    for k, v in rows:
        print(f"  {k:34s} {v}")
    return 0


