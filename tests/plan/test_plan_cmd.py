"""`terastack plan llm`: the same question gets the same answer, "does not fit" is an exit status, the training
state it shows adds up to the placements it lists, and a described machine is not called the probed one."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from terastack.cli import main
from terastack.llm.plan_cmd import NO_FIT
from terastack.plan.hardware import Hardware, save_probe

# a probed machine without an accelerator, as `terastack probe` caches it
PROBED = Hardware(name="this machine (probed)", measured=True, cores=2, host_memory_bytes=16 << 30, cpu_flops=5e10,
                  memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9, ssd_write_bytes_per_s=1e9,
                  cpu_adam_params_per_s=3e8, probe_dir="/tmp")
TINY = ["plan", "llm", "--model", "tiny-llama", "--seq-len", "16", "--time-units", "--json"]


def _json(capsys, argv) -> tuple[int, dict]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def _calibrated_step(capsys, monkeypatch) -> float:
    """The first calibrated plan on the probed machine: its predicted step (the units' times now kept beside the
    probe)."""
    from terastack.llm.engine import profile

    save_probe(PROBED)
    monkeypatch.setattr(profile, "_CALIBRATED", {})
    code, first = _json(capsys, TINY)
    assert code == 0
    step = first["plan"]["predicted_step_s"]
    assert step > 0 and profile.unit_times_path().is_file()
    return step


def test_the_same_calibrated_plan_twice_predicts_the_same_step(capsys, monkeypatch):
    from terastack.llm.engine import profile

    step = _calibrated_step(capsys, monkeypatch)
    code, again = _json(capsys, TINY)  # the same process
    assert code == 0 and again["plan"]["predicted_step_s"] == pytest.approx(step, rel=0.05)
    # a new process on a busier machine: nothing in memory, and every unit would now time 50x slower (a shared
    # machine's neighbours); the same question still gets the answer it got
    monkeypatch.setattr(profile, "_CALIBRATED", {})
    real = profile.time.perf_counter
    monkeypatch.setattr(profile.time, "perf_counter", lambda: 50 * real())
    code, busy = _json(capsys, TINY)
    monkeypatch.setattr(profile.time, "perf_counter", real)
    assert code == 0 and busy["plan"]["predicted_step_s"] == pytest.approx(step, rel=0.05)
    # --recalibrate times the units again (here: 50x slower, so the prediction moves)
    monkeypatch.setattr(profile.time, "perf_counter", lambda: 50 * real())
    code, again = _json(capsys, [*TINY, "--recalibrate"])
    assert code == 0 and again["plan"]["predicted_step_s"] > 5 * step


def test_a_calibrated_plan_in_another_process_predicts_the_same_step(capsys, monkeypatch):
    """The times one process calibrated, read by a new one (a test of its own: the new interpreter's start-up runs
    beside the test above)."""
    step = _calibrated_step(capsys, monkeypatch)
    other = subprocess.run([sys.executable, "-m", "terastack", *TINY], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TERASTACK_CACHE": os.environ["TERASTACK_CACHE"]})
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["plan"]["predicted_step_s"] == pytest.approx(step, rel=0.05)


@pytest.mark.parametrize("as_json", [False, True])
def test_does_not_fit_exits_non_zero(capsys, as_json):
    argv = ["plan", "llm", "--model", "opt-1.3b", "--hardware", "rtx4090-workstation", "--host-mem", "1GB"]
    assert main(argv + (["--json"] if as_json else [])) == NO_FIT == 3  # 2 is an error in the question
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out)["fits"] is False
    else:
        assert "does not fit" in out and "host budget" in out
    assert main(["plan", "llm", "--model", "opt-1.3b", "--hardware", "rtx4090-workstation"]) == 0
    assert main(["plan", "llm", "--model", "opt-1.3b", "--hardware", "no-such-machine"]) == 2  # an error


def _bytes(text: str) -> int:
    value, unit = text.split()
    return int(float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit])


@pytest.mark.parametrize("extra, trainable_bytes, frozen_bytes", [
    (["--host-mem", "12GB"], 12 + 2, 2),  # full fine-tune in bf16: fp32 master + 2 moments + the bf16 compute copy
    (["--host-mem", "2GB", "--lora", "8"], 12 + 2, 2),  # LoRA: the adapters as above, the frozen base in bf16
])
def test_training_state_adds_up_to_the_placements(capsys, extra, trainable_bytes, frozen_bytes):
    # a host too small for all the state: it is spread over host memory and the SSD (and the device: a LoRA base)
    argv = ["plan", "llm", "--model", "opt-1.3b", "--hardware", "rtx4090-workstation", *extra]
    code, r = _json(capsys, argv + ["--json"])
    assert code == 0
    frozen = r["parameters"] - r["trainable_parameters"]
    assert r["training_state_bytes"] == r["trainable_parameters"] * trainable_bytes + frozen * frozen_bytes
    placed = r["placement_bytes"]
    assert sum(placed.values()) == r["training_state_bytes"]
    assert sum(1 for v in placed.values() if v) >= 2  # the state is spread over more than one place
    assert main(argv) == 0
    out = capsys.readouterr().out
    head = re.search(r"training state ([\d.]+ \w+), batch", out).group(1)
    listed = re.search(r"^training state ([\d.]+ \w+):$", out, re.M).group(1)
    assert head == listed
    parts = [_bytes(b) for b in re.findall(r"([\d.]+ \w+) (?:in host memory|on SSD|on the device)", out)]
    assert len(parts) >= 4 and sum(parts) == pytest.approx(_bytes(head), rel=0.01)


def test_a_described_gpu_is_not_called_the_probed_machine(capsys):
    save_probe(PROBED)
    code = main(["plan", "llm", "--model", "opt-125m", "--gpu-mem", "24GB", "--gpu-tflops", "100"])
    out = capsys.readouterr().out
    assert code == 0
    machine = next(line for line in out.splitlines() if line.startswith("on "))
    assert "(probed)" not in machine and "hypothetical" in machine and "--gpu-mem 24GB" in machine, machine
    code, r = _json(capsys, ["plan", "llm", "--model", "opt-125m", "--gpu-mem", "24GB", "--gpu-tflops", "100",
                             "--json"])
    assert "probed" not in r["hardware"]["name"] and r["prediction"] is True
    # the probed machine itself keeps its name
    assert main(["plan", "llm", "--model", "opt-125m"]) == 0
    assert "on this machine (probed)" in capsys.readouterr().out


def test_a_lora_base_that_fits_the_gpu_stays_there(capsys):
    """The issue's case: LoRA of a 7B model on an 80 GB GPU streamed its 12.6 GiB base over PCIe every step."""
    code, r = _json(capsys, ["plan", "llm", "--model", "llama-2-7b", "--lora", "16", "--hardware", "a100-server",
                             "--gpu-mem", "80GB", "--json"])
    assert code == 0
    frozen = r["parameters"] - r["trainable_parameters"]
    assert r["placement_bytes"]["compute_device"] == frozen * 2  # the whole bf16 base
    plan = r["plan"]
    assert plan["predicted_device_link_bytes"] < 1 << 30 and plan["predicted_ssd_read_bytes"] < 1 << 30
    assert frozen * 2 <= plan["predicted_device_peak_bytes"] <= 72 * 10**9


def test_plan_llm_plans_the_job_finetune_would_run(tmp_path, capsys):
    """`plan llm --config job.yaml KEY=VALUE` reads the job as `finetune` does, with the job's defaults (the batch,
    the "auto" budgets of this machine, the built-in rules), and its plan is the one the offloaded engine makes
    for that job: the same placement, budgets and prediction."""
    import dataclasses

    from terastack.llm import Trainer, TrainerConfig
    from terastack.memory import mem_total
    from terastack.training.job import resolve_job

    from ..llm.llm_helpers import make_model

    make_model("llama", tmp_path / "model")
    capsys.readouterr()
    # this machine as its probe would describe it, so that "auto" budgets mean the same to both
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(dataclasses.replace(PROBED, host_memory_bytes=mem_total()).to_dict()))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"model: {tmp_path / 'model'}\ntraining: {{seq_len: 16, grad_accum: 2, optimizer: adamw8bit}}\n"
                        f"schedule: {{activation_policy: recompute}}\noffload: {{calibrate: false, hardware: {hw}}}\n")
    overrides = ["batch_size=3", "lr=1e-5"]
    code, r = _json(capsys, ["plan", "llm", "--config", str(job_file), *overrides, "--json"])
    assert code == 0 and (r["batch"], r["seq_len"], r["grad_accum"]) == (3, 16, 2)
    job = resolve_job(file=job_file, flags={}, overrides=overrides)
    with Trainer.from_pretrained(tmp_path / "model", TrainerConfig(job, store_dir=str(tmp_path / "store"))) as t:
        engine = json.loads(json.dumps(t.plan.summary(), default=str))
        placed = t.plan.placement_bytes(t.profile)
    assert r["plan"] == engine and r["placement_bytes"] == placed
    assert engine["optimizer"] == "adamw8bit" and engine["policies"]["recompute"] == 4
    # the job's defaults, not a planner's own: batch 4 x 128 unless the job says otherwise
    code, r = _json(capsys, ["plan", "llm", "--model", "tiny-llama", "--hardware", str(hw), "--json"])
    assert code == 0 and (r["batch"], r["seq_len"]) == (4, 128)


@pytest.mark.parametrize("fmt, state, update", [("adamw", "AdamW moments", "AdamW"),
                                                ("adamw8bit", "8-bit AdamW moments", "8-bit AdamW"),
                                                ("adafactor", "Adafactor's factored second moments", "Adafactor")])
def test_a_plan_names_the_optimizer_state_it_plans(capsys, fmt, state, update):
    assert main(["plan", "llm", "--model", "tiny-llama", "--optimizer", fmt, "--hardware", "a100-server"]) == 0
    out = capsys.readouterr().out
    assert f"fp32 masters + {state}: " in out and f"| CPU {update} " in out, out
    if fmt != "adamw":
        assert "AdamW moments" not in out.replace(state, "") and "CPU AdamW " not in out


def test_a_kept_profile_answers_the_same_question_without_profiling_again(capsys, monkeypatch):
    """[Note: kept profiles]: the second process asking the same question reads the profile the first kept (no
    model code imported, no skeleton built) and gets the same plan; another question is profiled."""
    from terastack.llm import plan_cmd
    from terastack.llm.engine import profile

    argv = ["plan", "llm", "--model", "tiny-llama", "--hardware", "rtx4090-workstation", "--json"]
    monkeypatch.setattr(plan_cmd, "_PROFILES", {})
    code, first = _json(capsys, argv)
    fresh = next(iter(plan_cmd._PROFILES.values()))
    (kept,) = profile.unit_times_path().parent.glob("profiles/*.json")
    # in the profile's own order: the planner reads tensors in order, and ties go to the first
    assert code == 0 and list(json.loads(kept.read_text())["tensor_numel"]) == list(fresh.tensor_numel)
    monkeypatch.setattr(plan_cmd, "_PROFILES", {})   # a new process
    made = []
    real = profile.profile_config
    monkeypatch.setattr(profile, "profile_config", lambda *a, **k: made.append(1) or real(*a, **k))
    code, again = _json(capsys, argv)
    assert code == 0 and again == first and made == []
    code, other = _json(capsys, [*argv, "--batch-size", "2"])
    assert code == 0 and made == [1] and other["batch"] == 2
