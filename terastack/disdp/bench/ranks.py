"""One rank of a system of ``terastack bench dist --model``: ``python -m terastack.disdp.bench.ranks SPEC.json``
under torchrun. Every rank writes its figures to ``RUN_DIR/stats/rank-N.json``.

The terastack system is the disaggregated job as ``terastack dist train`` runs it (:mod:`terastack.disdp.job_run`
joins the ranks, :mod:`terastack.disdp.job_engine` gives every role its part and rank 0 its engine, servers keep
their state where ``disdp.state`` says); only the driver differs: rank 0 steps the engine on the benchmark's
batches instead of a data set, and times every step. FSDP2 and ZeRO-3 run :func:`terastack.disdp.fsdp2.run_bench`
and :func:`terastack.disdp.zero3.run_bench` on the same batches and initial weights.
"""
from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from terastack import trace
from terastack.disdp.bench.spec import BenchSpec, global_batch, init_std, init_tensor, write_rank_stats
from terastack.disdp.comm import join_process_group
from terastack.disdp.roles import Role
from terastack.disdp.shutdown import exit_rank


class TimedWorker:
    """A worker's part of every pass, timed: the pass's seconds and the seconds its hooks waited for parameters
    (the rest of the pass is its compute)."""

    def __init__(self, worker):
        self.worker = worker
        self.sharded = worker.sharded
        self.pass_s: list[float] = []
        self.wait_s: list[float] = []

    def run_pass(self, command, rows: dict) -> float:
        t0, w0 = time.perf_counter(), self.sharded.wait_s
        loss = self.worker.run_pass(command, rows)
        self.pass_s.append(time.perf_counter() - t0)
        self.wait_s.append(self.sharded.wait_s - w0)
        return loss


class InitialShard(Mapping):
    """A server's slice of every bucket of the benchmark's initial weights, made when asked for, one bucket at a
    time ([Note: the benchmark's initial weights] in terastack.disdp.bench.spec)."""

    def __init__(self, layout, server: int, *, seed: int, std: float):
        self.layout, self.server, self.seed, self.std = layout, server, seed, std

    def __len__(self) -> int:
        return len(self.layout.buckets)

    def __iter__(self):
        return iter(range(len(self.layout.buckets)))

    def __getitem__(self, b: int) -> torch.Tensor:
        lo, hi = self.layout.shard(b, self.server)
        out = torch.empty(hi - lo)
        for slot in self.layout.buckets[b].params:
            start, end = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
            if start < end:
                full = init_tensor(slot.name, slot.shape, seed=self.seed, std=self.std).reshape(-1)
                out[start - lo:end - lo] = full[start - slot.offset:end - slot.offset]
        return out


def run_terastack(spec: BenchSpec) -> int:
    from terastack.disdp.job_run import join_job

    job = spec.job()
    if spec.trace_dir:
        trace.tracer.start()
    me, control = join_job(job)
    try:
        run_terastack_rank(spec, me, control)
        if spec.trace_dir:
            trace.tracer.save(Path(spec.trace_dir) / f"rank-{me.rank}-{me.role.value}{me.index}.json")
        dist.monitored_barrier(group=control.group, timeout=datetime.timedelta(seconds=spec.timeout_s),
                               wait_all_ranks=True)
    finally:
        me.liveness.close()   # its thread ends before the group goes ([Note: a thread inside the network at exit])
    dist.destroy_process_group()
    return 0


def run_terastack_rank(spec: BenchSpec, me, control) -> None:
    """Rank 0 steps the engine on the benchmark's batches and times them; every other rank follows."""
    from terastack.disdp.job_engine import DisdpEngine, JobWorker, follow, part_of

    vocab = me.hf_config.vocab_size
    if me.rank == 0:
        worker = TimedWorker(JobWorker(me))
        engine = DisdpEngine(me, control, worker, lr=spec.lr, hf_config=me.hf_config, model_dir=None)
        step_s, losses = [], []
        for step in range(spec.total_steps):
            t0 = time.perf_counter()
            losses.append(engine.step(input_ids=global_batch(spec, step, vocab)))
            step_s.append(time.perf_counter() - t0)
        memory = engine.stop()
        stats = {"step_s": step_s, "pass_s": worker.pass_s, "wait_s": worker.wait_s, "loss": losses, **memory}
    else:
        shard = (InitialShard(me.layout, me.index, seed=spec.seed, std=init_std(me.hf_config))
                 if me.role is Role.SERVER else None)
        part = part_of(me, control, shard)
        del shard
        timed = None
        if me.role is Role.WORKER:
            timed = part.worker = TimedWorker(part.worker)
        try:
            follow(me, control, part)
        finally:
            if hasattr(part, "close"):
                part.close()
        stats = {"pass_s": timed.pass_s, "wait_s": timed.wait_s} if timed is not None else {}
    write_rank_stats(spec, me.rank, {"rank": me.rank, "role": me.role.value, "index": me.index} | stats)


def run_baseline(spec: BenchSpec) -> int:
    from terastack.disdp import fsdp2, zero3

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(spec.threads)
    join_process_group("cpu", rank=rank, world_size=world, timeout_s=spec.timeout_s)   # the baselines' CPU mesh
    stats = {"fsdp2": fsdp2.run_bench, "zero3": zero3.run_bench}[spec.system](spec, rank, world)
    write_rank_stats(spec, rank, {"rank": rank, "role": "worker", "index": rank} | stats)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run(spec: BenchSpec) -> int:
    return run_terastack(spec) if spec.system == "terastack" else run_baseline(spec)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    return exit_rank(record(run), BenchSpec.load(argv[0]))   # [Note: a thread inside the network at exit]


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
