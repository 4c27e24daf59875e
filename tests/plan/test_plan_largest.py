"""`terastack plan llm`: the disk must hold the state a plan rests there, an NF4 LoRA base is priced at its own
bytes, and `--largest` answers per optimizer format which model fits a machine."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from terastack.cli import main
from terastack.llm import plan_cmd, plan_largest
from terastack.plan.base_formats import NF4_BLOCK, nf4_bytes
from terastack.plan.hardware import Hardware

from .test_llm_planner import profile as synthetic_profile

CPU = Hardware(name="described", cores=2, host_memory_bytes=16 << 30, cpu_flops=5e10, memcpy_bytes_per_s=5e9,
               ssd_read_bytes_per_s=2e9, ssd_write_bytes_per_s=1e9, cpu_adam_params_per_s=3e8)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_disk_too_small_for_the_state_is_refused_in_one_line(capsys, as_json):
    argv = ["plan", "llm", "--model", "opt-1.3b", "--hardware", "rtx4090-workstation", "--host-mem", "4GB",
            "--disk", "1GB"]
    assert main(argv + (["--json"] if as_json else [])) == plan_cmd.NO_FIT
    out = capsys.readouterr().out
    if as_json:
        r = json.loads(out)
        assert r["fits"] is False and r["short"]["budget"] == "disk" and r["short"]["available"] == 10**9
    else:
        line, = [s for s in out.splitlines() if s.startswith("does not fit")]
        assert "disk budget exceeded" in line and "--disk" in line and "953.67 MiB" in line
    assert main(argv[:-2]) == 0  # the preset's own disk (4 TB) holds it


def test_an_nf4_base_is_priced_at_half_a_byte_and_a_scale_per_64_values():
    assert nf4_bytes(128) == 64 + 4 * 2 and nf4_bytes(100) == 50 + 4 * 2 and NF4_BLOCK == 64
    prof = synthetic_profile(layers=4, params=1 << 20, compute_bytes=2)
    for t in ("l0", "l1", "l2", "l3"):
        prof.tensor_trainable[t] = False
        prof.tensor_shape[t] = (1024, 1024)
    # the frozen layer matrices rest in NF4 (the engine's profile records their bytes); the embedding stays bf16
    nf4 = dataclasses.replace(prof, frozen_rest={t: nf4_bytes(1 << 20) for t in ("l0", "l1", "l2", "l3")})
    assert prof.state_bytes() - nf4.state_bytes() == 4 * ((2 << 20) - nf4_bytes(1 << 20))
    assert nf4.frozen_bytes("embed") == prof.frozen_bytes("embed")
    # the planner streams the smaller base: its weight reads from the SSD shrink with it
    from terastack.plan.llm_planner import LLMPlanner

    cfg = LLMPlanner.Config(device_budget=1 << 30, host_budget=64 << 20, state_placement="ssd")
    bf16 = LLMPlanner(cfg).plan(prof, CPU).prediction.bytes_by_kind["weights_forward_read"]
    four = LLMPlanner(cfg).plan(nf4, CPU).prediction.bytes_by_kind["weights_forward_read"]
    assert bf16 - four == pytest.approx(4 * ((2 << 20) - nf4_bytes(1 << 20)), rel=0.01)


def test_base_format_needs_lora(capsys):
    assert main(["plan", "llm", "--model", "tiny-llama", "--hardware", "rtx4090-workstation", "--base-format",
                 "nf4"]) == 2
    assert "--lora" in capsys.readouterr().err


def test_largest_model_per_format_follows_its_state_bytes(tmp_path, capsys):
    """On a described machine whose disk holds llama-150m's state in 8-bit or factored form but not AdamW's, the
    largest model of a two-rung ladder differs by format; each answer has its bytes per parameter per step."""
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(CPU.to_dict()))
    parser = argparse.ArgumentParser()
    plan_cmd.add_arguments(parser)
    args = parser.parse_args(["--largest", "--hardware", str(hw), "--host-mem", "1GB", "--disk", "1.2GB",
                              "--seq-len", "16", "--json"])
    job = plan_cmd.read_job(args)
    machine = plan_cmd.resolve_hardware(args, job)
    assert plan_largest.run_largest(plan_cmd.plan_model, job, args, machine, ladder=("tiny-llama", "llama-150m")) \
        == 0
    r = json.loads(capsys.readouterr().out)
    rows = {row["optimizer"]: row for row in r["largest"]}
    assert rows["adamw"]["model"] == "tiny-llama" and "disk budget exceeded" in rows["adamw"]["reason"]
    assert rows["adamw8bit"]["model"] == rows["adafactor"]["model"] == "llama-150m"
    assert rows["adafactor"]["state_bytes_per_parameter"] < rows["adamw8bit"]["state_bytes_per_parameter"] < 12
    for row in rows.values():
        per = row["bytes_per_parameter_per_step"]
        assert per["read"] >= 0 and row["disk_holds_parameters"] == int(1.2e9 / row["state_bytes_per_parameter"])
    assert r["nf4_lora"]["base_format"] == "nf4" and r["nf4_lora"]["model"] == "llama-150m"

