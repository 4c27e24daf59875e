"""When the optimizer's updates run: one small schedule object per spec, one executor (inline or a thread).

:class:`~terastack.llm.engine.optimizer.OffloadedAdamW` composes the state I/O, the
gradient intake and the update math. A :class:`Schedule` decides *when* an update
runs, answering the step's hand-offs (see :func:`terastack.llm.engine.step.train_step`):

===========================  =================================================================
hand-off                     called
===========================  =================================================================
``on_unit_backward(unit)``   backward of ``unit`` begins (read ahead the state it completes)
``on_grads_ready(unit, ns)`` backward of ``unit`` delivered the last gradient of tensors ``ns``
``on_backward_end(coef)``    backward is done; ``coef`` is the clip coefficient (or None)
===========================  =================================================================

and an :class:`Executor` decides *where*: on the training thread right away
(:class:`InlineExecutor`) or queued for the optimizer thread
(:class:`ThreadExecutor`), as the schedule's spec says
(:meth:`~terastack.plan.schedule_specs.ScheduleSpec.executor`).

Each schedule is the runtime half of a spec in :mod:`terastack.plan.schedule_specs`
(the half the planner reads too: back-pressure, memory, traffic, executor); a
subclass naming its ``spec`` (and ``executor_kind``, for an inline variant)
is registered by being defined, and :func:`make_schedule` finds it by the spec.

============================  ==========  =====================================================
schedule                      executor    when a tensor's update runs
============================  ==========  =====================================================
:class:`Eager`                thread      as soon as its last gradient exists, beside backward
:class:`EagerInline`          inline      right after its unit's backward, on the training thread
:class:`Deferred`             thread      after backward (clip coefficient known), forward order,
                                          overlapped with the next step's forward
:class:`AfterBackward`        thread      as deferred, and the step waits for all of them
============================  ==========  =====================================================

The reasons are the optimizer's notes: [Note: active gradient offloading],
[Note: clipping with eager updates], [Note: inline updates without an
accelerator].

Adding a schedule: a :class:`~terastack.plan.schedule_specs.ScheduleSpec`
subclass registered there (what the planner models), and here a
:class:`Schedule` subclass with that ``spec`` answering the three hand-offs
with the optimizer's public operations.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, ClassVar, Protocol

from terastack.plan.schedule_specs import AFTER_BACKWARD, DEFERRED, EAGER, ExecutorKind, ScheduleSpec

# ``opt`` below is terastack.llm.engine.optimizer's OffloadedAdamW, ``task`` its UpdateTask (that module imports
# this one)


class UpdateFailure:
    """The first failure of an update (or of its state's write-back), re-raised on the training thread."""

    __slots__ = ("error",)

    def __init__(self):
        self.error: BaseException | None = None

    def record(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def raise_if_failed(self) -> None:
        if isinstance(self.error, (KeyboardInterrupt, SystemExit)):
            raise self.error  # Ctrl-C during an inline update is the user's interrupt, not a failed update
        if self.error is not None:
            raise RuntimeError(f"an optimizer update failed: {type(self.error).__name__}: {self.error}") \
                from self.error


# --------------------------------------------------------------- executors
class Executor(Protocol):
    #: True: ``submit`` runs the update before it returns, on the caller's thread
    inline: bool

    def submit(self, task) -> None:
        """Run ``task`` (now, or queued); a failure goes to the ``on_error`` callback, never raised here."""

    def wait_idle(self, timeout: float, stop: Callable[[], bool]) -> bool:
        """Wait until nothing is queued or running, or ``stop()``; False on timeout."""

    def busy(self) -> bool: ...

    def queued(self) -> int: ...

    def is_current(self) -> bool:
        """Whether the calling thread is the one running updates (it must not wait for itself)."""

    def close(self, timeout: float) -> None: ...


class InlineExecutor:
    """Updates run on the submitting (training) thread, before ``submit`` returns."""

    inline = True

    def __init__(self, run: Callable, on_error: Callable):
        self._run, self._on_error = run, on_error

    def submit(self, task) -> None:
        try:
            self._run(task, None)
        except BaseException as exc:  # noqa: BLE001 - reported as the optimizer thread's failures are
            self._on_error(task, exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise  # the user's interrupt stops the step here, as itself

    def wait_idle(self, timeout: float, stop: Callable[[], bool]) -> bool:
        return True

    def busy(self) -> bool:
        return False

    def queued(self) -> int:
        return 0

    def is_current(self) -> bool:
        return False

    def close(self, timeout: float) -> None:
        pass


class ThreadExecutor:
    """Updates run in submission order on one daemon thread. ``run(task, next_task)`` gets the task queued
    behind it (to start reading its state). ``cv`` is the optimizer's condition: it is notified whenever a task
    ends, which is what waits for room in the optimizer's allowances wait for."""

    inline = False

    def __init__(self, run: Callable, on_error: Callable, cv: threading.Condition):
        self._run, self._on_error, self._cv = run, on_error, cv
        self._queue: collections.deque = collections.deque()
        self._running = False
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name="terastack-adamw", daemon=True)
        self._thread.start()

    def submit(self, task) -> None:
        with self._cv:
            self._queue.append(task)
            self._cv.notify_all()

    def wait_idle(self, timeout: float, stop: Callable[[], bool]) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: (not self._queue and not self._running) or stop(), timeout)

    def busy(self) -> bool:
        with self._cv:
            return bool(self._queue) or self._running

    def queued(self) -> int:
        return len(self._queue)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, timeout: float) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)

    def _worker(self) -> None:
        # (torch.set_num_threads here would also change MKL's process-wide thread count: the model's matmuls
        # would run on one core. The optimizer shares the intra-op pool setting of the process.)
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                task = self._queue.popleft()
                nxt = self._queue[0] if self._queue else None
                self._running = True
            try:
                self._run(task, nxt)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._on_error(task, exc)
            finally:
                with self._cv:
                    self._running = False
                    self._cv.notify_all()


# --------------------------------------------------------------- schedules
#: (spec name, executor kind) -> the Schedule class that runs it; filled by defining a subclass
_SCHEDULES: dict[tuple[str, ExecutorKind], type] = {}


class Schedule:
    """Base schedule: nothing happens at the hand-offs. ``spec`` says what backward does with gradients and
    masters (``backpressure``, ``hands_off_masters``) and what the planner budgeted for it."""

    spec: ClassVar[ScheduleSpec]
    #: the executor this class runs under (a subclass for the inline variant sets INLINE)
    executor_kind: ClassVar[ExecutorKind] = ExecutorKind.THREAD

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__ or "executor_kind" in cls.__dict__:
            _SCHEDULES[(cls.spec.name, cls.executor_kind)] = cls

    def __init__(self, opt, executor: Executor):
        self.opt = opt
        self.executor = executor

    def on_unit_backward(self, unit) -> None:
        pass

    def on_grads_ready(self, unit, names: list[str]) -> None:
        pass

    def on_backward_end(self, coef) -> None:
        pass


class Eager(Schedule):
    """[Note: active gradient offloading]: a tensor's update is queued for the optimizer thread as soon as its
    last gradient exists; the first chunk of each tensor a unit completes is read when its backward begins."""

    spec = EAGER

    def on_unit_backward(self, unit) -> None:
        for name in self.opt.completed_by(unit.index):
            if not self.opt.prefetch_chunk(name, 0):
                return

    def on_grads_ready(self, unit, names: list[str]) -> None:
        self.executor.submit(self.opt.task(unit.index, names))


class EagerInline(Eager):
    """[Note: inline updates without an accelerator]: the unit's updates run right after its backward, on the
    training thread; the state of the unit backward reaches next is read meanwhile."""

    executor_kind = ExecutorKind.INLINE

    def on_unit_backward(self, unit) -> None:
        self.opt.read_ahead(unit.index)

    def on_grads_ready(self, unit, names: list[str]) -> None:
        self.executor.submit(self.opt.task(unit.index, names))
        self.opt.raise_if_failed()
        self.opt.read_ahead(self.opt.next_in_backward(unit.index))


class Deferred(Schedule):
    """[Note: clipping with eager updates]: gradients are gathered (the pool, else spilled to the SSD); when
    backward ends the updates are queued in forward order with the clip coefficient."""

    spec = DEFERRED

    def on_grads_ready(self, unit, names: list[str]) -> None:
        for name in names:
            self.opt.spill_if_unpooled(name)

    def on_backward_end(self, coef) -> None:
        by_unit = self.opt.gathered_by_unit()
        for unit_index in self.opt.forward_order(by_unit):
            names = by_unit[unit_index]
            if names:
                self.executor.submit(self.opt.task(unit_index, names, coef))


class AfterBackward(Deferred):
    """The ablation "active offloading off": as :class:`Deferred`, and the step waits for every update."""

    spec = AFTER_BACKWARD

    def on_backward_end(self, coef) -> None:
        super().on_backward_end(coef)
        self.opt.synchronize()


def make_schedule(opt, spec: ScheduleSpec, *, inline: bool, run: Callable, on_error: Callable,
                  cv: threading.Condition) -> Schedule:
    """The schedule of ``spec`` with its executor: inline when asked for and the spec can (the others gather
    gradients first and their updates overlap the next forward, which needs the thread)."""
    kind = spec.executor(inline)
    cls = schedule_class(spec, kind)
    executor = InlineExecutor(run, on_error) if kind is ExecutorKind.INLINE else ThreadExecutor(run, on_error, cv)
    return cls(opt, executor)


def schedule_class(spec: ScheduleSpec, kind: ExecutorKind) -> type[Schedule]:
    """The :class:`Schedule` subclass that runs ``spec`` under an executor of ``kind``."""
    cls = _SCHEDULES.get((spec.name, kind))
    if cls is None:
        raise ValueError(f"optimizer_schedule: the engine has no {kind.value} schedule for {spec.name!r}")
    return cls
