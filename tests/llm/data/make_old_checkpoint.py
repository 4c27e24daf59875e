"""Writes the old-format checkpoint fixture of tests/llm/test_checkpoint_format.py.

Written by the code at commit c9ae8ec (terastack's checkpoint code before the checkpoint became a manager over
``Stateful`` components); the fixture only means something if it is regenerated with that code:

    git archive c9ae8ec | tar -x -C /tmp/terastack-c9ae8ec
    PYTHONPATH=/tmp/terastack-c9ae8ec python tests/llm/data/make_old_checkpoint.py

It writes, next to this script:

- ``old_checkpoint/``: a tiny GPT-2 (one layer; tied embeddings and dropout, so the RNG state matters) trained
  two steps with gradient clipping, checkpointed with a loop state in its ``extra`` as ``terastack finetune``
  wrote it;
- ``old_checkpoint_expected.safetensors``: every parameter after two more steps of the same, uninterrupted run
  (batches 3 and 4 of ``llm_helpers.batches(4)``), and the losses of those steps in its metadata.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_helpers import batches, make_model  # noqa: E402

from terastack.llm import Trainer, TrainerConfig  # noqa: E402
from terastack.plan.hardware import Hardware  # noqa: E402

#: the trainer settings of the fixture (tests/llm/conftest.py's ``trainer_config`` with clipping)
SETTINGS = dict(device_budget="64MiB", host_budget="64MiB", lr=1e-3, weight_decay=0.01, batch_size=2, seq_len=16,
                calibrate=False, optimizer_impl="single", max_grad_norm=1.0)
#: what ``terastack finetune`` stored with a checkpoint at step 2 (one micro-batch per step)
LOOP = {"step": 2, "micro_batches": 2, "batch_size": 2, "grad_accum": 1, "seed": 0,
        "schedule": {"kind": "constant", "lr": 1e-3, "total_steps": 4, "warmup_steps": 0, "min_lr": 0.0}}


def main() -> None:
    import terastack.llm.checkpoint as old

    if not hasattr(old, "fill_from_checkpoint"):
        sys.exit("run this with the code of commit c9ae8ec on PYTHONPATH (see the docstring)")
    out = HERE / "old_checkpoint"
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_model("gpt2", tmp / "model", layers=1)
        hw = Hardware(name="test machine", measured=True, cores=2, host_memory_bytes=8 << 30, cpu_flops=2e10,
                      memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=1e9, ssd_write_bytes_per_s=8e8,
                      cpu_adam_params_per_s=2e8)
        (tmp / "hw.json").write_text(json.dumps(hw.to_dict()))
        config = TrainerConfig(store_dir=str(tmp / "store"), hardware=str(tmp / "hw.json"), **SETTINGS)
        data = batches(4)
        with Trainer.from_pretrained(tmp / "model", config) as trainer:
            torch.manual_seed(5)
            for ids in data[:2]:
                trainer.step(ids)
            trainer.save_checkpoint(out, extra={"note": "written by the code at commit c9ae8ec", "loop": LOOP})
            losses = [trainer.step(ids) for ids in data[2:]]
            expected = trainer.state_dict()
    save_file({k: v.contiguous() for k, v in expected.items()}, str(HERE / "old_checkpoint_expected.safetensors"),
              metadata={"losses": json.dumps(losses), "written_by": "c9ae8ec"})
    print(f"wrote {out} ({sum(p.stat().st_size for p in out.rglob('*') if p.is_file())} bytes)")


if __name__ == "__main__":
    main()
