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

[Note: reading the sums ahead]
A micro-batch that only accumulates reads no optimizer state, so the
optimizer's read-ahead window and write-back allowance are free: the sums use
them. When a unit's backward begins, the sums its gradients will join start
coming in (within the window), so the reads overlap the unit's backward
instead of the addition waiting for each chunk's read in turn; the addition
keeps the window topped up with its tensor's next chunks and lets write-backs
run up to the allowance. The last micro-batch, whose update reads state in
that window, reads each sum one chunk ahead into the second working buffer
(no write-back needs it: the sums are deleted).

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

import torch

from terastack.llm.engine import records
from terastack.llm.engine.writeback_window import WritebackWindow
from terastack.tiers import Tier
from terastack.training.data.examples import IGNORE


class GradientSums:
    """The running sums of one accumulated step: ``add`` a micro-batch's complete gradient, ``take_into`` the
    last micro-batch's."""

    def __init__(self, runtime, homes: dict[str, str], *, read_ahead_bytes: int = 0, writeback_bytes: int = 0):
        """``homes``: tensor -> the Tier where its sum rests (the plan's ``grad_home``; SSD if absent).
        ``read_ahead_bytes`` / ``writeback_bytes``: the optimizer's window and write-back allowance, which a
        micro-batch that only accumulates uses for the sums ([Note: reading the sums ahead]; 0: one chunk
        read at a time and one written back)."""
        self.rt = runtime
        self.store = runtime.store
        self.homes = homes
        self.read_ahead_bytes = read_ahead_bytes
        self._names: set[str] = set()
        self._writes = WritebackWindow(runtime, writeback_bytes, what="a sum of gradients written back",
                                       cat="accumulate")  # the sums on their way back
        self._ahead: dict[str, int] = {}  # records read ahead and not yet added to: bytes
        self._ahead_bytes = 0  # their sum (kept, not recounted: checked once per chunk)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __bool__(self) -> bool:
        return bool(self._names)

    def _home(self, name: str) -> Tier:
        return self.homes.get(name, Tier.SSD)

    def _records(self, name: str) -> list[str]:
        return [records.accumulated_grad(name, k) for k in range(len(self.rt.chunk_ranges(name)))]

    def read_ahead(self, names) -> None:
        """A backward that only accumulates begins: start reading the sums on the SSD that ``names``' gradients
        will join, within the read-ahead window ([Note: reading the sums ahead])."""
        self._issue([r for name in names if name in self._names and self._home(name) is Tier.SSD
                     for r in self._records(name)])

    def _issue(self, wanted: list[str], *, window: int | None = None) -> None:
        """Start reading ``wanted`` (in order) while they fit the window beside those already read ahead."""
        window = self.read_ahead_bytes if window is None else window
        start = []
        for record in wanted:
            if record in self._ahead:
                continue
            nbytes = self.store.padded(record)
            if self._ahead_bytes + nbytes > window:
                break
            self._ahead[record] = nbytes
            self._ahead_bytes += nbytes
            start.append(record)
        if start:
            try:
                self.store.prefetch_many(start, Tier.HOST)
            except MemoryError:
                pass  # read when the addition gets to it

    def add(self, name: str, grad: torch.Tensor) -> None:
        """Add ``grad`` (flat fp32, host) to the sum of ``name``; the first micro-batch's becomes the sum."""
        rt = self.rt
        home = self._home(name)
        recs = self._records(name)
        for k, (lo, hi) in enumerate(rt.chunk_ranges(name)):
            record = recs[k]
            part = grad[lo:hi]
            if name not in self._names:
                # an SSD-home put writes from ``part`` directly; the caller drops its gradient afterwards
                put = (lambda r=record, p=part: self.store.put(r, p, home=home))
                rt.track_write(rt.with_room(put, f"sum of the gradients of {name!r}"))
                continue
            if home is Tier.SSD:
                self._issue(recs[k + 1:])  # the next chunks come in while this one is added to
            nbytes = self.store.padded(record)
            self._writes.make_room(nbytes)
            total = self._read(record, name)
            total.add_(part)
            self.store.mark_dirty(record)
            self._writes.add(rt.track_write(self.store.evict(record)), nbytes)
        self._names.add(name)

    def take_into(self, name: str, grad: torch.Tensor) -> None:
        """The last micro-batch: add the sum of ``name`` into its gradient ``grad`` (flat fp32) and forget it."""
        recs = self._records(name)
        for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name)):
            if k + 1 < len(recs) and self._home(name) is Tier.SSD:  # the next chunk, into the second buffer
                self._issue(recs[k + 1:k + 2], window=self.store.padded(recs[k + 1]))
            grad[lo:hi].add_(self._read(recs[k], name))
            self.store.delete(recs[k])
        self._names.discard(name)
        if not self._names:
            self._ahead.clear()  # the step's sums are all taken (any read ahead for no addition is deleted)
            self._ahead_bytes = 0

    def _read(self, record: str, name: str) -> torch.Tensor:
        rt = self.rt
        what = f"sum of the gradients of {name!r}"
        self._ahead_bytes -= self._ahead.pop(record, 0)
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
