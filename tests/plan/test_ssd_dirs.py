"""Several SSDs: the planner's SSD bandwidth is the sum over the probed directories' devices, one directory
gives exactly its own figures, and the store's placement weights are the directories' measured bandwidths."""
import pytest

from terastack.plan.hardware import Hardware, aggregate_ssd
from terastack.plan.llm_planner import LLMPlanner

from tests.plan.test_llm_planner import CPU, profile


def entry(d, dev, read, write, iops=1e5):
    return {"dir": d, "device": dev, "ssd_read_bytes_per_s": read, "ssd_write_bytes_per_s": write,
            "ssd_rand4k_iops": iops}


def hardware(entries):
    base = {k: v for k, v in CPU.to_dict().items() if k not in ("ssd_read_bytes_per_s", "ssd_write_bytes_per_s",
                                                                  "ssd_rand4k_iops", "ssds")}
    return Hardware(**base | aggregate_ssd(entries) | {"ssd_dirs": entries})


def test_one_directory_is_exactly_its_own_measurement():
    one = hardware([entry("/a", 1, 2e9, 1e9)])
    assert (one.ssd_read_bytes_per_s, one.ssd_write_bytes_per_s, one.ssds) == (2e9, 1e9, 1)
    assert one.ssd_read_total == CPU.ssd_read_total and one.ssd_write_total == CPU.ssd_write_total


def test_two_directories_sum_and_the_planner_uses_the_sum():
    two = hardware([entry("/a", 1, 2e9, 1e9), entry("/b", 2, 1e9, 0.5e9)])
    assert two.ssds == 2
    assert two.ssd_read_total == pytest.approx(3e9) and two.ssd_write_total == pytest.approx(1.5e9)
    # the predicted SSD time is the bytes over the summed bandwidths
    kw = dict(device_budget=1 << 30, host_budget=160 << 20, state_placement="ssd")
    p1 = LLMPlanner(LLMPlanner.Config(**kw)).plan(profile(), hardware([entry("/a", 1, 2e9, 1e9)])).prediction
    p2 = LLMPlanner(LLMPlanner.Config(**kw)).plan(profile(), two).prediction
    assert p1.ssd_read_bytes == p2.ssd_read_bytes > 0
    assert p1.ssd_s == pytest.approx(p1.ssd_read_bytes / 2e9 + p1.ssd_write_bytes / 1e9)
    assert p2.ssd_s == pytest.approx(p2.ssd_read_bytes / 3e9 + p2.ssd_write_bytes / 1.5e9)


def test_directories_on_one_device_count_once():
    same = hardware([entry("/a", 7, 2e9, 1e9), entry("/b", 7, 1e9, 1e9)])
    assert same.ssds == 1 and same.ssd_read_total == pytest.approx(1.5e9)


def test_placement_weights_are_the_measured_bandwidths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    hw = hardware([entry(str(a), 1, 3e9, 1e9), entry(str(b), 2, 1e9, 1e9)])
    assert hw.dir_bandwidths([str(a), str(b)]) == (3e9, 1e9)
    assert hw.dir_bandwidths([str(b)]) == (1e9,)
    assert hw.dir_bandwidths([str(a), str(tmp_path / "unmeasured")]) == ()  # equal shares then
