"""Train the 3.4B built-in Llama (OpenLLaMA-3B shape) for a few steps under one 4 GiB budget for the whole process,
export it (float32, sharded) and check the export without loading the model: keys and shapes on the meta device
through transformers' conversions, sampled tensors against the trainer's masters.

    MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4194304 python benchmarks/llm-3b-export-check.py DIR [STEPS [MODEL]]

(MODEL: a built-in name, default openllama-3b; tiny-llama checks the script itself in seconds.)

DIR needs about 41 GB (the store) + 14 GB (the export) free; both are removed at the end. Prints one JSON line.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

from terastack.llm import Trainer, TrainerConfig
from terastack.training.model_registry import resolve_model
from terastack.training.hf.export_check import check_export
from terastack.memory import memory_left, peak_rss

PROCESS_BUDGET = 4 << 30


def main() -> int:
    root = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    store, out = root / "store", root / "export"
    store.mkdir(parents=True, exist_ok=True)
    model = sys.argv[3] if len(sys.argv) > 3 else "openllama-3b"
    hf_config, _ = resolve_model(model)
    config = TrainerConfig(store_dir=str(store), memory_budget=memory_left(PROCESS_BUDGET, "4 GiB"), seq_len=256,
                           batch_size=1, lr=1e-4)
    result: dict = {"model": model}
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    try:
        with Trainer.from_config(hf_config, config, name=model) as trainer:
            result["parameters"] = trainer.profile.total_params
            result["setup_s"] = time.perf_counter() - t0
            ids = torch.randint(0, 256, (1, 256), generator=gen)  # one batch repeated: its loss must fall
            result["losses"] = [trainer.step(ids) for _ in range(steps)]
            result["step_s"] = [h.seconds for h in trainer.history]
            t1 = time.perf_counter()
            trainer.save_pretrained(out, max_shard_size="2GB")
            result["export_s"] = time.perf_counter() - t1
            result["export_files"] = sorted(p.name for p in out.iterdir())
            result["export_bytes"] = sum(p.stat().st_size for p in out.iterdir())
            result["checked_tensors"] = check_export(out, trainer.parameter)  # float32: bit-equal
    finally:
        result["peak_rss_bytes"] = peak_rss()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    result["peak_rss_within_4gib"] = result["peak_rss_bytes"] <= PROCESS_BUDGET
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
