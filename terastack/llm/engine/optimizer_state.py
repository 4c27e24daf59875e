"""The offloaded optimizer's state I/O: fp32 masters and the format's state read from the store and written back.

What an update holds stays within the plan's allowances: whole fp32 masters --
handed over by backward, read for an update, or on their way back -- within
``masters_bytes``, of which the largest master's size is kept free for the
update's own read; one chunk read ahead (optimizer thread) or a unit's state
within ``read_ahead_bytes`` (inline); chunks being written back within
``writeback_bytes``. Without these limits a lagging optimizer would fill the
host ledger with work it has not reached. Which records a chunk has:
the runtime's [Note: optimizer chunks].
"""
from __future__ import annotations

import threading

import torch

from terastack import trace
from terastack.llm.engine import records
from terastack.llm.engine.writeback_window import WritebackWindow
from terastack.plan.llm_profile import held_bytes
from terastack.tiers import Tier
from terastack.units import format_bytes


def read_to_host(rt, record: str, what: str) -> torch.Tensor:
    """``record`` resident in host memory (read from the SSD, waiting for room, when it is not)."""
    resident = rt.store.resident(record, Tier.HOST)
    if resident is not None:
        return resident
    fut = rt.with_room(lambda: rt.store.prefetch(record, Tier.HOST), what)
    if fut.done():
        return fut.result()
    with trace.span(f"wait {record}", track="stall", cat="state"):
        return rt.wait(fut, what)


def check_whole_tensor_gather(fmt, rt, tensors: dict) -> None:
    """[Note: scheduling a whole-matrix gather]
    A format that updates a parameter whole (``OptimizerFormat.whole_tensor``: Adafactor, [Note: whole-matrix
    updates]) is scheduled like any other: its optimizer chunks are read in the update's order, within the same
    windows (one chunk read ahead on the optimizer thread; inline, the read-ahead window, in groups of half of
    it). What changes is where a group may end: only after the last chunk of a parameter (``_divisible``), so
    a group holds at least one whole parameter, and the one update call runs per parameter, one after the other.
    What the gather holds beyond the plan's windows is therefore bounded by the largest single matrix: its
    state (two small factored records, read with its first chunk), its gradient (whole in the pool, or its
    spilled chunks), its master (with fp32 compute the whole master, in the masters allowance; in mixed precision
    its chunk records) and the copies the format joins non-adjacent chunks into (``OptimizerFormat.
    scratch_bytes``: none for a whole fp32 master and a pooled gradient, whose chunks are views of one tensor;
    one master's and one spilled gradient's in mixed precision). Those copies are charged to the host ledger
    while the update runs (waiting for write-backs to free room, or refused naming the host tier and the
    shortfall), and this check refuses a run up front when even the largest parameter's state and master (and
    in mixed precision their joined copy) exceed the host tier whole. Both read ``OptimizerFormat.gather_bytes``,
    and so does the planner, which counts the largest parameter's gather in the optimizer's working set beside
    its windows (``OptimizerSizes.gather``): a plan the engine would refuse here does not fit the planner."""
    if not tensors:
        return
    name = max(tensors, key=lambda n: tensors[n].numel)
    info = tensors[name]
    # a gradient held whole in the pool needs no copy; the planner counts a spilled one's too (its working set)
    needed = fmt.gather_bytes(tuple(info.shape), rt.chunk, master_is_compute=rt.master_is_compute,
                              gradient_spilled=False)
    limit = rt.store.budgets[Tier.HOST].limit
    if needed > limit:
        raise ValueError(f"host_budget: the {fmt.name} optimizer updates each parameter as one matrix; {name!r} "
                         f"needs {format_bytes(needed)} of host memory at once (its state and fp32 master"
                         f"{'' if rt.master_is_compute else ', and the master joined from its chunks'}), more "
                         f"than the host tier's {format_bytes(limit)} by {format_bytes(needed - limit)}; raise "
                         "host_budget, or choose an optimizer that updates in chunks (adamw8bit, adamw)")


class OptimizerState:
    """Reads and writes the optimizer state of the trainable ``tensors`` under runtime ``rt``'s plan. ``cv`` is
    the optimizer's condition (notified when a master leaves); ``failure`` takes a write-back's failure."""

    def __init__(self, rt, tensors: dict, *, cv: threading.Condition, failure, masters_bytes: int,
                 writeback_bytes: int, read_ahead_bytes: int, timeout: float):
        self.rt = rt
        self.store = rt.store
        self.tensors = tensors
        self._cv = cv
        self._failure = failure
        self.timeout = timeout
        self.masters_limit = masters_bytes
        self.read_ahead_limit = read_ahead_bytes
        largest = max((i.numel for i in tensors.values()), default=0)
        self._master_reserve = held_bytes(4 * largest)
        self._masters: dict[str, int] = {}   # whole fp32 masters held: name -> bytes
        self._ahead: set[tuple[str, int]] = set()  # the chunk read ahead (optimizer thread)
        self._writebacks = WritebackWindow(rt, writeback_bytes, what="optimizer state written back to the SSD",
                                           cat="state")  # updated state on its way home
        self._chunk_bytes: dict[tuple[str, int], int] = {}  # (tensor, chunk) -> bytes of its state, fixed
        self._low: dict[str, torch.Tensor] = {}  # mixed precision: compute copies being rebuilt from masters

    @property
    def writeback_limit(self) -> int:
        """Bytes of updated state allowed on their way home at once (the write-back window's allowance)."""
        return self._writebacks.limit

    # ------------------------------------------------------------ records
    def parts(self, name: str, k: int) -> list[tuple[str, str]]:
        """(part key, record) of the optimizer format's state optimizer chunk ``k`` of ``name`` reads: its chunk of
        every chunked part, and with the first chunk the parts kept for the whole parameter."""
        return [(part.key, recs[k] if part.chunked else recs[0])
                for part, recs in self.rt.state_parts(name).items() if part.chunked or k == 0]

    def records(self, name: str, k: int) -> list[str]:
        """The state records of optimizer chunk ``k`` of ``name``: the format's state (:meth:`parts`), and the
        master chunk in mixed precision (with fp32 compute the whole master is handled apart: it is the compute
        weight)."""
        rt = self.rt
        recs = [r for _, r in self.parts(name, k)]
        if not rt.master_is_compute:
            recs.append(rt.master_records(name)[k])
        return recs

    def chunk_bytes(self, name: str, k: int) -> int:
        """Bytes of the state chunk ``k`` of ``name`` reads (moments; the master chunk in mixed precision),
        fixed for the run."""
        size = self._chunk_bytes.get((name, k))
        if size is None:
            size = self._chunk_bytes[(name, k)] = sum(self.store.padded(r) for r in self.records(name, k))
        return size

    def read(self, record: str, part: str, name: str, k: int | None = None) -> torch.Tensor:
        """The state record ``record`` (``part`` of tensor ``name``, chunk ``k``) resident in host memory."""
        what = f"{part} {name!r} for its update" if k is None else f"{part} chunk {k} of {name!r}"
        return read_to_host(self.rt, record, what)

    # ---------------------------------------------------------- reading ahead
    def read_ahead(self, jobs: list[list[str]], *, bounded: bool = True) -> None:
        """Start reading the records of ``jobs`` (one list per chunk, in update order) within the read-ahead
        allowance (``bounded=False``: all of them, the caller keeps to it); the rest is read when its update
        gets to it. Records already resident in host memory are left as they are."""
        allowance = self.read_ahead_limit if bounded else None
        wanted: list[str] = []
        for job in jobs:
            if allowance is not None:
                allowance -= sum(self.store.padded(r) for r in job)
                if allowance < 0:
                    break
            wanted += [r for r in job if self.store.resident(r, Tier.HOST) is None]
        if not wanted:
            return
        try:
            self.store.prefetch_many(wanted, Tier.HOST)
        except MemoryError:
            pass  # read when the update gets to it

    def prefetch_chunk(self, key: tuple[str, int], job: list[str]) -> bool:
        """Start reading one chunk's records (``key``: tensor and chunk; one chunk ahead at most); False when
        that is not possible now."""
        with self._cv:
            if key in self._ahead:
                return True
            if self._ahead:
                return False
            self._ahead.add(key)
        for record in job:
            try:
                self.store.prefetch(record, Tier.HOST)
            except MemoryError:
                return False
        return True

    def reached(self, key: tuple[str, int]) -> None:
        """The update got to the chunk ``key``: it is no longer ahead."""
        with self._cv:
            self._ahead.discard(key)

    # ----------------------------------------------------------- fp32 masters
    def hand_over(self, names, *, alone: bool = False) -> set[str]:
        """Of ``names`` (whose last gradient backward is computing), those whose fp32 working copy backward may
        hand over instead of dropping: as many as fit the masters allowance less the update's reserve.

        ``alone``: no other update runs or waits (inline updates), so the next update is the one of ``names``
        and every master held now is on its way home. When all of ``names`` fit the whole allowance they are
        all handed over, after waiting for those write-backs where needed (a backward faster than the last
        unit's write-back: waiting costs less than reading the masters again): that update then reads no
        master and needs no reserve (the planner's ``masters_reread`` counts the same rule). A larger unit
        waits for them all to go home, then hands over what fits beside the reserve ([Note: the hand-over does
        not depend on the disk's pace])."""
        out = set()
        sizes = {name: held_bytes(self.tensors[name].numel * 4) for name in names}
        with self._cv:
            if alone:
                whole = sum(sizes.values()) <= self.masters_limit
                self._wait_for_room(lambda: sum(self._masters.values()) + sum(sizes.values()) <= self.masters_limit
                                    if whole else not self._masters, len(sizes))
                if whole:
                    self._masters.update(sizes)
                    return set(sizes)
            held = sum(self._masters.values())
            for name in names:
                nbytes = sizes[name]
                if held + nbytes <= self.masters_limit - self._master_reserve:
                    self._masters[name] = nbytes
                    held += nbytes
                    out.add(name)
        return out

    def _wait_for_room(self, fits, count: int) -> None:
        """[Note: the hand-over does not depend on the disk's pace]
        Inline, what backward hands over is decided while the previous unit's masters may still be on their way
        home: on a slow disk they are, on a fast one they are gone. Counted as held, they would leave less room
        for this unit's masters, and more of them would be read again -- bytes the planner's ``masters_reread``
        does not count (it takes every unit's hand-over to find the last unit's masters home). So the hand-over
        waits for those write-backs (they complete without the training thread: nothing they need waits for it)
        and decides with the room the plan assumes, the same masters handed over at any pace. Lock held."""
        if fits():
            return
        with trace.span("wait for masters written back", track="stall", cat="state"):
            if not self._cv.wait_for(fits, self.timeout):
                raise TimeoutError(f"waited {self.timeout:.0f} s for masters being written back before handing "
                                   f"over {count} masters")

    def master_fits(self, name: str, whole: dict) -> bool:
        """Whether ``name``'s whole fp32 master can be held now without waiting (see :meth:`admit_master`)."""
        if not self.rt.master_is_compute or name in whole:
            return True
        with self._cv:
            return name in self._masters or (sum(self._masters.values()) + held_bytes(self.tensors[name].numel * 4)
                                             <= self.masters_limit)

    def admit_master(self, name: str) -> None:
        """Before reading a whole master for its update: wait until it fits the masters allowance."""
        nbytes = held_bytes(self.tensors[name].numel * 4)
        with self._cv:
            if name in self._masters:
                return  # handed over by backward
            ok = self._cv.wait_for(lambda: sum(self._masters.values()) + nbytes <= self.masters_limit
                                   or not self._masters, self.timeout)
            if not ok:
                raise TimeoutError(f"waited {self.timeout:.0f} s for masters being written back before "
                                   f"reading {name!r}")
            self._masters[name] = nbytes

    def read_master(self, name: str) -> torch.Tensor:
        """The whole fp32 master of ``name`` (flat) for its update, admitted to the allowance first."""
        self.admit_master(name)
        return self.read(self.rt.master_records(name)[0], "master", name).view(-1)

    def return_master(self, name: str) -> None:
        """No update for ``name`` this step: a master backward handed over goes back home."""
        with self._cv:
            handed = self._masters.pop(name, None)
            self._cv.notify_all()
        if handed is not None:
            self.rt.track_write(self.store.evict(records.master(name)))

    def finish_master(self, name: str) -> None:
        """The updated whole master of ``name`` goes home: written back, and kept for the next forward in the
        device tier where the plan retains it (the planner's [Note: weights kept for the next forward]; without
        room there it goes home like the others). It leaves the allowance once written."""
        rt = self.rt
        record = records.master(name)
        self.store.mark_dirty(record)
        if name in rt.retained:
            fut = rt.track_write(self.store.writeback(record))
            fut.add_done_callback(lambda _f, r=record, n=name: self._retain(r, n))
        else:
            fut = rt.track_write(self.store.evict(record))
            fut.add_done_callback(lambda _f, n=name: self._master_gone(n))

    def _retain(self, record: str, name: str) -> None:
        try:
            self.store.prefetch(record, Tier.DEVICE)  # without an accelerator: the buffer changes ledgers
        except MemoryError:
            self.rt.track_write(self.store.evict(record))
        except BaseException as exc:  # noqa: BLE001 - reported by the next wait on this tensor
            self._failure.record(exc)
        self._master_gone(name)

    def _master_gone(self, name: str) -> None:
        with self._cv:
            self._masters.pop(name, None)
            self._cv.notify_all()

    # ------------------------------------------------- mixed-precision copies
    def keep_low(self, name: str, lo: int, hi: int, master: torch.Tensor) -> None:
        """Mixed precision: the updated master chunk ``[lo, hi)`` into the compute copy being rebuilt."""
        low = self._low.get(name)
        if low is None:
            low = self._low[name] = torch.empty(self.tensors[name].numel, dtype=self.rt.compute_dtype)
        low[lo:hi].copy_(master)

    def finish_low(self, name: str) -> None:
        """Mixed precision: the rebuilt compute copy of ``name`` replaces the old one."""
        low = self._low.pop(name, None)
        if low is not None:
            self.rt.write_compute_copy(name, low.view(self.tensors[name].shape))

    # -------------------------------------------------------------- writing
    def write_back(self, recs: list[str]) -> None:
        """Send updated records home (SSD: written in one request vector, then their host buffers freed)."""
        for record, fut in zip(recs, self.store.evict_many(recs, dirty=True)):
            self._writebacks.add(self.rt.track_write(fut), self.store.padded(record))

    def throttle_writebacks(self, incoming: int) -> None:
        """Make room for ``incoming`` bytes of write-backs within the plan's allowance (waiting for older ones).

        [Note: a group's write-back is made room for whole]
        An update gathers a group of chunks and sends them home together, after the group is computed. Room is
        therefore made before each chunk for the whole group gathered so far, not for the chunk alone: making
        room chunk by chunk let a group join write-backs still in flight that, with the group, passed the
        allowance (with a slow disk: the previous unit's state still on its way while this unit's whole group
        was sent, the host ledger's peak above the plan's)."""
        self._writebacks.make_room(incoming)
