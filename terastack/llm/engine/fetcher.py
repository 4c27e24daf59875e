"""Compute weights in, just in time: prefetch the next unit while this one runs, release it after.

[Note: weight streaming]
Forward runs units in the model's order, backward in reverse. When a unit
starts, the fetcher issues reads for the next ``depth`` units of that order
(forward: the following units; backward: the preceding ones), so their
weights travel while this unit computes; ``acquire`` then only waits for a
transfer already under way. ``release`` drops the working copy (weights are
never modified in the device tier; nothing is written back), except when
backward hands a fp32 master straight to the optimizer, which updates it next
(see the optimizer's [Note: active gradient offloading]).

The order is learned: before the first forward it is the profile's (or the
module order); every forward records the order units really ran in and later
steps prefetch by it.

Before a unit's weights are fetched for the next step, the update of this
step must be finished: ``acquire`` and ``prefetch`` wait for the optimizer's
per-tensor update future first.

[Note: a frozen NF4 base]
A LoRA base resting as NF4 (terastack.training.hf.nf4's [Note: the NF4 record]) moves as its NF4 bytes: the
store reads, prefetches and holds those, about a quarter of bf16's. ``acquire`` hands the unit its weights
dequantized by bitsandbytes in the compute dtype, where the record is (the GPU when there is one); the
dequantized copy is the unit's working memory, outside the ledger like its activations while it computes, and is
freed when the unit lets go of its weights. The planner sizes a unit's weights in flight at the compute dtype
plus its NF4 bytes: while it computes, both are held. Backward dequantizes again (nothing of the base trains; its weights are never written).
"""
from __future__ import annotations

import threading

import torch

from terastack import trace
from terastack.io.futures import Future
from terastack.tiers import State, Tier


class WeightFetcher:
    def __init__(self, runtime, units, *, depth: int, order: list[int] | None = None, gates=None):
        """``order``: unit indices in the order forward will run them (None: the module order); ``gates``:
        anything with ``update_gate(name) -> Future | None`` (the optimizer; None: no updates to wait for)."""
        self.rt = runtime
        self.gates = gates
        self.store = runtime.store
        self.units = units
        self.depth = depth
        self._set_order([u.index for u in units] if order is None else list(order))
        self._observed: list[int] = []
        self._refs: dict[str, int] = {}
        self._lock = threading.Lock()
        self.bytes_in = 0          # compute weights brought into the device tier (from host or SSD)

    def _gate(self, name: str):
        return None if self.gates is None else self.gates.update_gate(name)

    # ---------------------------------------------------------------- order
    def begin_forward(self) -> None:
        self._observed = []

    def observe(self, unit) -> None:
        if unit.index not in self._observed:
            self._observed.append(unit.index)

    def end_forward(self) -> None:
        seen = self._observed
        if seen and seen != self.order:
            self._set_order(seen + [u for u in self.order if u not in seen])

    def _set_order(self, order: list[int]) -> None:
        self.order = order
        self._pos = {u: i for i, u in enumerate(order)}

    def first_units(self) -> list[int]:
        return self.order[: max(1, self.depth)]

    def neighbours(self, unit, phase: str) -> list[int]:
        """The next ``depth`` units ``phase`` will run after ``unit``."""
        i = self._pos[unit.index]
        if phase == "forward":
            return self.order[i + 1: i + 1 + self.depth]
        return self.order[max(0, i - self.depth): i][::-1]

    # ------------------------------------------------------------- movement
    def records(self, unit) -> dict[str, str]:
        """local name -> store record of the compute copy."""
        return {local: self.rt.compute_record(cname) for local, cname in unit.tensors.items()}

    def prefetch(self, unit_index: int, phase: str = "forward") -> None:
        """Start bringing a unit's weights in for ``phase``; advisory (skipped when the device ledger has no
        room)."""
        unit = self.units[unit_index]
        for cname in set(unit.tensors.values()):
            record = self.rt.compute_record(cname)
            if self.rt.read_in_place(record):
                continue  # resident where compute reads it, always
            gate = self._gate(cname)
            if gate is not None and not gate.done():
                gate.add_done_callback(lambda _f, r=record, c=cname: self._try_prefetch(r, c, phase))
            else:
                self._try_prefetch(record, cname, phase)

    def _try_prefetch(self, record: str, cname: str, phase: str) -> None:
        tier = self.rt.compute_tier(record)
        try:
            with trace.span(f"prefetch {record}", track="io", cat="prefetch"), self.rt.bytes.reading(phase):
                # advisory: a record resident where compute reads it, or with a transfer under way, is left alone
                self.bytes_in += self.store.fetch(record, tier, behind_transfer=False).moved_bytes
        except MemoryError:
            pass  # no room now: acquire fetches it once earlier units are released

    def acquire(self, unit, phase: str) -> dict[str, torch.Tensor]:
        """The unit's compute weights, resident; waits for their update and their transfer."""
        out = {}
        fetched = {}
        for local, cname in unit.tensors.items():
            record = self.rt.compute_record(cname)
            if record not in fetched:
                gate = self._gate(cname)
                if gate is not None and not gate.done():
                    self.rt.wait(gate, f"the update of {cname!r} before {phase} of {unit.path}")
                tier = self.rt.compute_tier(record)
                weight = self.store.resident(record, tier)
                if weight is None:
                    fut = self._fetch_blocking(record, tier, unit, phase)
                    if fut.done():
                        weight = fut.result()
                    else:
                        with trace.span(f"wait {record}", track="stall", cat="weights"):
                            weight = self.rt.wait(fut, f"weights {record!r} for {phase} of {unit.path}")
                # [Note: a frozen NF4 base]: dequantized here, once per acquire
                fetched[record] = self.rt.compute_weight(cname, weight)
                with self._lock:
                    self._refs[record] = self._refs.get(record, 0) + 1
            out[local] = fetched[record]
        return out

    def _fetch_blocking(self, record: str, tier: Tier, unit, phase: str) -> Future:
        """store.fetch, waiting for releases in flight when the device ledger is momentarily full."""
        with self.rt.bytes.reading(phase):
            fetch = self.rt.with_room(lambda: self.store.fetch(record, tier),
                                      f"weights {record!r} for {phase} of {unit.path}")
        self.bytes_in += fetch.moved_bytes
        return fetch.future

    def release(self, unit, *, handoff: set[str] = frozenset()) -> None:
        """Drop the unit's working copies; canonical names in ``handoff`` move to the host tier instead."""
        for record, cname in {self.rt.compute_record(c): c for c in unit.tensors.values()}.items():
            with self._lock:
                left = self._refs.get(record, 0) - 1
                if left > 0:
                    self._refs[record] = left
                    continue
                self._refs.pop(record, None)
            if self.rt.read_in_place(record):
                continue  # the working copy is the resting copy: nothing to drop or hand over
            if cname in handoff:
                try:
                    fut = self.store.prefetch(record, Tier.HOST)
                    # a copy under way (a GPU's download) is not waited for here: the optimizer's read of the master
                    # joins its future, which completes once the copy's event has fired. Anything else (done, or
                    # chained behind another transfer) is waited for as before, its MemoryError handled below.
                    if self.store.device.type != "cuda" or self.store.record(record).state is not State.INFLIGHT_IN:
                        fut.result()
                    continue
                except MemoryError:
                    pass  # no host room: the optimizer reads it again
            self.rt.track_write(self.store.evict(record))

    def sweep(self) -> None:
        """After a step: evict working copies that were prefetched but never used (not those the optimizer
        keeps for the next forward)."""
        for unit in self.units:
            for cname in set(unit.tensors.values()):
                if cname in self.rt.retained:
                    continue
                record = self.rt.compute_record(cname)
                if self.rt.read_in_place(record):
                    continue
                try:
                    rec = self.store.record(record)
                    if (record not in self._refs and rec.state is State.RESIDENT and rec.tier is Tier.DEVICE
                            and rec.home is not Tier.DEVICE):
                        self.rt.track_write(self.store.evict(record))
                except KeyError:
                    # the optimizer thread is replacing this compute copy right now (delete, then put: see
                    # StepRuntime.write_compute_copy): its new copy rests on the SSD, nothing to evict
                    continue
