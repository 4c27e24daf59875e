"""A job on the disaggregated engine: :class:`DisdpEngine`, the :class:`~terastack.training.engine_protocol.
TrainingEngine` that rank 0 hands the shared loop, and :func:`follow`, what every other rank does meanwhile.

Rank 0 is worker 0: each call of the loop becomes step messages ([Note: step messages] in
:mod:`terastack.disdp.control`) and rank 0 computes its own rows of every pass like any other worker. The
optimizer state never leaves the servers but for a checkpoint (:meth:`DisdpEngine.save_checkpoint`, gathered
to rank 0 and written by the checkpoint manager) and the export (:meth:`DisdpEngine.save_pretrained`).

[Note: equal to the single-process job]
The loss of a step is the sum over its target tokens divided by their number in the whole step (every
micro-batch, every worker): worker i's loss is its rows' sum divided by that number, so the workers'
gradients *add up* (the aggregator and the servers sum, not average) to the gradient of the whole batch, as
``terastack finetune`` computes it. The servers add the micro-batches' gradients, clip by the norm of the
whole gradient (all shards) and apply PyTorch's AdamW at the schedule's learning rate.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from terastack.disdp.agent import AgentCore, AgentProcess, RelayLink, ThreadAgent
from terastack.disdp.aggregator import Aggregator
from terastack.disdp.control import Command, Control, Op, split_rows, target_tokens
from terastack.disdp.roles import Role
from terastack.disdp.server import AdamWConfig, ParameterServer, scratch_dir
from terastack.disdp.server_state import COMPONENT, ServerState, bucket_kinds, slice_regions
from terastack.disdp.train_config import inject_fault
from terastack.disdp.worker import ShardedModel
from terastack.training.engine_protocol import StepCount, StepStats
from terastack.units import parse_bytes


class JobWorker:
    """Worker i's part of every pass: the unmodified model, parameters arriving and gradients leaving per
    bucket through its agent (a thread pair per pass, or the agent process)."""

    def __init__(self, me):
        self.me = me
        self.sharded = ShardedModel(me.meta_model, me.layout, me.schedule)
        self.relay = (RelayLink(me.comm, me.roles, me.index, me.schedule, self.sharded.buckets,
                                prefetch=me.job.disdp.prefetch) if me.roles.agents == "process" else None)

    def run_pass(self, command: Command, rows: dict) -> float:
        me, sharded = self.me, self.sharded
        if self.relay is not None:
            link = self.relay
        else:
            core = AgentCore(roles=me.roles, comm=me.comm, layout=me.layout, worker=me.index)
            link = ThreadAgent(core, me.schedule, sharded.buckets, first_step=command.pass_index, steps=1,
                               prefetch=me.job.disdp.prefetch, timeout_s=me.job.disdp.timeout_s)
        sharded.link = link
        try:
            sharded.begin_step(command.pass_index)
            # the loss's denominator is the whole step's target tokens ([Note: equal to the single-process job])
            out = sharded.model(**rows, num_items_in_batch=command.targets, use_cache=False)
            loss = out.loss
            del out
            loss.backward()
            sharded.finish_step()
        except BaseException:
            link.abort()
            raise
        if self.relay is None:
            link.close()
        return float(loss.detach())


class DisdpEngine:
    """The disaggregated engine as the loop sees it ([Note: the engine protocol]); lives on rank 0."""

    def __init__(self, me, control: Control, worker: JobWorker, *, lr: float, hf_config, model_dir: str | None):
        self.me, self.control, self.worker = me, control, worker
        self.lr = lr
        self.max_grad_norm = me.job.training.max_grad_norm
        self.hf_config, self.source_dir = hf_config, model_dir
        self.history: list[StepStats] = []
        self.progress = StepCount()
        self.passes = 0
        n = me.layout.numel
        self.profile = SimpleNamespace(total_params=n, trainable_params=n)

    @property
    def step_count(self) -> int:
        return self.progress.step

    # ---------------------------------------------------------------- passes
    def _pass(self, op: Op, batch: dict, *, targets: int, apply: bool = False) -> tuple[float, float]:
        me = self.me
        command = Command(op=op, pass_index=self.passes, lr=self.lr, targets=targets, apply=apply,
                          max_grad_norm=self.max_grad_norm or 0.0)
        self.passes += 1
        self.control.announce(command)
        parts = split_rows(batch, me.roles.workers)
        for w in range(1, me.roles.workers):
            self.control.send_rows(parts[w], me.roles.worker_rank(w))
        mine = self.worker.run_pass(command, parts[0])
        loss, norm = self.control.add_up([mine, 0.0])
        return loss, norm

    @staticmethod
    def _batch(input_ids, labels=None, attention_mask=None, position_ids=None) -> dict:
        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        out = {"input_ids": ids, "labels": ids if labels is None else torch.as_tensor(labels).reshape(ids.shape)}
        if attention_mask is not None:
            out["attention_mask"] = torch.as_tensor(attention_mask).reshape(ids.shape)
        if position_ids is not None:
            out["position_ids"] = torch.as_tensor(position_ids).reshape(ids.shape)
        return out

    def step(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        return self.step_accumulated([dict(input_ids=input_ids, labels=labels, attention_mask=attention_mask,
                                           position_ids=position_ids)])

    def step_accumulated(self, micro_batches) -> float:
        batches = [self._batch(**mb) for mb in micro_batches]
        targets = sum(target_tokens(b) for b in batches)
        if targets == 0:
            raise ValueError("micro_batches: no target token in any micro-batch (every label after the shift is "
                             "-100); the token-weighted loss is undefined")
        t0 = time.perf_counter()
        loss = norm = 0.0
        for k, b in enumerate(batches):   # the servers update after the last micro-batch (and report the norm)
            part, norm = self._pass(Op.TRAIN, b, targets=targets, apply=k == len(batches) - 1)
            loss += part
        self.progress.step += 1
        self.history.append(StepStats(step=self.progress.step, loss=loss, seconds=time.perf_counter() - t0,
                                      tokens=sum(b["input_ids"].numel() for b in batches),
                                      grad_norm=norm if self.max_grad_norm else None))
        return loss

    def loss(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        batch = self._batch(input_ids, labels, attention_mask, position_ids)
        return self._pass(Op.EVAL, batch, targets=max(1, target_tokens(batch)))[0]

    def synchronize(self) -> None:
        pass  # every call returns after its updates have landed (the figures come back after them)

    # ----------------------------------------------------------- the state
    def _pull(self, b: int, moments: bool) -> dict[str, torch.Tensor]:
        """Bucket ``b`` whole (parameters, and the optimizer state's records with ``moments``), asked of every
        server."""
        me = self.me
        kinds = bucket_kinds(me.layout, b)
        out = {k: torch.empty(n, dtype=dtype) for k, (dtype, n) in kinds.items() if moments or k == "param"}
        for s in range(me.roles.servers):
            self.control.send(torch.tensor([b, int(moments)], dtype=torch.int64), me.roles.server_rank(s))
        for s in range(me.roles.servers):
            for k, (_, lo, hi) in slice_regions(me.layout, b, s).items():
                if k in out:
                    self.control.recv(out[k][lo:hi], me.roles.server_rank(s))
        return out

    def _end_pulls(self) -> None:
        for s in range(self.me.roles.servers):
            self.control.send(torch.tensor([-1, 0], dtype=torch.int64), self.me.roles.server_rank(s))

    def save_checkpoint(self, path, *, components=None):
        from terastack.training.checkpoint import JSONState, save_checkpoint

        self.control.announce(Command(op=Op.SAVE))
        adam_step = float(self.control.recv(torch.zeros(1, dtype=torch.float64), self.me.roles.server_rank(0)))
        state = ServerState(self.me.layout, pull=lambda b: self._pull(b, moments=True), adam_step=adam_step)
        try:
            return save_checkpoint(path, {COMPONENT: state,
                                          "progress": self.progress, "job": JSONState(self.me.job.to_dict()),
                                          **(components or {})}, step=self.step_count)
        finally:
            self._end_pulls()

    def resume(self, snapshot) -> None:
        """Load the servers' state and the step from ``snapshot`` (the loop loads its own parts after)."""
        me = self.me
        state = ServerState(me.layout)
        snapshot.load({COMPONENT: state, "progress": self.progress})
        self.control.announce(Command(op=Op.LOAD, adam_step=state.adam_step))
        for b in range(len(me.layout.buckets)):   # one tensor in memory at a time
            for k in bucket_kinds(me.layout, b):
                full = state.read(b, k)
                for s in range(me.roles.servers):
                    _, lo, hi = slice_regions(me.layout, b, s).get(k, (None, 0, 0))
                    self.control.send(full[lo:hi], me.roles.server_rank(s))

    def save_pretrained(self, path, *, dtype: str | None = None, max_shard_size="5GB") -> Path:
        """The model in Hugging Face format (``config.json``, safetensors shards, the tokenizer files)."""
        from terastack.dtypes import WEIGHT_DTYPES, dtype_name, to_dtype
        from terastack.training.hf.keys import export_layout
        from terastack.training.hf.model_files import build_skeleton
        from terastack.training.hf.sharded_writer import (copy_tokenizer_files, shard_limit, staged_dir,
                                                          write_safetensors_files)

        layout = self.me.layout
        where = {slot.name: (b, slot) for b, bucket in enumerate(layout.buckets) for slot in bucket.params}
        tensors = {name: SimpleNamespace(shape=slot.shape, numel=slot.numel) for name, (_, slot) in where.items()}
        target = torch.float32 if dtype is None else to_dtype(dtype, allowed=WEIGHT_DTYPES)
        skeleton = build_skeleton(self.hf_config)
        # Streamed: the root bucket (the embeddings; with tied weights also the head) and one other bucket are on
        # rank 0 at a time, pulled from the servers as the writer reaches them.
        cache: dict[int, torch.Tensor] = {}

        def fetch(name: str) -> torch.Tensor:
            b, slot = where[name]
            if b not in cache:
                for old in [k for k in cache if k != 0]:
                    del cache[old]
                cache[b] = self._pull(b, moments=False)["param"]
            return cache[b][slot.offset:slot.offset + slot.numel].view(slot.shape).clone()

        self.control.announce(Command(op=Op.EXPORT))
        try:
            with staged_dir(path) as tmp:
                groups = [({key: (shape, target) for key, shape in shapes.items()},
                           lambda run=run: run(fetch))
                          for _, run, shapes in export_layout(skeleton, tensors)]
                write_safetensors_files(tmp, groups, max_shard_size=shard_limit(max_shard_size),
                                        total_parameters=layout.numel)
                cfg = copy.deepcopy(self.hf_config)
                cfg.dtype = dtype_name(target)
                cfg.to_json_file(str(tmp / "config.json"))
                copy_tokenizer_files(self.source_dir, tmp)
        finally:
            self._end_pulls()
        return Path(path)

    def stop(self) -> dict:
        """End the job on every rank; the memory figures: the most parameter bytes a worker held at once and
        the most host bytes a server's state took (the most over the ranks)."""
        self.control.announce(Command(op=Op.STOP))
        # [server state, worker parameters], as every follower's figures() gives them
        server, worker = self.control.max_of([0.0, float(self.worker.sharded.peak_param_bytes)])
        return {"worker_peak_param_bytes": int(worker), "server_peak_host_state_bytes": int(server),
                "model_param_bytes": self.me.layout.numel * 4}


def follow(me, control: Control, part) -> int:
    """What every rank but rank 0 does: carry out rank 0's commands until STOP; the passes it ran. The job's
    ``disdp.kill_at`` (ROLE:INDEX:STEP[:FAULT]) fails this rank as its first pass of step STEP (counted from 1)
    comes: the checkpoints of the steps before it are written by then, and the job cannot end without it."""
    passes = done = 0   # done: the steps the servers have applied (a resumed job's checkpoint counts)
    while True:
        command = control.next()
        if command.op is Op.STOP:
            control.max_of(part.figures())
            return passes
        if command.op in (Op.TRAIN, Op.EVAL):
            if command.op is Op.TRAIN:
                inject_fault(me.job.disdp.kill_at, me.role, me.index, done + 1, me.roles.describe(me.rank))
                done += command.apply
            passes += 1
            control.add_up(part.run_pass(command))
        else:
            done = int(command.adam_step) if command.op is Op.LOAD else done
            part.state(command)


class WorkerPart:
    def __init__(self, me, control: Control):
        self.worker, self.control = JobWorker(me), control

    def run_pass(self, command: Command) -> list[float]:
        return [self.worker.run_pass(command, self.control.recv_rows(0)), 0.0]

    def figures(self) -> list[float]:
        return [0.0, float(self.worker.sharded.peak_param_bytes)]

    def state(self, command: Command) -> None:
        pass


class ServerPart:
    def __init__(self, me, control: Control, shard: dict[int, torch.Tensor]):
        self.me, self.control = me, control
        job = me.job
        t = job.training
        ssd = job.disdp.state == "ssd"
        budget = job.store.host_budget
        self.server = ParameterServer(
            # with the state on the SSD: the job's host budget (store.host_budget) bounds each server's store, and
            # one gradient bucket is received ahead ([Note: the server's host memory] in terastack.disdp.server)
            ParameterServer.Config(state=job.disdp.state, store_root=scratch_dir(job.disdp.run_dir, me.index),
                                   mean=False, tier_params=True, recv_ahead=1 if ssd else 2,
                                   send_window=1 if ssd else 2,   # the next bucket is read ahead meanwhile
                                   host_budget=parse_bytes(budget, field="store.host_budget")
                                   if ssd and budget not in (None, "auto") else None),
            index=me.index, roles=me.roles, comm=me.comm, layout=me.layout, schedule=me.schedule,
            adamw_config=AdamWConfig(lr=1.0, beta1=t.betas[0], beta2=t.betas[1], eps=t.eps,
                                     weight_decay=t.weight_decay),
            shard=shard)

    def run_pass(self, command: Command) -> list[float]:
        self.server.opt.lr = command.lr
        norm = self.server.step(command.pass_index, keep=command.op is Op.TRAIN, apply=command.apply,
                                max_grad_norm=command.max_grad_norm or None, norm_group=self.control.servers)
        return [0.0, norm if norm is not None and self.me.index == 0 else 0.0]

    def state(self, command: Command) -> None:
        server, layout, control = self.server, self.me.layout, self.control
        if command.op is Op.LOAD:
            for b in range(len(layout.buckets)):   # rank 0 sends every kind of the bucket, an empty part if none
                regions = slice_regions(layout, b, self.me.index)
                parts = {k: control.recv(torch.empty(regions[k][2] - regions[k][1] if k in regions else 0,
                                                     dtype=dtype), 0)
                         for k, (dtype, _) in bucket_kinds(layout, b).items()}
                server.load_bucket(b, parts.pop("param"), {k: v for k, v in parts.items() if k in regions},
                                   command.adam_step)
            server.optimizer_state.flush()
            return
        if command.op is Op.SAVE and self.me.index == 0:
            control.send(torch.tensor([float(server.adam_steps[0].item())], dtype=torch.float64), 0)
        # rank 0 asks for one bucket at a time: with state="ssd" the shard is never whole in memory
        while True:
            b, moments = control.recv(torch.zeros(2, dtype=torch.int64), 0).tolist()
            if b < 0:
                return
            control.send(server.params.get(b), 0)
            server.params.release(b)
            if moments:   # in the order slice_regions gives
                state = server.optimizer_state.get(b, self.me.job.disdp.timeout_s)
                for name in server.slices[b].records:
                    control.send(state[name], 0)
                server.optimizer_state.release(b)

    def figures(self) -> list[float]:
        return [float(self.server.host_state_bytes()), 0.0]

    def close(self) -> None:
        self.server.close()


class AggregatorPart:
    def __init__(self, me, control: Control):
        self.agg = Aggregator(roles=me.roles, comm=me.comm, layout=me.layout, schedule=me.schedule, mean=False)

    def run_pass(self, command: Command) -> list[float]:
        self.agg.step(command.pass_index)
        return [0.0, 0.0]

    def figures(self) -> list[float]:
        return [0.0, 0.0]

    def state(self, command: Command) -> None:
        pass


class AgentPart:
    def __init__(self, me, control: Control):
        core = AgentCore(roles=me.roles, comm=me.comm, layout=me.layout, worker=me.index)
        self.agent = AgentProcess(core, me.schedule, prefetch=me.job.disdp.prefetch)

    def run_pass(self, command: Command) -> list[float]:
        self.agent.step(command.pass_index)
        return [0.0, 0.0]

    def figures(self) -> list[float]:
        return [0.0, 0.0]

    def state(self, command: Command) -> None:
        pass


def part_of(me, control: Control, shard=None):
    """The follower of ``me``'s role (a server takes its slice of the initial weights)."""
    if me.role is Role.SERVER:
        return ServerPart(me, control, shard)
    return {Role.WORKER: WorkerPart, Role.AGGREGATOR: AggregatorPart, Role.AGENT: AgentPart}[me.role](me, control)

