"""The language-model steps of benchmarks/gpu-check.sh (see docs/gpu.md): each writes one JSON file.

    python benchmarks/gpu_check.py llm --dtype bfloat16 --out FILE        mid-size Llama, 3 steps, trace stalls
    python benchmarks/gpu_check.py llm --dtype float32 --reference --out FILE   ... and the CPU reference
    python benchmarks/gpu_check.py bench-llm --model llama-1.1b --out FILE      vs in-memory training on the GPU
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

#: a Llama-3-like vocabulary on a small stack: the embedding and head dominate (about 0.26 G of 0.36 G params)
MID_LLAMA = dict(model_type="llama", vocab_size=128256, hidden_size=1024, intermediate_size=2816,
                 num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)


def _batches(vocab: int, n: int, batch: int, seq: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n)]


def _stalls(events: list[dict]) -> dict:
    """Seconds and count of the trainer's waits (the "stall" track) per kind."""
    out: dict[str, dict] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") and str(e.get("name", "")).startswith("wait"):
            kind = out.setdefault(e["cat"], {"count": 0, "seconds": 0.0})
            kind["count"] += 1
            kind["seconds"] += e["dur"] / 1e6
    return out


def llm(args) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from terastack import trace
    from terastack.llm import Trainer, TrainerConfig

    work = Path(tempfile.mkdtemp(prefix="terastack-gpu-check-", dir=args.dir))
    cfg = dict(MID_LLAMA)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(hf_config)  # fp32, on the CPU: the reference
    ref.save_pretrained(work / "model", safe_serialization=True)
    data = _batches(hf_config.vocab_size, args.steps, args.batch_size, args.seq_len)
    tc = TrainerConfig(store_dir=str(work / "store"), device="cuda", dtype=args.dtype, device_budget="auto",
                       host_budget=args.host_budget, calibrate=True, lr=1e-4, weight_decay=0.01,
                       batch_size=args.batch_size, seq_len=args.seq_len)
    torch.cuda.reset_peak_memory_stats()
    trace.tracer.start()
    result: dict = {"model": "llama vocab 128256 hidden 1024 8 layers", "dtype": args.dtype,
                    "host_budget": args.host_budget, "steps": args.steps}
    with Trainer.from_pretrained(work / "model", tc) as t:
        result["plan"] = t.plan.summary() if hasattr(t.plan, "summary") else str(t.plan)
        losses = [t.step(ids.cuda()) for ids in data]
        t.synchronize()
        trace.tracer.stop()
        result.update(losses=losses, step_s=[h.seconds for h in t.history],
                      peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                      peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                      stalls=_stalls(trace.tracer.events()), usage=t.store.usage())
        if args.reference:
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-4, weight_decay=0.01)
            ref_losses = []
            torch.manual_seed(tc.seed)
            for ids in data:
                out = ref(input_ids=ids, labels=ids, use_cache=False)
                out.loss.backward()
                opt.step()
                opt.zero_grad()
                ref_losses.append(out.loss.item())
            diff = max((t.parameter(n) - p.detach()).abs().max().item() for n, p in ref.named_parameters())
            result.update(reference_losses=ref_losses, max_weight_diff=diff, tolerance=1e-4,
                          matches_reference=diff <= 1e-4)
    return result


def bench_llm(args) -> dict:
    """terastack (bf16, device budget a quarter of the bf16 weights) against in-memory mixed-precision
    training on the same GPU (fp32 weights and AdamW, bf16 autocast), same model and batches."""
    from transformers import AutoModelForCausalLM

    from terastack.llm import Trainer, TrainerConfig
    from terastack.training.model_registry import resolve_model

    hf_config, _ = resolve_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="terastack-gpu-bench-", dir=args.dir))
    data = _batches(hf_config.vocab_size, args.warmup + args.steps, args.batch_size, args.seq_len)
    result: dict = {"model": args.model, "seq_len": args.seq_len, "batch_size": args.batch_size}

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    times = []
    for k, ids in enumerate(data):
        ids = ids.cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    result["in_memory_gpu"] = {"step_s": times, "peak_reserved_bytes": torch.cuda.max_memory_reserved()}
    del model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    device_budget = params * 2 // 4  # a quarter of the bf16 weights
    tc = TrainerConfig(store_dir=str(work / "store"), device="cuda", dtype="bfloat16",
                       device_budget=device_budget, host_budget=args.host_budget, calibrate=True, lr=1e-4,
                       batch_size=args.batch_size, seq_len=args.seq_len)
    with Trainer.from_config(hf_config, tc, name=args.model) as t:
        for ids in data:
            t.step(ids.cuda())
        t.synchronize()
        result["terastack"] = {"step_s": [h.seconds for h in t.history[args.warmup:]],
                               "device_budget": device_budget, "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                               "predicted_step_s": t.plan.prediction.step_s}
    mem = sorted(result["in_memory_gpu"]["step_s"])[len(times) // 2]
    ts = sorted(result["terastack"]["step_s"])[len(result["terastack"]["step_s"]) // 2]
    result.update(params=params, median_step_s={"in_memory_gpu": mem, "terastack": ts},
                  slowdown_vs_in_memory=ts / mem)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("llm")
    a.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    a.add_argument("--reference", action="store_true", help="train the fp32 CPU reference too and compare")
    a.add_argument("--steps", type=int, default=3)
    a.add_argument("--host-budget", default="2GiB")
    a.add_argument("--batch-size", type=int, default=1)
    a.add_argument("--seq-len", type=int, default=256)
    b = sub.add_parser("bench-llm")
    b.add_argument("--model", default="llama-1.1b")
    b.add_argument("--steps", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--host-budget", default="8GiB")
    b.add_argument("--batch-size", type=int, default=1)
    b.add_argument("--seq-len", type=int, default=512)
    for sp in (a, b):
        sp.add_argument("--dir", default=None, help="directory on the SSD for the store")
        sp.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here", file=sys.stderr)
        return 2
    result = llm(args) if args.what == "llm" else bench_llm(args)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
