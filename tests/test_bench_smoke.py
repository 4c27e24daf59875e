"""Every benchmark runs end to end at tiny size (its PRESETS['smoke']) and reports its ratios."""
import importlib
import json
import math

import pytest

from terastack import bench
from terastack.cli import main
from terastack.commands import available

# Benchmarks whose own smoke test checks every field (and costs tens of seconds) are not run twice here.
DEDICATED = {"dist": "tests/disdp/test_bench.py", "llm-scale": "tests/llm/test_bench_scale.py",
             "io": "test_io_smoke_fields_are_ratios below"}
AVAILABLE = [c.name for c in bench.BENCHMARKS if all(map(available, c.needs)) and c.name not in DEDICATED]
# Ratios a benchmark must report as positive numbers, beyond its headline fields being present and finite.
POSITIVE = {"gnn": ("slowdown_vs_in_memory_pipelined", "slowdown_vs_in_memory_serial"),
            "llm": ("slowdown_vs_in_memory_host_resident", "host_resident_paired_ratio_median",
                    "host_resident_cpu_ratio")}
# Fields that must be exactly zero: with the host budget holding the whole state, terastack's store moves nothing.
ZERO = {"llm": ("host_resident_store_bytes_per_step",)}
# Benchmarks whose smoke preset runs its systems in a process each, in a test per system (its --systems one at a
# time) that xdist runs side by side; each test's ratios are the ones its system gives (llm's POSITIVE and ZERO:
# host_resident's, which pairs its steps with in-memory AdamW's in its own process); the ratios between systems
# run apart: test_llm_ratios_between_systems below.
SPLIT = {"llm": ("in_memory", "terastack", "host_resident", "small_budget")}
CASES = [pytest.param(name, systems, id=f"{name}-{systems.replace(',', '-')}" if systems else name)
         for name in AVAILABLE for systems in SPLIT.get(name, (None,))]


@pytest.mark.parametrize("name,systems", CASES)
def test_benchmark_smoke(name, systems, tmp_path, capsys, cached_probe):
    module = importlib.import_module({c.name: c.module for c in bench.BENCHMARKS}[name])
    args = ["bench", name, "--json", "--trace", str(tmp_path / "trace.json")] + module.PRESETS["smoke"]
    args += ["--systems", systems] if systems else []
    assert main(args + (["--dir", str(tmp_path)] if _takes_dir(module) else [])) == 0
    result = json.loads(capsys.readouterr().out)
    for field in module.HEADLINE:
        assert field in result, f"{name}: headline field {field} missing"
        value = result[field]
        if isinstance(value, float):
            assert math.isfinite(value), f"{name}: {field} = {value}"
    if systems:
        assert "errors" not in result, result["errors"]  # the system ran
        assert all(isinstance(result[s], dict) for s in systems.split(","))
    checked = systems is None or "host_resident" in systems
    for field in POSITIVE.get(name, ()) if checked else ():
        assert result[field] > 0, f"{name}: {field} = {result[field]}"
    for field in ZERO.get(name, ()) if checked else ():
        assert result[field] == 0, f"{name}: {field} = {result[field]}"
    assert result["environment"]["versions"]["torch"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"]), "trace has no spans"


def _takes_dir(module) -> bool:
    import argparse

    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return any(a.dest == "dir" for a in p._actions)


def test_io_smoke_fields_are_ratios(tmp_path, capsys):
    from terastack.io.bench import rates as io_bench

    trace = tmp_path / "trace.json"
    assert main(["bench", "io", "--json", "--dir", str(tmp_path), "--trace", str(trace)] + io_bench.PRESETS["smoke"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert all(field in r for field in io_bench.HEADLINE) and r["environment"]["versions"]["torch"]
    assert any(e.get("ph") == "X" for e in json.loads(trace.read_text())["traceEvents"]), "trace has no spans"
    for key in ("seq_read_vs_fio", "seq_write_vs_fio", "rand4k_read_vs_fio"):
        assert 0 < r[key] < 100
    assert r["batch_submit_ops_per_s"] > 1000 and r["backend"] in ("io_uring", "threads", "python")


def test_llm_ratios_between_systems():
    """bench llm's ratios between its systems' processes, on given figures (the smoke tests above run one system
    each, so none of them has two to compare)."""
    from terastack.llm.bench import bench_llm

    r = {"in_memory": {"step_s": 0.5, "peak_rss_bytes": 100},
         "terastack": {"planned": {"step_s": 2.0, "peak_rss_bytes": 50, "predicted_step_s": 1.5},
                       "all_swap": {"step_s": 3.0}},
         "zero_infinity": {"step_s": 8.0, "peak_rss_bytes": 200}}
    bench_llm._ratios(r)
    assert r["slowdown_vs_in_memory"] == 4.0 and r["speedup_vs_zero_infinity"] == 4.0
    assert r["rss_vs_zero_infinity"] == 0.25 and r["prediction_error"] == -0.25 and r["ablation_all_swap"] == 1.5
    assert "errors" not in r
