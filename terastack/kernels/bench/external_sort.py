"""``terastack bench sort``: external merge sort of random 64-bit keys, 8x the host budget or more.

Measured in one run: the sort with I/O overlapped (pipelined), the same sort
with every transfer waited for (sync), its compute alone (the same run
formation and merge on in-memory data), its I/O alone (the same transfers,
no sorting), and fio's sequential read and write bandwidth on the same disk.
The output is checked sorted and a permutation of the input (order-independent
checksums). On 2 cores sorting is compute-bound, so ``smaller_side_hidden`` =
(compute_only + io_only - pipelined) / min(compute_only, io_only), in [0, 1], is the figure that
shows whether the I/O is hidden ([Note: the share of the smaller side hidden] in
terastack.kernels.overlap); ``io_bound_ratio`` = (bytes moved / fio bandwidth) / pipelined time
says how far the run is from the disk's limit.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from terastack import io
from terastack.constants import SEQ_BLOCK
from terastack.io.bench.rates import SEQ_DEPTH, best_fio_engine, run_fio
from terastack.kernels.sort import KEY, Checksum, ExternalSort
from terastack.kernels.overlap import overlap_figures
from terastack.memory import PeakRSS
from terastack.units import format_bytes, parse_bytes

HEADLINE = ["smaller_side_hidden", "speedup_vs_sync", "io_bound_ratio", "compute_only_s", "io_only_s", "sync_s",
            "pipelined_s", "peak_rss_bytes", "host_budget_bytes", "verified"]
PRESETS = {
    "smoke": ["--host-budget", "1MiB", "--repeat", "1"],
    "small": ["--quick"],
    "full": [],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="32MiB budget, one repetition")
    p.add_argument("--dir", default=None, help="directory on the SSD (default: system temp dir)")
    p.add_argument("--host-budget", default=None, help="key buffers in memory (default 128MiB, --quick 32MiB)")
    p.add_argument("--data-factor", type=float, default=8.0, help="input size as a multiple of the budget (>= 8)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions per schedule (default 3, --quick 1)")
    p.add_argument("--threads", type=int, default=0, help="sorting threads (default: one per core, at most 4)")
    p.add_argument("--no-fio", action="store_true", help="skip the fio bandwidth (io_bound_ratio not reported)")


def _generate(path: str, keys: int) -> Checksum:
    check = Checksum()
    rng = np.random.default_rng(2024)
    chunk = io.aligned_empty(min(keys, 8 << 20), KEY)
    with io.open(path, "w", direct=True, size=keys * 8) as f:
        for start in range(0, keys, len(chunk)):
            n = min(len(chunk), keys - start)
            chunk[:n] = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
            check.add(chunk[:n])
            f.write(chunk[:n], start * 8)
        f.sync()
    return check


def _verify(path: str, keys: int, expect: Checksum) -> bool:
    check = Checksum()
    buf = io.aligned_empty(min(keys, 8 << 20), KEY)
    last = np.iinfo(np.int64).min
    ok = True
    with io.open(path, "r", direct=True) as f:
        if f.size != keys * 8:
            return False
        for start in range(0, keys, len(buf)):
            n = min(len(buf), keys - start)
            f.read(buf[:n], start * 8)
            block = buf[:n]
            ok &= bool(block[0] >= last) and bool((block[1:] >= block[:-1]).all())
            last = int(block[-1])
            check.add(block)
    return ok and check == expect


def measure(args: argparse.Namespace) -> dict:
    budget = parse_bytes(args.host_budget or ("32MiB" if args.quick else "128MiB"), field="--host-budget")
    if args.data_factor < 8:
        raise ValueError("--data-factor: the input must be at least 8x the host budget")
    repeat = args.repeat or (1 if args.quick else 3)
    keys = int(args.data_factor * budget) // 8 // 512 * 512
    directory = args.dir or tempfile.gettempdir()
    times: dict[str, list[float]] = {"compute_only": [], "io_only": [], "sync": [], "pipelined": []}
    phases: dict[str, dict] = {}
    verified = True
    peak = 0
    with tempfile.TemporaryDirectory(prefix="terastack-sort-", dir=directory) as tmp:
        src, dst = os.path.join(tmp, "input.bin"), os.path.join(tmp, "output.bin")
        print(f"bench sort: {keys} keys ({format_bytes(keys * 8)}), host budget {format_bytes(budget)}",
              file=sys.stderr)
        expect = _generate(src, keys)
        fio = None
        if not args.no_fio:
            if shutil.which("fio") is None:
                raise RuntimeError("fio is not installed; `apt-get install fio` or pass --no-fio")
            engine = best_fio_engine()
            fio = {"read": run_fio(src, keys * 8, "read", SEQ_BLOCK, SEQ_DEPTH, engine),
                   "write": run_fio(src, keys * 8, "write", SEQ_BLOCK, SEQ_DEPTH, engine)}
            expect = _generate(src, keys)  # fio's write replaced the keys
        for rep in range(repeat):
            data = np.fromfile(src, dtype=KEY)
            sorter = ExternalSort(ExternalSort.Config(host_budget=budget, threads=args.threads))
            out, st = sorter.sort_in_memory(data)
            times["compute_only"].append(st.run_formation_s + st.merge_s)
            phases["compute_only"] = {"run_formation_s": st.run_formation_s, "merge_s": st.merge_s}
            verified &= bool((out[1:] >= out[:-1]).all())
            del data, out
            sorter.close()
            for mode in ("io_only", "sync", "pipelined"):
                cfg = ExternalSort.Config(host_budget=budget, threads=args.threads, pipelined=mode != "sync",
                                          io_only=mode == "io_only")
                sorter = ExternalSort(cfg)
                with PeakRSS() as rss:
                    t0 = time.perf_counter()
                    st = sorter.sort_file(src, dst, tmp)
                    times[mode].append(time.perf_counter() - t0)
                sorter.close()
                phases[mode] = {"run_formation_s": st.run_formation_s, "merge_s": st.merge_s,
                                "wait_io_s": st.wait_io_s, "runs": st.runs, "bytes_read": st.bytes_read,
                                "bytes_written": st.bytes_written, "buffer_bytes": st.peak_buffer_bytes}
                if mode != "io_only":
                    peak = max(peak, rss.peak_bytes)
                    verified &= _verify(dst, keys, expect)
                os.unlink(dst)
            print(f"  repetition {rep + 1}/{repeat}: " + ", ".join(f"{m} {v[-1]:.2f}s" for m, v in times.items()),
                  file=sys.stderr)
    moved_read = phases["pipelined"]["bytes_read"]
    moved_written = phases["pipelined"]["bytes_written"]
    result = {
        **overlap_figures(times),
        "peak_rss_bytes": peak,
        "host_budget_bytes": budget,
        "verified": verified,
        "keys": keys,
        "data_bytes": keys * 8,
        "bytes_moved": moved_read + moved_written,
        "phases": phases,
        "times": times,
        "repeat": repeat,
    }
    if fio:
        at_fio = moved_read / fio["read"] + moved_written / fio["write"]
        result["io_bound_ratio"] = at_fio / result["pipelined_s"]
        result["fio_bytes_per_s"] = fio
    return result
