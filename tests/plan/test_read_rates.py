"""The TPC model's SSD rate at the gather's own request size: a described disk's random-read figures, the fallback
to the older pricing without them, and the figure's source in the prediction's output."""
from __future__ import annotations

import json

import pytest

from terastack import probe
from terastack.plan.hardware import Hardware, aggregate_ssd, load_probe, save_probe
from terastack.plan.read_rates import random_read_rate
from terastack.plan.tpc import DEFAULT_PRICES, GnnWorkload, PriceTable, advise, predict_epoch

#: a described disk: sequential 2 GB/s, 4 KiB random at 100k reads/s, and (at queue depth 128) random reads of
#: 4 KiB at 60k/s and of 16 KiB at 40k/s: the rates a disk whose day is slow gives the gather's own pattern
FIGURES = [{"request_bytes": 4096, "queue_depth": 128, "reads_per_s": 60_000.0},
           {"request_bytes": 16384, "queue_depth": 128, "reads_per_s": 40_000.0}]


def disk(**changes) -> Hardware:
    fields = dict(name="described disk", cores=2, cpu_flops=5e10, ssd_read_bytes_per_s=2e9, ssd_rand4k_iops=100_000,
                  ssd_random_reads=FIGURES)
    fields.update(changes)
    return Hardware(**fields)


def workload(**changes) -> GnnWorkload:
    # 1M rows; nothing cached (hit rate 0), so every one of a batch's 10k rows is read from the SSD
    fields = dict(num_nodes=1_000_000, row_bytes=512, feature_bytes=512_000_000, batches_per_epoch=10,
                  nodes_per_batch=10_000, curve_rows=[0, 1_000_000], curve_hits=[0.0, 1.0], blocks_per_miss=1.0,
                  sample_seconds=0.001, compute_seconds=0.001, gather_seconds_per_row=0.0,
                  miss_cpu_seconds_per_row=0.0)
    fields.update(changes)
    return GnnWorkload(**fields)


def test_rows_of_one_block_are_priced_at_the_random_read_figure_of_one_block():
    p = predict_epoch(workload(), disk(), device_cache=0, host_cache=0, queue_depth=128)
    # 10k one-block reads at 60k reads/s, not at min(2 GB/s, 100k x 4 KiB) (0.1 s)
    assert p.stages["ssd"] == pytest.approx(10_000 / 60_000)
    assert p.bottleneck == "ssd" and p.ssd_rate.measured_at_request_size
    assert "random reads of 4.0 KiB at queue depth 128" in p.ssd_rate_source


def test_wider_rows_are_priced_at_their_extent_between_measured_sizes():
    # rows of 10 KiB: on average 3.25 blocks each (13 KiB extents), between the 4 and 16 KiB figures
    w = workload(row_bytes=10240, feature_bytes=10_240_000_000, blocks_per_miss=3.25)
    p = predict_epoch(w, disk(), device_cache=0, host_cache=0)
    per_read = 1 / 60_000 + (1 / 40_000 - 1 / 60_000) * (13312 - 4096) / (16384 - 4096)
    assert p.stages["ssd"] == pytest.approx(10_000 * per_read)
    old = 10_000 * 3.25 * 4096 / min(2e9, 100_000 * 4096)  # each block a separate 4 KiB read
    assert p.stages["ssd"] < old
    # never above the sequential rate: a disk of 0.1 GB/s sequential caps the extents' bytes
    slow = predict_epoch(w, disk(ssd_read_bytes_per_s=1e8), device_cache=0, host_cache=0)
    assert slow.stages["ssd"] == pytest.approx(10_000 * 13312 / 1e8)


def test_without_the_figure_the_older_pricing_stands_and_says_so():
    old = disk(ssd_random_reads=[])
    p = predict_epoch(workload(), old, device_cache=0, host_cache=0)
    assert p.stages["ssd"] == pytest.approx(10_000 * 4096 / min(2e9, 100_000 * 4096))
    assert not p.ssd_rate.measured_at_request_size and p.ssd_rate_source.startswith("min(sequential read")
    # figures at another queue depth than the gather's are not the gather's pattern either
    other = predict_epoch(workload(), disk(), device_cache=0, host_cache=0, queue_depth=32)
    assert other.stages["ssd"] == pytest.approx(p.stages["ssd"]) and "queue depth 32" in other.ssd_rate_source
    with pytest.raises(ValueError, match="unknown"):
        random_read_rate(Hardware(name="blank"), 4096)


def test_the_source_is_in_the_json_and_in_the_advice(tmp_path):
    p = predict_epoch(workload(), disk(), device_cache=0, host_cache=0)
    out = json.loads(json.dumps(p.to_dict()))
    assert out["ssd_read_rate"]["source"] == p.ssd_rate_source
    assert out["ssd_read_rate"]["bytes_per_s"] == pytest.approx(60_000 * 4096)
    prices = PriceTable.load(DEFAULT_PRICES)
    priced = advise(workload(), disk(), prices, ssd_counts=(1,), memory_gib=[64], gpus=["none"])
    assert priced["best"]["ssd_rate_source"].startswith("min(sequential read")  # spec-sheet SSD: no figure
    text = DEFAULT_PRICES.read_text().replace("rand4k_iops = 800000.0", "rand4k_iops = 0.0")
    (tmp_path / "p.toml").write_text(text.replace("read_bytes_per_s = 6.8e9", "read_bytes_per_s = 0.0"))
    ours = advise(workload(), disk(), PriceTable.load(tmp_path / "p.toml"), ssd_counts=(1, 2), memory_gib=[64],
                  gpus=["none"])
    assert all("random reads of 4.0 KiB" in c["ssd_rate_source"] for c in ours["candidates"])


def test_an_older_cached_probe_loads_and_falls_back(tmp_path):
    data = disk().to_dict()
    del data["ssd_random_reads"]
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data))
    hw = load_probe(path)
    assert hw.ssd_random_reads == []
    assert not predict_epoch(workload(), hw, device_cache=0, host_cache=0).ssd_rate.measured_at_request_size
    save_probe(disk(), path)
    assert load_probe(path).ssd_random_reads == FIGURES
    with pytest.raises(ValueError, match="ssd_random_reads"):
        disk(ssd_random_reads=[{"request_bytes": 4096, "queue_depth": 0, "reads_per_s": 1.0}])


def test_directories_on_two_ssds_keep_the_sizes_both_measured():
    a = {"dir": "/a", "device": 1, "ssd_read_bytes_per_s": 1e9, "ssd_write_bytes_per_s": 1e9, "ssd_rand4k_iops": 1e5,
         "ssd_random_reads": FIGURES}
    b = {**a, "dir": "/b", "device": 2, "ssd_random_reads": [{**FIGURES[0], "reads_per_s": 80_000.0}]}
    out = aggregate_ssd([a, b])
    assert out["ssds"] == 2
    assert out["ssd_random_reads"] == [{"request_bytes": 4096, "queue_depth": 128, "reads_per_s": 70_000.0}]


def test_the_probe_measures_random_reads_per_size_on_a_real_file(tmp_path):
    r = probe.measure_ssd(str(tmp_path), 16 << 20, rand_seconds=0.2)
    sizes = [e["request_bytes"] for e in r["ssd_random_reads"]]
    assert sizes == list(probe.RANDOM_READ_SIZES)
    from terastack import io

    assert all(e["reads_per_s"] > 0 and e["queue_depth"] == io.get_engine().config.queue_depth
               for e in r["ssd_random_reads"])
    hw = Hardware(name="here", **aggregate_ssd([{"dir": str(tmp_path), **r}]))
    assert random_read_rate(hw, 4096).measured_at_request_size
    assert list(tmp_path.iterdir()) == []
