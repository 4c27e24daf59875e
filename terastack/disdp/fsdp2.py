"""Baseline: PyTorch FSDP2 (``fully_shard``) on a CPU gloo mesh, same model, data, seeds and AdamW.

Each layer and the root are wrapped with ``fully_shard``; FSDP2 prefetches the
next layer's all-gather and reduce-scatters gradients, and ``torch.optim.AdamW``
steps the sharded parameters on every worker. Exposed communication is the
time the training thread spends inside FSDP2's collectives and waits on them,
measured by timing the ``torch.distributed`` calls FSDP2 makes (and waits on
the work objects they return). ``python -m terastack.disdp.fsdp2 JOB.json`` under torchrun.
"""
from __future__ import annotations

import sys
import threading
import time

import torch
import torch.distributed as dist

from terastack.disdp.baseline import finish_baseline, init_baseline, save_final
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.launch import rank_main
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


def run(config: TrainConfig) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = init_baseline(config, "FSDP2")
    spec = config.model_spec()
    model = build_model(spec, seed=config.seed)
    layout = Layout.of(model, 1)
    names = {id(p): n for n, p in model.named_parameters()}
    mesh = init_device_mesh("cpu", (world,))
    _, layers = find_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=config.reshard)
    fully_shard(model, mesh=mesh)
    params = {names[id(p)] if id(p) in names else n: p for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
                            weight_decay=config.weight_decay)
    step_s, wait_s, losses = [], [], []
    with CommTimer() as timer:
        for step in range(config.steps):
            batch = worker_batch(spec, step=step, seed=config.seed, micro_batch=config.micro_batch, worker=rank,
                                 workers=world)
            t0, c0 = time.perf_counter(), timer.seconds
            loss = loss_of(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_s.append(time.perf_counter() - t0)
            wait_s.append(timer.seconds - c0)
            losses.append(float(loss.detach()))
    full = {n: p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for n, p in params.items()}
    if rank == 0:
        save_final(config, layout, layout.flatten(full), config.steps)
    return finish_baseline(config, rank, {"step_s": step_s, "wait_s": wait_s, "loss": losses})


if __name__ == "__main__":
    sys.exit(rank_main(run))
