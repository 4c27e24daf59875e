"""The ZeRO-Infinity contender's DeepSpeed configuration, sized from the model ([Note: ZeRO-Infinity configured for
the model]); DeepSpeed's own validation reads it where DeepSpeed is installed."""
import argparse
import importlib.util

import pytest

from terastack.llm.bench import zero_infinity
from terastack.training.model_registry import resolve_model


def _args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(dir=str(tmp_path), batch_size=1, grad_accum=1, lr=1e-4)


def test_buffers_hold_the_largest_parameter_and_swapped_parameters_are_released_after_use(tmp_path):
    hf, _ = resolve_model("tiny-llama")
    params, largest = zero_infinity.model_shape(hf)
    # the largest parameter: the embedding or an MLP projection, whichever is wider
    assert largest == max(hf.vocab_size, hf.intermediate_size) * hf.hidden_size < params
    on_nvme = zero_infinity.ds_config(_args(tmp_path), hf, max_in_cpu=0)["zero_optimization"]
    offload = on_nvme["offload_param"]
    assert offload["buffer_size"] >= largest and offload["buffer_size"] % (1 << 20) == 0
    assert offload["buffer_count"] == 5 and offload["max_in_cpu"] == 0
    # parameters swap from the NVMe: released unless needed again within one buffer, not DeepSpeed's 1e9 elements
    assert on_nvme["stage3_max_reuse_distance"] == offload["buffer_size"]
    # a model under max_in_cpu keeps its parameters in host memory, and DeepSpeed's default distance with them
    in_cpu = zero_infinity.ds_config(_args(tmp_path), hf)["zero_optimization"]
    assert in_cpu["offload_param"]["max_in_cpu"] == 10**9 and in_cpu["stage3_max_reuse_distance"] == 10**9


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed checks its own configuration")
def test_deepspeed_accepts_the_configuration(tmp_path):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    hf, _ = resolve_model("tiny-llama")
    zero = DeepSpeedZeroConfig(**zero_infinity.ds_config(_args(tmp_path), hf, max_in_cpu=0)["zero_optimization"])
    assert zero.offload_param.max_in_cpu == 0 and zero.max_reuse_distance == zero.offload_param.buffer_size


def test_the_ladder_puts_every_parameter_on_the_nvme(tmp_path, monkeypatch):
    from terastack.llm.bench import bench_scale

    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return bench_scale.ChildOutcome(returncode=1, peak_rss_bytes=0, killed_for_rss=False, timed_out=False,
                                        stderr_tail="AssertionError: not run by this test")

    monkeypatch.setattr(bench_scale, "run_watched", fake_run)
    args = argparse.Namespace(seq_len=16, batch_size=1, steps=1, warmup=0, grad_accum=1, timeout=10.0)
    row = bench_scale._run_system("zero_infinity", "tiny-llama", 1, args, tmp_path, None, 0, 1 << 30)
    assert seen["cmd"][seen["cmd"].index("--zero-max-in-cpu") + 1] == "0"
    assert row["fits"] is None and "not run by this test" in row["reason"]     # a failure, never "does not fit"
