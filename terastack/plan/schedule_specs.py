"""When the CPU optimizer's updates run, as the planner and the engine both read it: one spec per schedule.

[Note: schedule specs]
A schedule decides when a trainable tensor's AdamW update runs relative to
backward. Its spec says everything the planner models and the engine obeys:

* back-pressure: whether backward waits for room in the host gradient pool
  (``backpressure``), or a gradient without room goes to the SSD and back
  (:meth:`ScheduleSpec.spill_traffic`, :meth:`ScheduleSpec.spill_room`);
* memory: the store records one optimizer chunk's update holds
  (:meth:`ScheduleSpec.records_per_chunk`) and the whole fp32 masters the
  optimizer may hold (:meth:`ScheduleSpec.masters_held`); whether backward
  hands an fp32 master to the optimizer (``hands_off_masters``) and whether
  updated masters may stay in the device tier for the next forward
  (``retains_masters``);
* the executor: on the training thread (:attr:`ExecutorKind.INLINE`, no
  accelerator) or on the optimizer thread (:meth:`ScheduleSpec.executor`);
* the part of the step no schedule hides (:meth:`ScheduleSpec.exposed_s`);
* whether a global-norm clip is exact (``exact_clipping``).

The runtime side -- which answers the step's hand-offs with the optimizer's
operations -- is one ``Schedule`` class per spec in
``terastack.llm.engine.schedules``, found by the spec. A new schedule is a
subclass here, registered with :func:`register_schedule`, and its runtime
class there; nothing branches on a schedule's name. (This module is the
planning half so that ``plan`` imports no engine.)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar


class ExecutorKind(str, enum.Enum):
    """Where updates run: on the training thread before the hand-off returns, or on the optimizer thread."""

    INLINE = "inline"
    THREAD = "thread"


@dataclass(frozen=True, kw_only=True, slots=True)
class Exposure:
    """What the part of a step no schedule hides is made of (seconds; the planner's [Note: the step-time
    model]). "Apart": where the optimizer runs beside compute (an accelerator), its time; without one it adds to
    the CPU's own time already, and this is 0."""

    optimizer_apart_s: float     # AdamW over every trainable tensor
    first_update_apart_s: float  # AdamW over the first unit of the forward
    first_state_io_s: float      # reading and writing the first unit's state, when it rests on the SSD
    forward_s: float             # one forward
    state_io_s: float            # reading and writing all the state that rests on the SSD


class ScheduleSpec:
    """One schedule: see [Note: schedule specs]. Subclasses set the class attributes and :meth:`exposed_s`."""

    #: the name configs and plans give (``LLMPlanner.Config.optimizer_schedule``, ``OffloadedAdamW.Config.optimizer_schedule``; the job's ``schedule.optimizer``)
    name: ClassVar[str] = ""
    #: backward waits for room in the gradient pool (True), or a gradient without room is spilled to the SSD
    backpressure: ClassVar[bool] = True
    #: backward hands an fp32 master's working copy to the optimizer instead of dropping it (fp32 compute)
    hands_off_masters: ClassVar[bool] = False
    #: updates may run inline on the training thread (asked for where there is no accelerator)
    inline_capable: ClassVar[bool] = False
    #: every update waits for the whole step's gradient: a global-norm clip is exact
    exact_clipping: ClassVar[bool] = False
    #: updated fp32 masters of the first units may stay in the device tier for the next forward
    retains_masters: ClassVar[bool] = True

    def __repr__(self) -> str:
        return f"<schedule {self.name}>"

    def executor(self, inline: bool) -> ExecutorKind:
        """Where updates run when ``inline`` is asked for (only schedules that can run inline do)."""
        return ExecutorKind.INLINE if inline and self.inline_capable else ExecutorKind.THREAD

    def check_clipping(self, max_grad_norm: float | None) -> None:
        """Refuse a global-norm clip this schedule cannot apply exactly (ValueError naming ``optimizer_schedule``)."""
        if max_grad_norm is not None and not self.exact_clipping:
            exact = ", ".join(n for n, s in SCHEDULES.items() if s.exact_clipping)
            raise ValueError(f"optimizer_schedule: {self.name} updates cannot apply a global-norm clip exactly; use {exact} "
                             f"(see [Note: clipping with eager updates])")

    # ------------------------------------------------------------- memory
    def records_per_chunk(self, mixed: bool) -> int:
        """Store records one optimizer chunk's update holds: the two moments, the master chunk in mixed
        precision, and the gradient chunk where gradients may have been spilled to the SSD."""
        return 2 + (1 if mixed else 0) + (0 if self.backpressure else 1)

    def masters_held(self, largest: int, unit_masters: list[int], *, inline: bool = False) -> int:
        """Bytes of whole fp32 masters the optimizer may hold with room to spare: the one being updated
        (``largest``: the largest master's), plus those backward hands over before the optimizer gets to them
        (two units' worth, of ``unit_masters``: each unit's masters) or, without hand-overs, one read ahead.
        Inline updates hand over one unit's masters, whose update comes next and reads none: the larger of
        those and the one master read (``OptimizerState.hand_over``)."""
        if self.hands_off_masters and inline:
            return max([largest, *unit_masters])
        if self.hands_off_masters:
            top = sorted(unit_masters, reverse=True) + [0, 0]
            return largest + top[0] + top[1]
        return 2 * largest

    # ------------------------------------------------------------ traffic
    def spill_traffic(self, grad_bytes: int, grad_unit: int) -> int:
        """Gradient bytes written to the SSD and read back per step: those beyond a pool of two units' gradients
        (``grad_unit``: the largest unit's) wait there for the norm. 0 with back-pressure."""
        return 0 if self.backpressure else max(0, grad_bytes - 2 * grad_unit)

    def spill_room(self, grad_bytes: int) -> int:
        """SSD bytes spilled gradients may take at most (every gradient, without back-pressure)."""
        return 0 if self.backpressure else grad_bytes

    def exposed_s(self, e: Exposure) -> float:
        """Seconds of the step no overlap hides (the planner's [Note: the step-time model])."""
        raise NotImplementedError


class EagerSpec(ScheduleSpec):
    """[Note: active gradient offloading]: a tensor's update runs as soon as its last gradient exists, beside
    backward (inline, right after its unit's backward, without an accelerator). The next forward's first unit
    waits for its own update and state traffic."""

    name = "eager"
    backpressure = True
    hands_off_masters = True
    inline_capable = True

    def exposed_s(self, e: Exposure) -> float:
        return e.first_state_io_s + e.first_update_apart_s


class DeferredSpec(ScheduleSpec):
    """[Note: clipping with eager updates]: gradients are gathered (the pool, else the SSD); once backward has
    the global norm the updates run in forward order, overlapped with the next forward."""

    name = "deferred"
    backpressure = False
    exact_clipping = True

    def exposed_s(self, e: Exposure) -> float:
        return max(0.0, e.optimizer_apart_s - e.forward_s) + e.first_state_io_s


class AfterBackwardSpec(DeferredSpec):
    """The ablation "active offloading off": as deferred, and the step waits for every update (so no master
    stays for the next forward: ZeRO-Offload's order of things)."""

    name = "after_backward"
    retains_masters = False

    def exposed_s(self, e: Exposure) -> float:
        return max(e.optimizer_apart_s, e.state_io_s)


#: name -> spec of every schedule; the one list of them
SCHEDULES: dict[str, ScheduleSpec] = {}


def register_schedule(spec: ScheduleSpec) -> ScheduleSpec:
    if not spec.name or spec.name in SCHEDULES:
        raise ValueError(f"schedule spec {spec!r}: its name must be new and not empty")
    SCHEDULES[spec.name] = spec
    return spec


EAGER = register_schedule(EagerSpec())
DEFERRED = register_schedule(DeferredSpec())
AFTER_BACKWARD = register_schedule(AfterBackwardSpec())


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec registered as ``name``; ValueError naming the field ``optimizer_schedule`` otherwise (the one check)."""
    spec = SCHEDULES.get(name)
    if spec is None:
        raise ValueError(f"optimizer_schedule: must be one of {', '.join(SCHEDULES)}; got {name!r}")
    return spec
