"""Gradients summed over the micro-batches of one accumulated step, kept in the store (horizontal accumulation),
and the micro-batches of a step stacked into one batch (vertical accumulation).

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
from terastack.training.data.examples import IGNORE


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


def stack_micro_batches(micro_batches: list[dict]) -> dict:
    """The micro-batches of one step (the model call's keyword arguments, ``num_items_in_batch`` the step's total
    of target tokens) as one batch of all their rows: the vertical order's single pass ([Note: vertical and
    horizontal accumulation] in terastack.plan.accumulation_specs).

    [Note: stacking micro-batches exactly]
    Rows shorter than the longest are padded on the right: token 0, label -100 (outside the loss), attention 1,
    positions continuing the row's last. Causal attention keeps every real position from seeing the columns after
    it, so each real position computes what it computed in its own micro-batch, and the padded ones add nothing
    to the loss (nor, through it, to a gradient); attention 1 keeps a padded query from having no key at all (a
    fully masked row would compute NaN, which the backward would carry into the weights' gradients). A mask is
    given to all rows when some micro-batch gives one (ones for the others), positions when some gives them
    (0, 1, ... for the others, what the model uses without them). Packed rows (positions restarting inside a
    row) take no mask, so they do not stack with a micro-batch that gives one.
    """
    length = max(mb["input_ids"].shape[1] for mb in micro_batches)
    masked = any(mb.get("attention_mask") is not None for mb in micro_batches)
    positioned = any(mb.get("position_ids") is not None for mb in micro_batches)
    ids, labels, masks, positions = [], [], [], []
    for i, mb in enumerate(micro_batches):
        x = mb["input_ids"]
        rows, cols = x.shape
        pad = length - cols
        ids.append(torch.nn.functional.pad(x, (0, pad), value=0))
        labels.append(torch.nn.functional.pad(mb["labels"], (0, pad), value=IGNORE))
        if masked:
            mask = mb.get("attention_mask")
            mask = torch.ones_like(x) if mask is None else mask
            masks.append(torch.nn.functional.pad(mask, (0, pad), value=1))
        if positioned:
            pos = mb.get("position_ids")
            if pos is None:
                pos = torch.arange(cols, device=x.device).expand(rows, cols)
            elif masked and cols > 1 and bool((pos[:, 1:] - pos[:, :-1] != 1).any()):
                raise ValueError(f"micro_batches[{i}].position_ids: packed rows (positions restarting inside a row) "
                                 "and another micro-batch's attention_mask cannot run as one batch (packed rows "
                                 "take no mask); give every micro-batch of a step the same kind of rows, or set "
                                 "TrainerConfig.accumulation='horizontal'")
            if pad:
                pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, pad + 1, device=pos.device, dtype=pos.dtype)],
                                dim=1)
            positions.append(pos)
    out = {"input_ids": torch.cat(ids), "labels": torch.cat(labels),
           "attention_mask": torch.cat(masks) if masked else None}
    if positioned:
        out["position_ids"] = torch.cat(positions)
    if "num_items_in_batch" in micro_batches[0]:
        out["num_items_in_batch"] = micro_batches[0]["num_items_in_batch"]
    return out
