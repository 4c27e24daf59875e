"""The TPC model: epoch-time arithmetic against hand-computed values, bottlenecks, the price table, ranking."""
from __future__ import annotations

import numpy as np
import pytest

from terastack.plan.hardware import Hardware
from terastack.plan.tpc import DEFAULT_PRICES, GnnWorkload, PriceTable, advise, blocks_per_miss, predict_epoch

GIB = 1 << 30


def workload(**changes) -> GnnWorkload:
    # 1M nodes of 512 bytes; a cache of k rows serves min(1, k / 500k) of the accesses (linear curve)
    fields = dict(num_nodes=1_000_000, row_bytes=512, feature_bytes=512_000_000, batches_per_epoch=100,
                  nodes_per_batch=10_000, curve_rows=[0, 500_000, 1_000_000], curve_hits=[0.0, 1.0, 1.0],
                  blocks_per_miss=1.0, sample_seconds=0.002, compute_seconds=0.020, flops_per_batch=2e9,
                  gather_seconds_per_row=1e-7, miss_cpu_seconds_per_row=2e-7)
    fields.update(changes)
    return GnnWorkload(**fields)


def cpu_box(**changes) -> Hardware:
    fields = dict(name="box", cores=2, cpu_flops=5e10, ssd_read_bytes_per_s=2e9, ssd_rand4k_iops=100_000)
    fields.update(changes)
    return Hardware(**fields)


def test_cpu_epoch_matches_hand_computation():
    w = workload()
    table = 1_000_000 * 4
    # host cache of 250k rows -> hit rate 0.5
    p = predict_epoch(w, cpu_box(), device_cache=0, host_cache=table + 250_000 * 512)
    assert p.hit_rate == pytest.approx(0.5)
    misses = 0.5 * 10_000
    ssd = misses * 4096 / min(2e9, 100_000 * 4096)  # IOPS-bound: 0.05 s
    gather = 10_000 * 1e-7 + misses * 2e-7          # 0.002 s
    cpu = 0.002 + gather + 0.020
    assert p.stages == pytest.approx({"sample": 0.002, "gather": gather, "compute": 0.020, "ssd": ssd})
    assert p.bottleneck == "ssd" and p.batch_seconds == pytest.approx(ssd)
    assert p.epoch_seconds == pytest.approx(100 * ssd + 0.002 + gather + ssd)
    # a bigger cache: the CPU (compute) becomes the bottleneck; the epoch never gets slower with more cache
    q = predict_epoch(w, cpu_box(), device_cache=0, host_cache=table + 480_000 * 512)
    assert q.bottleneck == "compute" and q.epoch_seconds < p.epoch_seconds
    assert q.batch_seconds == pytest.approx(0.002 + 10_000 * 1e-7 + 0.04 * 10_000 * 2e-7 + 0.020)
    assert cpu > 0
    # the kernel's CPU time per block read is CPU the training step does not get
    with_io = predict_epoch(workload(io_cpu_seconds_per_block=4e-6), cpu_box(), device_cache=0,
                            host_cache=table + 480_000 * 512)
    assert with_io.stages["gather"] == pytest.approx(q.stages["gather"] + 0.04 * 10_000 * 4e-6)


def test_cpu_stages_overlap_only_when_training_leaves_cores_free():
    table = 1_000_000 * 4
    cache = dict(device_cache=0, host_cache=table + 480_000 * 512)  # hit rate 0.96: the CPU, not the SSD, bounds
    gather = 10_000 * 1e-7 + 0.04 * 10_000 * 2e-7                    # 0.00108 s
    all_cores = predict_epoch(workload(), cpu_box(cores=2), **cache)
    assert all_cores.batch_seconds == pytest.approx(0.002 + gather + 0.020)
    # one training thread on two cores: sampling and gathering run on the other core, hidden behind the step
    one_thread = predict_epoch(workload(), cpu_box(cores=2), train_threads=1, **cache)
    assert one_thread.batch_seconds == pytest.approx(0.020) and one_thread.bottleneck == "compute"
    # ... unless they outlast it: then the free core is the bound
    slow_sampler = predict_epoch(workload(sample_seconds=0.030), cpu_box(cores=2), train_threads=1, **cache)
    assert slow_sampler.batch_seconds == pytest.approx(0.030 + gather)
    # the kernel's work per block read runs in the storage engine's threads, on whichever core is idle: the free
    # core carries the interpreter's share, and all of it is bounded by the CPU work over both cores
    io_bound = workload(sample_seconds=0.004, io_cpu_seconds_per_block=2e-5, topology_blocks_per_batch=500)
    spread = predict_epoch(io_bound, cpu_box(cores=2), train_threads=1, samplers=2, **cache)
    sample_cpu = 0.004 + 500 * 2e-5                        # 0.014 s
    gather_io = gather + 0.04 * 10_000 * 2e-5              # 0.00908 s
    kernel = (500 + 0.04 * 10_000) * 2e-5                  # 0.018 s of it is the kernel's
    assert sample_cpu + gather_io - kernel < 0.020 < (0.020 + sample_cpu + gather_io) / 2 < sample_cpu + gather_io
    assert spread.batch_seconds == pytest.approx((0.020 + sample_cpu + gather_io) / 2)
    # three of four cores training: the same overlap
    four = predict_epoch(workload(), cpu_box(cores=4), train_threads=3, **cache)
    assert four.batch_seconds == pytest.approx(0.020)
    # a thread count at or above the cores means every core trains
    assert predict_epoch(workload(), cpu_box(cores=2), train_threads=8, **cache).batch_seconds == pytest.approx(
        all_cores.batch_seconds)
    with pytest.raises(ValueError, match="train_threads"):
        predict_epoch(workload(), cpu_box(), train_threads=-1, **cache)


def test_gpu_epoch_overlaps_stages():
    w = workload()
    gpu = cpu_box(gpu_flops=1e14, gpu_memory_bytes=24 * GIB, pcie_bytes_per_s=2.5e10)
    p = predict_epoch(w, gpu, device_cache=100_000 * 512, host_cache=1_000_000 * 4 + 400_000 * 512,
                      gpu_efficiency=0.1)
    assert p.device_hit_rate == pytest.approx(0.2) and p.hit_rate == pytest.approx(1.0)
    assert p.stages["compute"] == pytest.approx(2e9 / 1e13)
    assert p.stages["pcie"] == pytest.approx(0.8 * 10_000 * 512 / 2.5e10)
    assert p.stages["ssd"] == 0
    assert p.batch_seconds == pytest.approx(max(p.stages.values()))
    with pytest.raises(ValueError, match="flops_per_batch"):
        predict_epoch(workload(flops_per_batch=0), gpu, device_cache=0, host_cache=0)


def test_more_ssds_help_only_when_ssd_bound():
    w = workload()
    small = dict(device_cache=0, host_cache=0)
    one, two = (predict_epoch(w, cpu_box(ssds=k), **small) for k in (1, 2))
    assert one.bottleneck == "ssd" and two.epoch_seconds < one.epoch_seconds
    big = dict(device_cache=0, host_cache=4_000_000 + 500_000 * 512)
    assert predict_epoch(w, cpu_box(ssds=1), **big).epoch_seconds == pytest.approx(
        predict_epoch(w, cpu_box(ssds=4), **big).epoch_seconds)


def test_blocks_per_miss_matches_brute_force():
    for row_bytes in (64, 400, 512, 4096, 4400, 12):
        n = 4096 * 3
        starts = np.arange(n) * row_bytes
        spans = (starts + row_bytes - 1) // 4096 - starts // 4096 + 1
        assert blocks_per_miss(row_bytes) == pytest.approx(spans.mean()), row_bytes


def test_shipped_price_table_is_valid():
    prices = PriceTable.load()
    assert prices.source == str(DEFAULT_PRICES)
    assert prices.lifetime_years > 0 and prices.memory["options_gib"]
    assert any(g["flops"] == 0 for g in prices.gpus) and any(g["flops"] > 0 for g in prices.gpus)
    assert prices.gpu("RTX 4090")["memory_gib"] == 24


@pytest.mark.parametrize("text, message", [
    ("lifetime_years = 3\n", "section \\[base\\] is missing"),
    (DEFAULT_PRICES.read_text().replace("usd_per_gib = 2.5", "usd_per_gib = -1"), "memory.usd_per_gib"),
    (DEFAULT_PRICES.read_text().replace('usd = 1800.0', 'usd = "cheap"'), "gpu\\[1\\].usd"),
    ("this is = not toml [", "not valid TOML"),
])
def test_bad_price_table_names_the_field(tmp_path, text, message):
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        PriceTable.load(path)


def test_advise_ranks_by_epochs_per_dollar(tmp_path):
    prices = PriceTable.load()
    probe = cpu_box(memcpy_bytes_per_s=1e10)
    result = advise(workload(), probe, prices, ssd_counts=(1, 2), memory_gib=[64, 256], gpus=["none", "RTX 4090"])
    cands = result["candidates"]
    assert len(cands) == 8
    values = [c["epochs_per_usd"] for c in cands]
    assert values == sorted(values, reverse=True) and result["best"] == cands[0]
    for c in cands:  # epochs over the lifetime per dollar of purchase + energy
        hours = prices.lifetime_years * 365.25 * 24
        assert c["epochs_per_usd"] == pytest.approx(hours * 3600 / c["epoch_seconds"] / c["cost_usd"])
        assert c["cost_usd"] == pytest.approx(c["capex_usd"] + c["energy_usd"])
    with pytest.raises(ValueError, match="ssds"):
        advise(workload(), probe, prices, ssd_counts=(0,))
    with pytest.raises(ValueError, match="gpus"):
        advise(workload(), probe, prices, gpus=["no such card"])


def test_workload_validation():
    with pytest.raises(ValueError, match="curve_rows"):
        workload(curve_rows=[0], curve_hits=[0.0])
    with pytest.raises(ValueError, match="batches_per_epoch"):
        workload(batches_per_epoch=0)


def test_cpu_stages_add_up_whatever_the_thread_count():
    w = workload(compute_seconds=0.030, sample_seconds=0.010)
    big = dict(device_cache=0, host_cache=4_000_000 + 500_000 * 512)  # everything cached: no SSD
    p = predict_epoch(w, cpu_box(cores=2), **big)
    assert p.batch_seconds == pytest.approx(0.030 + 0.010 + 10_000 * 1e-7) and p.bottleneck == "compute"
    w2 = workload(compute_seconds=0.030, sample_seconds=0.045)
    assert predict_epoch(w2, cpu_box(cores=2), **big).bottleneck == "sample"
