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

When each mode runs its updates is written down in one place,
:mod:`terastack.llm.engine.schedules`; this module keeps the state and the math.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import torch

from terastack import trace
from terastack.io.errors import BudgetError
from terastack.io.futures import Future
from terastack.llm.engine import records
from terastack.llm.engine.accumulate import GradientSums
from terastack.llm.engine.schedules import MODES, make_schedule
from terastack.plan.llm_planner import held_bytes
from terastack.tiers import BudgetLedger, Tier


def adamw_kwargs(impl: str, device: torch.device) -> dict:
    """foreach/fused flags for torch's functional Adam (``decoupled_weight_decay=True`` is AdamW)."""
    if impl == "fused" or (impl == "auto" and _fused_supported(device)):
        return {"fused": True, "foreach": False}
    if impl == "foreach":
        return {"fused": False, "foreach": True}
    return {"fused": False, "foreach": False}


_FUSED: dict[str, bool] = {}


def _fused_supported(device: torch.device) -> bool:
    if device.type not in _FUSED:
        from torch.optim.adam import adam

        p = torch.zeros(4, device=device)
        try:
            adam([p], [torch.zeros_like(p)], [torch.zeros_like(p)], [torch.zeros_like(p)], [],
                 [torch.zeros((), device=device)], fused=True, foreach=False, decoupled_weight_decay=True,
                 amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.0, eps=1e-8, maximize=False)
            _FUSED[device.type] = True
        except (RuntimeError, TypeError):
            _FUSED[device.type] = False
    return _FUSED[device.type]


@dataclass(slots=True)
class _Grad:
    tensor: torch.Tensor | None        # on the host (None once spilled to the SSD)
    charged: int                        # bytes held in the gradient pool
    records: list = field(default_factory=list)  # spilled to the SSD: one store record per optimizer chunk


@dataclass(slots=True)
class UpdateTask:
    """The updates of the tensors one unit completes (what a schedule hands its executor)."""

    unit: str
    names: list[str]
    coef: float | None                 # clip coefficient (None: no clipping)
    lr: float


class OffloadedAdamW:
    """AdamW whose fp32 masters and moments rest in the store; updates run on one CPU thread."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        lr: float = 1e-4
        betas: tuple[float, float] = (0.9, 0.999)
        eps: float = 1e-8
        weight_decay: float = 0.0
        max_grad_norm: float | None = None
        mode: str = "eager"
        #: "auto" (fused when torch supports it on the device), "fused", "foreach" or "single"
        impl: str = "auto"
        timeout: float = 600.0

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
            if self.mode not in MODES:
                raise ValueError(f"mode: must be one of {', '.join(MODES)}; got {self.mode!r}")
            if self.max_grad_norm is not None and self.mode == "eager":
                raise ValueError("mode: eager updates cannot apply a global-norm clip exactly; use deferred "
                                 "(see [Note: clipping with eager updates])")
            if self.impl not in ("auto", "fused", "foreach", "single"):
                raise ValueError(f"impl: must be auto, fused, foreach or single; got {self.impl!r}")

    def __init__(self, config: "OffloadedAdamW.Config", runtime, tensors: dict, *, grad_pool_bytes: int,
                 masters_bytes: int = 1 << 62, writeback_bytes: int = 1 << 62, read_ahead_bytes: int = 0,
                 inline: bool = False, grad_homes: dict | None = None):
        self.config = config
        self.rt = runtime
        self.store = runtime.store
        self.tensors = {name: info for name, info in tensors.items() if info.trainable}
        self.lr = config.lr
        self.steps: dict[str, int] = {name: 0 for name in self.tensors}
        self.grad_pool = BudgetLedger("host (gradients in flight)", grad_pool_bytes)
        # Host memory the optimizer may hold (the planner's working set): whole fp32 masters -- handed over by
        # backward, read for an update, or on their way back -- within `masters_bytes`, of which the largest
        # master's size is kept free for the update's own read; one chunk read ahead; chunks being written back
        # within `writeback_bytes`. Without these limits a lagging optimizer would fill the host ledger with work
        # it has not reached.
        self.masters_limit = masters_bytes
        largest = max((i.numel for i in self.tensors.values()), default=0)
        self._master_reserve = held_bytes(4 * largest)
        self._masters: dict[str, int] = {}
        self._ahead: set[tuple[str, int]] = set()
        self.writeback_limit = writeback_bytes
        self.read_ahead_limit = read_ahead_bytes
        self._backward_next: dict[int, int] = {}
        self._read_ahead_units: set[int] = set()  # units whose state this backward has started reading
        self._low: dict[str, torch.Tensor] = {}  # mixed precision: compute copies being rebuilt from masters
        self._writebacks: collections.deque = collections.deque()  # (future, bytes) of state being written
        self._adam = adamw_kwargs(config.impl, torch.device("cpu"))
        self._gates: dict[str, Future] = {}
        self._chunk_bytes: dict[tuple[str, int], int] = {}  # (tensor, chunk) -> bytes of its state, fixed
        self._contrib: dict[str, int] = {}
        self._grads: dict[str, _Grad] = {}
        #: 2-norm of each complete gradient of this step (clipping only); the total is the norm of these norms,
        #: as ``clip_grad_norm_`` computes it
        self._grad_norms: dict[str, torch.Tensor] = {}
        self._last_users: dict[int, list[str]] = {}
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self.last_grad_norm: float | None = None
        self.updated_params = 0
        # [Note: gradient accumulation] (terastack.llm.engine.accumulate): this backward only adds to the sums
        self.sums = GradientSums(runtime, grad_homes or {})
        self._accumulating = False
        # when updates run (and on which thread): [Note: inline updates without an accelerator]
        self.schedule = make_schedule(self, config.mode, inline=inline, run=self._update, on_error=self._fail,
                                      cv=self._cv)
        self.executor = self.schedule.executor

    @property
    def inline(self) -> bool:
        """Updates run on the training thread (see [Note: inline updates without an accelerator])."""
        return self.executor.inline

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """What a checkpoint needs besides the records in the store: the learning rate and per-tensor AdamW
        step counts (masters and moments are streamed from the store record by record)."""
        return {"lr": self.lr, "adam_steps": dict(self.steps)}

    def load_state_dict(self, state: dict) -> None:
        self.lr = float(state["lr"])
        for name, steps in state["adam_steps"].items():
            if name in self.steps:
                self.steps[name] = int(steps)

    # -------------------------------------------------------------- per step
    def begin_step(self, *, accumulate: bool = False) -> None:
        """A forward and backward begin. ``accumulate``: a micro-batch of an accumulated step other than the last:
        its gradients are added to the sums and nothing is updated (see [Note: gradient accumulation])."""
        self._raise_if_failed()
        self._accumulating = accumulate
        self._contrib = {name: len(set(info.users)) for name, info in self.tensors.items()}
        self._grad_norms = {}
        self._step_lr = self.lr

    def begin_backward(self) -> None:
        """Forward is done (and the fetcher knows the order units ran in)."""
        # the unit whose backward delivers a tensor's last gradient: its user that runs first in forward
        order = {u: i for i, u in enumerate(self.rt.fetcher.order)}
        self._backward_next = dict(zip(self.rt.fetcher.order[1:], self.rt.fetcher.order[:-1]))
        self._read_ahead_units = set()
        self._last_users = {}
        for name, info in self.tensors.items():
            last = min(info.users, key=lambda u: order.get(u, u))
            self._last_users.setdefault(last, []).append(name)

    def update_gate(self, name: str) -> Future | None:
        return self._gates.get(name)

    def prepare(self, unit) -> None:
        """Backward of ``unit`` begins (the schedule may start reading the state of tensors it completes)."""
        if not self._accumulating:
            self.schedule.on_unit_backward(unit)

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
        return {unit_index: [n for n in names if n in self._grads] for unit_index, names in self._last_users.items()}

    def forward_order(self, by_unit: dict) -> list[int]:
        """The keys of ``by_unit`` (unit indices) in the order forward runs them."""
        order = self.rt.fetcher.order
        return [u for u in order if u in by_unit] + [u for u in by_unit if u not in order]

    def _unit_jobs(self, names: list[str]) -> list[tuple[str, int, int, int]]:
        """(tensor, chunk, lo, hi) of every optimizer chunk of ``names``."""
        return [(name, k, lo, hi) for name in names for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name))]

    def read_ahead(self, unit_index: int | None) -> None:
        """Inline mode: start reading the state of the tensors ``unit_index`` completes, within the plan's
        read-ahead allowance (the rest is read when its update gets to it)."""
        if unit_index is None or unit_index in self._read_ahead_units:
            return
        self._read_ahead_units.add(unit_index)
        names = self._last_users.get(unit_index, ())
        allowance = self.read_ahead_limit
        wanted: list[str] = []
        for name, k, _, _ in self._unit_jobs(list(names)):
            job = self._job_records(name, k)
            allowance -= sum(self.store.padded(r) for r in job)
            if allowance < 0:
                break
            wanted += job
        try:
            self.store.prefetch_many(wanted, Tier.HOST)
        except MemoryError:
            pass  # read when the update gets to it

    def handoff(self, unit) -> set[str]:
        """Canonical names whose fp32 working copy backward should hand over instead of dropping."""
        if not self.schedule.hands_off_masters or not self.rt.master_is_compute or self._accumulating:
            return set()
        out = set()
        with self._cv:
            held = sum(self._masters.values())
            for name in self._last_users.get(unit.index, ()):
                nbytes = held_bytes(self.tensors[name].numel * 4)
                if held + nbytes <= self.masters_limit - self._master_reserve:
                    self._masters[name] = nbytes
                    held += nbytes
                    out.add(name)
        return out

    def accept(self, unit, grads: dict[str, torch.Tensor | None]) -> None:
        """Gradients of ``unit`` (canonical names), called from backward. Inline: the updates they complete run
        now; otherwise this returns without waiting for them."""
        self._raise_if_failed()
        ready = []
        with trace.span(f"offload gradients {unit.path}", track="gradients", cat="offload"):
            for name, g in grads.items():
                if name not in self._contrib:
                    continue
                if g is not None:
                    if g.device.type != "cpu" or g.dtype != torch.float32:
                        g = g.to("cpu", torch.float32)
                    g = g.detach()
                    held = self._grads.get(name)
                    if held is None:
                        self._grads[name] = self._hold(name, g)
                    else:
                        held.tensor.add_(g)
                self._contrib[name] -= 1
                if self._contrib[name] == 0 and name not in self._grads:
                    if self._accumulating or name not in self.sums:
                        self._unused(name)
                        continue
                    # no gradient in the last micro-batch, but in earlier ones: the sum is the gradient
                    self._grads[name] = self._hold(name, torch.zeros(self.tensors[name].numel))
                if self._contrib[name] == 0 and self._accumulating:
                    self._add_to_sum(name)
                    continue
                if self._contrib[name] == 0:
                    if name in self.sums:
                        self.sums.take_into(name, self._grads[name].tensor.view(-1))
                    if self.config.max_grad_norm is not None:
                        # the norm of the whole gradient (a tied tensor's contributions summed)
                        self._grad_norms[name] = torch.linalg.vector_norm(self._grads[name].tensor, 2)
                    ready.append(name)
        if not ready:
            return
        for name in ready:
            self._gates[name] = Future()
        self.schedule.on_grads_ready(unit, ready)

    def end_step(self) -> None:
        """Backward is done: the schedule gets the clip coefficient (deferred updates are queued; after_backward
        waits for them)."""
        self._raise_if_failed()
        cfg = self.config
        pending = [n for n, left in self._contrib.items() if left > 0 and n in self._grads]
        if pending:
            raise RuntimeError(f"backward ended with gradients of {pending[:3]} still incomplete")
        if self._accumulating:
            return  # the updates run in the last micro-batch
        coef = None
        if cfg.max_grad_norm is not None:
            total = self._total_grad_norm()
            self.last_grad_norm = float(total)
            coef = torch.clamp(cfg.max_grad_norm / (total + 1e-6), max=1.0)
        self.schedule.on_backward_end(coef)

    def _total_grad_norm(self) -> torch.Tensor:
        """The global 2-norm of this step's gradients, as ``clip_grad_norm_`` computes it (the norm of the
        per-tensor norms, in parameter order); 0 when no gradient arrived."""
        if not self._grad_norms:
            return torch.zeros(())
        ordered = sorted(self._grad_norms, key=lambda n: self.tensors[n].index)
        return torch.linalg.vector_norm(torch.stack([self._grad_norms[n] for n in ordered]), 2)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait until every scheduled update is done (and re-raise a failure of one)."""
        timeout = self.config.timeout if timeout is None else timeout
        if not self.executor.wait_idle(timeout, lambda: self._error is not None):
            raise TimeoutError(f"optimizer updates still running after {timeout:.0f} s "
                               f"({self.executor.queued()} units queued)")
        self._raise_if_failed()

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

    # --------------------------------------------------------------- helpers
    def raise_if_failed(self) -> None:
        """Re-raise (on the training thread) the failure of an update."""
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"an optimizer update failed: {type(self._error).__name__}: {self._error}") \
                from self._error

    def _hold(self, name: str, g: torch.Tensor) -> _Grad:
        nbytes = g.numel() * 4
        if self.schedule.backpressure:
            # backpressure: backward waits for the optimizer to free room in the pool
            with trace.span(f"wait for room: gradient of {name}", track="stall", cat="gradients"):
                self._reserve_pool(nbytes, name)
            return _Grad(g if g.is_contiguous() else g.contiguous(), nbytes)
        try:
            self.grad_pool.reserve(nbytes, what=f"gradient of {name!r}")
            return _Grad(g.contiguous(), nbytes)
        except BudgetError:
            return _Grad(g.contiguous(), 0)  # spilled to the SSD once complete (spill_if_unpooled)

    def _add_to_sum(self, name: str) -> None:
        """A micro-batch's complete gradient of ``name`` joins its sum and leaves the gradient pool."""
        held = self._grads.pop(name)
        with trace.span(f"accumulate gradient {name}", track="gradients", cat="accumulate"):
            self.sums.add(name, held.tensor.view(-1))
        held.tensor = None
        if held.charged:
            with self._cv:
                self.grad_pool.release(held.charged)
                self._cv.notify_all()

    def spill_if_unpooled(self, name: str) -> None:
        """A complete gradient that did not fit the pool goes to the SSD, in optimizer chunks."""
        held = self._grads[name]
        if held.charged or held.records:
            return
        flat = held.tensor.view(-1)
        for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name)):
            record = records.spilled_grad(name, k)
            self.rt.track_write(self.store.put(record, flat[lo:hi], home=Tier.SSD))
            held.records.append(record)
        held.tensor = None

    def _reserve_pool(self, nbytes: int, name: str) -> None:
        deadline = self.config.timeout
        with self._cv:
            while True:
                try:
                    self.grad_pool.reserve(nbytes, what=f"gradient of {name!r}")
                    return
                except BudgetError:
                    if self._error is not None:
                        self._raise_if_failed()
                    if not self.executor.busy():
                        raise
                    if not self._cv.wait(timeout=deadline):
                        raise TimeoutError(f"gradient of {name!r} waited {deadline:.0f} s for room in the host "
                                           f"gradient pool ({self.grad_pool})") from None

    def _state_records(self, name: str, k: int) -> list[str]:
        """The state records of optimizer chunk ``k`` of ``name``: moments, and the master chunk in mixed
        precision (with fp32 compute the whole master is handled apart: it is the compute weight)."""
        rt = self.rt
        recs = [rt.moment_records(name, 1)[k], rt.moment_records(name, 2)[k]]
        if not rt.master_is_compute:
            recs.append(rt.master_records(name)[k])
        return recs

    def _job_records(self, name: str, k: int) -> list[str]:
        """Store records one optimizer chunk reads: its state records and a spilled gradient chunk."""
        recs = self._state_records(name, k)
        held = self._grads.get(name)
        if held is not None and held.records:
            recs.append(held.records[k])
        return recs

    def prefetch_chunk(self, name: str, k: int) -> bool:
        """Start reading one chunk's records (one chunk ahead at most); False when that is not possible now."""
        with self._cv:
            if (name, k) in self._ahead:
                return True
            if self._ahead:
                return False
            self._ahead.add((name, k))
        for record in self._job_records(name, k):
            try:
                self.store.prefetch(record, Tier.HOST)
            except MemoryError:
                return False
        return True

    # ---------------------------------------------------------------- updates
    def _fail(self, task: UpdateTask, exc: BaseException) -> None:
        self._error = exc
        for name in task.names:
            gate = self._gates.get(name)
            if gate is not None and not gate.done():
                gate.set_exception(exc)

    def _state_bytes(self, name: str, k: int) -> int:
        """Bytes of the optimizer state chunk ``k`` of ``name`` reads (moments; the master chunk in mixed
        precision), fixed for the run."""
        size = self._chunk_bytes.get((name, k))
        if size is None:
            size = self._chunk_bytes[(name, k)] = sum(self.store.padded(r) for r in self._state_records(name, k))
        return size

    def _fetch(self, record: str, part: str, name: str, k: int | None = None) -> torch.Tensor:
        """The state record ``record`` (``part`` of tensor ``name``, chunk ``k``) resident in host memory."""
        resident = self.store.resident(record, Tier.HOST)
        if resident is not None:
            return resident
        rt = self.rt
        what = f"{part} {name!r} for its update" if k is None else f"{part} chunk {k} of {name!r}"
        return rt.wait(rt.with_room(lambda: self.store.prefetch(record, Tier.HOST), what), what)

    def _update(self, task: UpdateTask, nxt: UpdateTask | None) -> None:
        """AdamW over the task's tensors. On the optimizer thread: chunk by chunk, reading chunk j+1 while
        updating chunk j. Inline: in groups of up to the read-ahead and write-back allowances (a whole unit when
        the plan has room), one fused call per group."""
        jobs = self._unit_jobs(task.names)
        # a group is written back in one request vector, and the next unit's state is read ahead while it is on
        # its way: so a group fits the write-back allowance too (with a lean plan, one chunk)
        group_limit = min(self.read_ahead_limit, self.writeback_limit) if self.inline else 0
        with trace.span(f"adamw {task.unit}", track="optimizer", cat="optimizer", tensors=len(task.names)):
            whole: dict[str, torch.Tensor] = {}
            group: list[tuple] = []
            group_bytes = 0
            for j, (name, k, lo, hi) in enumerate(jobs):
                if not self.inline:
                    if j + 1 < len(jobs):
                        self.prefetch_chunk(jobs[j + 1][0], jobs[j + 1][1])
                    elif nxt is not None:
                        self.prefetch_chunk(nxt.names[0], 0)
                    with self._cv:
                        self._ahead.discard((name, k))
                nbytes = self._state_bytes(name, k)
                # a master that must wait for room may be waiting for those the group holds: update them first
                if group and (group_bytes + nbytes > group_limit or not self._master_fits(name, whole)):
                    self._apply(task, group, whole)
                    group, group_bytes = [], 0
                self._throttle_writebacks(nbytes)
                group.append(self._gather(task, name, k, lo, hi, whole))
                group_bytes += nbytes
            self._apply(task, group, whole)

    def _gather(self, task: UpdateTask, name: str, k: int, lo: int, hi: int, whole: dict) -> tuple:
        """(name, chunk, lo, hi, master, gradient, exp_avg, exp_avg_sq) of one chunk, its state read."""
        rt = self.rt
        held = self._grads[name]
        if rt.master_is_compute:
            if name not in whole:
                self._admit_master(name)
                whole[name] = self._fetch(rt.master_records(name)[0], "master", name).view(-1)
            p = whole[name][lo:hi]
        else:
            p = self._fetch(rt.master_records(name)[k], "master", name, k)
        m = self._fetch(rt.moment_records(name, 1)[k], "exp_avg", name, k)
        v = self._fetch(rt.moment_records(name, 2)[k], "exp_avg_sq", name, k)
        if held.records:
            g = self._fetch(held.records[k], "gradient (from the SSD)", name, k)
        else:
            g = held.tensor.view(-1)[lo:hi]
        if task.coef is not None:
            g.mul_(task.coef)
        return name, k, lo, hi, p, g, m, v

    def _apply(self, task: UpdateTask, group: list[tuple], whole: dict) -> None:
        """One AdamW call over the gathered chunks; their state goes home, finished tensors open their gates."""
        from torch.optim.adam import adam

        if not group:
            return
        rt = self.rt
        cfg = self.config
        names, _, _, _, ps, gs, ms, vs = zip(*group)
        with torch.no_grad():
            adam(list(ps), list(gs), list(ms), list(vs), [], [torch.tensor(float(self.steps[n])) for n in names],
                 decoupled_weight_decay=True, amsgrad=False, beta1=cfg.betas[0], beta2=cfg.betas[1], lr=task.lr,
                 weight_decay=cfg.weight_decay, eps=cfg.eps, maximize=False, **self._adam)
        done = []
        for name, k, lo, hi, p, _, _, _ in group:
            done += self._state_records(name, k)
            if not rt.master_is_compute:
                if name not in self._low:
                    self._low[name] = torch.empty(self.tensors[name].numel, dtype=rt.compute_dtype)
                self._low[name][lo:hi].copy_(p)
        self._write_back(done)
        for name, k, lo, hi, _, _, _, _ in group:
            held = self._grads[name]
            if held.records:
                self.store.delete(held.records[k])
            if hi == self.tensors[name].numel:
                self._finish(name, whole.pop(name, None), self._low.pop(name, None))

    def _write_back(self, records: list[str]) -> None:
        """Send updated records home (SSD: written in one request vector, then their host buffers freed)."""
        for record, fut in zip(records, self.store.evict_many(records, dirty=True)):
            if not self.rt.track_write(fut).done():
                self._writebacks.append((fut, self.store.padded(record)))

    def _throttle_writebacks(self, incoming: int) -> None:
        """Make room for ``incoming`` bytes of write-backs within the plan's allowance (waiting for older ones)."""
        while self._writebacks:
            if self._writebacks[0][0].done():
                self._writebacks.popleft()
                continue
            if sum(n for _, n in self._writebacks) + incoming <= self.writeback_limit:
                return
            fut, _ = self._writebacks.popleft()
            self.rt.wait(fut, "optimizer state written back to the SSD")

    def _unused(self, name: str) -> None:
        """No unit produced a gradient for ``name`` this step: like torch's AdamW, it is not updated (its step
        count stays); a master backward handed over goes back home."""
        with self._cv:
            handed = self._masters.pop(name, None)
            self._cv.notify_all()
        if handed is not None:
            self.rt.track_write(self.store.evict(records.master(name)))

    def _master_fits(self, name: str, whole: dict) -> bool:
        """Whether ``name``'s whole fp32 master can be held now without waiting (see :meth:`_admit_master`)."""
        if not self.rt.master_is_compute or name in whole:
            return True
        with self._cv:
            return name in self._masters or (sum(self._masters.values()) + held_bytes(self.tensors[name].numel * 4)
                                             <= self.masters_limit)

    def _admit_master(self, name: str) -> None:
        """Before reading a whole master for its update: wait until it fits the masters allowance."""
        nbytes = held_bytes(self.tensors[name].numel * 4)
        with self._cv:
            if name in self._masters:
                return  # handed over by backward
            ok = self._cv.wait_for(lambda: sum(self._masters.values()) + nbytes <= self.masters_limit
                                   or not self._masters, self.config.timeout)
            if not ok:
                raise TimeoutError(f"waited {self.config.timeout:.0f} s for masters being written back before "
                                   f"reading {name!r}")
            self._masters[name] = nbytes

    def _retain(self, record: str, name: str) -> None:
        try:
            self.store.prefetch(record, Tier.DEVICE)  # without an accelerator: the buffer changes ledgers
        except MemoryError:
            self.rt.track_write(self.store.evict(record))
        except BaseException as exc:  # noqa: BLE001 - reported by the next wait on this tensor
            self._error = self._error or exc
        self._master_gone(name)

    def _master_gone(self, name: str) -> None:
        with self._cv:
            self._masters.pop(name, None)
            self._cv.notify_all()

    def _finish(self, name: str, master: torch.Tensor | None, low: torch.Tensor | None) -> None:
        """The last chunk of ``name`` is updated: write the master or compute copy back, open its gate."""
        rt = self.rt
        self.steps[name] += 1
        self.updated_params += self.tensors[name].numel
        if master is not None:
            record = records.master(name)
            self.store.mark_dirty(record)
            if name in rt.retained:
                # written back, and kept for the next forward in the device tier (see the planner's
                # [Note: weights kept for the next forward]); without room there it goes home like the others
                fut = rt.track_write(self.store.writeback(record))
                fut.add_done_callback(lambda _f, r=record, n=name: self._retain(r, n))
            else:
                fut = rt.track_write(self.store.evict(record))
                fut.add_done_callback(lambda _f, n=name: self._master_gone(n))
        if low is not None:
            rt.write_compute_copy(name, low.view(self.tensors[name].shape))
        held = self._grads.pop(name)
        held.tensor = None
        if held.charged:
            self.grad_pool.release(held.charged)
        self._gates[name].set_result(None)
