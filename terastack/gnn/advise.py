"""``terastack gnn advise``: the dataset's side of the TPC model.

Builds a :class:`terastack.plan.tpc.GnnWorkload` from a dataset: the
pre-sampled hotness curve and batch shape, plus a short calibration on this
machine (a few real training steps of the chosen model on sampled batches, and
the host's row-gather rate), then asks the model for this machine's epoch
time and for the configuration with the best throughput per cost.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.gnn.sampling.hotness import Hotness
from terastack.gnn.training.models import train_step
from terastack.plan.hardware import Hardware
from terastack.plan.tpc import GnnWorkload, blocks_per_miss


def _calibration_batches(model_kind: str, examples: list, ds, *, hidden: int, layers: int, seed: int) -> tuple:
    """The model of ``ds``'s kind, its optimizer, and the pre-sampling's example batches with random features and
    labels: what a calibration trains on."""
    from terastack.gnn.training.train import build_model
    from terastack.gnn.settings import gnn_job

    if not examples:
        raise ValueError("hotness: pre-sampling kept no example batches to calibrate with")
    model = build_model(gnn_job(model=model_kind, hidden=hidden, seed=seed), ds, layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    dims = {t: ds.feature_dims[t] or 1 for t in ds.node_types}
    datas = [b.to_data({t: torch.randn(len(v), dims[t], generator=gen) for t, v in b.nodes.items()},
                       torch.randint(0, ds.num_classes, (len(b.nodes[ds.target]),), generator=gen)) for b in examples]
    return model, opt, datas


def calibrate_compute(model_kind: str, hot: Hotness, ds, *, hidden: int, layers: int, steps: int = 5,
                      seed: int = 0) -> tuple[float, float]:
    """(seconds per training step scaled to the mean batch, FLOPs per batch) measured on this machine's CPU."""
    model, opt, datas = _calibration_batches(model_kind, hot.examples, ds, hidden=hidden, layers=layers, seed=seed)
    weights = sum(p.numel() for p in model.parameters() if p.dim() > 1)
    flops = 6.0 * hot.nodes_per_batch * weights + 6.0 * hot.edges_per_batch * hidden * layers
    if steps < 1:
        return float("nan"), flops
    train_once = _stepper(model, opt, datas)
    train_once(0)  # warm-up (allocator, lazy init)
    per_node = float(np.median(_timed_steps(train_once, min_steps=steps)))  # the median resists a slowed step
    return per_node * hot.nodes_per_batch, flops


def _stepper(model, opt, datas: list):
    """``train_once(k)``: one training step on the k-th of ``datas`` (cyclically); returns the nodes it trained."""
    def train_once(k: int) -> int:
        d = datas[k % len(datas)]
        train_step(model, opt, d)
        return d.num_nodes  # of every type

    return train_once


def _timed_steps(train_once, *, min_steps: int, seconds: float = 0.0, going=lambda: True) -> list[float]:
    """Seconds per node of ``train_once(1)``, ``train_once(2)``, ...: at least ``min_steps`` steps and ``seconds``,
    while ``going()``."""
    per_node, started = [], time.perf_counter()
    while going() and (len(per_node) < min_steps or time.perf_counter() - started < seconds):
        t0 = time.perf_counter()
        nodes = train_once(len(per_node) + 1)
        per_node.append((time.perf_counter() - t0) / max(nodes, 1))
    return per_node


def measure_gather_costs(num_nodes: int, row_len: int, dtype: torch.dtype, rows_per_batch: float, *,
                         cache_rows: int = 1 << 18, reps: int = 5, seed: int = 0) -> tuple[float, float]:
    """CPU seconds per gathered row of the unified cache's gather on this machine: (every row, extra per miss).

    Replays the gather's own steps on synthetic data of the batch's size: the
    lookup-table read and tier split, the cache copy, and for misses the block
    planning and the cut of rows out of a block buffer (the SSD wait excluded).
    """
    from terastack.gnn.storage.rows import covering_blocks

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
             calibrate: bool = True, calibration_steps: int = 5, io_cpu_seconds_per_block: float = 0.0,
             curve: tuple | None = None) -> GnnWorkload:
    """The TPC workload of training ``model`` on ``ds`` with ``batch_size`` seeds per batch (``curve``: a
    hit-rate curve scored elsewhere, e.g. :func:`out_of_sample_curve`; default the pre-sampling's own)."""
    ks, hits = hot.curve() if curve is None else curve
    compute, flops = calibrate_compute(model, hot, ds, hidden=hidden, layers=layers,
                                       steps=calibration_steps if calibrate else 0)
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


def probe_feature_file(ds, *, seconds: float = 1.5, windows: int = 5, batch_blocks: int = 8192,
                       seq_bytes: int = 256 << 20, seq_reads: int = 3, engine=None) -> dict:
    """SSD figures measured on the dataset's own feature file: 4 KiB random-read IOPS at the queue depth
    of one batch's request (``batch_blocks`` blocks per ``pread_many``), the kernel's CPU per block, and
    sequential read bandwidth. The page cache is dropped first; reads are O_DIRECT when the file system
    allows it.

    A cloud disk's rate moves from second to second (a one-second probe once read a ninth of the rate the
    epoch after it sustained), so the random reads are timed in ``windows`` windows over ``seconds`` and the
    sequential reads ``seq_reads`` times at different offsets; each figure is the median, and the windows'
    own figures are returned beside it. Dirty pages are written back first (``os.sync``): a dataset just
    written would otherwise share the disk with its own write-back."""
    from terastack import io

    blocks_in_file = ds.feature_bytes // BLOCK
    if blocks_in_file < 1:
        raise ValueError(f"{ds.features_path}: too small to measure (under one 4 KiB block)")
    if windows < 1 or seq_reads < 1:
        raise ValueError(f"windows and seq_reads must be at least 1 (got {windows}, {seq_reads})")
    os.sync()
    rng = np.random.default_rng(0)
    with io.open(ds.features_path, "r", direct="auto", engine=engine) as f:
        f.drop_cache()
        n = int(min(batch_blocks, blocks_in_file))
        iops, cpu_per_block = _random_read_windows(f, blocks_in_file, n, rng, window_seconds=seconds / windows,
                                                   windows=windows)
        length = int(min(seq_bytes, blocks_in_file * BLOCK))
        seq = io.aligned_empty(length)
        bandwidth = []
        span = blocks_in_file * BLOCK - length  # offsets spread over the file, block-aligned
        for k in range(seq_reads):
            f.drop_cache()
            offset = (span * k // max(seq_reads - 1, 1)) // BLOCK * BLOCK
            t0 = time.perf_counter()
            f.read(seq, offset, length, timeout=300)
            bandwidth.append(length / (time.perf_counter() - t0))
        direct = f.direct
    return {"ssd_rand4k_iops": float(np.median(iops)), "ssd_read_bytes_per_s": float(np.median(bandwidth)),
            "direct": direct, "io_cpu_seconds_per_block": float(np.median(cpu_per_block)),
            "windows": {"ssd_rand4k_iops": iops, "io_cpu_seconds_per_block": cpu_per_block,
                        "ssd_read_bytes_per_s": bandwidth}}


def feature_file_hardware(ssd: dict, *, iops: float | None = None, where: str = "the feature file",
                          engine=None, extent_blocks: int = 1) -> Hardware:
    """This machine's SSD as the TPC model takes it from a measurement on a feature file (``ssd``: a result of
    :func:`probe_feature_file`; ``iops``: its 4 KiB random-read rate measured elsewhere, e.g. beside the training
    steps): the random reads at one block, the gather's request for rows up to a block, at the storage engine's
    queue depth, where the gather reads them (terastack.plan.read_rates [Note: random reads at the gather's own
    request size]); reads only, as the epoch's gather (the cache is static). ``extent_blocks`` > 1: ``iops`` are
    blocks a second read in extents of that many (:func:`probe_while_training`), a wide row's request."""
    from terastack import io

    k = extent_blocks
    rate = ssd["ssd_rand4k_iops"] if iops is None else iops
    depth = (engine or io.get_engine()).config.queue_depth
    return Hardware(name=f"this machine ({k * BLOCK // 1024} KiB random reads of {where})", measured=True,
                    cores=os.cpu_count() or 1, ssd_read_bytes_per_s=ssd["ssd_read_bytes_per_s"],
                    ssd_rand4k_iops=rate if k == 1 else ssd["ssd_rand4k_iops"],
                    ssd_random_reads=[{"request_bytes": k * BLOCK, "queue_depth": depth, "reads_per_s": rate / k}]
                    if rate > 0 else [])


def _random_read_windows(f, blocks_in_file: int, n: int, rng, *, window_seconds: float, windows: int | None,
                         stop: threading.Event | None = None, period: float = 0.0,
                         extent_blocks: int = 1) -> tuple[list, list]:
    """4 KiB random reads of ``n`` blocks per ``pread_many``, one after another (or, with ``period`` > 0, one
    request every ``period`` seconds at most, as an epoch's batches ask), timed in windows of ``window_seconds``:
    each window's reads per second and kernel CPU per block. ``windows`` windows, or (None) until ``stop`` is
    set; a window ``stop`` cuts short is dropped unless no window was complete. ``extent_blocks`` > 1: the ``n``
    blocks are read as extents of that many consecutive blocks (a wide row's covering blocks, as the gather reads
    them); the rate is still blocks a second."""
    from terastack import io

    buf = io.aligned_empty(n * BLOCK)
    iops, cpu_per_block, partial = [], [], None
    due = start = time.perf_counter()  # paced: when the next request may go; the first window's start
    while windows is None or len(iops) < windows:
        done, sys_cpu = 0, 0.0
        while time.perf_counter() - start < window_seconds or done == 0:
            if stop is not None and stop.is_set() and (done or iops):
                break
            wait = due - time.perf_counter()
            if wait > 0 and (stop.wait(wait) if stop is not None else time.sleep(wait)) and (done or iops):
                break  # stopped while waiting for the request's turn
            issued, before = time.perf_counter(), os.times().system
            if extent_blocks == 1:
                blocks = np.sort(rng.choice(blocks_in_file, n, replace=False))
                f.pread_many(buf, blocks * BLOCK, BLOCK).result(timeout=120)
            else:
                k = extent_blocks
                starts = np.sort(rng.choice(blocks_in_file - k + 1, max(1, min(n // k, blocks_in_file - k + 1)),
                                            replace=False))
                f.pread_many(buf, starts * BLOCK, k * BLOCK, np.arange(len(starts)) * (k * BLOCK)).result(timeout=120)
            sys_cpu += os.times().system - before  # the kernel's share of each read, charged to this process
            done += n if extent_blocks == 1 else len(starts) * extent_blocks
            due = max(due, issued) + period  # a late request moves the next one's turn, as a late batch does
        if not done:
            break  # stopped before this window's first request
        # paced, a window runs to its last request's slot end (the next one's turn), so it counts whole slots
        end = max(time.perf_counter(), due)
        rate = (done / (end - start), sys_cpu / done)
        start = end
        if stop is not None and stop.is_set():
            partial = rate
            break
        iops.append(rate[0])
        cpu_per_block.append(rate[1])
    if not iops and partial is not None:
        iops, cpu_per_block = [partial[0]], [partial[1]]
    return iops, cpu_per_block


def training_steps(model_kind: str, examples: list, ds, *, hidden: int, layers: int, seed: int = 0):
    """``train_once(k)``: the calibration's k-th training step (the model of ``ds``'s kind and the sampled
    ``examples``, e.g. a pre-sampling's, with random features); returns the nodes (of every type) it trained on.
    The first call also warms the model up."""
    return _stepper(*_calibration_batches(model_kind, examples, ds, hidden=hidden, layers=layers, seed=seed))


def probe_while_training(features, train_once, *, seconds: float = 8.0, window_seconds: float = 1.0,
                         min_steps: int = 5, batch_blocks: int = 8192, rate: float | None = None, seed: int = 0,
                         engine=None, extent_blocks: int = 1) -> dict:
    """The SSD's 4 KiB random-read rate while the training step runs, and the step's time while the SSD reads.

    [Note: the SSD and the step measured under each other's load]
    On the 2-core development VM the disk serves fewer reads while the cores compute (idle ~100k reads/s, one
    busy process ~78k, two ~58k, the kernel's CPU per block unchanged), and the step is slower while the disk
    reads (SSD traffic slows the CPU's matmuls). An epoch does both at once, so the TPC model's SSD rate and
    step time measured apart, on idle cores and a quiet disk, were both too fast for it: +22.6% and +14.7% at
    the 48M-node scale run. Here a thread reads random blocks of the feature file, one batch's request after
    another as the gather does, in windows of ``window_seconds``, while this thread calls ``train_once(k)``
    (k = 0, 1, ...: the calibration's steps, e.g. :func:`training_steps`, on the torch threads the run trains
    with; it returns the nodes it trained on) for at least ``seconds`` and ``min_steps`` steps after one
    warm-up step. ``features``: the file (``features_path``, ``feature_bytes``). Returned: the windows' median
    reads per second, the steps' median seconds per node, and both lists. The kernel's CPU per block is not
    separable here (the training's system time counts too): take it from :func:`probe_feature_file`.

    ``rate`` (blocks a second): read no faster, one request of ``batch_blocks`` every ``batch_blocks / rate``
    seconds, as an epoch that reads at that rate does (0, or ``batch_blocks`` 0: no reads, the step alone);
    None reads as fast as the disk serves. The reads per second returned are then the rate the disk kept.
    ``extent_blocks``: the blocks are read as extents of that many (a wide row's, see :func:`_random_read_windows`);
    the rate is blocks a second either way."""
    from terastack import io

    blocks_in_file = features.feature_bytes // BLOCK
    if blocks_in_file < 1:
        raise ValueError(f"{features.features_path}: too small to measure (under one 4 KiB block)")
    if extent_blocks < 1 or extent_blocks > blocks_in_file:
        raise ValueError(f"extent_blocks: must be in 1..{blocks_in_file} (the file's blocks), got {extent_blocks}")
    if seconds <= 0 or window_seconds <= 0 or min_steps < 1 or batch_blocks < 0 or (rate is not None and rate < 0):
        raise ValueError(f"seconds, window_seconds, min_steps, batch_blocks, rate: must be > 0, > 0, >= 1, >= 0, "
                         f">= 0 (got {seconds}, {window_seconds}, {min_steps}, {batch_blocks}, {rate})")
    n = int(min(batch_blocks, blocks_in_file))
    idle = n == 0 or rate == 0
    period = 0.0 if rate is None or idle else n / rate
    window_seconds = max(window_seconds, 2 * period)  # a window spans requests, not the gap before one
    train_once(0)  # warm-up (allocator, lazy init), before the reads start
    os.sync()
    rng = np.random.default_rng(seed)
    reading, stop, out = threading.Event(), threading.Event(), {}

    def read() -> None:
        try:
            if idle:
                out["iops"] = [0.0]
                return
            with io.open(features.features_path, "r", direct="auto", engine=engine) as f:
                f.drop_cache()
                reading.set()
                out["iops"], _ = _random_read_windows(f, blocks_in_file, n, rng, window_seconds=window_seconds,
                                                      windows=None, stop=stop, period=period,
                                                      extent_blocks=extent_blocks)
        except BaseException as exc:  # noqa: BLE001 -- handed to the training thread, which raises it
            out["error"] = exc
        finally:
            reading.set()

    reader = threading.Thread(target=read, name="terastack-probe-reads", daemon=True)
    reader.start()
    reading.wait()
    started = time.perf_counter()
    try:
        per_node = _timed_steps(train_once, min_steps=min_steps, seconds=seconds, going=lambda: "error" not in out)
    finally:
        stop.set()
        reader.join()
    if "error" in out:
        raise out["error"]
    return {"ssd_rand4k_iops": float(np.median(out["iops"])), "compute_seconds_per_node": float(np.median(per_node)),
            "steps": len(per_node), "seconds": time.perf_counter() - started, "rate_limit": rate,
            "request_blocks": n, "windows": {"ssd_rand4k_iops": out["iops"], "compute_seconds_per_node": per_node}}


def measure_under_epoch_load(features, train_once, predict, *, seconds: float = 8.0, rounds: int = 2,
                             busy: float = 0.9, seed: int = 0, engine=None, **probe) -> dict:
    """The TPC model's SSD rate and training step, measured under the load the predicted epoch puts on the
    machine.

    [Note: the step measured beside the epoch's own read rate]
    The step is slower while the disk reads, by how much depends on how fast it reads: beside reads at the
    disk's full rate a 3-6 s heterogeneous step took 6.4 s, while its epoch, reading far less, ran at 3.5 s a
    batch. So the load is the epoch's own: first the disk's full rate while the steps run (the SSD figure the
    model takes, and a first step); then ``predict(ssd_rand4k_iops, compute_seconds_per_node)`` (a
    :class:`terastack.plan.tpc.Prediction`) gives the epoch's read rate and each batch's request, and the steps
    are timed again beside reads at that rate, one request a predicted batch, for up to ``rounds`` rounds (each
    prediction from the last round's step). An epoch predicted to keep the disk at least ``busy`` of its rate is
    measured at the full rate. ``probe``: further arguments of :func:`probe_while_training`. Returned: the SSD
    rate, the step, each round's figures, and the last prediction."""
    full = probe_while_training(features, train_once, seconds=seconds, seed=seed, engine=engine, **probe)
    iops, per_node, measured = full["ssd_rand4k_iops"], full["compute_seconds_per_node"], []
    prediction = predict(iops, per_node)
    for k in range(rounds):
        read_rate = prediction.ssd_bytes_per_epoch / BLOCK / max(prediction.epoch_seconds, 1e-12)
        if read_rate >= busy * iops:
            break
        request = int(round(read_rate * prediction.batch_seconds))
        at_rate = probe_while_training(features, train_once, seconds=seconds, seed=seed + k + 1, engine=engine,
                                       **{**probe, "rate": read_rate, "batch_blocks": request})
        measured.append(at_rate)
        per_node = at_rate["compute_seconds_per_node"]
        prediction = predict(iops, per_node)
    return {"ssd_rand4k_iops": iops, "compute_seconds_per_node": per_node, "full_rate": full, "at_epoch_rate": measured,
            "prediction": prediction}


def predict_under_load(wl: GnnWorkload, ssd: dict, features, train_once, *, rows: float, host_cache: int,
                       seconds: float, seed: int, where: str, engine=None, **predict):
    """(the predicted epoch, the measurements) of ``wl`` with the SSD's rate and the step (``train_once``, scaled
    to ``rows`` nodes a batch) measured under the epoch's own load ([Note: the step measured beside the epoch's
    own read rate]); ``predict``: more arguments of :func:`terastack.plan.tpc.predict_epoch`."""
    import dataclasses

    from terastack.plan.tpc import predict_epoch

    extent = max(1, round(wl.blocks_per_miss))  # blocks a missed row's read spans: the gather's request

    def prediction(iops: float, seconds_per_node: float):
        here = feature_file_hardware(ssd, iops=iops, where=where, engine=engine, extent_blocks=extent)
        return predict_epoch(dataclasses.replace(wl, compute_seconds=seconds_per_node * rows), here, device_cache=0,
                             host_cache=host_cache, train_threads=wl.compute_threads, **predict)

    loaded = measure_under_epoch_load(features, train_once, prediction, seconds=seconds, seed=seed,
                                      extent_blocks=extent, engine=engine)
    loaded["compute_seconds_per_batch"] = loaded["compute_seconds_per_node"] * rows
    return loaded.pop("prediction"), loaded


# ------------------------------------------------------------------ a sample of the epoch, the cache in place
#: added to the training seed for the hold-out sampling pass (differs from the pre-sampling pass's offset)
HOLDOUT_SEED_OFFSET = 104_729


def sample_seed_sets(train_ids: np.ndarray, presample_nodes: int, holdout_nodes: int, *, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random samples of the training seeds (sorted): the pre-sampling set the caches are placed
    from, and the hold-out set the model's inputs are measured on. When the training set is too small for
    both, the hold-out set is what the first leaves (or, with nothing left, the whole training set)."""
    order = np.random.default_rng([seed, HOLDOUT_SEED_OFFSET]).permutation(len(train_ids))
    first = np.sort(train_ids[order[:presample_nodes]])
    rest = order[presample_nodes:presample_nodes + holdout_nodes]
    return first, np.sort(train_ids[rest] if len(rest) else train_ids)


def profile_sampling(sampler, seeds: np.ndarray, batch_size: int, *, seed: int) -> dict:
    """Sample the batches of ``seeds`` with the topology's list cache in place: per batch, the sampler's own
    CPU time (``time.thread_time``: without the waits for its reads), the 4 KiB blocks its topology read,
    and the rows each node type gathers; plus every gathered id per node type, to
    score a cache ranking out of sample (:func:`out_of_sample_curve`)."""
    from terastack.gnn.sampling.sampler import epoch_batches

    topo = sampler.topology
    before = topo.stats.snapshot()
    cpu, batches, ids = 0.0, 0, {}
    for k, chunk in enumerate(epoch_batches(seeds, batch_size, seed=seed + HOLDOUT_SEED_OFFSET, epoch=0)):
        t0 = time.thread_time()
        batch = sampler.sample(chunk, np.random.default_rng([seed + HOLDOUT_SEED_OFFSET, k]))
        cpu += time.thread_time() - t0
        batches += 1
        for t, v in batch.nodes.items():
            ids.setdefault(t, []).append(v)
    after = topo.stats.snapshot()
    b = max(batches, 1)
    per_batch = ids
    ids = {t: np.concatenate(v) for t, v in ids.items()}
    return {"batches": batches, "ids_per_batch": per_batch, "sample_cpu_seconds_per_batch": cpu / b,
            "topology_blocks_per_batch": (after["ssd_blocks"] - before["ssd_blocks"]) / b,
            "topology_bytes_per_batch": (after["ssd_bytes"] - before["ssd_bytes"]) / b,
            "topology_hit_rate": (after["hits"] - before["hits"]) / max(after["lookups"] - before["lookups"], 1),
            "rows_per_batch": {t: len(v) / b for t, v in ids.items()}, "ids": ids}


def out_of_sample_curve(rank_of: np.ndarray, accessed: np.ndarray, points: int = 513
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(rows cached, fraction of ``accessed`` they serve) for a cache of the top-ranked rows, where
    ``rank_of[v]`` is node v's place in the ranking and ``accessed`` ids gathered by batches the ranking was
    not made from (terastack.gnn.storage.hotness [Note: hotness ranking and its hit-rate curve])."""
    ranks = np.sort(rank_of[accessed])
    ks = np.unique(np.linspace(0, len(rank_of), points).astype(np.int64))
    return ks, np.searchsorted(ranks, ks, side="left") / max(len(ranks), 1)


def rank_positions(ranking: np.ndarray, num_nodes: int, *, step: int = 1 << 22) -> np.ndarray:
    """``out[ranking[i]] = i``: each node's place in a ranking (int32 below 2^31 nodes), filled in pieces so
    that no int64 temporary of the whole graph is made."""
    out = np.empty(num_nodes, np.int32 if num_nodes < 2**31 else np.int64)
    for lo in range(0, len(ranking), step):
        out[ranking[lo:lo + step]] = np.arange(lo, min(len(ranking), lo + step), dtype=out.dtype)
    return out


def miss_blocks(rank_of: np.ndarray, batches: list, cached_rows: int, row_bytes: int) -> tuple[int, int, int]:
    """(rows gathered, rows missed, 4 KiB blocks read for the misses) over sampled ``batches`` (arrays of ids)
    for a cache of the ``cached_rows`` top-ranked rows: misses of one batch that share a block read it once
    (one request per batch, terastack.gnn.storage.rows [Note: row reads are block reads])."""
    from terastack.gnn.storage.rows import covering_blocks

    rows = missed = blocks = 0
    for ids in batches:
        miss = ids[rank_of[ids] >= cached_rows]
        rows, missed = rows + len(ids), missed + len(miss)
        blocks += len(covering_blocks(miss, row_bytes)) if len(miss) else 0
    return rows, missed, blocks
