"""``terastack dist train --config job.yaml``: the job file ``terastack finetune`` runs, on the disaggregated engine.

:func:`launch_job` starts every rank on this machine (torchrun's elastic agent, loopback); under torchrun each
rank runs :func:`run_rank` (``python -m terastack.disdp.job_rank JOB.yaml``: it takes SIGINT over, then imports
this module). Rank 0 (worker 0) reads the data, builds the job's schedule and runs the shared loop
(:class:`terastack.training.loop.FinetuneLoop`) on a :class:`~terastack.disdp.job_engine.DisdpEngine`; the
other ranks follow its step messages ([Note: step messages] in :mod:`terastack.disdp.control`). The job's
``batch_size`` is the global batch: every micro-batch is split by rows among the workers.

On several nodes each node runs one torchrun (``torchrun --nnodes N ... -m terastack dist train --config
job.yaml``) and every rank runs :func:`run_torchrun_rank`: roles follow the global rank ([Note: ranks on several
nodes] in :mod:`terastack.disdp.roles`), and a lost node ends the others with one line ([Note: a lost node] in
:mod:`terastack.disdp.control`).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from terastack import trace
from terastack.atomic import atomic_write_json
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.comm import Comm, backend_for, join_process_group
from terastack.disdp.control import Command, Control, Liveness, Op, lost_line, short_reason
from terastack.disdp.initial_weights import StreamedShard, random_init
from terastack.disdp.job_engine import DisdpEngine, JobWorker, follow, part_of
from terastack.disdp.launch import QUIET_ENV, launch_ranks
from terastack.disdp.roles import Role, RoleMap, local_node
from terastack.disdp.run import check_same_layout
from terastack.disdp.shutdown import defer_interrupts, exit_rank, follow_interrupts
from terastack.training.interrupt import JobInterrupted

#: the program every rank of a job runs (it imports this module once it has taken SIGINT over)
JOB_RUN_MODULE = "terastack.disdp.job_rank"
RESULT = "result.json"
COMMAND = "terastack dist train"


class NodeLost(RuntimeError):
    """Ranks of another node stopped answering ([Note: a lost node]); the message is the line to print."""

    def __init__(self, line: str, *, report: bool):
        super().__init__(line)
        self.report = report


@dataclass(kw_only=True, slots=True)
class JobRank:
    """Who this rank is and the model's layout (what every role's part needs)."""

    job: object
    rank: int
    role: Role
    index: int
    roles: RoleMap
    comm: Comm
    hf_config: object | None          # these three on the ranks that hold the model's tensors: workers and servers
    model_dir: str | None
    meta_model: nn.Module | None
    layout: Layout
    schedule: Schedule
    liveness: Liveness | None = None


def roles_of(job) -> RoleMap:
    d = job.disdp
    return RoleMap(workers=d.workers, servers=d.servers, aggregator=d.aggregator, agents=d.agents)


#: job settings the disaggregated engine does not serve, each refused by name when a job gives it (a value other
#: than its default); the offloaded engine's section (offload.*) is named in a note instead: a job file runs on
#: either engine ([Note: settings of the other engine] in terastack.training.job.layers)
NOT_SERVED = {
    "schedule.optimizer": "when updates run is the offloaded engine's schedule; the servers update after the "
                          "gradients of a bucket arrive",
    "schedule.active_offload": "the offloaded engine's schedule; the servers update as the gradients arrive",
    "schedule.activation_policy": "the workers keep their activations (no swap or recompute policy)",
    "schedule.accumulation": "the workers run micro-batches one after another",
    "store.device_budget": "the workers hold their layers as the schedule fetches them (no device budget)",
    "store.memory_budget": "give store.host_budget for the servers' store (with disdp.state=ssd)",
    "store.dtype": "the ranks compute in float32",
}


def check_job(job) -> None:
    """What the disaggregated engine refuses up front (before any rank starts)."""
    from terastack.training.job import SECTIONS, SettingError

    for path, reason in NOT_SERVED.items():
        section, name = path.split(".")
        if job.get(path) != getattr(SECTIONS[section](), name):   # the default as read
            raise SettingError(path, f"not served by terastack dist train: {reason}")
    if job.store.host_budget is not None and job.disdp.state != "ssd":
        raise SettingError("store.host_budget", "bounds the servers' store, which only disdp.state=ssd has")

    if job.lora.rank is not None:
        raise SettingError("lora.rank", "the disaggregated engine trains every parameter; LoRA adapters are "
                           "trained by terastack finetune")
    from terastack.plan.optimizer_formats import optimizer_format

    try:   # the servers update with the job's format ([Note: a slice's optimizer state] in terastack.disdp.slice_state)
        optimizer_format(job.training.optimizer).require()
    except ImportError as exc:
        raise SettingError("training.optimizer", f"{job.training.optimizer} " + str(exc).split(": ", 1)[1]) from None
    try:
        backend_for(job.disdp.device)   # NCCL without CUDA: refused before any rank starts
    except ValueError as exc:
        raise SettingError("disdp.device", str(exc).removeprefix("device: ")) from None
    if job.training.batch_size < job.disdp.workers:
        raise SettingError("training.batch_size", f"the global batch of {job.training.batch_size} rows cannot be "
                           f"split among {job.disdp.workers} workers (give at least one row per worker)")


def join_job(job) -> tuple[JobRank, Control]:
    from terastack.training.hf.model_files import apply_rope_scaling, build_skeleton, check_packing
    from terastack.training.model_registry import DEFAULT_MODEL, resolve_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # every role writes under the job's directory (job_run_dir), resolved once for all of them
    job = dataclasses.replace(job, disdp=dataclasses.replace(job.disdp, run_dir=job_run_dir(job)[0]))
    d = job.disdp
    roles = roles_of(job)
    roles.check_world(world)
    role, index = roles.role_of(rank)
    torch.set_num_threads(d.threads)
    if role is not Role.WORKER and d.helper_nice:
        os.nice(d.helper_nice)
    # gloo on the CPU, NCCL on CUDA; the step messages on gloo ([Note: process-group backend] in terastack.disdp.comm)
    backend = join_process_group(d.device, rank=rank, world_size=world, timeout_s=d.timeout_s)
    control = Control(roles, rank, timeout_s=d.timeout_s)
    nodes: list = [None] * world
    # every rank's node, for messages ([Note: ranks on several nodes])
    dist.all_gather_object(nodes, local_node(), group=control.group)
    roles = control.roles = roles.with_nodes(nodes)
    liveness = Liveness(rank, world)
    comm = Comm.open(roles, rank, timeout_s=d.timeout_s, backend=backend)
    # Only the ranks that hold the model's tensors read its config and build its skeleton: importing transformers
    # is seconds of CPU a rank, which the aggregator and the agents, sharing the node's cores, need not spend.
    # They take the layout rank 0 (worker 0) made; a model that cannot be read fails on the workers and servers.
    hf_config = model_dir = meta_model = None
    if role in (Role.WORKER, Role.SERVER):
        hf_config, model_dir = resolve_model(job.model.path or DEFAULT_MODEL)
        if job.model.rope_scaling is not None:
            apply_rope_scaling(hf_config, *job.model.rope_scaling)
        if job.data.pack:
            check_packing(hf_config)   # packed rows need the attention that position ids restart
        meta_model = build_skeleton(hf_config)
    mine = Layout.of(meta_model, d.servers, optimizer=job.training.optimizer) if meta_model is not None else None
    sent = [mine]
    dist.broadcast_object_list(sent, src=0, group=control.group)   # rank 0's layout, now on every rank
    layout = mine if mine is not None else sent[0]
    check_same_layout(layout, roles, rank, group=control.group)
    return JobRank(job=job, rank=rank, role=role, index=index, roles=roles, comm=comm, hf_config=hf_config,
                   model_dir=model_dir, meta_model=meta_model, layout=layout,
                   schedule=Schedule(layout, reshard=d.reshard), liveness=liveness), control


def initial_shard(me: JobRank) -> StreamedShard:
    """This server's slice of every bucket of the model's starting weights, made as the server asks for each
    ([Note: a server's starting weights] in terastack.disdp.initial_weights): the model directory's, read one group
    of tensors at a time through transformers' own key conversions, or a seeded random initialization made one
    bucket at a time (the model is never whole in memory)."""
    layout, server = me.layout, me.index
    if me.model_dir is not None:
        from terastack.training.hf.keys import CheckpointKeys
        from terastack.training.hf.model_files import CheckpointReader

        reader = CheckpointReader(me.model_dir)
        tensors = ((name, t.float()) for name, t in CheckpointKeys(me.meta_model, reader.keys()).tensors(reader.get))
        return StreamedShard(layout, server, tensors, source=me.model_dir, close=reader.close)
    from terastack.training.hf.model_files import build_skeleton

    skeleton = build_skeleton(me.hf_config)   # its own meta model: the bucket's modules get storage in turn
    return StreamedShard(layout, server, random_init(skeleton, layout, seed=me.job.training.seed),
                         source=me.job.model.path or "tiny-llama")


def rank_imports(job) -> tuple[str, ...]:
    """What a rank imports only once it runs, for a warm start to import once for every rank
    (:func:`terastack.local_ranks.rank_command`): this module (``job_rank`` imports it in ``main``), and for the
    workers and servers transformers with the model's family (:func:`join_job`)."""
    from terastack.training.model_registry import DEFAULT_MODEL, model_type_of

    family = (model_type_of(job.model.path or DEFAULT_MODEL) or "").replace("-", "_")
    return (__name__, "transformers", "transformers.models.auto.modeling_auto",
            *([f"transformers.models.{family}.modeling_{family}"] if family.isidentifier() else []))


def run_rank(job) -> int:
    """One rank of the job: rank 0 drives, the others follow; every rank leaves together. A communication error
    is checked against the ranks' heartbeats: lost ranks raise :class:`NodeLost` ([Note: a lost node])."""
    me, control = join_job(job)
    if job.disdp.trace_dir:
        trace.tracer.start()
    try:
        if me.rank == 0:
            try:
                drive(me, control)
            except KeyboardInterrupt:   # raised between two commands: every rank stops ([Note: Ctrl-C on a job])
                control.announce(Command(op=Op.STOP))
                control.max_of([0.0, 0.0])   # the followers' figures, not reported
        else:
            shard = initial_shard(me) if me.role is Role.SERVER else None
            try:
                part = part_of(me, control, shard)
            finally:
                if shard is not None:
                    shard.close()
            del shard
            try:
                follow(me, control, part)
            finally:
                if hasattr(part, "close"):
                    part.close()
        if job.disdp.trace_dir:   # one Chrome trace per rank, as terastack dist demo writes them
            trace.tracer.stop()
            trace.tracer.save(Path(job.disdp.trace_dir) / f"rank-{me.rank}-{me.role.value}{me.index}.json")
        dist.monitored_barrier(group=control.group, timeout=datetime.timedelta(seconds=job.disdp.timeout_s),
                               wait_all_ranks=True)
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        # gloo's errors, PeerError, a wait that ran out; a bad setting (ValueError) or a full disk (another
        # OSError) is this rank's own and goes up as it is
        lost = me.liveness.lost()
        if lost == []:
            raise
        line = lost_line(me.roles, lost, short_reason(exc)) + resume_hint(job, here=False)
        raise NodeLost(line, report=me.liveness.claim_report()) from None
    finally:
        me.liveness.close()
    dist.destroy_process_group()
    return 0


def run_torchrun_rank(job, *, early_interrupts: list | None = None) -> int:
    """One rank under torchrun (``-m terastack dist train``, or ``-m terastack.disdp.job_rank`` as
    :func:`launch_job` starts it): :func:`run_rank` under torchrun's error record; a lost node ends this rank
    with exit status 1 and, from the first rank to see it, one line ([Note: a lost node]). ``early_interrupts``:
    the SIGINTs rank 0 noted before this module was imported (:mod:`terastack.disdp.job_rank`)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    def recorded(job) -> int:
        try:
            return record(run_rank)(job)
        except NodeLost as exc:
            if exc.report:
                print(f"terastack dist: {exc}", file=sys.stderr, flush=True)
            return 1

    # Ctrl-C: rank 0 stops every rank between two commands ([Note: Ctrl-C on a job])
    if os.environ.get("RANK") == "0":
        defer_interrupts(early_interrupts)
    else:
        follow_interrupts()
    # the process group is destroyed on every path ([Note: a thread inside the network at exit])
    return exit_rank(recorded, job)


def resume_hint(job, *, here: bool = True) -> str:
    """Where the job's last checkpoint is and how to continue from it (``here``: this process can see rank 0's
    checkpoint directory)."""
    from terastack.training.interrupt import latest_checkpoint

    d = job.checkpoint.dir
    if not d:
        return "; no checkpoint directory was set (--checkpoint DIR), so a rerun starts over"
    last = latest_checkpoint(d)
    if last is None:
        return ("; no checkpoint was completed" if here else
                f"; checkpoints are written to {d} on rank 0's node: rerun with --resume {d} to continue from the "
                "last")
    return f"; the last checkpoint is step {last.step} in {d}: rerun with --resume {d} to continue"


class DisaggregatedEngine:
    """The disaggregated engine on rank 0 as the job runner uses it
    (:class:`terastack.training.job_runner.EngineChoice`)."""

    command = COMMAND

    def __init__(self, me: JobRank, control: Control, *, log=sys.stderr):
        self.me, self.control, self.log = me, control, log
        self.memory: dict = {}

    @contextmanager
    def open(self, start):
        me = self.me
        engine = DisdpEngine(me, self.control, JobWorker(me), lr=start.lr, hf_config=me.hf_config,
                             model_dir=me.model_dir)
        if start.snapshot is not None:
            engine.resume(start.snapshot)
        self.announce(start)
        yield engine
        self.memory = engine.stop()   # only after a whole run: the other ranks' way out of a failure is theirs

    def announce(self, start) -> None:
        me, job, log = self.me, self.me.job, self.log
        print(f"{COMMAND}: {start.model.name} ({me.layout.numel / 1e6:.2f}M parameters in "
              f"{len(me.layout.buckets)} buckets) on {start.data.info['source']}; {me.roles.workers} workers, "
              f"{me.roles.servers} servers (state in {job.disdp.state})"
              + (", an aggregator" if me.roles.aggregator else ""), file=log, flush=True)
        if me.roles.multi_node:
            roles = me.roles
            print(f"{COMMAND}: ranks on {len({n for n, _ in roles.nodes})} nodes\n{roles.table()}", file=log,
                  flush=True)
            apart = [w for w in range(roles.workers) if roles.nodes[roles.agent_rank(w)][0] != roles.nodes[w][0]]
            if apart:   # every bucket crosses the network twice: agent <-> worker, then agent <-> servers
                print(f"{COMMAND}: the agents of workers {', '.join(map(str, apart))} run on other nodes than "
                      "their workers; across nodes keep disdp.agents=thread", file=log, flush=True)

    def result(self, start, engine, done) -> dict:
        return {"workers": self.me.roles.workers, "servers": self.me.roles.servers}


def drive(me: JobRank, control: Control) -> dict:
    """Rank 0: the job on the one job runner (terastack.training.job_runner) with this engine; ``result.json``
    in the run dir."""
    from terastack.training.job_runner import JobModel, JobRunner

    job, log = me.job, sys.stderr
    quiet = os.environ.get(QUIET_ENV) == "1" or not job.disdp.progress
    run_dir = Path(job.disdp.run_dir)   # resolved by join_job
    run_dir.mkdir(parents=True, exist_ok=True)   # under an outer torchrun nothing made it yet
    choice = DisaggregatedEngine(me, control, log=log)
    runner = JobRunner(job, choice, log=log, loop_log=None if quiet else log)
    model = JobModel(name=job.model.path or "tiny-llama", hf_config=me.hf_config, model_dir=me.model_dir)
    result = runner.run(model)
    result.update(finished=time.time(), **choice.memory)
    atomic_write_json(run_dir / RESULT, result)
    return result


def job_run_dir(job) -> tuple[str, bool]:
    """The job's directory (statistics, the servers' SSD state, traces) and whether it is a scratch directory of
    this run: ``disdp.run_dir``; else ``terastack-dist`` under the store's first directory; else a temporary
    directory (named by torchrun's run id, so every rank of a node finds the same one). Never the working
    directory: a job writes where its settings say."""
    if job.disdp.run_dir:
        return job.disdp.run_dir, False
    if job.store.dirs:
        return os.path.join(job.store.dirs.split(",")[0].strip(), "terastack-dist"), False
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or f"{os.getpid()}"
    return os.path.join(tempfile.gettempdir(), f"terastack-dist-{run_id}"), True


def launch_job(job, *, quiet: bool = False, argv: list[str] | None = None) -> dict:
    """Run ``job`` on this machine: every rank under torchrun's elastic agent on loopback; rank 0's result.
    Ctrl-C raises :class:`~terastack.training.interrupt.JobInterrupted` once every rank has left, with the line
    naming the last checkpoint and the command (``argv``: the words after ``terastack``) that resumes from it."""
    from terastack.training.interrupt import interrupted_line, latest_checkpoint
    from terastack.training.job import write_job_file

    check_job(job)
    roles = roles_of(job)
    path, scratch = job_run_dir(job)
    run_dir = Path(path)
    job = dataclasses.replace(job, disdp=dataclasses.replace(job.disdp, run_dir=str(run_dir)))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RESULT).unlink(missing_ok=True)
        job_file = run_dir / "job.yaml"
        write_job_file(job.with_absolute_paths(), job_file, command=COMMAND)   # the ranks may start elsewhere
        interrupted = launch_ranks(roles, JOB_RUN_MODULE, [str(job_file)], world_size=roles.world_size,
                                   timeout_s=job.disdp.timeout_s, quiet=quiet,
                                   resume_hint=lambda: resume_hint(job), interruptible=True,
                                   preload=rank_imports(job))
        if interrupted and not (run_dir / RESULT).exists():   # a Ctrl-C after the job's end changes nothing
            d = job.checkpoint.dir
            raise JobInterrupted(interrupted_line(step=None, total=None, where="", last=latest_checkpoint(d),
                                                  argv=argv, checkpoint_dir=d, command=("dist", "train")))
        return json.loads((run_dir / RESULT).read_text())
    finally:
        if scratch:
            shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: list[str] | None = None, *, early_interrupts: list | None = None) -> int:
    """``python -m terastack.disdp.job_run JOB.yaml`` under torchrun (``early_interrupts``:
    :func:`run_torchrun_rank`)."""
    from terastack.training.job import resolve_job

    argv = sys.argv[1:] if argv is None else argv
    job = resolve_job(file=argv[0], flags={}, overrides=list(argv[1:]), log=None)
    return run_torchrun_rank(job, early_interrupts=early_interrupts)


if __name__ == "__main__":
    sys.exit(main())
