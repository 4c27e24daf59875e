"""Checkpoint and resume a full fine-tune of an OpenLLaMA-3B-shaped Llama under one 4 GiB budget for the whole
process: a process killed with SIGKILL inside a step resumes and continues exactly where a run never killed is.

    MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4194304 \\
        python benchmarks/llm-3b-checkpoint-resume.py DIR [--layers N] [--steps K] [--kill-at F] [--model NAME]
                                                         [--optimizer FORMAT] [--copy] [--fork]

Three processes, each under the same 4 GiB for the whole process (as a user's runs are), on the built-in
model's random initialisation (the 26-layer OpenLLaMA-3B shape, 3.43B parameters, by default) and one batch:

* run A trains, writes a checkpoint beside the store after step 1 that follows every later step
  (``save_checkpoint(beside_store=True, follow=True)``: [Note: a checkpoint that follows the step] in
  terastack.llm.step_checkpoint), and kills itself with SIGKILL inside step K, once the checkpoint's last point
  covers ``--kill-at`` (default 0.5) of the state updated in that step;
* run B resumes from the checkpoint in run A's store, finishes step K from the point and reports its loss;
* run R trains K steps in a store of its own without a checkpoint: the reference.

The figures: step K's loss in B and in R (equal bit for bit when the resume is exact), a digest of three
parameters after step K in each, the points written per step and the time they took, A's followed steps beside
R's, each process's peak RSS (VmHWM), and ``checkpoint_extra_bytes``: the most disk bytes the checkpoint held
beyond the store's own, sampled from the file system during A and B (the store's data files' allocated blocks
plus the checkpoint directory's, less the bytes of the store's records). ``--copy`` writes the checkpoint as a
copy of the state after step K-1 instead (run B resumes in a new store and takes step K; run A, not killed, is
the reference). DIR needs the state and a quarter more free (53 GB for 3.43B parameters; twice the state with
``--copy``); ``--layers`` keeps the shape of every layer and takes fewer of them. The run refuses to start,
naming both numbers, when DIR lacks the space. Prints one JSON line; DIR's stores and checkpoint are removed at
the end. ``--fork`` starts each run as a fork of the script's process (its modules imported: seconds less per
run for a small model) instead of a new interpreter. ``--optimizer adamw8bit --model llama-3-8b --steps 2`` is
the 8B full fine-tune of the optimizer formats' figures (its 128256-row embedding and head stream in parts:
[Note: vocabulary slices] in terastack.llm.vocab_slices).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from terastack.llm import Trainer, TrainerConfig
from terastack.training.model_registry import hf_config
from terastack.memory import memory_left, peak_rss
from terastack.plan.optimizer_formats import optimizer_format
from terastack.units import format_bytes

PROCESS_BUDGET = 4 << 30
#: parameters whose values after the last step are compared between the two runs
PROBES = ("model.norm.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")


def digest(trainer: Trainer) -> dict[str, str]:
    """sha256 of each probe parameter's fp32 bytes, part by part where the engine slices it (one part in memory at
    a time: a whole 8B head is 2 GiB)."""
    out = {}
    for name in PROBES:
        h = hashlib.sha256()
        for part in trainer.slicing.parts.get(name, [name]):
            h.update(trainer.parameter(part).numpy())  # hashed in place
        out[name] = h.hexdigest()[:16]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--model", default="openllama-3b", help="a built-in Llama (default openllama-3b)")
    p.add_argument("--layers", type=int, default=None,
                   help="keep this many of the model's layers (default: all, 26 for openllama-3b)")
    p.add_argument("--steps", type=int, default=3, help="K: run A is killed inside step K (default 3)")
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="run A is killed once the checkpoint covers this share of step K's updates (default 0.5)")
    p.add_argument("--state-placement", default=None,
                   help="where masters and moments rest (TrainerConfig.state_placement; default: the plan's "
                        "choice); 'ssd' puts a tiny model's state on the SSD, as the 3.4B model's is")
    p.add_argument("--optimizer", default="adamw", help="the optimizer state format (training.optimizer; default "
                   "adamw)")
    p.add_argument("--vocab-slice", default=None, help="offload.vocab_slice (default: the job's, 256MiB)")
    p.add_argument("--copy", action="store_true", help="copy the state into the checkpoint (not beside the store)")
    p.add_argument("--fork", action="store_true", help="start each run as a fork of this process, its modules "
                   "imported (seconds less per run, for small models), not as a new interpreter")
    p.add_argument("--phase", choices=["a", "b", "r"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.layers is not None and args.layers < 1:
        p.error("--layers: at least 1")
    if args.steps < 2:
        p.error("--steps: at least 2 (a checkpoint after step 1, then step K)")
    if not 0 < args.kill_at < 1:
        p.error("--kill-at: a share between 0 and 1")
    root = Path(args.dir)
    config = hf_config(args.model)
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    if args.phase:
        print(json.dumps(_phase(args.phase, root, config, args)))
        return 0
    root.mkdir(parents=True, exist_ok=True)
    params = _parameters(config)
    # the store holds an fp32 master and the format's state per parameter (AdamW: two fp32 moments), and the
    # checkpoint a share of it beyond (a copy: as much again); and room for activations and manifests
    state = 4 * params + optimizer_format(args.optimizer).state_bytes((params,))
    need = int((2 if args.copy else 1.25) * state) + (2 << 30)
    free = shutil.disk_usage(root).free
    if need > free:
        print(f"llm-3b-checkpoint-resume: needs {format_bytes(need)} free in {root} (the store of {params:,} "
              f"parameters and what its checkpoint holds beyond it), has {format_bytes(free)}; use --layers to "
              "take fewer layers",
              file=sys.stderr)
        return 2
    result: dict = {"model": args.model, "layers": config.num_hidden_layers, "parameters": params,
                    "optimizer": args.optimizer, "state_bytes": state, "beside_store": not args.copy,
                    "steps": args.steps,
                    "disk_free_bytes": free, "disk_needed_bytes": need}
    # each run is a process of its own, as a user's resume is: the budget is the whole process's either way
    forward = [args.dir, "--model", args.model, "--steps", str(args.steps), "--kill-at", str(args.kill_at),
               "--optimizer", args.optimizer]
    forward += ["--layers", str(args.layers)] if args.layers is not None else []
    forward += ["--copy"] if args.copy else []
    forward += ["--state-placement", args.state_placement] if args.state_placement else []
    forward += ["--vocab-slice", args.vocab_slice] if args.vocab_slice else []
    try:
        for phase in ("a", "b") if args.copy else ("a", "b", "r"):
            code, stdout = _start(phase, forward, root, config, args)
            killed = phase == "a" and not args.copy
            if code != (-signal.SIGKILL if killed else 0):
                print(f"llm-3b-checkpoint-resume: run {phase.upper()} "
                      f"{'was not killed inside the step' if killed else 'failed'} (exit {code})",
                      file=sys.stderr)
                return 1
            out = json.loads((root / f"run-{phase}.json").read_text() if killed or args.fork
                             else stdout.strip().splitlines()[-1])
            out[f"{phase}_peak_rss_bytes"] = out.pop("peak_rss_bytes")
            result.update(out)
            if phase == "b":
                for d in ("store-a", "store-b", "ckpt"):  # the reference's store takes their room
                    shutil.rmtree(root / d, ignore_errors=True)
    finally:
        for d in ("store-a", "store-b", "store-r", "ckpt", "run-a.json", "run-b.json", "run-r.json"):
            target = root / d
            target.unlink(missing_ok=True) if target.is_file() else shutil.rmtree(target, ignore_errors=True)
    _compare(result, args)
    print(json.dumps(result))
    return 0 if result["resumed_loss_equal"] and result["resumed_parameters_equal"] else 1


def _compare(result: dict, args) -> None:
    """The figures across the runs: the peaks, what the checkpoint held, and whether B equals the reference."""
    result["peak_rss_bytes"] = max(v for k, v in result.items() if k.endswith("_peak_rss_bytes"))
    for key in ("checkpoint_extra_bytes", "checkpoint_held_bytes"):
        result[key] = max(result[f"a_{key}"], result[f"b_{key}"])
    result["checkpoint_extra_fraction"] = result["checkpoint_extra_bytes"] / result["state_bytes"]
    reference = "a" if args.copy else "r"
    result["resumed_loss_equal"] = result["b_loss"] == result[f"{reference}_losses"][-1]
    result["resumed_parameters_equal"] = result["b_digest"] == result[f"{reference}_digest"]
    if not args.copy:
        # the steps before the kill, A's and R's: the same losses, and what following the checkpoint cost
        result["a_losses_equal_reference"] = result["a_losses"] == result["r_losses"][:len(result["a_losses"])]
        followed = result["a_step_s"][1:]
        result["followed_step_s_ratio"] = (sum(followed) / len(followed)) / result["r_step_s"][-1] if followed \
            else None
    result["peak_rss_within_4gib"] = result["peak_rss_bytes"] <= PROCESS_BUDGET


def _phase(phase: str, root: Path, config, args) -> dict:
    """Run A, B or R in this process: what it measured, its peak RSS among it."""
    result = {"a": run_a, "b": run_b, "r": run_reference}[phase](root, config, args)
    result["peak_rss_bytes"] = peak_rss()
    return result


def _start(phase: str, forward: list[str], root: Path, config, args) -> tuple[int, str]:
    """Run ``phase`` in a process of its own: a new interpreter (``--phase``, its JSON line on stdout), or with
    ``--fork`` a fork of this one, its modules already imported (its JSON in DIR/run-PHASE.json). The exit status
    as subprocess gives it (-9: killed by SIGKILL) and the run's stdout."""
    if not args.fork:
        proc = subprocess.run([sys.executable, __file__, *forward, "--phase", phase], stdout=subprocess.PIPE,
                              text=True)
        return proc.returncode, proc.stdout

    def forked() -> None:
        (root / f"run-{phase}.json").write_text(json.dumps(_phase(phase, root, config, args)))

    import multiprocessing

    # the process has started no thread (nothing has run but imports and a model on the meta device)
    child = multiprocessing.get_context("fork").Process(target=forked, name=f"run {phase.upper()}")
    child.start()
    child.join()
    return child.exitcode, ""


def _batch() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (1, 256), generator=gen)  # one batch repeated: its loss must fall


def _trainer_config(store: Path, args) -> TrainerConfig:
    more = {"state_placement": args.state_placement} if args.state_placement else {}
    more.update({"vocab_slice": args.vocab_slice} if args.vocab_slice else {})
    return TrainerConfig(store_dir=str(store), memory_budget=memory_left(PROCESS_BUDGET, "4 GiB"), seq_len=256,
                         batch_size=1, lr=1e-4, optimizer=args.optimizer, **more)


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

    def figures(self, phase: str) -> dict:
        return {f"{phase}_checkpoint_extra_bytes": self.extra, f"{phase}_checkpoint_held_bytes": self.held}

    def stop(self, phase: str) -> dict:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.figures(phase)


def run_a(root: Path, config, args) -> dict:
    """Train from the random initialisation. Beside the store: the following checkpoint after step 1, and a
    SIGKILL inside step K (what the run measured is in DIR/run-a.json by then). With ``--copy``: K steps, the
    copied checkpoint after step K-1, the store removed after."""
    store, ckpt, batch = root / "store-a", root / "ckpt", _batch()
    result: dict = {"a_losses": []}
    t0 = time.perf_counter()
    try:
        with Trainer.from_config(config, _trainer_config(store, args),
                                 name=f"{args.model}-{config.num_hidden_layers}l") as a:
            result["a_setup_s"] = time.perf_counter() - t0
            sampler = ExtraBytes(a, ckpt)
            for k in range(args.steps):
                if k == (args.steps - 1 if args.copy else 1):
                    t1 = time.perf_counter()
                    a.save_checkpoint(ckpt, beside_store=not args.copy, follow=not args.copy)
                    result["checkpoint_write_s"] = time.perf_counter() - t1
                    result["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
                    sampler.sample()
                    if not args.copy:
                        a.following.on_written.append(_killer(a, args, sampler, result, root))
                result["a_losses"].append(a.step(batch))
                result["a_step_s"] = [h.seconds for h in a.history]
                print(f"run A step {k + 1}: loss {result['a_losses'][-1]:.6f}", file=sys.stderr, flush=True)
            result.update(sampler.stop("a"))
            result["a_digest"] = digest(a)
    finally:
        if args.copy:
            shutil.rmtree(store, ignore_errors=True)
    return result


def _killer(a: Trainer, args, sampler: "ExtraBytes", result: dict, root: Path):
    """On the checkpoint's thread: once a point inside step K covers ``--kill-at`` of the step's updates, write
    what run A measured and kill the process (SIGKILL: nothing of it runs after)."""
    following = a.following
    total = sum(following.taker.state_bytes.values())

    def after(point) -> None:
        covered = sum(following.taker.state_bytes.get(n, 0) for n in point.updated) / total
        if point.unit is None or point.step != args.steps - 1 or covered < args.kill_at:
            return
        sampler.sample()
        # the training thread may have returned from step K already (its points are written behind it): the
        # losses reported are those of the steps before K, the steps the checkpoint holds as finished
        out = {**result, **sampler.figures("a"), "a_losses": result["a_losses"][:args.steps - 1],
               "a_step_s": result.get("a_step_s", [])[:args.steps - 1],
               "killed_at_share": covered, "killed_at_unit": point.unit,
               "points_written": following.points_written, "point_write_s": following.write_seconds,
               "points": following.log,
               "peak_rss_bytes": peak_rss()}
        (root / "run-a.json").write_text(json.dumps(out))
        print(f"run A: killed inside step {args.steps} after the point at unit {point.unit} ({covered:.0%} of "
              "its updates)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return after


def run_b(root: Path, config, args) -> dict:
    """Resume from run A's checkpoint -- in run A's store when it is beside it (finishing step K from its point
    inside it), else in a new store (taking step K) -- on the same batch."""
    store, ckpt = root / "store-b", root / "ckpt"
    t0 = time.perf_counter()
    with Trainer.load_checkpoint(ckpt, _trainer_config(store, args)) as b:
        result = {"resume_s": time.perf_counter() - t0, "b_resumed_inside_step": b.step_count + 1}
        sampler = ExtraBytes(b, ckpt)
        result["b_loss"] = b.step(_batch())
        print(f"run B step {args.steps}: loss {result['b_loss']:.6f}", file=sys.stderr, flush=True)
        result.update(sampler.stop("b"))
        result["b_step_s"] = b.history[-1].seconds
        result["b_digest"] = digest(b)
    return result


def run_reference(root: Path, config, args) -> dict:
    """K steps from the same initialisation in a store of its own, no checkpoint: what A and B must equal."""
    store, batch = root / "store-r", _batch()
    with Trainer.from_config(config, _trainer_config(store, args),
                             name=f"{args.model}-{config.num_hidden_layers}l") as r:
        result = {"r_losses": [r.step(batch) for _ in range(args.steps)]}
        result["r_step_s"] = [h.seconds for h in r.history]
        result["r_digest"] = digest(r)
    return result


def _parameters(config) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    sys.exit(main())
