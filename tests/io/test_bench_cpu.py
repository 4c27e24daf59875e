"""``terastack bench io-cpu``: the CPU share per GB/s is worked out from counted bytes and CPU seconds."""
import argparse
import os

import pytest

from terastack.io.bench import cpu as bench_cpu


def test_summary_ratios_from_counted_runs():
    runs = [{"bytes": 2_000_000_000, "wall_s": 4.0, "cpu_s": 1.0},
            {"bytes": 1_000_000_000, "wall_s": 1.0, "cpu_s": 0.5},
            {"bytes": 1_000_000_000, "wall_s": 2.0, "cpu_s": 0.2}]
    s = bench_cpu.summarize(runs, cores=2)
    assert [r["read_gb_per_s"] for r in runs] == pytest.approx([0.5, 1.0, 0.5])
    assert [r["cpu_share_at_disk_rate"] for r in runs] == pytest.approx([0.25, 0.5, 0.1])
    assert [r["cpu_cores_per_gb_per_s"] for r in runs] == pytest.approx([0.5, 0.5, 0.2])
    assert s["cpu_cores_per_gb_per_s"] == pytest.approx(0.5) and s["cpu_share_at_disk_rate"] == pytest.approx(0.25)
    assert s["cpu_share_of_machine"] == pytest.approx(0.125)


def test_a_run_reads_every_block_of_a_urandom_file_once(tmp_path):
    from terastack import io

    path = str(tmp_path / "f.bin")
    bench_cpu.prepare_file(path, 1 << 20)
    assert os.stat(path).st_blocks * 512 >= 1 << 20
    with io.IOEngine(backend="python") as engine:
        run = bench_cpu.read_run(engine, path, 1 << 20, 16384, batch=7, seed=0)
    assert run["bytes"] == 1 << 20 and run["wall_s"] > 0 and run["cpu_s"] >= 0


@pytest.mark.parametrize("argv, message", [(["--block", "1000"], "block"), (["--size", "4KiB"], "size"),
                                           (["--batch", "0"], "batch")])
def test_bad_settings_are_refused_by_name(argv, message):
    p = argparse.ArgumentParser()
    bench_cpu.add_arguments(p)
    with pytest.raises(ValueError, match=message):
        bench_cpu.measure(p.parse_args(argv))
