"""Baseline: PyTorch FSDP2 (``fully_shard``) on a CPU gloo mesh, same model, data, seeds and AdamW.

Each layer and the root are wrapped with ``fully_shard``; FSDP2 prefetches the
next layer's all-gather and reduce-scatters gradients, and ``torch.optim.AdamW``
steps the sharded parameters on every worker. Exposed communication is the
time the training thread spends inside FSDP2's collectives and waits on them,
measured by timing the ``torch.distributed`` calls FSDP2 makes (and waits on
the work objects they return). ``python -m terastack.disdp.fsdp2 JOB.json`` under torchrun;
:func:`run_bench` is the same on ``terastack bench dist --model``'s model and batches.
"""
from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from terastack.disdp.baseline import finish_baseline, init_baseline, save_final
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.launch import rank_main
from terastack.disdp.bench.spec import BenchSpec, init_std, init_tensor, worker_rows
from terastack.disdp.held_state import StateCensus
from terastack.disdp.job_stats import optimizer_state_bytes
from terastack.disdp.buckets import Layout, find_layers
from terastack.disdp.workload import build_model, loss_of, worker_batch


class CommTimer:
    """Times the calling thread's collective calls and waits (the training thread's exposed communication)."""

    NAMES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
             "all_reduce")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.thread = threading.get_ident()
        self._saved = {}

    def _timed(self, fn):
        timer = self

        class TimedWork:
            def __init__(self, work):
                self._work = work

            def wait(self, *a, **k):
                t0 = time.perf_counter()
                try:
                    return self._work.wait(*a, **k)
                finally:
                    if threading.get_ident() == timer.thread:
                        timer.seconds += time.perf_counter() - t0

            def __getattr__(self, name):
                return getattr(self._work, name)

        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
            finally:
                if threading.get_ident() == timer.thread:
                    timer.seconds += time.perf_counter() - t0
            return TimedWork(out) if out is not None and hasattr(out, "wait") else out
        return call

    def __enter__(self) -> "CommTimer":
        for name in self.NAMES:
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._timed(self._saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def shard(model, world: int, *, reshard: bool) -> None:
    """``fully_shard`` on every decoder layer and the root, on a CPU mesh of ``world`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    _, layers = find_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh)


def train_steps(model, opt, batch_of, steps: int) -> dict:
    """``steps`` steps of forward, backward and AdamW; per step its seconds, the seconds the training thread spent
    in FSDP2's collectives, and the loss."""
    step_s, wait_s, losses = [], [], []
    with CommTimer() as timer:
        for step in range(steps):
            batch = batch_of(step)
            t0, c0 = time.perf_counter(), timer.seconds
            loss = loss_of(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_s.append(time.perf_counter() - t0)
            wait_s.append(timer.seconds - c0)
            losses.append(float(loss.detach()))
    return {"step_s": step_s, "wait_s": wait_s, "loss": losses}


def run(config: TrainConfig) -> int:
    rank, world = init_baseline(config, "FSDP2")
    census = StateCensus() if config.census else None   # [Note: state a worker holds]
    spec = config.model_spec()
    model = build_model(spec, seed=config.seed)
    layout = Layout.of(model, 1)
    names = {id(p): n for n, p in model.named_parameters()}
    shard(model, world, reshard=config.reshard)
    params = {names[id(p)] if id(p) in names else n: p for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                            weight_decay=config.weight_decay)
    stats = train_steps(model, opt, lambda step: worker_batch(spec, step=step, seed=config.seed,
                                                              micro_batch=config.micro_batch, worker=rank,
                                                              workers=world), config.steps)
    if census is not None:
        stats["held_state"] = census.held_beyond_model()   # before the full parameters are gathered for the check
    full = {n: p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for n, p in params.items()}
    if rank == 0:
        save_final(config, layout, layout.flatten(full), config.steps)
    return finish_baseline(config, rank, stats)


def materialize(module: torch.nn.Module, prefix: str, *, seed: int, std: float) -> None:
    """Give ``module``'s meta parameters their benchmark values ([Note: the benchmark's initial weights] in
    terastack.disdp.bench.spec), one tensor at a time."""
    for sub_name, sub in module.named_modules(prefix=prefix):
        for name, p in list(sub._parameters.items()):
            if p is not None and p.is_meta:
                full = f"{sub_name}.{name}" if sub_name else name
                sub._parameters[name] = torch.nn.Parameter(init_tensor(full, p.shape, seed=seed, std=std))


def run_bench(spec: BenchSpec, rank: int, world: int) -> dict:
    """FSDP2 on the benchmark's model: built on the meta device, each decoder layer made and sharded before the
    next is made (a rank never holds the whole model), the root's parameters last; AdamW as the job's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from terastack.training.hf.model_files import build_skeleton

    hf = spec.hf_config()
    model = build_skeleton(hf)   # meta parameters, real buffers (the rotary tables)
    std = init_std(hf)
    mesh = init_device_mesh("cpu", (world,))
    layers_name, layers = find_layers(model)
    for i, layer in enumerate(layers):
        materialize(layer, f"{layers_name}.{i}", seed=spec.seed, std=std)
        fully_shard(layer, mesh=mesh, reshard_after_forward=spec.reshard)
    materialize(model, "", seed=spec.seed, std=std)
    fully_shard(model, mesh=mesh)
    t = spec.job().training
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)
    vocab = hf.vocab_size
    stats = train_steps(model, opt, lambda step: worker_rows(spec, step, vocab, rank), spec.total_steps)
    return stats | {"optimizer_state_bytes": optimizer_state_bytes()}   # while the optimizer is alive


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(rank_main(run))   # [Note: a process leaves without teardown]
