"""One system of ``terastack bench llm``, run in its own process so its peak memory is its own.

    python -m terastack.llm.bench.bench_worker --system terastack --model llama-150m --out result.json ...

Systems: ``in_memory`` (the unmodified model and torch.optim.AdamW in RAM), ``terastack`` (the offloading
trainer under the given budgets), ``host_resident`` (the trainer with a host budget holding the whole state,
its steps alternating with in-memory AdamW's in the same process), ``zero_infinity`` (DeepSpeed ZeRO-3 with parameters and optimizer state
offloaded to NVMe, on CPU). Every system trains the same model (same random init seed) on the same token
batches; the worker reports per-step times, peak RSS above the RSS after imports, and bytes the process read
from and wrote to storage per step (/proc/self/io).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time


def _io() -> tuple[int, int]:
    """Bytes this process read from and wrote to storage (O_DIRECT and page-cache writeback included)."""
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out["read_bytes"], out["write_bytes"]


def _batches(vocab: int, batch: int, seq: int, n: int, grad_accum: int = 1):
    """``n`` steps' token ids: one (batch, seq) tensor per step, or with ``grad_accum`` > 1 a list of that many
    micro-batches per step."""
    import torch

    g = torch.Generator().manual_seed(1234)
    steps = [[torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(grad_accum)] for _ in range(n)]
    return [micro[0] for micro in steps] if grad_accum == 1 else steps


def _measure(step_fn, batches, warmup: int, rss) -> dict:
    times, losses, reads, writes = [], [], [], []
    for i, ids in enumerate(batches):
        r0, w0 = _io()
        t0 = time.perf_counter()
        loss = step_fn(ids)
        dt = time.perf_counter() - t0
        r1, w1 = _io()
        losses.append(loss)
        if i >= warmup:
            times.append(dt)
            reads.append(r1 - r0)
            writes.append(w1 - w0)
        print(f"  step {i} {'(warm-up) ' if i < warmup else ''}{dt:.3f} s loss {loss:.4f}", file=sys.stderr,
              flush=True)
        rss.sample()
    return {"step_s": statistics.median(times), "step_times_s": times, "losses": losses,
            "ssd_read_bytes_per_step": statistics.mean(reads), "ssd_write_bytes_per_step": statistics.mean(writes)}


def _measure_alternating(step_fns: dict, batches, warmup: int, rss) -> dict:
    """Like :func:`_measure` for several systems in one process, their steps interleaved (each batch runs on
    every system before the next batch; the order rotates each batch), so a machine that drifts between
    minutes slows them alike."""
    names = list(step_fns)
    runs = {name: {"times": [], "cpu": [], "losses": [], "reads": [], "writes": []} for name in names}
    for i, ids in enumerate(batches):
        for name in names[i % len(names):] + names[:i % len(names)]:
            r0, w0 = _io()
            c0, t0 = time.process_time(), time.perf_counter()
            loss = step_fns[name](ids)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            r1, w1 = _io()
            run = runs[name]
            run["losses"].append(loss)
            if i >= warmup:
                run["times"].append(dt)
                run["cpu"].append(cpu)
                run["reads"].append(r1 - r0)
                run["writes"].append(w1 - w0)
            print(f"  step {i} {name} {'(warm-up) ' if i < warmup else ''}{dt:.3f} s loss {loss:.4f}",
                  file=sys.stderr, flush=True)
            rss.sample()
    # CPU seconds of the whole process (every thread) per step: on a shared machine, time other tenants take
    # from this one lengthens the wall-clock step but is not counted here
    return {name: {"step_s": statistics.median(run["times"]), "step_times_s": run["times"], "losses": run["losses"],
                   "cpu_s": statistics.median(run["cpu"]), "step_cpu_s": run["cpu"],
                   "ssd_read_bytes_per_step": statistics.mean(run["reads"]),
                   "ssd_write_bytes_per_step": statistics.mean(run["writes"])} for name, run in runs.items()}


def _in_memory_step(args, hf_config):
    """A step of the unmodified model with torch.optim.AdamW, all in RAM."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(hf_config)
    model.train()
    fused = args.optimizer_impl in ("auto", "fused")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=fused or None)

    def step(ids):
        micro = ids if isinstance(ids, list) else [ids]
        total = 0.0
        for part in micro:  # gradient accumulation: the mean over the micro-batches (equal token counts)
            out = model(input_ids=part, labels=part, use_cache=False)
            (out.loss / len(micro)).backward()
            total += float(out.loss.detach()) / len(micro)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total
    return step


def run_in_memory(args, hf_config, rss) -> dict:
    return _measure(_in_memory_step(args, hf_config),
                    _batches(hf_config.vocab_size, args.batch_size, args.seq_len, args.warmup + args.steps,
                             args.grad_accum), args.warmup, rss)


def run_host_resident(args, hf_config, rss) -> dict:
    """terastack with a host budget that holds the whole training state (no SSD traffic), its steps alternating
    with those of in-memory AdamW in this one process: the cost of terastack's own machinery, measured so that
    a busy machine's drift between processes does not pass for it."""
    from terastack.llm import Trainer, TrainerConfig

    fields = dict(store_dir=args.dir, device_budget=args.device_budget, host_budget=args.host_budget, lr=args.lr,
                  batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
                  activation_policy=args.activation_policy, state_placement=args.state_placement,
                  optimizer_impl=args.optimizer_impl, calibrate=True, hardware=args.hardware)
    in_memory = _in_memory_step(args, hf_config)
    with Trainer.from_config(hf_config, TrainerConfig(**fields), name=args.model) as trainer:
        print(trainer.describe_plan(), file=sys.stderr, flush=True)
        out = _measure_alternating({"in_memory": in_memory, "terastack": trainer.step},
                                   _batches(hf_config.vocab_size, args.batch_size, args.seq_len,
                                            args.warmup + args.steps), args.warmup, rss)
        trainer.synchronize()
        hist = trainer.history[args.warmup:]
        out["terastack"].update({"predicted_step_s": trainer.plan.prediction.step_s, "plan": trainer.plan.summary(),
                                 "store_read_bytes_per_step": statistics.mean(h.ssd_read_bytes for h in hist),
                                 "store_write_bytes_per_step": statistics.mean(h.ssd_write_bytes for h in hist)})
    return out


#: terastack variants: TrainerConfig overrides (the ablations of `terastack bench llm`)
VARIANTS = {
    "planned": {},
    "no_active_offload": {"active_offload": False},
    "all_recompute": {"activation_policy": "recompute"},
    "all_swap": {"activation_policy": "ssd"},
}


def run_terastack(args, hf_config, rss) -> dict:
    """Each variant in turn (its own Trainer and scratch store); peak RSS is reset between variants."""
    from terastack.memory import PeakRSS

    import gc

    out = {}
    planned_policies = None
    for i, name in enumerate(args.variants.split(",")):
        if name not in VARIANTS:
            raise ValueError(f"--variants: unknown variant {name!r} (known: {', '.join(VARIANTS)})")
        overrides = dict(VARIANTS[name])
        if "activation_policy" not in overrides and planned_policies is not None:
            overrides["activation_policy"] = planned_policies  # an ablation changes one thing only
        gc.collect()
        # the first variant starts from the process's baseline; later ones from what earlier ones left mapped
        with PeakRSS() as vrss:
            out[name] = _run_variant(args, hf_config, vrss, overrides, trace_file=args.trace if i == 0 else None)
        if planned_policies is None:
            planned_policies = out[name]["policies"]
        out[name]["peak_rss_bytes"] = vrss.peak_bytes
        rss.sample()
    return out


def _run_variant(args, hf_config, rss, overrides: dict, trace_file) -> dict:
    from terastack import trace
    from terastack.llm.bench.step_timeline import step_timelines
    from terastack.llm import Trainer, TrainerConfig

    if args.process_memory_budget:
        # the whole process's resident memory is bounded: the trainer gets what the interpreter and the
        # libraries loaded so far leave of it
        from terastack.memory import memory_left
        from terastack.units import parse_bytes

        whole = parse_bytes(args.process_memory_budget, field="--process-memory-budget")
        budgets = {"memory_budget": memory_left(whole, "--process-memory-budget")}
    elif args.memory_budget:
        budgets = {"memory_budget": args.memory_budget}
    else:
        budgets = {"device_budget": args.device_budget, "host_budget": args.host_budget}
    fields = dict(store_dir=args.dir, **budgets, lr=args.lr, grad_accum=args.grad_accum,
                  batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
                  activation_policy=args.activation_policy, state_placement=args.state_placement,
                  optimizer_impl=args.optimizer_impl, calibrate=True, hardware=args.hardware,
                  optimizer=args.optimizer, dtype=args.dtype)
    fields.update(overrides)
    t0 = time.perf_counter()
    if args.lora:  # adapters over a frozen random base, initialized straight into the store
        from terastack.llm.trainer_config import LoraSpec

        fields["lora"] = LoraSpec(r=args.lora, alpha=2 * args.lora, base_format=args.base_format)
    with Trainer.from_config(hf_config, TrainerConfig(**fields), name=args.model) as trainer:
        setup = time.perf_counter() - t0
        print(trainer.describe_plan(), file=sys.stderr, flush=True)
        # always traced: the step's timeline is read out of it ([Note: the step's timeline])
        trace.tracer.start()

        def step(ids):
            if isinstance(ids, list):
                return trainer.step_accumulated([{"input_ids": part} for part in ids])
            return trainer.step(ids)

        out = _measure(step, _batches(hf_config.vocab_size, args.batch_size, args.seq_len, args.warmup + args.steps,
                                      args.grad_accum), args.warmup, rss)
        trainer.synchronize()
        trace.tracer.stop()
        if trace_file:
            trace.tracer.save(trace_file)
        timeline = step_timelines(trace.tracer.events())[args.warmup:]
        trace.tracer.clear()
        for key in ("compute_s", "stall_s", "update_s", "disk_busy_share"):
            out[key] = statistics.median(t[key] for t in timeline) if timeline else None
        hist = trainer.history[args.warmup:]
        out.update({"setup_s": setup, "predicted_step_s": trainer.plan.prediction.step_s,
                    "policies": list(trainer.plan.policies),
                    "plan": trainer.plan.summary(), "usage": trainer.usage(),
                    "predicted_bytes_by_kind": dict(trainer.plan.prediction.bytes_by_kind or {}),
                    "store_read_bytes_per_step": statistics.mean(h.ssd_read_bytes for h in hist),
                    "store_write_bytes_per_step": statistics.mean(h.ssd_write_bytes for h in hist),
                    "bytes_by_kind_per_step": {k: statistics.mean(h.bytes_by_kind.get(k, 0) for h in hist)
                                               for k in hist[-1].bytes_by_kind}})
    return out


def run_zero_infinity(args, hf_config, rss) -> dict:
    """DeepSpeed ZeRO-Infinity ([Note: ZeRO-Infinity configured for the model] in terastack.llm.bench.zero_infinity)."""
    from terastack.llm.bench import zero_infinity

    batches = _batches(hf_config.vocab_size, args.batch_size, args.seq_len, args.warmup + args.steps, args.grad_accum)
    return zero_infinity.run(args, hf_config, rss, _measure, batches)


SYSTEMS = {"in_memory": run_in_memory, "terastack": run_terastack, "host_resident": run_host_resident,
           "zero_infinity": run_zero_infinity}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m terastack.llm.bench.bench_worker")
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    p.add_argument("--model", default="llama-150m")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--device-budget", default="1GiB")
    p.add_argument("--host-budget", default="1GiB")
    p.add_argument("--memory-budget", default=None, help="one budget for device and host tiers (CPU)")
    p.add_argument("--process-memory-budget", default=None,
                   help="one budget for the whole process's resident memory (CPU): the trainer's memory budget is "
                        "what remains of it after the interpreter and libraries")
    p.add_argument("--activation-policy", default="auto")
    p.add_argument("--variants", default="planned", help=f"terastack variants, comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--state-placement", default="auto")
    p.add_argument("--optimizer-impl", default="auto")
    p.add_argument("--optimizer", default="adamw", help="terastack's optimizer state format")
    p.add_argument("--trace", default=None)
    p.add_argument("--hardware", default=None, help="probe JSON the planner predicts from")
    p.add_argument("--lora", type=int, default=None,
                   help="terastack: train a LoRA adapter of this rank over a frozen random base")
    p.add_argument("--base-format", default="auto", help="with --lora: lora.base_format")
    p.add_argument("--dtype", default="auto", help="terastack: the compute dtype (store.dtype)")
    p.add_argument("--zero-max-in-cpu", type=int, default=None,
                   help="zero_infinity: parameter elements DeepSpeed keeps in host memory instead of on the NVMe "
                        "(default DeepSpeed's, 1e9; 0: every parameter on the NVMe)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    # Everything imported before the baseline, so peak RSS counts the system's own memory
    # (masking_utils pulls in torch._dynamo, which must also come before DeepSpeed patches tensor creation).
    import importlib

    for module in ("torch", "transformers.masking_utils"):
        importlib.import_module(module)
    from transformers import AutoModelForCausalLM

    from terastack.training.model_registry import resolve_model
    from terastack.memory import PeakRSS, peak_rss

    hf_config, _ = resolve_model(args.model)
    # No padding row: ZeRO-3's partitioned init cannot zero it, and every system must train the same model.
    hf_config.pad_token_id = None
    AutoModelForCausalLM._model_mapping[type(hf_config)]  # imports the model's modules
    if args.system == "zero_infinity":
        importlib.import_module("deepspeed")
    if args.lora:  # peft wraps the model; bitsandbytes quantizes an NF4 base (80 MB of modules between them)
        importlib.import_module("peft")
        if args.base_format != "native":
            importlib.import_module("bitsandbytes.functional")
    import gc

    gc.collect()
    with PeakRSS() as rss:
        result = SYSTEMS[args.system](args, hf_config, rss)
    if args.system != "terastack":
        result["peak_rss_bytes"] = rss.peak_bytes
    result["rss_baseline_bytes"] = rss.baseline
    # the whole process's high-water mark since the baseline was taken (imports before it are smaller)
    result["process_peak_rss_bytes"] = peak_rss()
    result["system"] = args.system
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
