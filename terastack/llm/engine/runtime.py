"""The services every stage of a step shares: the store, the plan, ledgers with waiting, which records a
tensor has (their names: :mod:`terastack.llm.engine.records`).

The runtime builds the step's parts over these services -- the optimizer, the
weight fetcher (waiting on the optimizer's update gates) and the unit runner
(given the fetcher, the optimizer and each unit's activation policy) -- and
forwards nothing to them: the units' stand-ins call the runner, which calls
the services; the services call none of the parts back, except to wait for
the optimizer's progress when a ledger has no room.
"""
from __future__ import annotations

import collections
import threading
import time

import torch

from terastack import trace
from terastack.errors import BudgetError
from terastack.io.futures import Future
from terastack.llm.engine import records
from terastack.llm.engine.byte_ledger import ByteLedger
from terastack.llm.engine.fetcher import WeightFetcher
from terastack.llm.engine.optimizer import OffloadedAdamW
from terastack.llm.engine.streamed_units import UnitRunner
from terastack.llm.engine.unit_policies import unit_policy
from terastack.plan.activation_specs import DEFAULT
from terastack.plan.optimizer_formats import StatePart, optimizer_format
from terastack.tiers import State, Tier
from terastack.training.hf import nf4


class StepRuntime:
    """Everything a step's stages share, complete when built: the store, the plan, the optimizer, the weight
    fetcher and the unit runner (the runtime builds the last three over itself; the units' stand-ins call
    ``runner``)."""

    def __init__(self, *, store, units, tensors, plan, policies: dict[str, str], order: list[int],
                 compute_dtype: torch.dtype, timeout: float, optimizer_config, inline_updates: bool):
        """``policies``: unit path -> activation policy name; ``order``: unit indices in the order forward runs
        them (the profile's); ``optimizer_config``: an ``OffloadedAdamW.Config``."""
        self.store = store
        self.units = units
        self.tensors = tensors
        self.plan = plan
        self.compute_dtype = compute_dtype
        self.device = store.device
        self.timeout = timeout
        #: what the optimizer keeps per parameter and how it updates it ([Note: optimizer state formats])
        self.format = optimizer_format(optimizer_config.format)
        self.chunk = self.format.chunk_elements(plan.optimizer_chunk)
        #: canonical names whose updated masters stay in the device tier for the next forward (the planner's
        #: [Note: weights kept for the next forward])
        kept_units = set(plan.retained_units)
        self.retained: set[str] = {c for u in units if u.path in kept_units for c in u.tensors.values()
                                   if tensors[c].trainable and plan.state_home.get(c) is Tier.SSD}
        self._writes: collections.deque[Future] = collections.deque()
        self._lock = threading.Lock()
        self._act_writes: collections.deque[list] = collections.deque()
        self._compute_tiers: dict[str, Tier] = {}
        self._build_names()
        #: SSD bytes by kind ([Note: the byte ledger])
        self.bytes = ByteLedger()
        store.traffic = self.bytes.observe
        self.optimizer = OffloadedAdamW(optimizer_config, self, tensors, grad_pool_bytes=plan.grad_pool_bytes,
                                        masters_bytes=plan.masters_bytes, writeback_bytes=plan.writeback_bytes,
                                        read_ahead_bytes=plan.read_ahead_bytes, inline=inline_updates,
                                        grad_homes=plan.grad_home)
        try:
            self.fetcher = WeightFetcher(self, units, depth=plan.prefetch_depth, order=order, gates=self.optimizer)
            self.runner = UnitRunner(self, fetcher=self.fetcher, optimizer=self.optimizer,
                                     policies={path: unit_policy(name) for path, name in policies.items()},
                                     default=unit_policy(DEFAULT.name))
        except BaseException:
            self.optimizer.close()  # its thread is running already
            raise

    # ------------------------------------------------------------ records
    # [Note: optimizer chunks] State only the optimizer reads (moments; masters in mixed precision) is stored in
    # chunks of at most `chunk` elements, so the optimizer's working set is a few chunks, not a whole embedding.
    chunk: int = 1 << 20

    @property
    def master_is_compute(self) -> bool:
        """fp32 compute: a trainable tensor's master is its compute weight (one whole record)."""
        return self.compute_dtype == torch.float32

    def chunk_ranges(self, name: str) -> list[tuple[int, int]]:
        return self._ranges[name]

    def master_records(self, name: str) -> list[str]:
        return self._master_recs[name]

    def state_parts(self, name: str) -> dict[StatePart, list[str]]:
        """The optimizer format's state parts of trainable ``name``, each with its records (one per chunk, or
        one for the whole parameter)."""
        return self._state_recs[name]

    def compute_record(self, name: str) -> str:
        return self._compute_rec[name]

    def compute_weight(self, name: str, stored: torch.Tensor) -> torch.Tensor:
        """Parameter ``name``'s weight from its compute record ``stored``: the record itself, or a frozen NF4
        weight dequantized where the record is (into the compute dtype; the caller drops it after use)."""
        info = self.tensors[name]
        return nf4.decode(stored, info.shape, self.compute_dtype) if info.nf4 else stored

    def _build_names(self) -> None:
        """Chunk ranges and record names of every tensor, fixed for the runtime's life (a step asks for them a
        few thousand times)."""
        self._ranges, self._master_recs, self._compute_rec = {}, {}, {}
        self._state_recs = {}
        for name, info in self.tensors.items():
            n = info.numel
            ranges = self._ranges[name] = [(lo, min(lo + self.chunk, n)) for lo in range(0, max(n, 1), self.chunk)]
            self._master_recs[name] = ([records.master(name)] if self.master_is_compute
                                       else [records.master(name, k) for k in range(len(ranges))])
            self._state_recs[name] = {
                part: ([records.state_part(name, part.kind, part.key, k) for k in range(len(ranges))]
                       if part.chunked else [records.state_part(name, part.kind, part.key, None)])
                for part in self.format.parts(info.shape, full_width=info.full_width)}
            self._compute_rec[name] = (records.master(name) if info.trainable and self.master_is_compute
                                       else records.compute(name))

    def compute_tier(self, record: str) -> Tier:
        """Where compute reads a record: the device tier, or in place when it rests in host memory on a CPU.
        Remembered per record: its home is the plan's for the runtime's life (and this is asked a few hundred
        times a step)."""
        tier = self._compute_tiers.get(record)
        if tier is None:
            in_place = self.device.type != "cuda" and self.store.record(record).home is Tier.HOST
            tier = self._compute_tiers[record] = Tier.HOST if in_place else Tier.DEVICE
        return tier

    def read_in_place(self, record: str) -> bool:
        """Compute reads ``record`` where it rests (host memory on a CPU): nothing to prefetch or release."""
        return self.compute_tier(record) is Tier.HOST

    def read_record(self, record: str) -> torch.Tensor:
        """A CPU copy of a record; a resident working copy is read where it is and stays there."""
        if self.store.record(record).state is State.RESIDENT:
            return self.store.tensor(record).to("cpu", copy=True)
        t = self.wait(self.with_room(lambda: self.store.prefetch(record, Tier.HOST), f"reading {record!r}"),
                      f"{record!r} from the SSD").clone()
        self.track_write(self.store.evict(record))
        return t

    def write_compute_copy(self, name: str, master: torch.Tensor) -> None:
        """After an update in mixed precision: refresh the low-precision compute copy from the master."""
        record = records.compute(name)
        rec = self.store.record(record)
        if rec.home is Tier.HOST:
            self.wait(self.store.prefetch(record, Tier.HOST), f"compute copy {record!r}").copy_(master)
            self.store.mark_dirty(record)
            return
        self.store.delete(record)
        self.track_write(self.store.put(record, master.to(self.compute_dtype), home=Tier.SSD))

    # ----------------------------------------------------------- waiting
    def wait(self, fut, what: str):
        """``fut.result()`` with the runtime's timeout; a timeout names what was waited for."""
        try:
            return fut.result(timeout=self.timeout)
        except TimeoutError:
            if fut.done():
                raise
            raise TimeoutError(f"waited {self.timeout:.0f} s for {what}") from None

    def track_write(self, fut: Future) -> Future:
        if fut.done():
            return fut  # nothing to wait for (most write-backs of host-resident state)
        with self._lock:
            while self._writes and self._writes[0].done():
                self._writes.popleft()
            self._writes.append(fut)
        return fut

    def with_room(self, attempt, what: str):
        """``attempt()``; while it is refused for lack of room, wait for writes in flight (they free buffers)
        and for the optimizer, then try again. Refused with nothing left to wait for: the BudgetError stands."""
        try:
            return attempt()  # the common case, without the deadline's bookkeeping
        except BudgetError:
            pass
        deadline = time.monotonic() + self.timeout
        with trace.span(f"wait for room: {what}", track="stall", cat="room"):
            while True:
                try:
                    return attempt()
                except BudgetError:
                    if not self._wait_for_progress(deadline, what):
                        raise

    def _wait_for_progress(self, deadline: float, what: str) -> bool:
        with self._lock:
            pending = [f for f in self._writes if not f.done()]
        if pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waited {self.timeout:.0f} s for room for {what}")
            try:
                pending[0].exception(timeout=left)
            except TimeoutError:
                raise TimeoutError(f"waited {self.timeout:.0f} s for room for {what}") from None
            return True
        opt = self.optimizer
        if not opt.on_update_thread() and opt.busy():
            opt.wait_progress(min(1.0, max(0.0, deadline - time.monotonic())))
            return time.monotonic() < deadline
        return False

    def throttle_activation_writes(self) -> None:
        """Before a unit swaps its activations out: wait for every earlier unit's writes but the last one's, so
        at most two units' activations are on their way to the SSD (the planner's allowance)."""
        while len(self._act_writes) > 1:
            for fut in self._act_writes.popleft():
                if not fut.done():
                    with trace.span("wait for activations written", track="stall", cat="activations"):
                        self.wait(fut, "activations written to the SSD")

    def activation_writes_issued(self, writes: list) -> None:
        self._act_writes.append(writes)

    # ----------------------------------------------------- ledger charges
    def charge(self, entry, tier: Tier, nbytes: int, *, what: str):
        # on a GPU the device ledger charges the caching allocator's size, as the store's own buffers are
        # ([Note: the device ledger and the caching allocator] in terastack.allocator)
        nbytes = self.store.pool.charge(tier, nbytes)
        ledger = self.store.budgets[tier]
        self.with_room(lambda: ledger.reserve(nbytes, what=what), what)
        charge = (ledger, nbytes)
        with self._lock:
            entry.charged.append(charge)
        return charge

    def uncharge(self, entry, charge=None) -> None:
        with self._lock:
            if charge is None:
                charges, entry.charged = entry.charged, []
            elif charge in entry.charged:
                entry.charged.remove(charge)
                charges = [charge]
            else:
                charges = []
        for ledger, nbytes in charges:
            ledger.release(nbytes)

    def charge_device(self, nbytes: int, what: str):
        nbytes = self.store.pool.charge(Tier.DEVICE, nbytes)  # as charge() does
        ledger = self.store.budgets[Tier.DEVICE]
        self.with_room(lambda: ledger.reserve(nbytes, what=what), what)
        return ledger, nbytes

    @staticmethod
    def uncharge_device(charge) -> None:
        ledger, nbytes = charge
        ledger.release(nbytes)
