"""A training job: configuration, the entry point every rank runs under torchrun, and the local launcher.

One step, as the roles see it ([Note: one schedule for every role] in
:mod:`terastack.dist.layout`)::

    server s        post sends of its slice of every bucket (fetch order) -> for b in grad order:
                    receive reduced gradient b, AdamW on slice b
    agent i         receive bucket deliveries from all servers (<= prefetch ahead) into worker i's buffers;
                    send each gradient bucket on as soon as the worker hands it over
    worker i        forward / backward of the unmodified model; hooks wait for deliveries and hand over
                    gradients; never holds optimizer state, holds no parameters between steps
    aggregator      for b in grad order: receive b from every agent, average, send slice s to server s

[Note: failures]
Every wait has a timeout and every lost peer raises :class:`PeerError` naming
its rank and role. Under torchrun a rank that dies (or raises) ends the job:
torchrun stops the other ranks, and :func:`launch_local` turns torchrun's
per-rank failure records into one message naming the first rank to fail, its
role and the last checkpoint to resume from. Checkpoints are the servers'
state, so ``--resume`` loses nothing that was checkpointed.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from terastack.atomic import atomic_write_json
from terastack.dist.roles import AGENT_MODES, Role, RoleMap
from terastack.dist.server import STATES, AdamWConfig
from terastack.dist.models import ModelSpec


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    workers: int = 2
    servers: int = 1
    aggregator: bool = True
    agents: str = "thread"
    model: str = "tiny-llama"
    dim: int = 64
    layers: int = 2
    vocab: int = 256
    heads: int = 4
    seq_len: int = 32
    micro_batch: int = 4
    steps: int = 10
    seed: int = 0
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    #: where the servers keep optimizer state: "memory" or "ssd" (through terastack.tiers)
    state: str = "memory"
    run_dir: str = "runs/dist"
    #: checkpoint every N steps (0: only after the last step)
    checkpoint_every: int = 0
    resume: bool = False
    #: bucket deliveries an agent may run ahead of its worker's compute
    prefetch: int = 2
    #: release each layer after its forward and fetch it again for its backward (ZeRO-3 / FSDP behaviour)
    reshard: bool = True
    #: bound on every wait (seconds); a peer silent for longer is reported by rank and role
    timeout_s: float = 120.0
    #: torch intra-op threads per process
    threads: int = 1
    #: niceness added to servers, the aggregator and agent processes: roles that stand in for separate
    #: hardware (SmartNIC, switch, storage servers) yield the CPU to the workers when they share a machine
    helper_nice: int = 10
    #: fault injection for resilience tests: "ROLE:INDEX:STEP[:FAULT]" kills that rank with SIGKILL (FAULT
    #: "kill", the default) or makes it stop answering ("hang") at the start of that step
    kill_at: str = ""
    progress: bool = True
    #: write a Chrome trace per rank into this directory
    trace_dir: str = ""

    def __post_init__(self) -> None:
        for f in ("workers", "servers", "micro_batch", "steps", "prefetch", "threads"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        if self.agents not in AGENT_MODES:
            raise ValueError(f"agents: must be one of {', '.join(AGENT_MODES)}; got {self.agents!r}")
        if self.state not in STATES:
            raise ValueError(f"state: must be one of {', '.join(STATES)}; got {self.state!r}")
        if not 0 <= self.helper_nice <= 19:
            raise ValueError(f"helper_nice: must be in [0, 19], got {self.helper_nice}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if self.kill_at:
            parse_kill_at(self.kill_at)
        self.model_spec()
        self.adamw()

    def model_spec(self) -> ModelSpec:
        return ModelSpec(name=self.model, dim=self.dim, layers=self.layers, vocab=self.vocab, heads=self.heads,
                         seq_len=self.seq_len)

    def adamw(self) -> AdamWConfig:
        return AdamWConfig(lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                           weight_decay=self.weight_decay)

    def roles(self) -> RoleMap:
        return RoleMap(workers=self.workers, servers=self.servers, aggregator=self.aggregator, agents=self.agents)

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "config") -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> "TrainConfig":
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return cls.from_dict(data.get("train", data), source=str(path))


FAULTS = ("kill", "hang")


def parse_kill_at(text: str) -> tuple[Role, int, int, str]:
    """ROLE:INDEX:STEP[:FAULT]: FAULT "kill" (SIGKILL, the default) or "hang" (the rank stops answering)."""
    try:
        role, index, step, *fault = text.split(":")
        fault = fault[0].lower() if fault else "kill"
        if fault not in FAULTS or len(text.split(":")) > 4:
            raise ValueError(text)
        return Role(role), int(index), int(step), fault
    except ValueError:
        raise ValueError(f"kill_at: expected ROLE:INDEX:STEP[:FAULT] (ROLE one of worker, server, aggregator, "
                         f"agent; FAULT kill or hang), got {text!r}") from None


class JobFailed(RuntimeError):
    """A rank of the job died or failed; the message names the first one, its role and how to resume."""


# =====================================================================================================
# The entry point of every rank
# =====================================================================================================
def _optimizer_state_bytes() -> int:
    """Bytes of optimizer state held by live ``torch.optim`` optimizers in this process."""
    import gc

    total = 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer):
            for state in obj.state.values():
                for t in state.values():
                    if isinstance(t, torch.Tensor):
                        t = t.to_local() if hasattr(t, "to_local") else t   # a DTensor's local shard
                        total += t.numel() * t.element_size()
    return total


def write_stats(config: "TrainConfig", rank: int, stats: dict) -> None:
    stats_dir = Path(config.run_dir) / "stats"
    stats_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(stats_dir / f"rank-{rank}.json", stats)


def init_baseline(config: "TrainConfig", system: str) -> tuple[int, int]:
    """Start-up of a workers-only baseline rank: (rank, world size), gloo process group joined."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.workers:
        raise ValueError(f"the {system} baseline runs one rank per worker: {config.workers} workers, {world} ranks")
    torch.set_num_threads(config.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=config.timeout_s))
    return rank, world


def finish_baseline(config: "TrainConfig", rank: int, stats: dict) -> int:
    import torch.distributed as dist

    write_stats(config, rank, {"rank": rank, "role": "worker", "index": rank,
                               "optimizer_state_bytes": _optimizer_state_bytes()} | stats)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def save_final(config: "TrainConfig", layout, flats: list[torch.Tensor], step: int) -> None:
    """Write full parameters as a one-shard checkpoint (how the baselines hand back their result)."""
    from terastack.dist import checkpoint as ckpt
    from terastack.dist.layout import Layout

    one = Layout(layout.buckets, 1)
    ckpt.write_shard(config.checkpoint_dir, step, 0, {f"b{b}.param": f for b, f in enumerate(flats)}, {})
    ckpt.commit_index(config.checkpoint_dir, step, one, {"model": config.model_spec().to_dict()})


def _flats(model: torch.nn.Module, layout) -> list[torch.Tensor]:
    params = dict(model.named_parameters())
    return [torch.cat([params[p.name].detach().reshape(-1) for p in b.params]).float() for b in layout.buckets]


def _check_same_layout(layout, roles: RoleMap, rank: int) -> None:
    import torch.distributed as dist

    mine = torch.tensor([int(layout.fingerprint()[:15], 16)], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(roles.world_size)]
    dist.all_gather(every, mine)
    odd = [r for r in range(roles.world_size) if int(every[r]) != int(every[0])]
    if odd:
        raise ValueError(f"{roles.describe(rank)}: model layout differs on {', '.join(map(roles.describe, odd))} "
                         "(every rank must be started with the same model and --servers)")


def run_role(config: TrainConfig) -> int:
    """What one rank does under torchrun: find its role, train, write its statistics."""
    import torch.distributed as dist

    from terastack.dist import checkpoint as ckpt
    from terastack.dist.agent import AgentCore, AgentProcess, RelayLink, ThreadAgent
    from terastack.dist.aggregator import Aggregator
    from terastack.dist.comm import Comm
    from terastack.dist.layout import Layout, Schedule
    from terastack.dist.models import build_model, loss_of, worker_batch
    from terastack.dist.server import ParameterServer, scratch_dir
    from terastack.dist.worker import ShardedModel
    from terastack.progress import Progress

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    roles = config.roles()
    roles.check_world(world)
    role, index = roles.role_of(rank)
    torch.set_num_threads(config.threads)
    if role is not Role.WORKER and config.helper_nice:
        os.nice(config.helper_nice)
    if config.trace_dir:
        from terastack import trace

        trace.tracer.start()
    timeout = datetime.timedelta(seconds=config.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    comm = Comm(roles, rank, timeout_s=config.timeout_s)
    spec = config.model_spec()
    meta_model = build_model(spec, seed=config.seed, meta=True)
    layout = Layout.of(meta_model, config.servers)
    schedule = Schedule(layout, reshard=config.reshard)
    _check_same_layout(layout, roles, rank)

    # Start step: the servers' checkpoint decides, server 0 tells everyone.
    start = torch.zeros(1, dtype=torch.int64)
    index_data = None
    if config.resume and role is Role.SERVER:
        index_data = ckpt.read_index(config.checkpoint_dir)
    if role is Role.SERVER and index == 0 and index_data is not None:
        start[0] = int(index_data["step"])
    dist.broadcast(start, src=roles.server_rank(0))
    first = int(start[0])
    if rank == 0:
        print(f"terastack dist: {world} ranks on gloo; roles:\n{roles.table()}\n"
              f"  model {spec.name}: {layout.numel:,} parameters in {len(layout.buckets)} buckets "
              f"(root + {layout.layers} layers), servers hold state in {config.state}, "
              + (f"resuming at step {first}" if first else "starting at step 0")
              + f", training to step {config.steps}", flush=True)
    if first >= config.steps:
        if rank == 0:
            print(f"terastack dist: checkpoint is already at step {first} >= --steps {config.steps}; nothing to do",
                  flush=True)
        dist.destroy_process_group()
        return 0
    kill = parse_kill_at(config.kill_at) if config.kill_at else None

    def maybe_die(step: int) -> None:
        if kill and kill[:3] == (role, index, step):
            print(f"terastack dist: fault injection: {kill[3]} {roles.describe(rank)} at step {step}", flush=True)
            if kill[3] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:        # "hang": alive (its network threads too) but never answers again
                time.sleep(3600)

    stats: dict = {"rank": rank, "role": role.value, "index": index, "first_step": first}
    steps = range(first, config.steps)
    if role is Role.WORKER:
        sharded = ShardedModel(meta_model, layout, schedule)
        if roles.agents == "thread":
            core = AgentCore(roles=roles, comm=comm, layout=layout, worker=index)
            link = ThreadAgent(core, schedule, sharded.buckets, first_step=first, steps=len(steps),
                               prefetch=config.prefetch, timeout_s=config.timeout_s)
        else:
            link = RelayLink(comm, roles, index, schedule, sharded.buckets, prefetch=config.prefetch)
        sharded.link = link
        progress = Progress(len(steps), label=f"dist train (worker {index})", unit="step",
                            enabled=config.progress and index == 0)
        step_s, wait_s, losses = [], [], []
        try:
            for step in steps:
                maybe_die(step)
                batch = worker_batch(spec, step=step, seed=config.seed, micro_batch=config.micro_batch,
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
        link.close()
        stats.update(step_s=step_s, wait_s=wait_s, loss=losses, peak_param_bytes=sharded.peak_param_bytes,
                     model_param_bytes=layout.numel * 4, param_bytes_after_run=sharded.resident_param_bytes(),
                     optimizer_state_bytes=_optimizer_state_bytes())
    elif role is Role.SERVER:
        if index_data is not None:
            initial = [torch.zeros(b.numel) for b in layout.buckets]
        else:
            initial = _flats(build_model(spec, seed=config.seed), layout)
        server = ParameterServer(ParameterServer.Config(state=config.state, store_root=scratch_dir(config.run_dir,
                                                                                                   index)),
                                 index=index, roles=roles, comm=comm, layout=layout, schedule=schedule,
                                 adamw_config=config.adamw(), initial=initial)
        del initial
        if index_data is not None:
            server.resume(config.checkpoint_dir, index_data)
        extra = {"model": spec.to_dict(), "seed": config.seed}
        step_s = []
        try:
            for step in steps:
                maybe_die(step)
                t0 = time.perf_counter()
                server.step(step, more=step + 1 < config.steps)
                step_s.append(time.perf_counter() - t0)
                done = step + 1
                if done == config.steps or (config.checkpoint_every and done % config.checkpoint_every == 0):
                    server.checkpoint(config.checkpoint_dir, done, extra=extra)
        finally:
            server.close()
        stats.update(step_s=step_s, ingress_bytes=server.ingress_bytes, update_s=server.update_s,
                     optimizer_state_bytes=server.optimizer_bytes, host_moment_bytes=server.moments.host_bytes())
    elif role is Role.AGGREGATOR:
        agg = Aggregator(roles=roles, comm=comm, layout=layout, schedule=schedule)
        for step in steps:
            maybe_die(step)
            agg.step(step)
        stats.update(ingress_bytes=agg.ingress_bytes)
    else:
        core = AgentCore(roles=roles, comm=comm, layout=layout, worker=index)
        agent = AgentProcess(core, schedule, prefetch=config.prefetch)
        for step in steps:
            maybe_die(step)
            agent.step(step)
    stats["bytes_in"], stats["bytes_out"] = comm.counters()
    write_stats(config, rank, stats)
    if config.trace_dir:
        from terastack import trace

        trace.tracer.save(Path(config.trace_dir) / f"rank-{rank}-{role.value}{index}.json")
    # Every rank has finished its sends; wait (bounded) so nobody tears down a connection still in use.
    dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"terastack dist: trained to step {config.steps}; checkpoint in {config.checkpoint_dir}", flush=True)
    return 0


# =====================================================================================================
# The local launcher
# =====================================================================================================
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _failure_text(failure) -> str:
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = str(message or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {failure.exitcode}"


def _classify(failure) -> tuple[str, str]:
    """("error", its message) for a rank that raised; ("killed", signal) for one ended by a signal it did not
    raise over; ("stopped", "SIGTERM") for one torchrun stopped after the first failure."""
    message = getattr(failure, "message", "")
    message = str(message.get("message") if isinstance(message, dict) else message or "").strip()
    noted = re.match(r"Signal \d+ \((SIG\w+)\) received", message)   # torchrun's note of a signal death
    if message and not noted:
        return "error", _failure_text(failure)
    sig = noted.group(1) if noted else None
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            sig = signal.Signals(-failure.exitcode).name
        except ValueError:
            sig = f"signal {-failure.exitcode}"
    if sig is None:
        return "error", f"exit code {failure.exitcode}"
    return ("stopped" if sig == "SIGTERM" else "killed"), sig


def describe_failures(roles: RoleMap, failures: dict, checkpoint_dir: str) -> str:
    """One message from torchrun's per-rank failure records, naming the first rank to fail and its role.

    A rank killed by a signal (other than SIGTERM) is the likeliest root cause;
    then ranks that raised, earliest first; ranks that torchrun itself stopped
    with SIGTERM after the first failure are only counted.
    """
    rank_of_kind = {"killed": 0, "error": 1, "stopped": 2}
    classified = sorted(((rank_of_kind[kind], getattr(f, "timestamp", 0) or 0, rank, kind, text)
                         for rank, f in failures.items() for kind, text in [_classify(f)]))
    parts, stopped = [], 0
    for _, _, rank, kind, text in classified:
        who = roles.describe(rank) if 0 <= rank < roles.world_size else f"rank {rank}"
        if kind == "stopped":
            stopped += 1
        else:
            parts.append(f"{who} died ({text})" if kind == "killed" else f"{who} failed: {text}")
    if not parts:
        parts.append(f"{stopped} rank(s) were stopped with SIGTERM")
    elif stopped:
        parts.append(f"{stopped} other rank(s) were stopped")
    from terastack.dist import checkpoint as ckpt

    index = ckpt.read_index(checkpoint_dir) if os.path.isdir(checkpoint_dir) else None
    resume = (f"; the last checkpoint is step {index['step']} in {checkpoint_dir}: rerun with --resume to continue"
              if index else "; no checkpoint was completed")
    return "; then ".join(parts[:3]) + resume


def launch_local(config: TrainConfig, *, quiet: bool = False, module: str = "terastack.dist.job",
                 world_size: int | None = None) -> dict:
    """Run the job on this machine under torchrun's elastic agent (c10d rendezvous on loopback).

    ``module`` is the program every rank runs (``python -m MODULE JOB.json``):
    the disaggregated job by default, or a baseline that needs only workers.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    roles = config.roles()
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / "stats", ignore_errors=True)
    if not config.resume:
        shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
    job_file = atomic_write_json(run_dir / "job.json", config.to_dict())
    launch = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size or roles.world_size,
        run_id=f"terastack-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", local_addr="127.0.0.1",
        rdzv_configs={"timeout": int(config.timeout_s)}, max_restarts=0, monitor_interval=0.1,
        start_method="spawn", shutdown_timeout=2)
    env_before = os.environ.get("TERASTACK_DIST_QUIET")
    os.environ["TERASTACK_DIST_QUIET"] = "1" if quiet else "0"
    try:
        elastic_launch(launch, sys.executable)("-m", module, str(job_file))
    except ChildFailedError as exc:
        raise JobFailed(describe_failures(roles, exc.failures, config.checkpoint_dir)) from None
    finally:
        if env_before is None:
            os.environ.pop("TERASTACK_DIST_QUIET", None)
        else:
            os.environ["TERASTACK_DIST_QUIET"] = env_before
    return collect_stats(config, world_size or roles.world_size)


def collect_stats(config: TrainConfig, world_size: int) -> dict:
    """The job's figures from every rank's statistics file."""
    roles = config.roles()
    per_rank = {}
    for rank in range(world_size):
        path = Path(config.run_dir) / "stats" / f"rank-{rank}.json"
        if path.exists():
            per_rank[rank] = json.loads(path.read_text())
    workers = [per_rank[r] for r in range(roles.workers) if r in per_rank]
    servers = [per_rank[roles.server_rank(s)] for s in range(roles.servers)
               if per_rank.get(roles.server_rank(s), {}).get("role") == "server"]
    out: dict = {"workers": roles.workers, "servers": roles.servers, "aggregator": roles.aggregator,
                 "agents": roles.agents, "steps": config.steps}
    if workers:
        n = min(len(w["step_s"]) for w in workers)
        step = [max(w["step_s"][i] for w in workers) for i in range(n)]
        # [Note: exposed communication] In a synchronous step the worker that finishes its backward first
        # also waits for the slowest one (load imbalance, not communication). The worker that waits least
        # is the one on the critical path; its waits are the communication the step could not hide.
        # Both figures are reported, for every system alike.
        wait = [min(w["wait_s"][i] for w in workers) for i in range(n)]
        wait_any = [max(w["wait_s"][i] for w in workers) for i in range(n)]
        steady = slice(1, None) if n > 1 else slice(None)   # the first step pays start-up costs
        out["step_s"] = statistics.median(step[steady])
        out["exposed_comm_fraction"] = sum(wait[steady]) / sum(step[steady])
        out["exposed_comm_fraction_incl_imbalance"] = sum(wait_any[steady]) / sum(step[steady])
        out["loss"] = [statistics.fmean(w["loss"][i] for w in workers) for i in range(n)]
        out["comm_s"] = statistics.median(wait[steady])
        out["worker_optimizer_bytes"] = max(w["optimizer_state_bytes"] for w in workers)
        for key, field in (("worker_peak_param_bytes", "peak_param_bytes"), ("model_param_bytes", "model_param_bytes"),
                           ("worker_param_bytes_after_run", "param_bytes_after_run")):
            if all(field in w for w in workers):
                out[key] = max(w[field] for w in workers)
    if servers:
        n = min(len(s["ingress_bytes"]) for s in servers)
        out["server_ingress_bytes_per_step"] = max(max(s["ingress_bytes"][1:n] or s["ingress_bytes"][:n])
                                                   for s in servers)
        out["server_optimizer_bytes"] = sum(s["optimizer_state_bytes"] for s in servers)
        out["server_update_s"] = max(s["update_s"] for s in servers)
    out["per_rank"] = per_rank
    return out


def rank_main(entry, argv: list[str] | None = None) -> int:
    """``python -m MODULE JOB.json``: read the job's config and run ``entry(config)`` under torchrun's error record."""
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    config = TrainConfig.from_dict(json.loads(Path(argv[0]).read_text()), source=argv[0])
    if os.environ.get("TERASTACK_DIST_QUIET") == "1":
        config.progress = False
    return record(entry)(config)


def main(argv: list[str] | None = None) -> int:
    return rank_main(run_role, argv)


if __name__ == "__main__":
    sys.exit(main())
