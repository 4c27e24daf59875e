"""Where a step's time goes: in-memory AdamW (forward, backward, optimizer step) against terastack with the whole
state in host memory (forward, backward, and the inline AdamW updates inside backward), steps alternating in
one process on the same batches.

    python benchmarks/llm-overhead-phases.py [--model llama-150m|tiny] [--steps N]

``--model tiny`` keeps llama-150m's 20 decoder layers (23 units) at hidden size 64: compute is negligible, so
terastack's step minus the in-memory step is the engine's fixed per-step cost (Python per unit, per tensor,
per saved activation). Prints medians in milliseconds and one JSON line.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from terastack import trace
from terastack.llm import Trainer, TrainerConfig
from terastack.training.model_registry import hf_config


def model_config(name: str):
    """(config, vocabulary, sequence length) of the measured model."""
    if name == "tiny":
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=20,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256), 512, 128
    config = hf_config(name)
    return config, config.vocab_size, 256


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-150m", help="tiny, or a built-in model name (default llama-150m)")
    p.add_argument("--steps", type=int, default=10, help="measured steps of each system (after 2 warm-up steps)")
    args = p.parse_args()
    config, vocab, seq = model_config(args.model)
    torch.manual_seed(0)
    batches = [torch.randint(0, vocab, (1, seq)) for _ in range(args.steps + 2)]
    model = AutoModelForCausalLM.from_config(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    state = sum(p.numel() for p in model.parameters()) * 16

    def in_memory(ids) -> dict:
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        t1 = time.perf_counter()
        out.loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "adamw": t3 - t2, "step": t3 - t0}

    im, ts = collections.defaultdict(list), collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainerConfig(store_dir=d, host_budget=max(int(state * 1.25), 256 << 20), device_budget=512 << 20,
                            lr=1e-4, batch_size=1, seq_len=seq, calibrate=True)
        with Trainer.from_config(config, cfg) as trainer:
            for i, ids in enumerate(batches):
                a = in_memory(ids)
                trace.tracer.start()
                t0 = time.perf_counter()
                trainer.step(ids)
                b = collections.Counter({"step": time.perf_counter() - t0})
                trace.tracer.enabled = False
                for e in trace.tracer.events():
                    if e.get("ph") != "X":
                        continue
                    if e["cat"] == "phase" and e["name"] in ("forward", "backward"):
                        b[e["name"]] += e["dur"] / 1e6
                    elif e["name"].startswith("adamw "):
                        b["adamw"] += e["dur"] / 1e6  # inside backward: inline updates
                if i >= 2:
                    for k, v in a.items():
                        im[k].append(v)
                    for k, v in b.items():
                        ts[k].append(v)
    med = {sysname: {k: statistics.median(v) * 1e3 for k, v in runs.items()}
           for sysname, runs in (("in_memory", im), ("terastack", ts))}
    for sysname, m in med.items():
        print(f"{sysname:10s} " + "  ".join(f"{k} {v:.0f} ms" for k, v in m.items()))
    result = {"model": args.model, "steps": args.steps, "median_ms": med,
              "extra_ms_per_step": med["terastack"]["step"] - med["in_memory"]["step"],
              "step_ratio": med["terastack"]["step"] / med["in_memory"]["step"]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
