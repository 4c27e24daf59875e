"""Baseline: a serial ZeRO-3-style schedule — sharded parameters and optimizer on the workers, collectives
in the compute thread.

Each of the W workers owns slice ``w`` of every bucket (fp32 master weights
and AdamW moments, a ``torch.optim.AdamW`` per bucket). Per bucket the compute
thread all-gathers the parameters before use (blocking), and after the
bucket's backward reduce-scatters the gradients (blocking) and steps the
optimizer on its slice: every collective sits on the compute path, which is
what the disaggregated design removes. Same hooks, same buckets, same data as
the disaggregated job; ``python -m terastack.disdp.zero3 JOB.json`` under torchrun (:func:`run_bench`: the
same on ``terastack bench dist --model``'s model and batches).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from terastack.disdp.baseline import finish_baseline, init_baseline, save_final
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.launch import rank_main
from terastack.disdp.bench.spec import BenchSpec, init_std, init_tensor, worker_rows
from terastack.disdp.held_state import StateCensus
from terastack.disdp.job_stats import optimizer_state_bytes
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.workload import build_model, loss_of, worker_batch
from terastack.disdp.worker import ShardedModel


class SerialZero3Link:
    """The worker's link in the ZeRO-3 baseline: blocking collectives and the optimizer in the compute thread."""

    def __init__(self, sharded: ShardedModel, layout: Layout, flat_of, adamw: dict, rank: int, world: int):
        """``flat_of(b)``: bucket ``b``'s initial parameters, flat (asked once per bucket); ``adamw``: the
        optimizer's settings (``torch.optim.AdamW``'s keywords)."""
        self.sharded, self.layout, self.rank, self.world = sharded, layout, rank, world
        self.schedule = sharded.schedule
        self.comm_s = 0.0
        self.shards: list[torch.nn.Parameter] = []
        self.optimizers: list[torch.optim.AdamW] = []
        for b, bucket in enumerate(sharded.buckets):
            chunk = bucket.numel // world
            padded = torch.zeros(bucket.numel)
            flat = flat_of(b)
            padded[:flat.numel()] = flat
            del flat
            shard = torch.nn.Parameter(padded[rank * chunk:(rank + 1) * chunk].clone())
            self.shards.append(shard)
            self.optimizers.append(torch.optim.AdamW([shard], **adamw))

    def begin_step(self, step: int) -> None:
        pass

    def wait_params(self, slot: int) -> None:
        b = self.schedule.fetch_order[slot].bucket
        # `.data`: an alias with its own version counter, so the gather does not look like an in-place
        # change to the parameters autograd saved ([Note: storage resized in place] in worker.py).
        dist.all_gather_single(self.sharded.buckets[b].materialize().data, self.shards[b].detach())

    def released(self, bucket: int) -> None:
        pass

    def push_grad(self, bucket: int, grad: torch.Tensor) -> None:
        shard = self.shards[bucket]
        out = torch.empty_like(shard.detach())
        t0 = time.perf_counter()
        dist.reduce_scatter_single(out, grad)
        self.comm_s += time.perf_counter() - t0
        shard.grad = out.div_(self.world)
        self.optimizers[bucket].step()
        shard.grad = None

    def end_step(self) -> None:
        pass

    def sent(self) -> None:
        pass   # each gradient's reduce-scatter blocked the compute thread until it was done

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def train_steps(sharded: ShardedModel, link: SerialZero3Link, batch_of, steps: int) -> dict:
    """``steps`` steps; per step its seconds, the seconds spent in (and waiting on) collectives, and the loss."""
    step_s, wait_s, losses = [], [], []
    for step in range(steps):
        batch = batch_of(step)
        t0, w0, c0 = time.perf_counter(), sharded.wait_s, link.comm_s
        sharded.begin_step(step)
        loss = loss_of(sharded.model, batch)
        loss.backward()
        sharded.finish_step()
        step_s.append(time.perf_counter() - t0)
        # Exposed communication: all-gathers (waited in the hooks) plus reduce-scatters, all in this thread.
        wait_s.append(sharded.wait_s - w0 + link.comm_s - c0)
        losses.append(float(loss.detach()))
    return {"step_s": step_s, "wait_s": wait_s, "loss": losses}


def run(config: TrainConfig) -> int:
    rank, world = init_baseline(config, "ZeRO-3")
    census = StateCensus() if config.census else None   # [Note: state a worker holds]
    spec = config.model_spec()
    meta = build_model(spec, seed=config.seed, meta=True)
    layout = Layout.of(meta, 1)
    initial = layout.flatten(dict(build_model(spec, seed=config.seed).named_parameters()))
    sharded = ShardedModel(meta, layout, Schedule(layout, reshard=config.reshard), pad_multiple=world)
    adamw = dict(lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, weight_decay=config.weight_decay)
    link = sharded.link = SerialZero3Link(sharded, layout, initial.__getitem__, adamw, rank, world)
    initial.clear()  # the shards hold their slices now
    stats = train_steps(sharded, link, lambda step: worker_batch(spec, step=step, seed=config.seed,
                                                                 micro_batch=config.micro_batch, worker=rank,
                                                                 workers=world), config.steps)
    if census is not None:
        stats["held_state"] = census.held_beyond_model()   # before the full parameters are gathered for the check
    # Gather the full parameters for the correctness check.
    flats = []
    for b, bucket in enumerate(sharded.buckets):
        full = torch.empty(bucket.numel)
        dist.all_gather_single(full, link.shards[b].detach())
        flats.append(full[:layout.buckets[b].numel])
    if rank == 0:
        save_final(config, layout, flats, config.steps)
    return finish_baseline(config, rank, stats | {"peak_param_bytes": sharded.peak_param_bytes,
                                                  "model_param_bytes": layout.numel * 4,
                                                  "param_bytes_after_run": sharded.resident_param_bytes()})


def run_bench(spec: BenchSpec, rank: int, world: int) -> dict:
    """The serial ZeRO-3 schedule on the benchmark's model: each rank makes only its slice of each bucket's
    initial weights, one bucket at a time ([Note: the benchmark's initial weights] in
    terastack.disdp.bench.spec); AdamW as the job's."""
    from terastack.training.hf.model_files import build_skeleton

    hf = spec.hf_config()
    meta = build_skeleton(hf)
    layout = Layout.of(meta, 1)
    std = init_std(hf)

    def flat_of(b: int) -> torch.Tensor:
        bucket = layout.buckets[b]
        flat = torch.empty(bucket.numel)
        for slot in bucket.params:
            flat[slot.offset:slot.offset + slot.numel] = init_tensor(slot.name, slot.shape, seed=spec.seed,
                                                                     std=std).reshape(-1)
        return flat

    t = spec.job().training
    sharded = ShardedModel(meta, layout, Schedule(layout, reshard=spec.reshard), pad_multiple=world)
    link = sharded.link = SerialZero3Link(sharded, layout, flat_of,
                                          dict(lr=spec.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay),
                                          rank, world)
    vocab = hf.vocab_size
    stats = train_steps(sharded, link, lambda step: worker_rows(spec, step, vocab, rank), spec.total_steps)
    return stats | {"peak_param_bytes": sharded.peak_param_bytes, "optimizer_state_bytes": optimizer_state_bytes()}


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(rank_main(run))   # [Note: a process leaves without teardown]
