"""Points inside a step from which a resume finishes that step exactly, and the resumed step's forward stop.

[Note: points inside a step]
With eager updates, backward updates the units in reverse forward order, each right after its own backward.
After the update of unit j (and of every unit after it in forward order) the step's remaining work is the
backward of units 0..j-1 and their updates, and it needs only: the weights of units 0..j-1 as they were when
the step began (not yet updated), the batch, the RNG state at the step's start (their forward draws the same
dropout masks again), and the gradient backward delivered at unit j's inputs. That gradient is small (batch x
sequence x hidden), so a point is: which unit, that gradient, the tensors updated so far with their AdamW step
counts, the step's loss and learning rate, and the RNG state at the end of the step's forward (what the step
leaves behind, since a unit's recomputation restores the caller's stream).

A resume from a point runs the forward of the model until it reaches unit j (:class:`StopForward` carries
that call's inputs), then backward from those inputs with the saved gradient: units 0..j-1 compute and update
exactly as in the uninterrupted step, because their inputs and the gradient they receive are the same bytes.

This needs the gradient to reach units 0..j-1 only through unit j's inputs: the units must form a chain in the
autograd graph (:func:`unit_chain`: from the loss the first unit reached is the last one, and from each unit
only the one before it), as decoder stacks do. It also needs every tensor updated so far to have had its whole
gradient: while a tensor still has contributions to come (a tied embedding, whose head and embedding both add
to it) no point is taken. A point is offered only after ``min_bytes`` of state were updated since the last one
(each point costs a commit and a small snapshot); the step's end is always one (the trainer takes it).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from terastack.io.futures import Future
from terastack.plan.schedule_specs import EAGER
from terastack.training.rng_state import rng_states


class StopForward(Exception):
    """Raised by the unit runner when a resumed step's forward reaches the unit it stops before."""

    def __init__(self, inputs: list[torch.Tensor]):
        super().__init__("forward stopped")
        self.inputs = inputs


def batch_digest(inputs: dict) -> str:
    """A fingerprint of a step's batch (its tensors' bytes): a resumed step checks it is given the same one."""
    h = hashlib.sha256()
    for key in sorted(inputs):
        value = inputs[key]
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            h.update(str(tuple(value.shape)).encode())
            h.update(value.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:32]


def unit_chain(loss: torch.Tensor, order: list[int]) -> frozenset[int]:
    """The units after whose backward a point may be taken ([Note: points inside a step]), given ``order`` (unit
    indices, forward order); empty when the units in ``loss``'s autograd graph do not form a chain. Walking from
    the loss by levels -- the units first reached from the loss, then those first reached from that level's
    units, without passing another unit -- every level must lie wholly before the one above it in ``order``. A
    level of one unit is a point: every gradient to the units before it passes through its inputs. A level of
    several units side by side (the parts of a sliced head, terastack.llm.vocab_slices) is not, but the chain goes
    on through the level below it."""
    if loss.grad_fn is None:
        return frozenset()

    def first_units(node) -> dict[int, object]:
        found, seen = {}, set()
        stack = [n for n, _ in node.next_functions if n is not None]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            unit = getattr(n, "unit", None)  # a unit's backward node is its autograd context, which names it
            if unit is not None and hasattr(unit, "index"):
                found[unit.index] = n
                continue
            stack.extend(m for m, _ in n.next_functions if m is not None)
        return found

    pos = {u: i for i, u in enumerate(order)}
    level = first_units(loss.grad_fn)
    points: set[int] = set()
    above = None  # the forward position of the level above (its first unit)
    while level:
        where = [pos.get(i, -1) for i in level]
        if above is not None and max(where) >= above:
            return frozenset()
        if len(level) == 1:
            points.update(level)
        above = min(where)
        below: dict[int, object] = {}
        for node in level.values():
            below.update(first_units(node))
        level = below
    return frozenset(points)


#: a resumed step's points: any unit (the units before a point's own are a chain -- a sliced embedding's parts come
#: first and take no gradient at their inputs, so they offer none)
ANY_UNIT = None


@dataclass(slots=True)
class StepPoint:
    """What a resume needs to finish a step from inside it ([Note: points inside a step])."""

    step: int                          # steps done before this one
    unit: int | None                   # a resume stops its forward at this unit (None: the step is complete)
    boundary: list[torch.Tensor | None]  # the gradient at that unit's inputs that need one (CPU copies)
    updated: tuple[str, ...]           # tensors updated so far in this step
    adam_steps: dict[str, int]         # every trainable tensor's AdamW step count at this point
    lr: float
    loss: float
    rng_after_forward: dict            # torch RNG states (CPU; CUDA's when used) at the end of the forward
    rng_start: dict                    # ... when the step began (at the step's end: after it)
    batch: str                         # batch_digest of the step's inputs
    gates: list[Future] = field(default_factory=list)  # the updates of ``updated`` (the keeper waits for them)


class PointTaker:
    """Offers points inside each step to ``on_point`` (a callable taking a :class:`StepPoint`), after at least
    ``min_bytes`` of state were updated since the last one. The step calls :meth:`begin_step`,
    :meth:`forward_done` and, per unit backward, :meth:`after_unit`."""

    def __init__(self, optimizer, state_bytes: dict[str, int], *, min_bytes: int, on_point, before_backward=None):
        self.opt = optimizer
        self.state_bytes = state_bytes      # tensor -> bytes of its optimizer state (what an update rewrites)
        self.min_bytes = min_bytes
        self.on_point = on_point
        self.before_backward = before_backward  # called when backward is about to update (the keeper drains)
        self.active = False
        #: the units a point may follow (unit_chain), ANY_UNIT on a resumed step; empty: none
        self.chain: frozenset[int] | None = frozenset()
        self.updated: list[str] = []
        self._since = 0
        self._step = 0
        self._batch = ""
        self._loss = 0.0
        self._rng: dict = {}
        self._steps0: dict[str, int] = {}
        self._rng_start: dict = {}
        self._gates0: dict = {}

    def begin_step(self, *, step: int, batch: str, accumulate: bool) -> None:
        # deferred updates (clipping) run after backward, with a coefficient from every unit's gradient
        self.active = not accumulate and self.opt.schedule.spec.name == EAGER.name
        self.updated, self._since = [], 0
        self._step, self._batch = step, batch
        self._rng_start = rng_states()

    def resume_step(self, point: StepPoint, *, step: int) -> None:
        """A step finished from ``point`` (:func:`terastack.llm.engine.step.finish_step`) begins: its later points
        continue from that one (the units already updated, the forward's loss and RNG; the chain was checked by
        the step that took it)."""
        self.begin_step(step=step, batch=point.batch, accumulate=False)
        if self.before_backward is not None:
            self.before_backward()
        done = set(point.updated)
        self.updated = list(point.updated)
        self.chain = ANY_UNIT if self.active else frozenset()
        self._loss, self._rng = point.loss, point.rng_after_forward
        self._steps0 = {n: k - (n in done) for n, k in self.opt.steps.items()}
        self._gates0 = {n: self.opt.update_gate(n) for n in self._steps0}

    def forward_done(self, loss: torch.Tensor, order: list[int]) -> None:
        if self.before_backward is not None:
            self.before_backward()
        if not self.active:
            return
        self.chain = unit_chain(loss, order)
        self._loss = float(loss.detach())
        self._rng = rng_states()
        # no update of this step has run yet, and the last step's are done (the keeper waited for them)
        self._steps0 = dict(self.opt.steps)
        self._gates0 = {n: self.opt.update_gate(n) for n in self._steps0}

    def after_unit(self, unit, input_grads) -> None:
        """Backward of ``unit`` is done and its gradients handed over (inline: their updates ran)."""
        if not self.active:
            return
        opt = self.opt
        # a tensor updated this step has a new gate (the one of its last update is kept until then)
        names = [n for n in opt.completed_by(unit.index)
                 if opt.update_gate(n) is not None and opt.update_gate(n) is not self._gates0.get(n)]
        self.updated += names
        self._since += sum(self.state_bytes.get(n, 0) for n in names)
        if ((self.chain is not ANY_UNIT and unit.index not in self.chain) or self._since < self.min_bytes
                or opt.grads.incomplete()
                or all(g is None for g in input_grads)):
            return  # not a point (see the note); the first unit's backward ends the step: the trainer's point
        self._since = 0
        done = set(self.updated)
        self.on_point(StepPoint(
            step=self._step, unit=unit.index, boundary=[None if g is None else g.detach().to("cpu", copy=True)
                                                        for g in input_grads],
            updated=tuple(self.updated), adam_steps={n: k + (n in done) for n, k in self._steps0.items()},
            lr=opt.step_lr, loss=self._loss, rng_after_forward=self._rng, rng_start=self._rng_start,
            batch=self._batch, gates=[g for g in map(opt.update_gate, self.updated) if g is not None]))

    def step_end(self) -> StepPoint:
        """The point after the step (every tensor counts as updated; ``adam_steps`` is read once the updates,
        ``gates``, are done)."""
        opt = self.opt
        names = tuple(opt.steps)
        return StepPoint(step=self._step, unit=None, boundary=[], updated=names, adam_steps={}, lr=opt.step_lr,
                         loss=self._loss, rng_after_forward={}, rng_start=rng_states(), batch=self._batch,
                         gates=[g for g in map(opt.update_gate, names) if g is not None])
