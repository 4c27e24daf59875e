"""`terastack bench llm-scale` at tiny sizes: real child processes under the real RSS watchdog."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from terastack.cli import main
from terastack.llm.bench import bench_scale


def leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.startswith("terastack-scale")]


def run_bench(capsys, *args):
    assert main(["bench", "llm-scale", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_system_over_the_rss_limit_does_not_fit_and_is_not_tried_larger(tmp_path, capsys):
    # 64 MiB: less than an interpreter with torch imported, so the watchdog kills the child at the first rung
    r = run_bench(capsys, "--sizes", "tiny,0.15b", "--systems", "in_memory", "--rss-limit", "64MiB",
                  "--dir", str(tmp_path))
    tiny, larger = r["rows"]
    assert (tiny["size"], tiny["system"], tiny["fits"]) == ("tiny", "in_memory", False)
    assert "does not fit" in tiny["reason"] and "64.00 MiB" in tiny["reason"]
    assert tiny["peak_rss_bytes"] > 64 << 20 and tiny["step_s"] is None
    assert larger["size"] == "0.15b" and larger["fits"] is None and larger["reason"].startswith("not tried")
    assert r["max_params_in_memory"] is None and r["rss_limit_bytes"] == 64 << 20
    assert leftovers(tmp_path) == []  # every rung's files are deleted


def test_tiny_rung_trains_under_the_watchdog_and_reports_each_field(tmp_path, capsys, hardware_file):
    """Every field of a row, with --grad-accum 2: every system takes optimizer steps of two micro-batches
    (terastack plans for them) and tokens/s counts both (one run: each system's row is a process of its own)."""
    from transformers import AutoModelForCausalLM

    from terastack.training.model_registry import hf_config

    trace = tmp_path / "trace.json"
    r = run_bench(capsys, "--sizes", "tiny", "--systems", "terastack,in_memory", "--steps", "1", "--warmup", "1",
                  "--seq-len", "16", "--grad-accum", "2", "--dir", str(tmp_path), "--hardware", hardware_file,
                  "--trace", str(trace))
    assert r["environment"]["versions"]["torch"] and r["grad_accum"] == 2
    assert any(e.get("ph") == "X" for e in json.loads(trace.read_text())["traceEvents"]), "trace has no spans"
    trace.unlink()
    params = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf_config("tiny-llama")).parameters())
    rows = {row["system"]: row for row in r["rows"]}
    assert set(rows) == {"terastack", "in_memory"}
    for row in rows.values():
        assert row["fits"] is True and row["reason"] is None and row["params"] == params
        assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(2 * 16 / row["step_s"])
        assert 0 < row["peak_rss_bytes"] < r["rss_limit_bytes"]
        assert row["ssd_read_bytes_per_step"] >= 0 and row["ssd_write_bytes_per_step"] >= 0
        assert len(row["losses"]) == 2  # one per optimizer step (warm-up and measured), not per micro-batch
    ts = rows["terastack"]
    assert ts["plan"]["grad_accum"] == 2
    assert ts["predicted_step_s"] > 0
    assert ts["prediction_error"] == pytest.approx(ts["predicted_step_s"] / ts["step_s"] - 1)
    # a randomly initialized model starts near the loss of a uniform guess over the vocabulary
    for row in rows.values():
        assert row["losses"][0] == pytest.approx(math.log(hf_config("tiny-llama").vocab_size), abs=0.5)
    assert r["max_params_terastack"] == r["max_params_in_memory"] == params and r["max_params_zero_infinity"] is None
    assert r["tiny_terastack_step_vs_in_memory"] == pytest.approx(ts["step_s"] / rows["in_memory"]["step_s"])
    # the step's timeline: compute and waits inside the step, the disk's busy share a share, the floor from the
    # probe's rates
    assert 0 < ts["compute_s"] and ts["compute_s"] + ts["stall_s"] <= ts["step_s"] * 1.05
    assert 0 <= ts["disk_busy_share"] <= 1
    hw = json.loads(Path(hardware_file).read_text())
    assert ts["io_floor_s"] == pytest.approx(ts["ssd_read_bytes_per_step"] / hw["ssd_read_bytes_per_s"]
                                             + ts["ssd_write_bytes_per_step"] / hw["ssd_write_bytes_per_s"])
    assert {"weights_forward_read", "weights_backward_read", "moments_read", "moments_written"} <= set(
        ts["bytes_by_kind_per_step"])
    assert r["tiny_terastack_step_vs_floor"] == pytest.approx(
        ts["step_s"] / max(rows["in_memory"]["step_s"], ts["io_floor_s"]))
    assert leftovers(tmp_path) == []


def test_a_rung_that_would_not_fit_on_the_disk_is_refused(tmp_path, capsys, monkeypatch, hardware_file):
    free = 10 << 30
    real = bench_scale.shutil.disk_usage
    monkeypatch.setattr(bench_scale.shutil, "disk_usage", lambda p: real(p)._replace(free=free))
    r = run_bench(capsys, "--sizes", "3b", "--systems", "terastack,in_memory", "--dir", str(tmp_path),
                  "--hardware", hardware_file, "--rss-limit", "64MiB")  # in_memory is stopped at once
    params = bench_scale.parameter_count("openllama-3b")
    need = bench_scale.disk_needed(params, "terastack")
    assert need > 12 * params > free
    ts, im = r["rows"]
    assert ts["fits"] is None and ts["reason"].startswith("refused")
    assert str(need) in ts["reason"] and str(free) in ts["reason"]
    assert im["system"] == "in_memory" and not im["reason"].startswith("refused")  # it needs no disk


@pytest.mark.parametrize("code, fits, says", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", False, "OOM killer"),
    ("raise MemoryError('no room')", False, "out of memory"),
    ("import torch; torch.empty(1 << 62, dtype=torch.uint8)", False, "out of memory"),
    ("raise ValueError('a bug')", None, "a bug"),
    ("pass", True, None),
])
def test_children_that_die_of_memory_do_not_fit(code, fits, says, tmp_path):
    outcome = bench_scale.run_watched([sys.executable, "-c", code], rss_limit=8 << 30, timeout=60,
                                      log=tmp_path / "log")
    got, reason = bench_scale.classify(outcome, 8 << 30)
    assert got is fits
    assert (reason is None) if says is None else (says in reason)


def test_unknown_rung_is_refused(capsys):
    with pytest.raises(ValueError, match="--sizes: unknown rung '7q'"):
        bench_scale.resolve_sizes("0.15b,7q")


def test_one_terastack_row_per_optimizer_format_with_its_bytes_and_the_plans(tmp_path, capsys, hardware_file):
    """--optimizer adamw,adamw8bit: a terastack row per format, each with its bytes per parameter per step by kind
    (the byte ledger's) beside the planner's, and the disk pre-flight sized from the format's spec."""
    if importlib.util.find_spec("bitsandbytes") is None:  # the children import it; this process need not
        pytest.skip("bitsandbytes is not installed")
    # no warm-up step: the bytes a step moves are the same in its first step (the ledger counts them, not time)
    r = run_bench(capsys, "--sizes", "tiny", "--systems", "terastack", "--optimizer", "adamw,adamw8bit",
                  "--state-placement", "ssd", "--steps", "1", "--warmup", "0", "--seq-len", "16", "--dir", str(tmp_path),
                  "--hardware", hardware_file)
    rows = {row["optimizer"]: row for row in r["rows"]}
    assert set(rows) == {"adamw", "adamw8bit"} and r["optimizers"] == ["adamw", "adamw8bit"]
    for fmt, row in rows.items():
        assert row["fits"] is True and row["system"] == "terastack" and row["plan"]["optimizer"] == fmt
        got, planned = row["bytes_per_parameter_per_step"], row["predicted_bytes_per_parameter_per_step"]
        assert got["read"] == pytest.approx(row["bytes_by_kind_per_step"] and sum(
            v for k, v in row["bytes_by_kind_per_step"].items() if k.endswith("_read")) / row["params"])
        assert got["by_kind"]["moments_read"] > 0 and planned["by_kind"]["moments_read"] > 0
    eight, full = rows["adamw8bit"]["bytes_per_parameter_per_step"], rows["adamw"]["bytes_per_parameter_per_step"]
    # one byte per moment and a scale per 256 against four bytes per moment
    assert eight["by_kind"]["moments_read"] < 0.4 * full["by_kind"]["moments_read"]
    assert r["tiny_terastack_adamw8bit_bytes_vs_adamw"] < 1
    assert r["max_params_terastack"] == r["max_params_terastack_adamw8bit"] == rows["adamw"]["params"]
    assert bench_scale.state_bytes_per_param("tiny-llama", "adamw") == pytest.approx(12)
    assert bench_scale.state_bytes_per_param("tiny-llama", "adamw8bit") < 7
    assert leftovers(tmp_path) == []


def test_an_unknown_optimizer_format_is_refused(tmp_path, capsys):
    assert main(["bench", "llm-scale", "--sizes", "tiny", "--systems", "terastack", "--optimizer", "adamw,lion",
                 "--dir", str(tmp_path)]) == 2
    assert "--optimizer: must be one of" in capsys.readouterr().err


def test_lora_rows_train_an_adapter_over_an_nf4_base_and_the_others_are_refused(tmp_path, capsys, hardware_file):
    """--lora R --base-format nf4: terastack's row streams the frozen base as NF4 (a fraction of the 4 bytes per
    parameter a native fp32 base reads), the ledger's bytes by kind beside the planner's; the full fine-tuning
    systems are refused, naming why."""
    r = run_bench(capsys, "--sizes", "tiny", "--systems", "terastack,in_memory", "--steps", "1", "--warmup", "1",
                  "--seq-len", "16", "--lora", "4", "--base-format", "nf4", "--state-placement", "ssd",
                  "--dir", str(tmp_path), "--hardware", hardware_file)
    rows = {row["system"]: row for row in r["rows"]}
    assert (r["lora_rank"], r["base_format"]) == (4, "nf4")
    assert rows["in_memory"]["fits"] is None and "--lora trains terastack rows only" in rows["in_memory"]["reason"]
    ts = rows["terastack"]
    assert ts["fits"] is True and (ts["lora_rank"], ts["base_format"]) == (4, "nf4")
    measured, planned = ts["bytes_per_parameter_per_step"], ts["predicted_bytes_per_parameter_per_step"]
    assert 0 < measured["by_kind"]["weights_forward_read"] < 0.3 * 4  # NF4, not the 4 bytes of an fp32 base
    for kind, value in measured["by_kind"].items():
        assert planned["by_kind"][kind] == pytest.approx(value, rel=0.05), kind
    # only the adapters train: their masters are a sliver of the model's
    assert measured["by_kind"]["masters_written"] < 0.05 * 4
    assert leftovers(tmp_path) == []


def test_lora_disk_preflight_counts_the_nf4_store():
    import torch

    from terastack.plan.base_formats import nf4_bytes
    from terastack.training.hf.model_files import build_skeleton
    from terastack.training.model_registry import hf_config

    model = build_skeleton(hf_config("tiny-llama"))
    n = sum(p.numel() for p in model.parameters())
    linear = [m.weight.numel() for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and name != "lm_head"]
    nf4_store = 4 * (n - sum(linear)) + sum(nf4_bytes(k) for k in linear)
    assert bench_scale.lora_disk_bytes_per_param("tiny-llama", "nf4") == pytest.approx(nf4_store / n)
    assert bench_scale.lora_disk_bytes_per_param("tiny-llama", "native") == pytest.approx(4.0)


def test_nf4_base_without_lora_is_refused(capsys):
    assert main(["bench", "llm-scale", "--sizes", "tiny", "--base-format", "nf4"]) != 0
    assert "--lora" in capsys.readouterr().err
