"""Reads and writes at once: the disk's rates while it serves both (measured by the probe) price a step's SSD
time, not the read time plus the write time ([Note: reads and writes at once] in terastack.plan.hardware)."""
import pytest

from terastack.plan.hardware import Hardware, aggregate_ssd
from terastack.plan.llm_planner import LLMPlanner

from .test_llm_planner import profile

GB = 1e9


def disk(mixed=(0.0, 0.0), ssds=1):
    return Hardware(name="described", cores=2, host_memory_bytes=16 << 30, cpu_flops=5e10, memcpy_bytes_per_s=5e9,
                    ssd_read_bytes_per_s=2 * GB, ssd_write_bytes_per_s=1 * GB, ssd_mixed_read_bytes_per_s=mixed[0],
                    ssd_mixed_write_bytes_per_s=mixed[1], ssds=ssds, cpu_adam_params_per_s=3e8)


def test_without_a_mixed_measurement_reads_and_writes_take_turns():
    assert disk().ssd_seconds(16 * GB, 12 * GB) == pytest.approx(16 / 2 + 12 / 1)


def test_both_streams_run_at_their_mixed_rates_then_the_longer_alone():
    hw = disk(mixed=(1.6 * GB, 0.6 * GB))
    # 10 s together move 16 GB read and 6 GB written; the other 6 GB are written alone at 1 GB/s
    assert hw.ssd_seconds(16 * GB, 12 * GB) == pytest.approx(10 + 6)
    # reads outlast writes: 2 s together (3.2 GB read, 1.2 GB written), 12.8 GB read alone at 2 GB/s
    assert hw.ssd_seconds(16 * GB, 1.2 * GB) == pytest.approx(2 + 6.4)
    assert hw.ssd_seconds(16 * GB, 0) == pytest.approx(8) and hw.ssd_seconds(0, 3 * GB) == pytest.approx(3)
    # two SSDs striped: every rate doubles
    assert disk(mixed=(1.6 * GB, 0.6 * GB), ssds=2).ssd_seconds(32 * GB, 24 * GB) == pytest.approx(16)


def test_the_planner_prices_the_ssd_at_the_overlap_the_disk_gives():
    prof = profile()
    kw = dict(device_budget=1 << 30, host_budget=64 << 20, state_placement="ssd")
    turns = LLMPlanner(LLMPlanner.Config(**kw)).plan(prof, disk()).prediction
    both = LLMPlanner(LLMPlanner.Config(**kw)).plan(prof, disk(mixed=(1.8 * GB, 0.9 * GB))).prediction
    assert both.ssd_read_bytes == turns.ssd_read_bytes > 0 and both.ssd_write_bytes == turns.ssd_write_bytes > 0
    assert turns.ssd_s == pytest.approx(turns.ssd_read_bytes / (2 * GB) + turns.ssd_write_bytes / GB)
    assert both.ssd_s == pytest.approx(disk(mixed=(1.8 * GB, 0.9 * GB)).ssd_seconds(both.ssd_read_bytes,
                                                                                   both.ssd_write_bytes))
    assert both.ssd_s < turns.ssd_s


def test_mixed_rates_add_up_over_devices_and_survive_the_cache():
    entries = [{"dir": "/a", "device": 1, "ssd_read_bytes_per_s": 2e9, "ssd_write_bytes_per_s": 1e9,
                "ssd_rand4k_iops": 1e5, "ssd_mixed_read_bytes_per_s": 1.5e9, "ssd_mixed_write_bytes_per_s": 0.5e9},
               {"dir": "/b", "device": 2, "ssd_read_bytes_per_s": 2e9, "ssd_write_bytes_per_s": 1e9,
                "ssd_rand4k_iops": 1e5, "ssd_mixed_read_bytes_per_s": 1.3e9, "ssd_mixed_write_bytes_per_s": 0.7e9}]
    agg = aggregate_ssd(entries)
    assert agg["ssds"] == 2 and agg["ssd_mixed_read_bytes_per_s"] == pytest.approx(1.4e9)
    hw = Hardware(**agg)
    assert Hardware.from_dict(hw.to_dict()).ssd_seconds(2.8e9, 1.2e9) == pytest.approx(1.0)
    # an older probe (no mixed figures) stays readable and prices turns
    old = {k: v for k, v in entries[0].items() if "mixed" not in k}
    assert "ssd_mixed_read_bytes_per_s" not in aggregate_ssd([old])



def test_each_format_is_priced_at_its_own_measured_update_rate():
    """The probe measures each format's CPU update rate (bitsandbytes' 8-bit AdamW runs far below torch's AdamW
    on a CPU); the step model prices a format's update at its own rate, and at AdamW's where none was measured."""
    import dataclasses

    prof = profile()
    kw = dict(device_budget=1 << 30, host_budget=64 << 20, state_placement="ssd")
    slow = dataclasses.replace(disk(), cpu_update_params_per_s={"adamw8bit": 1e8})
    adamw = LLMPlanner(LLMPlanner.Config(**kw)).plan(prof, slow).prediction
    eight = LLMPlanner(LLMPlanner.Config(optimizer="adamw8bit", **kw)).plan(prof, slow).prediction
    unmeasured = LLMPlanner(LLMPlanner.Config(optimizer="adamw8bit", **kw)).plan(prof, disk()).prediction
    trainable = prof.trainable_params
    assert adamw.optimizer_s == pytest.approx(trainable / 3e8)
    assert eight.optimizer_s == pytest.approx(trainable / 1e8)
    assert unmeasured.optimizer_s == pytest.approx(trainable / 3e8)
    assert slow.update_rate("adafactor") == 3e8 and slow.update_rate("adamw8bit") == 1e8
    with pytest.raises(ValueError, match="cpu_update_params_per_s"):
        dataclasses.replace(disk(), cpu_update_params_per_s={"adamw8bit": -1.0})
