"""Checkpoint and resume a full fine-tune of an OpenLLaMA-3B-shaped Llama under one 4 GiB budget for the whole
process, and check that the resumed run continues exactly where the first one was.

    MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=262144 \\
        python benchmarks/llm-3b-checkpoint-resume.py DIR [--layers N] [--steps K] [--model NAME]

Run A trains K steps from the built-in model's random initialisation, writing a checkpoint after step K-1;
its store is then deleted. Run B resumes from that checkpoint in a new store and trains step K on the same
batch. The figures: step K's loss in A and in B (equal bit for bit when the resume is exact), a digest of three
parameters after step K in each run, the checkpoint's bytes and write/read times, and the process's peak RSS
(VmHWM).

The store and the checkpoint each hold the whole training state (16 bytes a parameter), so DIR needs twice the
state free: 82 GB for the 26-layer OpenLLaMA-3B shape (3.43B parameters). ``--layers`` keeps the shape of every
layer and takes fewer of them (23 layers: 3.06B parameters, 73 GB), for a disk that cannot hold two copies of
the 3.43B state. The run refuses to start, naming both numbers, when DIR lacks the space. Prints one JSON line;
DIR's store and checkpoint are removed at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig

from terastack.llm import Trainer, TrainerConfig
from terastack.llm.builtin import MODELS
from terastack.memory import current_rss, peak_rss
from terastack.units import format_bytes

PROCESS_BUDGET = 4 << 30
#: parameters whose values after the last step are compared between the two runs
PROBES = ("model.norm.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")


def digest(trainer: Trainer) -> dict[str, str]:
    """sha256 of each probe parameter's fp32 bytes (one tensor in memory at a time)."""
    out = {}
    for name in PROBES:
        t = trainer.parameter(name).contiguous()
        out[name] = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
        del t
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--model", default="openllama-3b", help="a built-in Llama (default openllama-3b)")
    p.add_argument("--layers", type=int, default=None, help="keep this many of the model's layers")
    p.add_argument("--steps", type=int, default=3, help="steps of run A; the checkpoint follows step K-1")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps: at least 2 (a checkpoint after step K-1, then step K)")
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    fields = dict(MODELS[args.model])
    if args.layers is not None:
        fields["num_hidden_layers"] = args.layers
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    params = _parameters(config)
    need = 2 * 16 * params + (2 << 30)  # store + checkpoint, and room for activations and the manifest
    free = shutil.disk_usage(root).free
    if need > free:
        print(f"llm-3b-checkpoint-resume: needs {format_bytes(need)} free in {root} (store and checkpoint of "
              f"{params:,} parameters), has {format_bytes(free)}; use --layers to take fewer layers",
              file=sys.stderr)
        return 2
    store_a, store_b, ckpt = root / "store-a", root / "store-b", root / "ckpt"
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (1, 256), generator=gen)  # one batch repeated: its loss must fall
    name = f"{args.model}-{config.num_hidden_layers}l"
    result: dict = {"model": args.model, "layers": config.num_hidden_layers, "parameters": params,
                    "disk_free_bytes": free, "disk_needed_bytes": need}

    def trainer_config(store: Path) -> TrainerConfig:
        return TrainerConfig(store_dir=str(store), memory_budget=PROCESS_BUDGET - current_rss(), seq_len=256,
                             batch_size=1, lr=1e-4)
    try:
        t0 = time.perf_counter()
        with Trainer.from_config(config, trainer_config(store_a), name=name) as a:
            result["a_setup_s"] = time.perf_counter() - t0
            result["a_losses"] = []
            for k in range(args.steps):
                if k == args.steps - 1:
                    t1 = time.perf_counter()
                    a.save_checkpoint(ckpt)
                    result["checkpoint_write_s"] = time.perf_counter() - t1
                    result["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
                result["a_losses"].append(a.step(batch))
                print(f"run A step {k + 1}: loss {result['a_losses'][-1]:.6f}", file=sys.stderr, flush=True)
            result["a_step_s"] = [h.seconds for h in a.history]
            result["a_digest"] = digest(a)
        shutil.rmtree(store_a, ignore_errors=True)
        result["peak_rss_after_a_bytes"] = peak_rss()
        t0 = time.perf_counter()
        with Trainer.load_checkpoint(ckpt, trainer_config(store_b)) as b:
            result["resume_s"] = time.perf_counter() - t0
            result["b_loss"] = b.step(batch)
            print(f"run B step {args.steps}: loss {result['b_loss']:.6f}", file=sys.stderr, flush=True)
            result["b_step_s"] = b.history[-1].seconds
            result["b_digest"] = digest(b)
    finally:
        result["peak_rss_bytes"] = peak_rss()
        for d in (store_a, store_b, ckpt):
            shutil.rmtree(d, ignore_errors=True)
    result["resumed_loss_equal"] = result.get("b_loss") == result["a_losses"][-1]
    result["resumed_parameters_equal"] = result.get("b_digest") == result.get("a_digest")
    result["peak_rss_within_4gib"] = result["peak_rss_bytes"] <= PROCESS_BUDGET
    print(json.dumps(result))
    return 0 if result["resumed_loss_equal"] and result["resumed_parameters_equal"] else 1


def _parameters(config) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    sys.exit(main())
