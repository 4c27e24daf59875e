"""Checkpoint and resume a full fine-tune of an OpenLLaMA-3B-shaped Llama under one 4 GiB budget for the whole
process, and check that the resumed run continues exactly where the first one was.

    MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4194304 \\
        python benchmarks/llm-3b-checkpoint-resume.py DIR [--layers N] [--steps K] [--model NAME] [--copy]

Run A trains K steps from the built-in model's random initialisation (the 26-layer OpenLLaMA-3B shape,
3.43B parameters, by default), writing a checkpoint after step K-1. Run B resumes from that checkpoint and
trains step K on the same batch. Each run is a process of its own (as a user's resume is), under the same
4 GiB for the whole process. The figures: step K's loss in A and in B (equal bit for bit when the resume is
exact), a digest of three parameters after step K in each run, the checkpoint's bytes, write and resume
times, each process's peak RSS (VmHWM), and ``checkpoint_extra_bytes``: the most disk bytes the checkpoint
held beyond the store's own, sampled from the file system during both runs (the store's data files'
allocated blocks plus the checkpoint directory's, less the bytes of the store's records).

The checkpoint is written beside the store (``save_checkpoint(beside_store=True)``): the store pins a commit
and the checkpoint refers to it, so writing it copies nothing, and run B continues in run A's store. What it
holds beyond the store is the pinned versions of the records rewritten since (``checkpoint_held_bytes``, the
store's own count): up to the whole state (12 bytes a parameter) after one step, since every master and moment
is rewritten once a step. ``--copy`` writes the checkpoint as a copy of the state instead (run B then
resumes in a new store). Either way DIR needs up to twice the state free (82 GB for 3.43B parameters);
``--layers`` keeps the shape of every layer and takes fewer of them (23 layers: 3.06B parameters, 73 GB).
The run refuses to start, naming both numbers, when DIR lacks the space. Prints one JSON line; DIR's stores
and checkpoint are removed at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from terastack.llm import Trainer, TrainerConfig
from terastack.training.model_registry import hf_config
from terastack.memory import memory_left, peak_rss
from terastack.units import format_bytes

PROCESS_BUDGET = 4 << 30
#: parameters whose values after the last step are compared between the two runs
PROBES = ("model.norm.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")


def digest(trainer: Trainer) -> dict[str, str]:
    """sha256 of each probe parameter's fp32 bytes (one tensor in memory at a time)."""
    out = {}
    for name in PROBES:
        out[name] = hashlib.sha256(trainer.parameter(name).numpy()).hexdigest()[:16]  # hashed in place
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--model", default="openllama-3b", help="a built-in Llama (default openllama-3b)")
    p.add_argument("--layers", type=int, default=None,
                   help="keep this many of the model's layers (default: all, 26 for openllama-3b)")
    p.add_argument("--steps", type=int, default=3, help="steps of run A; the checkpoint follows step K-1")
    p.add_argument("--state-placement", default=None,
                   help="where masters and moments rest (TrainerConfig.state_placement; default: the plan's "
                        "choice); 'ssd' puts a tiny model's state on the SSD, as the 3.4B model's is")
    p.add_argument("--copy", action="store_true", help="copy the state into the checkpoint (not beside the store)")
    p.add_argument("--phase", choices=["a", "b"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.layers is not None and args.layers < 1:
        p.error("--layers: at least 1")
    if args.steps < 2:
        p.error("--steps: at least 2 (a checkpoint after step K-1, then step K)")
    root = Path(args.dir)
    config = hf_config(args.model)
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    if args.phase:
        result = run_a(root, config, args) if args.phase == "a" else run_b(root, args)
        result["peak_rss_bytes"] = peak_rss()
        print(json.dumps(result))
        return 0
    root.mkdir(parents=True, exist_ok=True)
    params = _parameters(config)
    # the store holds an fp32 master and two fp32 moments per parameter, and the checkpoint up to as much again
    # (a copy, or the pinned versions of what one step rewrites); and room for activations and manifests
    need = 2 * 12 * params + (2 << 30)
    free = shutil.disk_usage(root).free
    if need > free:
        print(f"llm-3b-checkpoint-resume: needs {format_bytes(need)} free in {root} (the store of {params:,} "
              f"parameters and what its checkpoint holds beyond it), has {format_bytes(free)}; use --layers to "
              "take fewer layers",
              file=sys.stderr)
        return 2
    result: dict = {"model": args.model, "layers": config.num_hidden_layers, "parameters": params,
                    "state_bytes": 12 * params, "beside_store": not args.copy, "disk_free_bytes": free,
                    "disk_needed_bytes": need}
    # each run is a process of its own, as a user's resume is: the budget is the whole process's either way
    forward = [args.dir, "--model", args.model, "--steps", str(args.steps)]
    forward += ["--layers", str(args.layers)] if args.layers is not None else []
    forward += ["--copy"] if args.copy else []
    forward += ["--state-placement", args.state_placement] if args.state_placement else []
    try:
        for phase in ("a", "b"):
            proc = subprocess.run([sys.executable, __file__, *forward, "--phase", phase], stdout=subprocess.PIPE,
                                  text=True)
            if proc.returncode != 0:
                print(f"llm-3b-checkpoint-resume: run {phase.upper()} failed (exit {proc.returncode})",
                      file=sys.stderr)
                return 1
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            out[f"{phase}_peak_rss_bytes"] = out.pop("peak_rss_bytes")
            result.update(out)
    finally:
        for d in ("store-a", "store-b", "ckpt"):
            shutil.rmtree(root / d, ignore_errors=True)
    result["peak_rss_bytes"] = max(result["a_peak_rss_bytes"], result["b_peak_rss_bytes"])
    for key in ("checkpoint_extra_bytes", "checkpoint_held_bytes"):
        result[key] = max(result.pop(f"a_{key}"), result.pop(f"b_{key}"))
    result["checkpoint_extra_fraction"] = result["checkpoint_extra_bytes"] / result["state_bytes"]
    result["resumed_loss_equal"] = result["b_loss"] == result["a_losses"][-1]
    result["resumed_parameters_equal"] = result["b_digest"] == result["a_digest"]
    result["peak_rss_within_4gib"] = result["peak_rss_bytes"] <= PROCESS_BUDGET
    print(json.dumps(result))
    return 0 if result["resumed_loss_equal"] and result["resumed_parameters_equal"] else 1


def _batch() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (1, 256), generator=gen)  # one batch repeated: its loss must fall


def _trainer_config(store: Path, placement: str | None) -> TrainerConfig:
    more = {"state_placement": placement} if placement else {}
    return TrainerConfig(store_dir=str(store), memory_budget=memory_left(PROCESS_BUDGET, "4 GiB"), seq_len=256,
                         batch_size=1, lr=1e-4, **more)


def disk_bytes(path: Path) -> int:
    """Bytes the file system allocated to the files under ``path`` (st_blocks: holes and unwritten tails are
    not counted, fallocated space is)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class ExtraBytes:
    """Samples, while a trainer runs, the disk bytes its checkpoint holds beyond its store's own: the store's
    data files and the checkpoint directory as the file system counts them, less the bytes of the store's
    records (``usage()``: live extents less those held only for a pinned commit)."""

    def __init__(self, trainer: Trainer, ckpt: Path, *, every: float = 0.5):
        self.trainer, self.ckpt, self.every = trainer, ckpt, every
        self.extra = self.held = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        store = self.trainer.store
        ssd = store.usage()["ssd"]
        # a data file's allocated blocks up to its last extent: the fallocated tail past it is room to grow
        on_disk = sum(min(disk_bytes(Path(d["dir"]) / name), d["used"]) for d in ssd["dirs"]
                      for name in os.listdir(d["dir"]) if name.startswith("data") and name.endswith(".bin"))
        on_disk += disk_bytes(self.ckpt)
        self.extra = max(self.extra, on_disk - (ssd["live"] - ssd["held"]))
        self.held = max(self.held, ssd["held"])

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self, phase: str) -> dict:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {f"{phase}_checkpoint_extra_bytes": self.extra, f"{phase}_checkpoint_held_bytes": self.held}


def run_a(root: Path, config, args) -> dict:
    """K steps from the random initialisation, the checkpoint after step K-1. A copied checkpoint's store is
    removed after; one beside the store keeps it (run B continues in it)."""
    store, ckpt, batch = root / "store-a", root / "ckpt", _batch()
    result: dict = {"a_losses": []}
    t0 = time.perf_counter()
    try:
        with Trainer.from_config(config, _trainer_config(store, args.state_placement), name=f"{args.model}-{config.num_hidden_layers}l") as a:
            result["a_setup_s"] = time.perf_counter() - t0
            sampler = ExtraBytes(a, ckpt)
            for k in range(args.steps):
                if k == args.steps - 1:
                    t1 = time.perf_counter()
                    a.save_checkpoint(ckpt, beside_store=not args.copy)
                    result["checkpoint_write_s"] = time.perf_counter() - t1
                    result["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
                    sampler.sample()
                result["a_losses"].append(a.step(batch))
                print(f"run A step {k + 1}: loss {result['a_losses'][-1]:.6f}", file=sys.stderr, flush=True)
            result.update(sampler.stop("a"))
            result["a_step_s"] = [h.seconds for h in a.history]
            result["a_digest"] = digest(a)
    finally:
        if args.copy:
            shutil.rmtree(store, ignore_errors=True)
    return result


def run_b(root: Path, args) -> dict:
    """Resume from run A's checkpoint -- in run A's store when it is beside it, else in a new store -- and take
    step K on the same batch."""
    store, ckpt = root / "store-b", root / "ckpt"
    t0 = time.perf_counter()
    with Trainer.load_checkpoint(ckpt, _trainer_config(store, args.state_placement)) as b:
        result = {"resume_s": time.perf_counter() - t0}
        sampler = ExtraBytes(b, ckpt)
        result["b_loss"] = b.step(_batch())
        print(f"run B step {args.steps}: loss {result['b_loss']:.6f}", file=sys.stderr, flush=True)
        result.update(sampler.stop("b"))
        result["b_step_s"] = b.history[-1].seconds
        result["b_digest"] = digest(b)
    return result


def _parameters(config) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    sys.exit(main())
