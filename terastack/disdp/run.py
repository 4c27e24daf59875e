"""One rank of a training job under torchrun: find its role, run that role's loop, write its statistics.

One step, as the roles see it ([Note: one schedule for every role] in
:mod:`terastack.disdp.buckets`)::

    server s        post sends of its slice of every bucket (fetch order) -> for b in grad order:
                    receive reduced gradient b, AdamW on slice b
    agent i         receive bucket deliveries from all servers (<= prefetch ahead) into worker i's buffers;
                    send each gradient bucket on as soon as the worker hands it over
    worker i        forward / backward of the unmodified model; hooks wait for deliveries and hand over
                    gradients; never holds optimizer state, holds no parameters between steps
    aggregator      for b in grad order: receive b from every agent, average, send slice s to server s

:func:`run_role` joins the job (:func:`join`), hands the rank to its role's
loop (:func:`run_worker`, :func:`run_server`, :func:`run_aggregator`,
:func:`run_agent`: each returns the figures its role reports) and leaves it
(:func:`leave`). How failures end the job: [Note: failures] in
:mod:`terastack.disdp.launch`. ``python -m terastack.disdp.run JOB.json``.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from terastack import trace
from terastack.disdp.agent import AgentCore, AgentProcess, RelayLink, ThreadAgent
from terastack.disdp.aggregator import Aggregator
from terastack.disdp.comm import Comm, gloo_group, join_process_group
from terastack.disdp.train_config import TrainConfig, inject_fault
from terastack.disdp.launch import rank_main
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.workload import ModelSpec, build_model, loss_of, worker_batch
from terastack.disdp.roles import Role, RoleMap
from terastack.disdp.server import ParameterServer, scratch_dir
from terastack.disdp.server_state import resume_server, save_servers
from terastack.disdp.held_state import StateCensus
from terastack.disdp.job_stats import write_stats
from terastack.disdp.worker import ShardedModel
from terastack.progress import Progress
from terastack.training.checkpoint import JSONState, latest_step


@dataclass(kw_only=True, slots=True)
class Rank:
    """What every role's loop needs: who this rank is, the model's layout and the steps it runs."""

    config: TrainConfig
    rank: int
    role: Role
    index: int
    roles: RoleMap
    comm: Comm
    spec: ModelSpec
    meta_model: nn.Module
    layout: Layout
    schedule: Schedule
    #: the first step to run (the servers' checkpoint decides when resuming)
    first: int
    #: the gloo group of start-up, the barrier at the end (None: the default group, gloo;
    #: [Note: process-group backend] in terastack.disdp.comm)
    control_group: object = None

    @property
    def steps(self) -> range:
        return range(self.first, self.config.steps)

    def maybe_fail(self, step: int) -> None:
        """Fault injection (``--kill-at``): die or hang here when this rank and step are the ones named."""
        inject_fault(self.config.kill_at, self.role, self.index, step, self.roles.describe(self.rank))


def run_role(config: TrainConfig) -> int:
    """What one rank does under torchrun: find its role, train, write its statistics."""
    me = join(config)
    if me is None:
        return 0
    loop = {Role.WORKER: run_worker, Role.SERVER: run_server, Role.AGGREGATOR: run_aggregator,
            Role.AGENT: run_agent}[me.role]
    stats = {"rank": me.rank, "role": me.role.value, "index": me.index, "first_step": me.first} | loop(me)
    leave(me, stats)
    return 0


def join(config: TrainConfig) -> Rank | None:
    """Join the process group, check every rank has the same layout and agree on the first step.
    None when the checkpoint already reached ``config.steps`` (the process group is left again)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    roles = config.roles()
    roles.check_world(world)
    role, index = roles.role_of(rank)
    torch.set_num_threads(config.threads)
    if role is not Role.WORKER and config.helper_nice:
        os.nice(config.helper_nice)
    if config.trace_dir:
        trace.tracer.start()
    # gloo on the CPU, NCCL on CUDA ([Note: process-group backend] in terastack.disdp.comm)
    backend = join_process_group(config.device, rank=rank, world_size=world, timeout_s=config.timeout_s)
    group = gloo_group(config.timeout_s)
    comm = Comm.open(roles, rank, timeout_s=config.timeout_s, backend=backend)
    spec = config.model_spec()
    meta_model = build_model(spec, seed=config.seed, meta=True)
    layout = Layout.of(meta_model, config.servers)
    schedule = Schedule(layout, reshard=config.reshard)
    check_same_layout(layout, roles, rank, group=group)

    # Start step: the servers' checkpoint decides, server 0 tells everyone.
    start = torch.zeros(1, dtype=torch.int64)
    if config.resume and role is Role.SERVER and index == 0:
        start[0] = latest_step(config.checkpoint_dir) or 0
    dist.broadcast(start, src=roles.server_rank(0), group=group)
    first = int(start[0])
    if rank == 0:
        print(f"terastack dist: {world} ranks on {backend}; roles:\n{roles.table()}\n"
              f"  model {spec.name}: {layout.numel:,} parameters in {len(layout.buckets)} buckets "
              f"(root + {layout.layers} layers + {layout.tail} after them), servers hold state in {config.state}, "
              + (f"resuming at step {first}" if first else "starting at step 0")
              + f", training to step {config.steps}", flush=True)
    if first >= config.steps:
        if rank == 0:
            print(f"terastack dist: checkpoint is already at step {first} >= --steps {config.steps}; nothing to do",
                  flush=True)
        dist.destroy_process_group()
        return None
    return Rank(config=config, rank=rank, role=role, index=index, roles=roles, comm=comm, spec=spec,
                meta_model=meta_model, layout=layout, schedule=schedule, first=first, control_group=group)


def check_same_layout(layout: Layout, roles: RoleMap, rank: int, *, group=None) -> None:
    """Refuse a rank whose model layout differs from the others' (``group``: a gloo group of every rank)."""
    mine = torch.tensor([int(layout.fingerprint()[:15], 16)], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(roles.world_size)]
    dist.all_gather(every, mine, group=group)
    odd = [r for r in range(roles.world_size) if int(every[r]) != int(every[0])]
    if odd:
        raise ValueError(f"{roles.describe(rank)}: model layout differs on {', '.join(map(roles.describe, odd))} "
                         "(every rank must be started with the same model and --servers)")


def leave(me: Rank, stats: dict) -> None:
    """Write this rank's statistics (and trace), then leave the process group once every rank is done."""
    config = me.config
    stats["bytes_in"], stats["bytes_out"] = me.comm.counters()
    write_stats(config, me.rank, stats)
    if config.trace_dir:
        trace.tracer.save(Path(config.trace_dir) / f"rank-{me.rank}-{me.role.value}{me.index}.json")
    # Every rank has finished its sends; wait (bounded) so nobody tears down a connection still in use.
    dist.monitored_barrier(group=me.control_group, timeout=datetime.timedelta(seconds=config.timeout_s),
                           wait_all_ranks=True)
    dist.destroy_process_group()
    if me.rank == 0:
        print(f"terastack dist: trained to step {config.steps}; checkpoint in {config.checkpoint_dir}", flush=True)


def run_worker(me: Rank) -> dict:
    """Forward and backward of the model; parameters arrive and gradients leave through the worker's agent."""
    config, roles, index = me.config, me.roles, me.index
    census = StateCensus() if config.census else None   # [Note: state a worker holds]
    sharded = ShardedModel(me.meta_model, me.layout, me.schedule)
    if roles.agents == "thread":
        core = AgentCore(roles=roles, comm=me.comm, layout=me.layout, worker=index)
        link = ThreadAgent(core, me.schedule, sharded.buckets, first_step=me.first, steps=len(me.steps),
                           prefetch=config.prefetch, timeout_s=config.timeout_s)
    else:
        link = RelayLink(me.comm, roles, index, me.schedule, sharded.buckets, prefetch=config.prefetch)
    sharded.link = link
    progress = Progress(len(me.steps), label=f"dist train (worker {index})", unit="step",
                        enabled=config.progress and index == 0)
    step_s, wait_s, losses = [], [], []
    try:
        for step in me.steps:
            me.maybe_fail(step)
            batch = worker_batch(me.spec, step=step, seed=config.seed, micro_batch=config.micro_batch,
                                 worker=index, workers=roles.workers)
            t0, w0 = time.perf_counter(), sharded.wait_s
            sharded.begin_step(step)
            loss = loss_of(sharded.model, batch)
            loss.backward()
            sharded.finish_step()
            step_s.append(time.perf_counter() - t0)
            wait_s.append(sharded.wait_s - w0)
            losses.append(float(loss.detach()))
            progress.update(1, loss=losses[-1], exposed=wait_s[-1] / step_s[-1])
    except BaseException:
        link.abort()
        raise
    finally:
        progress.close()
    # the last step's batch, loss and gradients on their way out are not state the worker holds between steps
    batch = loss = None
    link.sent()
    held = census.held_beyond_model() if census is not None else None
    link.close()
    return dict(step_s=step_s, wait_s=wait_s, loss=losses, peak_param_bytes=sharded.peak_param_bytes,
                model_param_bytes=me.layout.numel * 4, param_bytes_after_run=sharded.resident_param_bytes(),
                held_state=held)


def run_server(me: Rank) -> dict:
    """AdamW on this shard's slice of every bucket; checkpoints every ``checkpoint_every`` steps and at the end."""
    config, layout = me.config, me.layout
    if me.first:   # resumed: the checkpoint's state replaces these
        initial = [torch.zeros(b.numel) for b in layout.buckets]
    else:
        initial = layout.flatten(dict(build_model(me.spec, seed=config.seed).named_parameters()))
    server = ParameterServer(ParameterServer.Config(state=config.state,
                                                    store_root=scratch_dir(config.run_dir, me.index)),
                             index=me.index, roles=me.roles, comm=me.comm, layout=layout, schedule=me.schedule,
                             adamw_config=config.adamw(), initial=initial)
    del initial
    if me.first:
        resumed = resume_server(server, config.checkpoint_dir)
        if resumed != me.first:   # another job wrote a checkpoint meanwhile
            raise ValueError(f"checkpoint {config.checkpoint_dir}: server {me.index} found step {resumed}, server 0 "
                             f"step {me.first}")
    # the demo's settings beside the servers' state (the model and the seed say what the state is of)
    config_state = JSONState(config.to_dict())
    step_s = []
    try:
        for step in me.steps:
            me.maybe_fail(step)
            t0 = time.perf_counter()
            server.step(step, more=step + 1 < config.steps)
            step_s.append(time.perf_counter() - t0)
            done = step + 1
            if done == config.steps or (config.checkpoint_every and done % config.checkpoint_every == 0):
                save_servers(server, config.checkpoint_dir, done, components={"config": config_state})
    finally:
        server.close()
    return dict(step_s=step_s, ingress_bytes=server.ingress_bytes, update_s=server.update_s,
                optimizer_state_bytes=server.optimizer_bytes, host_moment_bytes=server.optimizer_state.host_bytes())


def run_aggregator(me: Rank) -> dict:
    """Average every bucket's gradients over the agents and send each server its slice."""
    agg = Aggregator(roles=me.roles, comm=me.comm, layout=me.layout, schedule=me.schedule)
    for step in me.steps:
        me.maybe_fail(step)
        agg.step(step)
    return dict(ingress_bytes=agg.ingress_bytes)


def run_agent(me: Rank) -> dict:
    """An agent process (``agents="process"``): relays its worker's deliveries and gradients."""
    core = AgentCore(roles=me.roles, comm=me.comm, layout=me.layout, worker=me.index)
    agent = AgentProcess(core, me.schedule, prefetch=me.config.prefetch)
    for step in me.steps:
        me.maybe_fail(step)
        agent.step(step)
    return {}


def main(argv: list[str] | None = None) -> int:
    return rank_main(run_role, argv)


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
