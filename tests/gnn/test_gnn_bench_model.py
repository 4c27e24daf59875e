"""The benchmarks' measuring parts against references: the TPC model's topology term, the out-of-sample curve,
blocks read per missed row, seed samples, the same-batches window, and contenders in child processes."""
from __future__ import annotations

import time

import numpy as np
import pytest

from terastack.constants import BLOCK
from terastack.gnn.advise import miss_blocks, out_of_sample_curve, rank_positions, sample_seed_sets
from terastack.gnn.bench.workers import Contender, measure_window, window_seconds
from terastack.plan.hardware import Hardware
from terastack.plan.tpc import GnnWorkload, predict_epoch


def _workload(**extra) -> GnnWorkload:
    return GnnWorkload(num_nodes=1000, row_bytes=512, feature_bytes=512_000, batches_per_epoch=10, nodes_per_batch=100,
                       curve_rows=[0, 1000], curve_hits=[0.0, 1.0], blocks_per_miss=1.0, sample_seconds=0.01,
                       compute_seconds=0.02, compute_threads=1, io_cpu_seconds_per_block=1e-5, **extra)


def test_topology_term_lengthens_sampling_and_loads_the_ssd():
    hw = Hardware(name="t", measured=True, cores=2, ssd_read_bytes_per_s=1e9, ssd_rand4k_iops=50_000)
    base = predict_epoch(_workload(), hw, device_cache=0, host_cache=0, train_threads=1)
    blocks = 300.0
    topo = predict_epoch(_workload(topology_blocks_per_batch=blocks), hw, device_cache=0, host_cache=0,
                         train_threads=1)
    rate = min(1e9, 50_000 * BLOCK)  # random 4 KiB reads: the IOPS bound
    # the hop reads wait behind the gather's read of the batch's 100 missed rows (1 block each) as well as for their
    # own (tpc [Note: the epoch-time model])
    wait = (blocks + 100) * BLOCK / rate
    assert topo.stages["sample"] == pytest.approx(base.stages["sample"] + wait + blocks * 1e-5)
    assert topo.stages["ssd"] == pytest.approx(base.stages["ssd"] + blocks * BLOCK / rate)
    assert topo.ssd_bytes_per_epoch == pytest.approx(base.ssd_bytes_per_epoch + 10 * blocks * BLOCK)
    with pytest.raises(ValueError, match="topology_blocks_per_batch"):
        _workload(topology_blocks_per_batch=-1)


def test_sampler_threads_overlap_their_waits_but_not_their_work_nor_the_disk():
    hw = Hardware(name="t", measured=True, cores=2, ssd_read_bytes_per_s=1e9, ssd_rand4k_iops=50_000)
    rate = 50_000 * BLOCK
    w = _workload(topology_blocks_per_batch=1000.0)  # 100 feature blocks a batch (nothing cached), 1000 list blocks
    cpu = 0.01 + 1000 * 1e-5
    ssd = 1100 * BLOCK / rate
    wait = ssd  # the hop reads wait behind the gather's 100 blocks as well as for their own
    one, two, many = (predict_epoch(w, hw, device_cache=0, host_cache=0, train_threads=1, samplers=s)
                      for s in (1, 2, 64))
    assert one.stages["sample"] == pytest.approx(cpu + wait) and one.bottleneck == "sample"
    assert one.batch_seconds == pytest.approx(cpu + wait)
    assert two.stages["sample"] == pytest.approx((cpu + wait) / 2)
    assert two.batch_seconds == pytest.approx(max((cpu + wait) / 2, ssd, 0.02, cpu + 1e-5 * 100 + 2e-7 * 200))
    assert many.stages["sample"] == pytest.approx(cpu)  # the work does not divide
    assert many.batch_seconds == pytest.approx(ssd) and many.bottleneck == "ssd"  # nor does the disk
    in_memory = predict_epoch(_workload(), hw, device_cache=0, host_cache=0, train_threads=1, samplers=3)
    assert in_memory.stages["sample"] == pytest.approx(0.01)  # nothing to wait for
    with pytest.raises(ValueError, match="samplers"):
        predict_epoch(w, hw, device_cache=0, host_cache=0, samplers=0)


def test_out_of_sample_curve_and_miss_blocks_match_brute_force():
    rng = np.random.default_rng(0)
    n = 500
    ranking = rng.permutation(n)
    pos = rank_positions(ranking, n)
    assert (pos[ranking] == np.arange(n)).all() and pos.dtype == np.int32
    batches = [rng.integers(0, n, 60) for _ in range(5)]
    accessed = np.concatenate(batches)
    ks, hits = out_of_sample_curve(pos, accessed, points=11)
    for k, h in zip(ks, hits):
        assert h == pytest.approx(np.isin(accessed, ranking[:k]).mean())
    row_bytes, cached = 1000, 123
    rows, missed, blocks = miss_blocks(pos, batches, cached, row_bytes)
    expected = 0
    for b in batches:
        miss = b[~np.isin(b, ranking[:cached])]
        expected += len({blk for r in miss for blk in range(r * row_bytes // BLOCK, ((r + 1) * row_bytes - 1) // BLOCK + 1)})
    assert rows == len(accessed) and missed == int((~np.isin(accessed, ranking[:cached])).sum()) and blocks == expected


def test_seed_samples_are_disjoint_and_fall_back_when_the_set_is_small():
    train = np.arange(100, 300, 2)
    a, b = sample_seed_sets(train, 30, 20, seed=1)
    assert len(a) == 30 and len(b) == 20 and not np.intersect1d(a, b).size
    assert np.isin(a, train).all() and np.isin(b, train).all() and (np.diff(a) > 0).all()
    a, b = sample_seed_sets(train, 1000, 20, seed=1)  # nothing left: the hold-out is the whole set
    assert len(a) == 100 and (b == train).all()


def test_window_compares_the_same_batches():
    marks = [1.0, 2.0, 4.0, 7.0, 11.0]
    assert window_seconds(marks, 0, 2) == 2.0 and window_seconds(marks, 2, 3) == 9.0
    with pytest.raises(ValueError, match="window"):
        window_seconds(marks, 5, 1)
    assert measure_window(100, 32, 64) == (32, 64)
    assert measure_window(10, 32, 64) == (5, 5)  # a short epoch: half warms up, the rest is measured
    assert measure_window(1, 32, 64) == (0, 1)


def test_contender_answers_reports_errors_and_is_stopped_by_its_watchdog():
    with Contender("dict", "builtins:dict", {"a": 1}, rss_limit=1 << 40) as c:
        assert c.call("copy")["a"] == 1 and c.call("copy")["peak_rss_bytes"] > 0
        with pytest.raises(RuntimeError, match=r"(?s)contender .dict. failed while missing.*AttributeError"):
            c.call("missing")
    # 1 MiB: the interpreter alone is more; the watchdog's first look may come before the contender has answered
    # that it is set up, or after (then the next call finds it gone)
    with pytest.raises(RuntimeError, match=r"(?s)contender .small..*exit code 3.*--rss-limit"):
        with Contender("small", "builtins:dict", {}, rss_limit=1 << 20) as c:
            time.sleep(1.0)
            c.call("copy")
