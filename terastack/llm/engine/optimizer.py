"""AdamW on CPU threads over state in the store, one unit at a time, overlapped with backward.

[Note: active gradient offloading]
In "eager" mode a tensor's update starts as soon as its last gradient
contribution of the step exists (for most tensors: right after the backward
of their unit; a tied embedding waits for both of its users). The gradient
leaves the device at once and the update (read master and moments, AdamW,
write them back) runs on the optimizer thread while backward continues on
earlier units. With fp32 compute the master *is* the compute weight: backward
hands its working copy to the optimizer instead of dropping it, so the master
is read twice per step (forward, backward), not three times. The next step's
fetch of a tensor waits for its update future, so updates stay synchronous:
the weights of step t+1 are exactly those plain training produces.

[Note: clipping with eager updates]
Global-norm clipping scales every gradient by ``min(1, max_norm / (norm +
1e-6))``, and the norm is known only when backward has finished, after the
eager update of most units would already have run. Updating first and
correcting later cannot be exact (AdamW's moments are not reversible in
floating point), so with ``max_grad_norm`` set the optimizer runs in
"deferred" mode: backward still moves every gradient off the device at once
(to the host pool, or to the SSD when the pool is full) and adds up its
squared norm; when backward ends the coefficient is computed exactly as
``torch.nn.utils.clip_grad_norm_`` does, and the updates run in *forward*
order, overlapped with the next step's forward, which waits per unit for the
update of that unit only. The result equals plain training with
``clip_grad_norm_`` followed by ``AdamW.step``.

[Note: inline updates without an accelerator]
When the model computes on the CPU, backward and AdamW compete for the same
cores: an optimizer thread running beside backward only time-slices with it,
and each time it preempts one of the intra-op threads the other waits at the
next barrier. Measured on the 2-core bench machine (llama-150m, quarter host
budget, one process alternating the two): beside the optimizer thread the
backward phase took 1.57 s per step; inline, its compute took 1.33 s plus
0.20 s of updates, and the step fell from 2.22 s to 2.08 s. So without an
accelerator eager updates run *inline*: right after a unit's backward, on the
training thread,
over all of that unit's state in one fused AdamW call (no per-chunk calls),
while the SSD does the rest in the background: the next unit's state is read
while this unit's backward and update run, and the updated state is written
while the earlier units compute. The planner budgets one unit's state read
ahead and one unit's being written (``read_ahead_bytes``,
``writeback_bytes``); with less host memory the groups shrink to chunks.
With an accelerator the optimizer thread is what keeps the CPU's AdamW off
the GPU's critical path.

"after_backward" mode (the ablation "active offloading off") keeps the
gradients the same way but runs every update after backward and makes the
step wait for all of them, as ZeRO-Offload style optimizers do.

[Note: the optimizer's parts]
The optimizer is split the way the store is: this module composes the parts
and answers the step's hand-offs; when each schedule runs its updates is
:mod:`terastack.llm.engine.schedules` (over the specs of
:mod:`terastack.plan.schedule_specs`, which the planner reads too); what
backward hands over waits in :mod:`terastack.llm.engine.gradient_intake`;
masters and moments are read and written by
:mod:`terastack.llm.engine.optimizer_state`; the arithmetic is
:mod:`terastack.llm.engine.adamw`.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch

from terastack import trace
from terastack.io.futures import Future
from terastack.llm.engine.adamw import ChunkState, adamw_kwargs, clip_coefficient, total_norm
from terastack.llm.engine.gradient_intake import GradientIntake
from terastack.llm.engine.optimizer_state import OptimizerState, check_whole_tensor_gather
from terastack.llm.engine.schedules import UpdateFailure, make_schedule
from terastack.plan.optimizer_formats import ADAMW, optimizer_format
from terastack.plan.schedule_specs import EAGER, schedule_spec
from terastack.tiers import Tier


@dataclass(slots=True)
class UpdateTask:
    """The updates of the tensors one unit completes (what a schedule hands its executor)."""

    unit: str
    names: list[str]
    coef: float | None                 # clip coefficient (None: no clipping)
    lr: float


class OffloadedAdamW:
    """AdamW whose fp32 masters and moments rest in the store; updates run as the schedule says. See [Note: the
    optimizer's parts]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        lr: float = 1e-4
        betas: tuple[float, float] = (0.9, 0.999)
        eps: float = 1e-8
        weight_decay: float = 0.0
        max_grad_norm: float | None = None
        #: the schedule's name (terastack.plan.schedule_specs)
        optimizer_schedule: str = EAGER.name
        #: "auto" (fused when torch supports it on the device), "fused", "foreach" or "single"
        impl: str = "auto"
        timeout: float = 600.0
        #: the optimizer state format's name ([Note: optimizer state formats] in terastack.plan.optimizer_formats)
        format: str = ADAMW.name
        #: trainable tensors (canonical names) updated without weight decay, as a torch optimizer's parameter group
        #: with ``weight_decay=0`` updates them (transformers' Trainer puts biases and norms there)
        no_decay: frozenset[str] = frozenset()

        def __post_init__(self) -> None:
            if not self.lr >= 0:
                raise ValueError(f"lr: must be >= 0, got {self.lr}")
            if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
                raise ValueError(f"betas: must be two numbers in [0, 1), got {self.betas}")
            if not self.eps > 0:
                raise ValueError(f"eps: must be > 0, got {self.eps}")
            if not self.weight_decay >= 0:
                raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")
            if self.max_grad_norm is not None and not self.max_grad_norm > 0:
                raise ValueError(f"max_grad_norm: must be > 0 or None, got {self.max_grad_norm}")
            schedule_spec(self.optimizer_schedule).check_clipping(self.max_grad_norm)
            if self.impl not in ("auto", "fused", "foreach", "single"):
                raise ValueError(f"impl: must be auto, fused, foreach or single; got {self.impl!r}")
            optimizer_format(self.format)

    def __init__(self, config: "OffloadedAdamW.Config", runtime, tensors: dict, *, grad_pool_bytes: int,
                 masters_bytes: int = 1 << 62, writeback_bytes: int = 1 << 62, read_ahead_bytes: int = 0,
                 inline: bool = False, grad_homes: dict | None = None):
        self.config = config
        self.rt = runtime
        self.format = optimizer_format(config.format)
        self.format.require()
        self.tensors = {name: info for name, info in tensors.items() if info.trainable}
        if self.format.whole_tensor:
            check_whole_tensor_gather(self.format, runtime, self.tensors)
        self.lr = config.lr
        self._step_lr = config.lr
        self.steps: dict[str, int] = {name: 0 for name in self.tensors}
        self._cv = threading.Condition()  # notified when an update ends, a master leaves or the pool has room
        self._failure = UpdateFailure()
        self._gates: dict[str, Future] = {}
        self._adam = adamw_kwargs(config.impl, torch.device("cpu"))
        self._last_users: dict[int, list[str]] = {}
        self._backward_next: dict[int, int] = {}
        self._read_ahead_units: set[int] = set()  # units whose state this backward has started reading
        self.last_grad_norm: float | None = None
        self.updated_params = 0
        # when updates run (and on which thread): [Note: inline updates without an accelerator]
        spec = schedule_spec(config.optimizer_schedule)
        self.schedule = make_schedule(self, spec, inline=inline, run=self._update, on_error=self._fail, cv=self._cv)
        self.executor = self.schedule.executor
        self.state = OptimizerState(runtime, self.tensors, cv=self._cv, failure=self._failure,
                                    masters_bytes=masters_bytes, writeback_bytes=writeback_bytes,
                                    read_ahead_bytes=read_ahead_bytes, timeout=config.timeout)
        # [Note: gradient accumulation] (terastack.llm.engine.accumulate): a backward may only add to the sums
        self.grads = GradientIntake(runtime, self.tensors, pool_bytes=grad_pool_bytes, backpressure=spec.backpressure,
                                    clipping=config.max_grad_norm is not None, sum_homes=grad_homes or {},
                                    cv=self._cv, executor=self.executor, failure=self._failure,
                                    timeout=config.timeout, sum_window=(read_ahead_bytes, writeback_bytes))

    @property
    def inline(self) -> bool:
        """Updates run on the training thread (see [Note: inline updates without an accelerator])."""
        return self.executor.inline

    @property
    def step_lr(self) -> float:
        """The learning rate of the step under way (the last one begun)."""
        return self._step_lr

    @property
    def grad_pool(self):
        """The host ledger of gradients in flight."""
        return self.grads.pool

    @property
    def read_ahead_limit(self) -> int:
        """Bytes of optimizer state read ahead at most (inline updates group by it)."""
        return self.state.read_ahead_limit

    @read_ahead_limit.setter
    def read_ahead_limit(self, value: int) -> None:
        self.state.read_ahead_limit = value

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """What a checkpoint needs besides the records in the store: the learning rate, the state format and
        per-tensor step counts (masters and the format's state are streamed from the store record by record)."""
        return {"lr": self.lr, "adam_steps": dict(self.steps), "format": self.format.name}

    def load_state_dict(self, state: dict) -> None:
        written = state.get("format", ADAMW.name)  # checkpoints before the formats were AdamW's
        if written != self.format.name:
            raise ValueError(f"checkpoint: its optimizer state is {written}; this run's optimizer is "
                             f"{self.format.name} (resume with optimizer {written})")
        self.lr = float(state["lr"])
        for name, steps in state["adam_steps"].items():
            if name in self.steps:
                self.steps[name] = int(steps)

    # -------------------------------------------------------------- per step
    def begin_step(self, *, accumulate: bool = False) -> None:
        """A forward and backward begin. ``accumulate``: a micro-batch of an accumulated step other than the last:
        its gradients are added to the sums and nothing is updated (see [Note: gradient accumulation])."""
        self.raise_if_failed()
        self.grads.begin_step(accumulate=accumulate)
        self._step_lr = self.lr

    def begin_backward(self) -> None:
        """Forward is done (and the fetcher knows the order units ran in)."""
        # the unit whose backward delivers a tensor's last gradient: its user that runs first in forward
        order = self.rt.fetcher.order
        pos = {u: i for i, u in enumerate(order)}
        self._backward_next = dict(zip(order[1:], order[:-1]))
        self._read_ahead_units = set()
        self._last_users = {}
        for name, info in self.tensors.items():
            last = min(info.users, key=lambda u: pos.get(u, u))
            self._last_users.setdefault(last, []).append(name)

    def update_gate(self, name: str) -> Future | None:
        """The future of ``name``'s update this step (None: none scheduled); its weights wait for it."""
        return self._gates.get(name)

    def prepare(self, unit) -> None:
        """Backward of ``unit`` begins (the schedule may start reading the state of tensors it completes; a
        micro-batch that only accumulates starts reading their gradient sums instead)."""
        if not self.grads.accumulating:
            self.schedule.on_unit_backward(unit)
        else:
            self.grads.sums.read_ahead(self._last_users.get(unit.index, ()))

    def handoff(self, unit) -> set[str]:
        """Canonical names whose fp32 working copy backward should hand over instead of dropping."""
        if not self.schedule.spec.hands_off_masters or not self.rt.master_is_compute or self.grads.accumulating:
            return set()
        return self.state.hand_over(self._last_users.get(unit.index, ()), alone=self.inline)

    def accept(self, unit, grads: dict[str, torch.Tensor | None]) -> None:
        """Gradients of ``unit`` (canonical names), called from backward. Inline: the updates they complete run
        now; otherwise this returns without waiting for them."""
        self.raise_if_failed()
        intake = self.grads.accept(unit.path, grads)
        for name in intake.unused:
            self.state.return_master(name)
        if not intake.ready:
            return
        for name in intake.ready:
            self._gates[name] = Future()
        self.schedule.on_grads_ready(unit, intake.ready)

    def end_step(self) -> None:
        """Backward is done: the schedule gets the clip coefficient (deferred updates are queued; after_backward
        waits for them)."""
        self.raise_if_failed()
        pending = self.grads.incomplete()
        if pending:
            raise RuntimeError(f"backward ended with gradients of {pending[:3]} still incomplete")
        if self.grads.accumulating:
            return  # the updates run in the last micro-batch
        coef = None
        if self.config.max_grad_norm is not None:
            total = total_norm(self.grads.norms())
            self.last_grad_norm = float(total)
            coef = clip_coefficient(total, self.config.max_grad_norm)
        self.schedule.on_backward_end(coef)

    # ------------------------------------------- operations for schedules
    def completed_by(self, unit_index: int) -> list[str]:
        """Trainable tensors whose last gradient of the step comes from the backward of ``unit_index``."""
        return self._last_users.get(unit_index, [])

    def next_in_backward(self, unit_index: int) -> int | None:
        """The unit whose backward runs after ``unit_index``'s (None: it is the last)."""
        return self._backward_next.get(unit_index)

    def task(self, unit_index: int, names: list[str], coef=None) -> UpdateTask:
        """The update of ``names`` (completed by ``unit_index``) at this step's learning rate."""
        return UpdateTask(self.rt.units[unit_index].path, names, coef, self._step_lr)

    def gathered_by_unit(self) -> dict[int, list[str]]:
        """unit index -> tensors it completes that have a gradient this step (deferred schedules)."""
        return {unit_index: [n for n in names if self.grads.has(n)] for unit_index, names in self._last_users.items()}

    def forward_order(self, by_unit: dict) -> list[int]:
        """The keys of ``by_unit`` (unit indices) in the order forward runs them."""
        order = self.rt.fetcher.order
        return [u for u in order if u in by_unit] + [u for u in by_unit if u not in order]

    def read_ahead(self, unit_index: int | None) -> None:
        """Inline mode: start reading the state of the tensors ``unit_index`` completes, within the plan's
        read-ahead allowance (the rest is read when its update gets to it)."""
        if unit_index is None or unit_index in self._read_ahead_units:
            return
        self._read_ahead_units.add(unit_index)
        names = list(self._last_users.get(unit_index, ()))
        self.state.read_ahead([self._job_records(name, k) for name, k, _, _ in self._unit_jobs(names)])

    def prefetch_chunk(self, name: str, k: int) -> bool:
        """Start reading one chunk's records (one chunk ahead at most); False when that is not possible now."""
        return self.state.prefetch_chunk((name, k), self._job_records(name, k))

    def spill_if_unpooled(self, name: str) -> None:
        """A complete gradient that did not fit the pool goes to the SSD, in optimizer chunks."""
        self.grads.spill_if_unpooled(name)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until every scheduled update is done (and re-raise a failure of one)."""
        timeout = self.config.timeout if timeout is None else timeout
        if not self.executor.wait_idle(timeout, lambda: self._failure.error is not None):
            raise TimeoutError(f"optimizer updates still running after {timeout:.0f} s "
                               f"({self.executor.queued()} units queued)")
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Re-raise (on the training thread) the failure of an update."""
        self._failure.raise_if_failed()

    # ------------------------------------------------ for the step's services
    def busy(self) -> bool:
        return self.executor.busy()

    def on_update_thread(self) -> bool:
        """Whether the caller is the thread that runs updates (which must not wait for updates)."""
        return self.executor.is_current()

    def wait_progress(self, timeout: float) -> None:
        """Block until the worker finishes a task (or ``timeout`` passes)."""
        with self._cv:
            self._cv.wait(timeout)

    def close(self) -> None:
        self.executor.close(self.config.timeout)

    # ---------------------------------------------------------------- updates
    def _unit_jobs(self, names: list[str]) -> list[tuple[str, int, int, int]]:
        """(tensor, chunk, lo, hi) of every optimizer chunk of ``names``."""
        return [(name, k, lo, hi) for name in names for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name))]

    def _job_records(self, name: str, k: int) -> list[str]:
        """Store records one optimizer chunk reads: its state records and a spilled gradient chunk."""
        return self.state.records(name, k) + self.grads.spilled(name, k)

    def _fail(self, task: UpdateTask, exc: BaseException) -> None:
        self._failure.record(exc)
        for name in task.names:
            gate = self._gates.get(name)
            if gate is not None and not gate.done():
                gate.set_exception(exc)

    def _update(self, task: UpdateTask, nxt: UpdateTask | None) -> None:
        """AdamW over the task's tensors. On the optimizer thread: chunk by chunk, reading chunk j+1 while
        updating chunk j. Inline: see [Note: streaming a unit's state through the update]."""
        jobs = self._unit_jobs(task.names)
        with trace.span(f"adamw {task.unit}", track="optimizer", cat="optimizer", tensors=len(task.names)):
            if self.inline:
                self._update_streamed(task, jobs)
                return
            state = self.state
            whole: dict[str, torch.Tensor] = {}
            group: list[ChunkState] = []  # one chunk; a whole parameter where the format needs it
            group_bytes = 0
            for j, (name, k, lo, hi) in enumerate(jobs):
                if j + 1 < len(jobs):
                    self.prefetch_chunk(jobs[j + 1][0], jobs[j + 1][1])
                elif nxt is not None:
                    self.prefetch_chunk(nxt.names[0], 0)
                state.reached((name, k))
                group_bytes += state.chunk_bytes(name, k)
                state.throttle_writebacks(group_bytes)  # [Note: a group's write-back is made room for whole]
                group.append(self._gather(task, name, k, lo, hi, whole))
                if self._divisible(group):
                    self._apply(task, group, whole)
                    group, group_bytes = [], 0

    def _update_streamed(self, task: UpdateTask, jobs: list) -> None:
        """[Note: streaming a unit's state through the update]
        Inline, a unit's update runs on the training thread, so every read it waits for is a read compute waits
        for. Its chunks flow through a window of ``read_ahead_limit`` bytes: reads are issued ahead for the
        chunks that fit the window (those of this unit read ahead during its backward are already there), the
        chunks are updated in groups of at most half the window (so the other half is arriving while a group is
        computed) and of the write-back allowance, and each group is sent home as one request vector while the
        next is gathered. A unit whose state fits the window is read ahead whole during its backward and is
        updated in one fused call; a larger one streams at the disk's rate with large requests in flight,
        instead of one chunk read, updated and written at a time."""
        state = self.state
        window = state.read_ahead_limit
        records = [self._job_records(name, k) for name, k, _, _ in jobs]
        sizes = [sum(self.rt.store.padded(r) for r in recs) for recs in records]
        # a unit that fits the window was read ahead whole: one group; a larger one streams in half-windows
        group_limit = max(1, min(window if sum(sizes) <= window else window // 2, state.writeback_limit))
        issued = 0      # jobs whose reads have been issued
        ahead = 0       # bytes of issued jobs not yet updated
        whole: dict[str, torch.Tensor] = {}
        group: list[ChunkState] = []
        group_bytes = 0
        for j, (name, k, lo, hi) in enumerate(jobs):
            wanted = []
            while issued < len(jobs) and (issued <= j or ahead + sizes[issued] <= window):
                wanted += records[issued]
                ahead += sizes[issued]
                issued += 1
            if wanted:
                state.read_ahead([wanted], bounded=False)
            # a master that must wait for room may be waiting for those the group holds: update them first (a
            # group holding part of a parameter the format updates whole goes on: the master is the group's)
            if self._divisible(group) and (group_bytes + sizes[j] > group_limit or not state.master_fits(name, whole)):
                self._apply(task, group, whole)
                ahead -= group_bytes
                group, group_bytes = [], 0
            group_bytes += sizes[j]
            state.throttle_writebacks(group_bytes)  # [Note: a group's write-back is made room for whole]
            group.append(self._gather(task, name, k, lo, hi, whole))
        self._apply(task, group, whole)

    def _divisible(self, group: list[ChunkState]) -> bool:
        """Whether ``group`` may be updated now: it is not empty and, for a format that updates a parameter as one
        group ([Note: whole-matrix updates]), its last chunk completes its parameter."""
        return bool(group) and (not self.format.whole_tensor or group[-1].hi == self.tensors[group[-1].name].numel)

    def _gather(self, task: UpdateTask, name: str, k: int, lo: int, hi: int, whole: dict) -> ChunkState:
        """One chunk with its state read (``whole``: the whole fp32 masters read for this task, by name)."""
        rt, state = self.rt, self.state
        if rt.master_is_compute:
            if name not in whole:
                whole[name] = state.read_master(name)
            p = whole[name][lo:hi]
        else:
            p = state.read(rt.master_records(name)[k], "master", name, k)
        parts = {key: state.read(record, key, name, k) for key, record in state.parts(name, k)}
        g = self.grads.chunk(name, k, lo, hi)
        if task.coef is not None:
            g.mul_(task.coef)
        return ChunkState(name=name, chunk=k, lo=lo, hi=hi, shape=self.tensors[name].shape, param=p, grad=g,
                          state=parts)

    def _apply(self, task: UpdateTask, group: list[ChunkState], whole: dict) -> None:
        """One update of the format over the gathered chunks; their state goes home, finished tensors open their
        gates. The copies the format joins chunks into are charged to the host ledger while it runs ([Note:
        scheduling a whole-matrix gather] in terastack.llm.engine.optimizer_state)."""
        if not group:
            return
        for chunks, hyper in self._decay_groups(group):
            steps = [self.steps[c.name] for c in chunks]
            scratch = self.format.scratch_bytes(chunks, steps)
            if scratch:
                ledger = self.rt.store.budgets[Tier.HOST]
                what = f"{self.format.name} update of {chunks[0].name!r} (its chunks joined)"
                self.rt.with_room(lambda: ledger.reserve(scratch, what=what), what)
            try:
                self.format.update(chunks, steps, lr=task.lr, hyper=hyper, impl=self._adam)
            finally:
                if scratch:
                    ledger.release(scratch)
        done = []
        for c in group:
            done += self.state.records(c.name, c.chunk)
            if not self.rt.master_is_compute:
                self.state.keep_low(c.name, c.lo, c.hi, c.param)
        self.state.write_back(done)
        for c in group:
            self.grads.chunk_done(c.name, c.chunk)
            if c.hi == self.tensors[c.name].numel:
                self._finish(c.name, whole.pop(c.name, None))

    def _decay_groups(self, group: list[ChunkState]) -> list[tuple[list[ChunkState], "OffloadedAdamW.Config"]]:
        """``group`` as the update calls it takes: one, or (with ``no_decay``) the decayed chunks and the others,
        each with its hyperparameters (a torch optimizer's two parameter groups, updated elementwise alike)."""
        exempt = self.config.no_decay
        if not exempt or not self.config.weight_decay:
            return [(group, self.config)]
        decayed = [c for c in group if c.name not in exempt]
        plain = [c for c in group if c.name in exempt]
        return ([(decayed, self.config)] if decayed else []) + (
            [(plain, dataclasses.replace(self.config, weight_decay=0.0))] if plain else [])

    def _finish(self, name: str, master: torch.Tensor | None) -> None:
        """The last chunk of ``name`` is updated: its master or compute copy goes home, its gate opens."""
        self.steps[name] += 1
        self.updated_params += self.tensors[name].numel
        if master is not None:
            self.state.finish_master(name)
        self.state.finish_low(name)
        self.grads.release(name)
        self._gates[name].set_result(None)
