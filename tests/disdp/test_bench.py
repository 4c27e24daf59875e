"""``terastack bench dist`` at smoke size: every field the issue asks for, measured in one run."""
from __future__ import annotations

import argparse
import json

import pytest

from terastack.disdp.bench import measure as bench


def _smoke_args(tmp_path, *more: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(bench.PRESETS["smoke"] + ["--run-dir", str(tmp_path), *more])


@pytest.mark.timeout(200)
def test_bench_dist_smoke(tmp_path):
    """The three systems on the smoke job, end to end through ``measure``; the ingress sweep over worker counts:
    the test below, run beside this one."""
    result = bench.measure(_smoke_args(tmp_path, "--ingress-workers", ""))
    for system in ("terastack", "fsdp2", "zero3"):
        assert result[f"{system}_step_s"] > 0
        assert 0 <= result[f"{system}_exposed_comm_fraction"] <= 1
        assert result[f"{system}_max_abs_diff"] <= 1e-5        # each equals single-process AdamW
    assert result["worker_state_bytes"] == 0                   # terastack workers hold nothing between steps
    # FSDP2's workers hold their half of AdamW's two moments (8 bytes a parameter), ZeRO-3's the fp32 master too
    half = result["parameters"] // 2
    assert 8 * half <= result["fsdp2_worker_state_bytes"] < 8 * half + 1024
    assert 12 * half <= result["zero3_worker_state_bytes"] < 12 * half + 1024
    assert result["speedup_vs_fsdp2"] == pytest.approx(result["fsdp2_step_s"] / result["terastack_step_s"])
    stronger = min(("fsdp2", "zero3"), key=lambda k: result[f"{k}_step_s"])
    assert result["strongest_baseline"] == stronger
    assert result["speedup_vs_strongest_baseline"] == pytest.approx(result[f"{stronger}_step_s"]
                                                                   / result["terastack_step_s"])
    assert "server_ingress_bytes_per_step" not in result and "ps_scaling" not in result   # no sweep asked for


@pytest.mark.timeout(200)
def test_bench_dist_ingress_sweep(tmp_path):
    """The servers' ingress as the workers grow from 1 to 2, with and without the aggregator, as ``measure`` sweeps
    after the systems' comparison: the comparison's run (2 workers, the aggregator) stands for that configuration,
    here a run of its own."""
    from terastack.disdp.launch import launch_local
    from terastack.disdp.train_config import TrainConfig

    args = _smoke_args(tmp_path)
    bench._fill(args, timeout=120.0)
    common = bench.job_settings(args)
    main_run = launch_local(TrainConfig(**common, workers=2, servers=args.servers, steps=args.ingress_steps,
                                        run_dir=str(tmp_path / "main")), quiet=True)
    result = bench._ingress_sweep(args, tmp_path, common, main_run)
    ingress = result["server_ingress_bytes_per_step"]
    with_agg, without = ingress["with_aggregator"], ingress["without_aggregator"]
    assert set(with_agg) == set(without) == {"1", "2"}
    # With the aggregator a server receives one gradient's worth per step whatever the number of workers;
    # without it, one per worker.
    assert with_agg["1"] == with_agg["2"] == without["1"]
    assert without["2"] == 2 * without["1"]
    assert result["server_ingress_flat_with_aggregator"] and result["server_ingress_grows_without_aggregator"]
    # the runs without the aggregator, read as one server's throughput as the workers grow
    scaling = result["ps_scaling"]
    assert set(scaling["by_workers"]) == {"1", "2"} and scaling["by_workers"]["1"]["efficiency"] == 1.0
    assert result["ps_scaling_efficiency"] == scaling["by_workers"]["2"]["efficiency"] > 0
    assert scaling["by_workers"]["2"]["server_ingress_bytes_per_s"] == pytest.approx(
        without["2"] / scaling["by_workers"]["2"]["step_s"])


def test_bench_presets_parse():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for name, argv in bench.PRESETS.items():
        args = parser.parse_args(argv)
        assert args.steps >= 2, name


# ------------------------------------------------------------------ bench dist --model (the systems on a model)
def _summed(spec_kw, **stats):
    from terastack.disdp.bench.on_model import summarize
    from terastack.disdp.bench.spec import BenchSpec

    return summarize(BenchSpec(**spec_kw), stats["stats"])


def test_summarize_takes_the_waits_of_the_critical_worker():
    kw = dict(model="tiny-llama", run_dir="unused", workers=2, batch_size=2, steps=2, warmup=1)
    # FSDP2: per step the slowest worker's step and the least waiting worker's waits; the warm-up step is not timed
    fsdp2 = [{"role": "worker", "index": i, "step_s": s, "wait_s": w, "loss": [1.0, 1.0, 1.0]}
             for i, (s, w) in enumerate([([9.0, 2.0, 4.0], [9.0, 1.0, 1.0]), ([9.0, 3.0, 3.0], [9.0, 0.5, 2.0])])]
    out = _summed(kw | {"system": "fsdp2"}, stats=fsdp2)
    assert out["step_s"] == pytest.approx(3.5)                          # median of max(2, 3), max(4, 3)
    assert out["exposed_comm_fraction"] == pytest.approx((0.5 + 1.0) / (3.0 + 4.0))
    # terastack: rank 0's whole step less the compute of the worker that computes longest
    ts = [{"role": "worker", "index": 0, "step_s": [9.0, 4.0, 5.0], "pass_s": [9.0, 3.0, 4.0],
           "wait_s": [0.0, 1.0, 1.0], "loss": [2.0, 1.0, 1.0]},
          {"role": "worker", "index": 1, "pass_s": [9.0, 3.5, 4.0], "wait_s": [0.0, 0.5, 2.0]},
          {"role": "server", "index": 0}]
    out = _summed(kw | {"system": "terastack"}, stats=ts)
    assert out["step_s"] == pytest.approx(4.5)
    assert out["exposed_comm_fraction"] == pytest.approx(((4.0 - 3.0) + (5.0 - 3.0)) / (4.0 + 5.0))
    with pytest.raises(ValueError, match="1 of 2 workers"):
        _summed(kw | {"system": "terastack"}, stats=ts[1:])


def _first_loss_of_one_process(spec_file) -> float:
    """The benchmark's initial weights ([Note: the benchmark's initial weights]) on its first global batch, in this
    process: the loss every system must start from."""
    import torch

    from terastack.disdp.bench.spec import BenchSpec, global_batch, init_std
    from terastack.disdp.fsdp2 import materialize
    from terastack.disdp.workload import loss_of
    from terastack.training.hf.model_files import build_skeleton
    from terastack.training.model_registry import hf_config

    spec, hf = BenchSpec.load(str(spec_file)), hf_config("tiny-llama")
    model = build_skeleton(hf)
    materialize(model, "", seed=spec.seed, std=init_std(hf))
    with torch.no_grad():
        return float(loss_of(model, global_batch(spec, 0, hf.vocab_size)))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("system", ["terastack", "fsdp2"])
def test_bench_dist_model_smoke(tmp_path, capsys, system):
    """One system on the built-in tiny model, end to end through the command line (a test per system, so that
    they run side by side; the ratios between systems: the test below)."""
    from terastack.cli import main
    from terastack.training.hf.model_files import build_skeleton
    from terastack.training.model_registry import hf_config

    assert main(["bench", "dist", "--model", "tiny-llama", "--systems", system, "--steps", "1",
                 "--seq-len", "16", "--timeout", "60", "--run-dir", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["params"] == sum(p.numel() for p in build_skeleton(hf_config("tiny-llama")).parameters())
    assert result[f"fits_{system}"] is True, result.get(f"error_{system}")
    assert result[f"step_s_{system}"] > 0
    assert 0 <= result[f"exposed_comm_fraction_{system}"] <= 1
    # every process of the system counted: each one imports torch (well over 50 MB)
    assert result[f"peak_rss_bytes_total_{system}"] > result[f"processes_{system}"] * (50 << 20)
    # 2 workers and a server; FSDP2: 2 workers
    assert result[f"processes_{system}"] >= {"terastack": 3, "fsdp2": 2}[system]
    for other in {"terastack", "fsdp2", "zero3"} - {system}:
        assert result[f"peak_rss_bytes_total_{other}"] is None and result[f"fits_{other}"] is None
    # the same weights and the same rows in every system: the loss of the one-process model on the first batch
    # (and it is a sane one)
    assert result[f"loss_first_{system}"] == pytest.approx(_first_loss_of_one_process(tmp_path / system /
                                                                                      "spec.json"), abs=1e-5)
    assert 4.0 < result[f"loss_first_{system}"] < 7.0                 # about ln(259) for random tokens
    if system == "terastack":
        assert result["worker_optimizer_bytes_terastack"] == 0
    else:
        assert result["worker_optimizer_bytes_fsdp2"] > 0
    assert not list(tmp_path.rglob("server-*")), "the servers' stores were left behind"


def test_bench_dist_model_ratios_are_against_fsdp2(monkeypatch, tmp_path):
    """The systems' figures as run_system gives them, read into the ratios against FSDP2 (no rank started)."""
    from terastack.disdp.bench import on_model

    figures = {"terastack": dict(step_s=2.0, exposed_comm_s=0.5, exposed_comm_fraction=0.25),
               "fsdp2": dict(step_s=4.0, exposed_comm_s=2.0, exposed_comm_fraction=0.5)}
    monkeypatch.setattr(on_model, "run_system", lambda spec, limit: dict(
        figures[spec.system], fits=True, losses=[5.0], peak_rss_bytes_total=1 << 30, processes=3))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--model", "tiny-llama", "--systems", "terastack,fsdp2", "--steps", "1",
                              "--seq-len", "16", "--run-dir", str(tmp_path)])
    result = bench.measure(args)
    assert result["step_time_ratio_vs_fsdp2"] == 0.5 and result["speedup_vs_fsdp2"] == 2.0
    assert result["exposed_comm_ratio_vs_fsdp2"] == 0.5 and result["exposed_comm_s_ratio_vs_fsdp2"] == 0.25
    assert result["loss_first_terastack"] == result["loss_first_fsdp2"] == 5.0
    assert result["step_time_ratio_zero3_vs_fsdp2"] is None and result["fits_zero3"] is None


@pytest.mark.timeout(60)
def test_bench_dist_model_does_not_fit(tmp_path):
    """A system past the RSS limit is reported as not fitting (and its stores deleted), not raised."""
    from terastack.disdp.bench.on_model import run_system
    from terastack.disdp.bench.spec import BenchSpec

    spec = BenchSpec(system="terastack", model="tiny-llama", run_dir=str(tmp_path / "ts"), batch_size=2, seq_len=8,
                     steps=1, timeout_s=60)
    out = run_system(spec, limit=60 << 20)
    assert out["fits"] is False and "watchdog" in out["note"]
    assert out["peak_rss_bytes_total"] > 60 << 20
    assert "error" not in out and "step_s" not in out
    assert not list(tmp_path.rglob("server-*"))
