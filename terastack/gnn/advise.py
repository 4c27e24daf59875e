"""``terastack gnn advise``: the dataset's side of the TPC model.

Builds a :class:`terastack.plan.tpc.GnnWorkload` from a dataset: the
pre-sampled hotness curve and batch shape, plus a short calibration on this
machine (a few real training steps of the chosen model on sampled batches, and
the host's row-gather rate), then asks the model for this machine's epoch
time and for the configuration with the best throughput per cost.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.gnn.hotness import Hotness
from terastack.gnn.models import GNN, train_step
from terastack.plan.tpc import GnnWorkload, blocks_per_miss


def calibrate_compute(model_kind: str, hot: Hotness, *, feat_dim: int, hidden: int, classes: int, layers: int,
                      steps: int = 5, seed: int = 0) -> tuple[float, float]:
    """(seconds per training step scaled to the mean batch, FLOPs per batch) measured on this machine's CPU."""
    torch.manual_seed(seed)
    model = GNN(model_kind, feat_dim, hidden, classes, layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    examples = hot.examples or []
    if not examples:
        raise ValueError("hotness: pre-sampling kept no example batches to calibrate with")
    datas = []
    gen = torch.Generator().manual_seed(seed)
    for b in examples:
        x = torch.randn(b.num_nodes, feat_dim, generator=gen)
        y = torch.randint(0, classes, (b.num_nodes,), generator=gen)
        datas.append(b.to_data(x, y))
    weights = sum(p.numel() for p in model.parameters() if p.dim() > 1)
    flops = 6.0 * hot.nodes_per_batch * weights + 6.0 * hot.edges_per_batch * hidden * layers
    if steps < 1:
        return float("nan"), flops
    train_step(model, opt, datas[0])  # warm-up (allocator, lazy init)
    per_node = []
    for k in range(steps):
        d = datas[k % len(datas)]
        t0 = time.perf_counter()
        train_step(model, opt, d)
        per_node.append((time.perf_counter() - t0) / max(d.num_nodes, 1))
    per_node = float(np.median(per_node))  # the median resists a step slowed by other work on the machine
    return per_node * hot.nodes_per_batch, flops


def measure_gather_costs(num_nodes: int, row_len: int, dtype: torch.dtype, rows_per_batch: float, *,
                         cache_rows: int = 1 << 18, reps: int = 5, seed: int = 0) -> tuple[float, float]:
    """CPU seconds per gathered row of the unified cache's gather on this machine: (every row, extra per miss).

    Replays the gather's own steps on synthetic data of the batch's size: the
    lookup-table read and tier split, the cache copy, and for misses the block
    planning and the cut of rows out of a block buffer (the SSD wait excluded).
    """
    from terastack.gnn.rows import covering_blocks

    gen = np.random.default_rng(seed)
    rows = max(1, int(rows_per_batch))
    table = np.full(num_nodes, -1, np.int32)
    cache_rows = int(min(cache_rows, num_nodes))
    table[gen.choice(num_nodes, cache_rows, replace=False)] = np.arange(cache_rows, dtype=np.int32)
    cache = torch.zeros(cache_rows, row_len, dtype=dtype)
    ids = gen.choice(num_nodes, rows, replace=False)
    out = torch.empty(rows, row_len, dtype=dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    row_bytes = row_len * itemsize

    def hit_path() -> None:
        loc = table[ids]
        hit = np.flatnonzero(loc >= 0)
        np.flatnonzero(loc < 0)
        slots = torch.from_numpy(np.minimum(np.abs(loc), cache_rows - 1).astype(np.int64))
        out.index_copy_(0, torch.from_numpy(np.arange(rows)), cache.index_select(0, slots))
        return hit

    blocks_buf = torch.zeros(len(covering_blocks(ids, row_bytes)) * BLOCK // itemsize + row_len, dtype=dtype)

    def miss_path() -> None:
        blocks = covering_blocks(ids, row_bytes)
        start = ids * row_bytes
        slot = np.searchsorted(blocks, start // BLOCK)
        elem = torch.from_numpy((slot * BLOCK + start % BLOCK) // itemsize)
        out.index_copy_(0, torch.from_numpy(np.arange(rows)), blocks_buf.unfold(0, row_len, 1).index_select(0, elem))

    timings = []
    for fn in (hit_path, miss_path):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        timings.append((time.perf_counter() - t0) / reps / rows)
    return timings[0], timings[1]


def workload(ds, hot: Hotness, *, batch_size: int, model: str, hidden: int, layers: int,
             calibrate: bool = True, calibration_steps: int = 5, io_cpu_seconds_per_block: float = 0.0
             ) -> GnnWorkload:
    """The TPC workload of training ``model`` on ``ds`` with ``batch_size`` seeds per batch."""
    ks, hits = hot.curve()
    compute, flops = calibrate_compute(model, hot, feat_dim=ds.feat_dim, hidden=hidden, classes=ds.num_classes,
                                       layers=layers, steps=calibration_steps if calibrate else 0)
    compute = compute if calibrate else None
    dtype = torch.from_numpy(np.zeros(0, ds.feat_dtype)).dtype
    per_row, per_miss = measure_gather_costs(ds.num_nodes, ds.feat_dim, dtype, hot.nodes_per_batch)
    batches = -(-len(ds.splits["train"]) // batch_size)
    return GnnWorkload(num_nodes=ds.num_nodes, row_bytes=ds.row_bytes, feature_bytes=ds.feature_bytes,
                       batches_per_epoch=batches, nodes_per_batch=hot.nodes_per_batch, curve_rows=ks, curve_hits=hits,
                       blocks_per_miss=blocks_per_miss(ds.row_bytes), sample_seconds=hot.sample_seconds_per_batch,
                       compute_seconds=compute, flops_per_batch=flops, compute_threads=torch.get_num_threads(),
                       gather_seconds_per_row=per_row,
                       miss_cpu_seconds_per_row=per_miss, io_cpu_seconds_per_block=io_cpu_seconds_per_block,
                       table_bytes_per_node=4 if ds.num_nodes < 2**31 else 8)


def probe_feature_file(ds, *, seconds: float = 1.0, batch_blocks: int = 8192, seq_bytes: int = 256 << 20,
                       engine=None) -> dict:
    """SSD figures measured on the dataset's own feature file: 4 KiB random-read IOPS at the queue depth
    of one batch's request (``batch_blocks`` blocks per ``pread_many``), and sequential read bandwidth.
    The page cache is dropped first; reads are O_DIRECT when the file system allows it."""
    from terastack import io

    blocks_in_file = ds.feature_bytes // BLOCK
    if blocks_in_file < 1:
        raise ValueError(f"{ds.features_path}: too small to measure (under one 4 KiB block)")
    rng = np.random.default_rng(0)
    with io.open(ds.features_path, "r", direct="auto", engine=engine) as f:
        f.drop_cache()
        n = int(min(batch_blocks, blocks_in_file))
        buf = io.aligned_empty(n * BLOCK)
        done, start, sys_cpu = 0, time.perf_counter(), 0.0
        while time.perf_counter() - start < seconds or done == 0:
            blocks = np.sort(rng.choice(blocks_in_file, n, replace=False))
            before = os.times().system
            f.pread_many(buf, blocks * BLOCK, BLOCK).result(timeout=120)
            sys_cpu += os.times().system - before  # the kernel's share of each read, charged to this process
            done += n
        iops = done / (time.perf_counter() - start)
        f.drop_cache()
        length = int(min(seq_bytes, blocks_in_file * BLOCK))
        seq = io.aligned_empty(length)
        t0 = time.perf_counter()
        f.read(seq, 0, length, timeout=300)
        bandwidth = length / (time.perf_counter() - t0)
        direct = f.direct
    return {"ssd_rand4k_iops": iops, "ssd_read_bytes_per_s": bandwidth, "direct": direct,
            "io_cpu_seconds_per_block": sys_cpu / done}
