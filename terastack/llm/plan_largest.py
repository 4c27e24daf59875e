"""``terastack plan llm --largest``: the largest model each optimizer state format fully fine-tunes on a machine.

For each format (``adamw``, ``adamw8bit``, ``adafactor``) the built-in models of :data:`LADDER` are planned from
the largest down; the first whose plan fits the device and host budgets and whose state the disk holds is that
format's answer, with the planner's bytes per parameter per step. Beside it, the parameters whose state the
disk could hold at that format's bytes per parameter (the bound a larger built-in shape would meet first), and
a LoRA fine-tune of the largest Llama shape over an NF4 base (:mod:`terastack.plan.base_formats`): whether it
fits the accelerator, and its predicted step. Every figure is the planner's (a prediction for a described
machine).
"""
from __future__ import annotations

import json

from terastack.units import format_bytes

#: built-in shapes tried, smallest first
LADDER = ("llama-1.1b", "openllama-3b", "llama-3-8b", "llama-2-13b", "llama-3-70b", "opt-175b")
#: the LoRA question: this shape, this rank, its base in NF4
LORA_MODEL, LORA_RANK = "llama-3-70b", 16


def _planned(plan_model, job, args, hw, changes: dict) -> tuple:
    """(profile, plan or None, error or None): ``plan_model`` (the plan command's) of ``job`` with ``changes``
    (``section.field`` -> value)."""
    from terastack.training.job import with_settings

    return plan_model(with_settings(job, changes), hw, args)


def largest_per_format(plan_model, job, args, hw, ladder=LADDER) -> list[dict]:
    """Per optimizer format: the largest of ``ladder`` that fits (planned largest first), or None."""
    from terastack.plan.optimizer_formats import FORMATS

    rows = []
    for fmt in FORMATS:
        row = {"optimizer": fmt, "model": None, "reason": None}
        for model in reversed(ladder):
            profile, plan, error = _planned(plan_model, job, args, hw, {
                "model.path": model, "training.optimizer": fmt, "lora.rank": None, "lora.base_format": "auto"})
            if row["reason"] is None and error is not None:
                row["reason"] = f"{model}: {error}"  # why the largest does not fit
            if plan is None:
                continue
            state = profile.state_bytes(FORMATS[fmt])
            row.update(model=model, parameters=profile.total_params, training_state_bytes=state,
                       state_bytes_per_parameter=state / profile.total_params,
                       bytes_per_parameter_per_step=plan.bytes_per_parameter(profile),
                       predicted_step_s=plan.prediction.step_s, bottleneck=plan.prediction.bottleneck)
            if hw.disk_bytes:
                row["disk_holds_parameters"] = int(hw.disk_bytes / row["state_bytes_per_parameter"])
            break
        rows.append(row)
    return rows


def nf4_lora(plan_model, job, args, hw, model=LORA_MODEL) -> dict:
    """A LoRA fine-tune of ``model`` (the job's rank, else :data:`LORA_RANK`) over an NF4 base: fits or not."""
    rank = job.lora.rank or LORA_RANK
    profile, plan, error = _planned(plan_model, job, args, hw, {"model.path": model, "lora.rank": rank,
                                                               "lora.base_format": "nf4"})
    out = {"model": model, "lora_rank": rank, "base_format": "nf4", "fits": plan is not None,
           "base_bytes": sum(profile.frozen_bytes(t) for t, tr in profile.tensor_trainable.items() if not tr)}
    if plan is None:
        out["reason"] = str(error)
        return out
    p = plan.prediction
    out.update(predicted_step_s=p.step_s, tokens_per_s=p.tokens_per_s, bottleneck=p.bottleneck,
               device_peak_bytes=p.device_peak_bytes, device_budget=plan.device_budget,
               host_peak_bytes=p.host_peak_bytes)
    return out


def run_largest(plan_model, job, args, hw, ladder=LADDER) -> int:
    """Print (or ``--json``) the largest model per format and the NF4 LoRA answer for ``job``'s other settings
    (its batch, budgets...); ``plan_model``: the plan command's planning of one job."""
    rows = largest_per_format(plan_model, job, args, hw, ladder)
    lora = nf4_lora(plan_model, job, args, hw, model=ladder[-1] if ladder != LADDER else LORA_MODEL)
    machine = hw.name + ("" if hw.measured else " (hypothetical: every figure is a prediction)")
    if args.json:
        print(json.dumps({"hardware": hw.to_dict(), "prediction": not hw.measured, "largest": rows,
                          "nf4_lora": lora, "ladder": list(ladder)}, indent=1, default=str))
        return 0
    print(f"largest full fine-tune per optimizer format on {machine}, of {', '.join(ladder)}"
          f" (batch {job.training.batch_size} x {job.training.seq_len} tokens):")
    for r in rows:
        if r["model"] is None:
            print(f"  {r['optimizer']:10s} none fits ({r['reason']})")
            continue
        per = r["bytes_per_parameter_per_step"]
        disk = (f"; the disk holds the state of {r['disk_holds_parameters'] / 1e9:.0f}B parameters"
                if r.get("disk_holds_parameters") else "")
        print(f"  {r['optimizer']:10s} {r['model']} ({r['parameters'] / 1e9:.3g}B): state "
              f"{format_bytes(r['training_state_bytes'])} ({r['state_bytes_per_parameter']:.3g} B/param), SSD "
              f"{per['read']:.3g} + {per['written']:.3g} bytes per parameter per step read + written, step "
              f"{r['predicted_step_s']:.3g} s{disk}")
    what = f"{lora['model']} LoRA r{lora['lora_rank']} over an NF4 base ({format_bytes(lora['base_bytes'])})"
    if lora["fits"]:
        gpu = "the accelerator" if not hw.gpu_memory_bytes else f"the {format_bytes(hw.gpu_memory_bytes)} GPU"
        print(f"  {what}: fits {gpu} (device peak {format_bytes(lora['device_peak_bytes'])}), step "
              f"{lora['predicted_step_s']:.3g} s, {lora['tokens_per_s']:.4g} tokens/s; bottleneck: "
              f"{lora['bottleneck']}")
    else:
        print(f"  {what}: does not fit: {lora['reason']}")
    return 0
