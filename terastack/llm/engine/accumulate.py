"""Gradients summed over the micro-batches of one accumulated step, kept in the store.

[Note: gradient accumulation]
``Trainer.step_accumulated`` runs N micro-batches and then ONE AdamW step,
equal to plain training on the N micro-batches together with the loss
normalised by the total number of target tokens over all of them. Each
micro-batch's loss is therefore its sum over target tokens divided by that
total (the model call's ``num_items_in_batch``, which transformers' causal-LM
loss takes for exactly this), and the gradients of the N backwards add up to
the gradient of the whole.

The sums are training state like the moments: one store record per optimizer
chunk (``s:NAME#k``), resting in host memory or on the SSD as the plan says
(:attr:`LLMPlan.grad_home`, a Tier per tensor; the planner gives host room to the records that
move the most bytes per byte held, and with N micro-batches a sum on the SSD
is written N-1 times and read N-1 times per step). The host bytes of the sums
that rest there are charged to the host ledger like any host-resting record;
one on the SSD is read into a host working buffer, added to, and written
back, one chunk at a time (the planner budgets two chunks: one being added
to, one on its way back).

Micro-batches 1..N-1 only accumulate: when a tensor's gradient of the
micro-batch is complete (its last user's backward), it is added to its sum and
leaves the gradient pool; no update runs, no optimizer state is read. In the
last micro-batch a complete gradient takes its sum in (and the sum's records
are deleted) before the schedule sees it, so eager updates run during the last
micro-batch's backward exactly as in a one-batch step, and deferred clipping
computes the norm of the whole gradient. The additions happen in micro-batch
order, ``((g1 + g2) + ...) + gN``.
"""
from __future__ import annotations

import collections

import torch

from terastack.llm.engine import records
from terastack.tiers import Tier


class GradientSums:
    """The running sums of one accumulated step: ``add`` a micro-batch's complete gradient, ``take_into`` the
    last micro-batch's."""

    def __init__(self, runtime, homes: dict[str, str]):
        """``homes``: tensor -> the Tier where its sum rests (the plan's ``grad_home``; SSD if absent)."""
        self.rt = runtime
        self.store = runtime.store
        self.homes = homes
        self._names: set[str] = set()
        self._writes: collections.deque = collections.deque()  # sums on their way back to the SSD

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __bool__(self) -> bool:
        return bool(self._names)

    def _home(self, name: str) -> Tier:
        return self.homes.get(name, Tier.SSD)

    def add(self, name: str, grad: torch.Tensor) -> None:
        """Add ``grad`` (flat fp32, host) to the sum of ``name``; the first micro-batch's becomes the sum."""
        rt = self.rt
        home = self._home(name)
        for k, (lo, hi) in enumerate(rt.chunk_ranges(name)):
            record = records.accumulated_grad(name, k)
            part = grad[lo:hi]
            if name not in self._names:
                # an SSD-home put writes from ``part`` directly; the caller drops its gradient afterwards
                put = (lambda r=record, p=part: self.store.put(r, p, home=home))
                rt.track_write(rt.with_room(put, f"sum of the gradients of {name!r}"))
                continue
            # the planner's two working buffers: this chunk, and the previous one on its way back
            while len(self._writes) > 1:
                rt.wait(self._writes.popleft(), f"sum of the gradients of {name!r} written back")
            total = self._read(record, name)
            total.add_(part)
            self.store.mark_dirty(record)
            self._writes.append(rt.track_write(self.store.evict(record)))
        self._names.add(name)

    def take_into(self, name: str, grad: torch.Tensor) -> None:
        """The last micro-batch: add the sum of ``name`` into its gradient ``grad`` (flat fp32) and forget it."""
        for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name)):
            record = records.accumulated_grad(name, k)
            grad[lo:hi].add_(self._read(record, name))
            self.store.delete(record)
        self._names.discard(name)

    def _read(self, record: str, name: str) -> torch.Tensor:
        rt = self.rt
        what = f"sum of the gradients of {name!r}"
        return rt.wait(rt.with_room(lambda: self.store.prefetch(record, Tier.HOST), what), what)
