"""``terastack bench gemm``: out-of-core GEMM, pipelined vs synchronous, with compute and I/O alone.

A (rows x K, fp32) is ``--data-factor`` times the host budget and lives on SSD
in a TieredStore; C = A @ B streams through the store's device tier (host
memory with its own budget here). N, the width of B, is chosen by measuring
this machine so that computing a tile and moving it take about the same time:
an overlap figure says nothing when one side dominates.

Four schedules over the same tiles, each run ``--repeat`` times, medians kept:
compute only (no I/O), I/O only (no compute), synchronous, pipelined.
smaller_side_hidden = (compute_only + io_only - pipelined) / min(compute_only, io_only), in [0, 1] ([Note: the
share of the smaller side hidden] in terastack.kernels.overlap).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from terastack import trace
from terastack.kernels.gemm import OutOfCoreGemm, TiledMatrix, working_set_bytes
from terastack.kernels.overlap import overlap_figures
from terastack.memory import PeakRSS
from terastack.progress import Progress
from terastack.tiers import Tier, TieredStore
from terastack.units import format_bytes, parse_bytes

HEADLINE = ["speedup_vs_sync", "smaller_side_hidden", "compute_only_s", "io_only_s", "sync_s", "pipelined_s",
            "peak_rss_bytes", "host_budget_bytes", "max_abs_error"]
PRESETS = {
    "smoke": ["--host-budget", "4MiB", "--k", "256", "--tile-rows", "512", "--n", "32", "--repeat", "1"],
    "small": ["--quick"],
    "full": [],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="128MiB budget, one repetition (under a minute)")
    p.add_argument("--dir", default=None, help="directory on the SSD for the store (default: system temp dir)")
    p.add_argument("--host-budget", default=None, help="host memory for the tiles (default 512MiB, --quick 128MiB)")
    p.add_argument("--data-factor", type=float, default=8.0, help="size of A as a multiple of the budget (>= 4)")
    p.add_argument("--k", type=int, default=4096, help="inner dimension")
    p.add_argument("--n", default="auto", help="columns of B; 'auto' balances compute and I/O on this machine")
    p.add_argument("--tile-rows", type=int, default=None, help="rows per tile (default: 32 MiB tiles of A)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions of each schedule (default 3, --quick 1)")


def _store(root: Path, budget: int) -> TieredStore:
    return TieredStore(TieredStore.Config(root=str(root), device_budget=budget, host_budget=budget,
                                          direct=True, copy_on_write=False))


def _write_a(store: TieredStore, a: TiledMatrix) -> None:
    gen = torch.Generator().manual_seed(0)
    progress = Progress(a.tiles, label="writing A", unit="tiles")
    for i in range(a.tiles):
        tile = torch.rand(a.tile_shape(i), generator=gen) - 0.5
        store.put(a.tile(i), tile).result()
        progress.update(1)
    progress.close()


def _balanced_n(store: TieredStore, a: TiledMatrix) -> tuple[int, dict]:
    """N that makes one tile's matmul take as long as reading it (measured here)."""
    probe_tiles = min(a.tiles, 8)
    start = time.perf_counter()
    for i in range(probe_tiles):
        store.get(a.tile(i), Tier.HOST)
        store.evict(a.tile(i)).result()
    read_s = (time.perf_counter() - start) / probe_tiles
    tile = store.get(a.tile(0), Tier.HOST)
    # A matmul this thin is partly bound by streaming the tile from memory, so its time is not
    # proportional to N: re-time at each candidate until N stops moving.
    n, tried = 128, {}
    while n not in tried and len(tried) < 4:
        b = torch.rand(a.cols, n)
        out = torch.empty(tile.shape[0], n)
        torch.matmul(tile, b, out=out)
        start = time.perf_counter()
        for _ in range(3):
            torch.matmul(tile, b, out=out)
        tried[n] = (time.perf_counter() - start) / 3
        n = max(8, min(4096, int(round(n * read_s / tried[n] / 8)) * 8))
    store.evict(a.tile(0)).result()
    return n, {"tile_read_s": read_s, **{f"tile_compute_s_at_n{k}": v for k, v in tried.items()}}


def _compute_only(store: TieredStore, a: TiledMatrix, b_name: str, c: TiledMatrix) -> float:
    """The same matmuls on resident data: one A tile and one C tile reused, nothing moved."""
    a_tile = store.get(a.tile(0), Tier.DEVICE)
    b = store.get(b_name, Tier.DEVICE)
    out = torch.empty(c.tile_shape(0), device=a_tile.device)  # where the tiles are (the GPU's on a GPU)
    _sync(a_tile.device)
    start = time.perf_counter()
    for i in range(a.tiles):
        rows = a.tile_shape(i)[0]
        with trace.span(f"compute C/{i}", track="compute"):
            torch.matmul(a_tile[:rows], b, out=out[:rows])
    _sync(a_tile.device)  # kernels are asynchronous on a GPU: time them done
    elapsed = time.perf_counter() - start
    store.evict(a.tile(0)).result()
    return elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _io_only(store: TieredStore, a: TiledMatrix, c: TiledMatrix) -> float:
    """The pipelined schedule's traffic without its compute: read every A tile, write every C tile."""
    start = time.perf_counter()
    next_a = store.prefetch(a.tile(0), Tier.DEVICE)
    pending_c = None
    for i in range(a.tiles):
        next_a.result()
        if i + 1 < a.tiles:
            next_a = store.prefetch(a.tile(i + 1), Tier.DEVICE)
        store.create(c.tile(i), c.tile_shape(i), torch.float32, home=Tier.SSD, tier=Tier.DEVICE)
        store.evict(a.tile(i))
        if pending_c is not None:
            pending_c.result()
        pending_c = store.evict(c.tile(i))
    if pending_c is not None:
        pending_c.result()
    elapsed = time.perf_counter() - start
    _drop(store, c)
    return elapsed


def _drop(store: TieredStore, c: TiledMatrix) -> None:
    for i in range(c.tiles):
        if c.tile(i) in store:
            store.delete(c.tile(i))


def _check(store: TieredStore, a: TiledMatrix, b_name: str, c: TiledMatrix, samples: int = 4) -> float:
    """Max |C - A @ B| over sampled tiles, against a float64 in-memory product."""
    b = store.get(b_name, Tier.HOST).double()
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for i in torch.randint(0, a.tiles, (samples,), generator=gen).tolist():
        a_tile = store.get(a.tile(i), Tier.HOST)
        rows = torch.randint(0, a_tile.shape[0], (64,), generator=gen)
        expect = a_tile[rows].double() @ b
        got = store.get(c.tile(i), Tier.HOST)[rows].double()
        worst = max(worst, float((got - expect).abs().max()))
        store.evict(a.tile(i)).result()
        store.evict(c.tile(i)).result()
    store.evict(b_name).result()
    return worst


def measure(args: argparse.Namespace) -> dict:
    budget = parse_bytes(args.host_budget or ("128MiB" if args.quick else "512MiB"), field="--host-budget")
    repeat = args.repeat or (1 if args.quick else 3)
    if args.data_factor < 4:
        raise ValueError("--data-factor: the data must be at least 4x the host budget")
    k = args.k
    tile_rows = args.tile_rows or max(64, (32 << 20) // (k * 4) // 64 * 64)
    rows = int(args.data_factor * budget) // (k * 4)
    rows = max(tile_rows * 2, rows // tile_rows * tile_rows)
    a = TiledMatrix("A", rows, k, tile_rows)
    with tempfile.TemporaryDirectory(prefix="terastack-gemm-", dir=args.dir) as tmp:
        store = _store(Path(tmp) / "store", budget)
        print(f"bench gemm: A {rows}x{k} fp32 ({format_bytes(rows * k * 4)}) in {a.tiles} tiles, "
              f"host budget {format_bytes(budget)}", file=sys.stderr)
        _write_a(store, a)
        if args.n == "auto":
            n, calibration = _balanced_n(store, a)
        else:
            n, calibration = int(args.n), {}
        need = working_set_bytes(a, n)
        if need > budget:
            raise ValueError(f"--host-budget: the pipelined working set (2 A tiles, 2 C tiles, B) needs "
                             f"{format_bytes(need)}, more than {format_bytes(budget)}; lower --tile-rows")
        c = TiledMatrix("C", rows, n, tile_rows)
        store.put("B", torch.rand(k, n, generator=torch.Generator().manual_seed(2)) - 0.5, home=Tier.HOST).result()
        print(f"  N = {n} ({'balanced: ' + str({k_: round(v, 4) for k_, v in calibration.items()}) if calibration else 'given'})",
              file=sys.stderr)
        times: dict[str, list[float]] = {"compute_only": [], "io_only": [], "sync": [], "pipelined": []}
        peak = 0
        max_err = float("nan")
        for rep in range(repeat):
            times["compute_only"].append(_compute_only(store, a, "B", c))
            times["io_only"].append(_io_only(store, a, c))
            for mode in ("sync", "pipelined"):
                gemm = OutOfCoreGemm(store, OutOfCoreGemm.Config(pipelined=mode == "pipelined"))
                store.trim()  # buffers pooled by earlier schedules would hide this one's memory from RSS
                with PeakRSS() as rss:
                    stats = gemm.multiply(a, "B", c)
                peak = max(peak, rss.peak_bytes)
                times[mode].append(stats["total_s"])
                if mode == "pipelined" and rep == 0:
                    max_err = _check(store, a, "B", c)
                _drop(store, c)
            print(f"  repetition {rep + 1}/{repeat}: " + ", ".join(f"{m} {v[-1]:.2f}s" for m, v in times.items()),
                  file=sys.stderr)
        device_peak = store.budgets[Tier.DEVICE].peak
        store.close()
    return {
        **overlap_figures(times),
        "peak_rss_bytes": peak,
        "host_budget_bytes": budget,
        "device_tier_peak_bytes": device_peak,
        "max_abs_error": max_err,
        "error_tolerance": 1e-3,
        "result_ok": bool(max_err <= 1e-3),
        "shape": {"m": rows, "k": k, "n": n, "tile_rows": tile_rows, "tiles": a.tiles},
        "data_bytes": rows * k * 4 + k * n * 4 + rows * n * 4,
        "calibration": calibration,
        "times": times,
        "repeat": repeat,
    }
