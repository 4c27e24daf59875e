"""The offloaded optimizer's gradient intake: what backward hands over, until an update takes it.

A unit's weight gradients leave the device as soon as its backward has them. A
tensor's gradient is held in the host gradient pool (the plan's
``grad_pool_bytes``) from its first contribution of the step to its update;
a tensor several units share adds up their contributions. When the pool has
no room, the schedule's back-pressure decides: backward waits for the
optimizer to free some, or the complete gradient is spilled to the SSD in
optimizer chunks (the schedule specs' [Note: schedule specs]). With clipping
the norm of each complete gradient is kept; with gradient accumulation a
complete gradient joins its sum instead ([Note: gradient accumulation] in
terastack.llm.engine.accumulate).

[Note: gradients off the GPU]
On a GPU a unit's gradients are copied into pinned host buffers on the
download stream, after the backward kernels that produce them, without
blocking backward (a ``g.to("cpu")`` per tensor would wait for each copy, from
pageable memory at a fraction of the bandwidth). Each held gradient keeps its
copy's event, and whoever reads it on the CPU first -- a second contribution
added to it, its norm, its sum, its spill to the SSD, or the optimizer thread
reading a chunk for its update -- waits on that event (:meth:`GradientIntake.
settled`). The device gradient records the download stream, so backward may
free it at once. The pinned buffers are the gradient pool's own
(:class:`~terastack.tiers.pool.BufferPool` over the pool's ledger, page-locked
page for page: [Note: pinned host tier] in terastack.tiers.pool): a held
gradient's buffer is reserved in the pool before its copy starts, and an
updated one's goes back for the next step's gradient of its size, so the
pinned bytes -- held or kept for reuse -- stay within the pool's budget
(PyTorch's pinned allocator would round each request up to a power of two
and keep the blocks outside any ledger). A second contribution is copied
into a pooled buffer as well, returned once added; when the pool has no room
for a gradient that may be spilled (or for a second contribution), its
buffer is pinned apart (exactly its pages, given back once dropped) and
charged nowhere, like a spilled gradient without an accelerator. A buffer
whose bytes a store write may still read (a first micro-batch's sum) is not
reused: its charge is released and the buffer dropped with its last reader.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from terastack import trace
from terastack.errors import BudgetError
from terastack.io.cuda import pinned_host_empty, to_host
from terastack.llm.engine import records
from terastack.llm.engine.accumulate import GradientSums
from terastack.llm.engine.optimizer_state import read_to_host
from terastack.tiers import BudgetLedger, Tier
from terastack.tiers.pool import BufferPool


@dataclass(slots=True)
class HeldGradient:
    tensor: torch.Tensor | None        # on the host (None once spilled to the SSD or taken)
    charged: int                        # bytes held in the gradient pool
    records: list = field(default_factory=list)  # spilled to the SSD: one store record per optimizer chunk
    ready: object = None                # the event of its copy off the GPU, until waited for ([Note: gradients off
                                        # the GPU])
    raw: torch.Tensor | None = None     # its pinned buffer from the gradient pool's buffers (charged: ``charged``)


class Intake(NamedTuple):
    """What one unit's gradients completed."""

    ready: list[str]     # tensors whose gradient of the step is complete: their updates may be scheduled
    unused: list[str]    # tensors no unit produced a gradient for this step (not updated, as torch's AdamW)


class GradientIntake:
    """Gradients of the trainable ``tensors`` in flight from backward to their updates. ``executor`` and
    ``failure`` are the optimizer's: backward waiting for room gives up when nothing runs that could free it."""

    def __init__(self, rt, tensors: dict, *, pool_bytes: int, backpressure: bool, clipping: bool, sum_homes: dict,
                 cv: threading.Condition, executor, failure, timeout: float, sum_window: tuple[int, int] = (0, 0)):
        self.rt = rt
        self.store = rt.store
        self.tensors = tensors
        self.pool = BudgetLedger("host (gradients in flight)", pool_bytes)
        self.backpressure = backpressure
        self.clipping = clipping
        # ``sum_window``: the optimizer's read-ahead window and write-back allowance, which the sums use while a
        # micro-batch only accumulates ([Note: reading the sums ahead] in terastack.llm.engine.accumulate)
        self.sums = GradientSums(rt, sum_homes, read_ahead_bytes=sum_window[0], writeback_bytes=sum_window[1])
        self._cv = cv
        self._executor = executor
        self._failure = failure
        self.timeout = timeout
        self._grads: dict[str, HeldGradient] = {}
        self._contrib: dict[str, int] = {}
        #: 2-norm of each complete gradient of this step (clipping only)
        self._norms: dict[str, torch.Tensor] = {}
        self.accumulating = False
        #: pinned buffers of gradients off the GPU, reserved in ``pool`` (made on the first; [Note: gradients off
        #: the GPU])
        self.buffers: BufferPool | None = None

    def begin_step(self, *, accumulate: bool) -> None:
        self.accumulating = accumulate
        self._contrib = {name: len(set(info.users)) for name, info in self.tensors.items()}
        self._norms = {}

    # ------------------------------------------------------------- intake
    def accept(self, unit_path: str, grads: dict[str, torch.Tensor | None]) -> Intake:
        """Gradients of one unit's backward (canonical names)."""
        ready, unused = [], []
        with trace.span(f"offload gradients {unit_path}", track="gradients", cat="offload"):
            for name, g in grads.items():
                if name not in self._contrib:
                    continue
                if g is not None:
                    copied = raw = None
                    pooled = False
                    held = self._grads.get(name)
                    if g.device.type == "cuda":
                        # [Note: gradients off the GPU]: copied on the download stream, waited for by its first reader
                        raw, pooled = self._pinned(name, g.numel() * 4, first=held is None)
                        host = raw[:g.numel() * 4].view(torch.float32).view(g.shape)  # pool buffers are uint8
                        copied, g = to_host(host, g.detach()), host
                    elif g.device.type != "cpu" or g.dtype != torch.float32:
                        g = g.to("cpu", torch.float32)
                    g = g.detach()
                    if held is None:
                        self._grads[name] = self._hold(name, g, raw if pooled else None, pinned_apart=raw is not None)
                        self._grads[name].ready = copied
                    else:
                        if copied is not None:
                            copied.synchronize()
                        self.settled(held).add_(g)
                        if pooled:
                            self.buffers.free(Tier.HOST, raw)  # added: back to the pool for the next copy
                self._contrib[name] -= 1
                if self._contrib[name] == 0 and name not in self._grads:
                    if self.accumulating or name not in self.sums:
                        unused.append(name)
                        continue
                    # no gradient in the last micro-batch, but in earlier ones: the sum is the gradient
                    self._grads[name] = self._hold(name, torch.zeros(self.tensors[name].numel))
                if self._contrib[name] == 0 and self.accumulating:
                    self._add_to_sum(name)
                    continue
                if self._contrib[name] == 0:
                    if name in self.sums:
                        self.sums.take_into(name, self.settled(self._grads[name]).view(-1))
                    if self.clipping:
                        # the norm of the whole gradient (a tied tensor's contributions summed)
                        self._norms[name] = torch.linalg.vector_norm(self.settled(self._grads[name]), 2)
                    ready.append(name)
        return Intake(ready=ready, unused=unused)

    def incomplete(self) -> list[str]:
        """Tensors whose gradient has contributions still to come (none once backward has ended)."""
        return [n for n, left in self._contrib.items() if left > 0 and n in self._grads]

    def norms(self) -> list[torch.Tensor]:
        """This step's per-tensor gradient norms, in parameter order (as ``clip_grad_norm_`` stacks them)."""
        return [self._norms[n] for n in sorted(self._norms, key=lambda n: self.tensors[n].index)]

    def has(self, name: str) -> bool:
        return name in self._grads

    @staticmethod
    def settled(held: HeldGradient) -> torch.Tensor:
        """``held``'s host tensor, once its copy off the GPU (if any) has landed ([Note: gradients off the GPU])."""
        ready = held.ready
        if ready is not None:
            ready.synchronize()  # every reader waits: synchronize on a fired event returns at once
            held.ready = None
        return held.tensor

    def _pinned(self, name: str, nbytes: int, *, first: bool) -> tuple[torch.Tensor, bool]:
        """A pinned uint8 buffer of ``nbytes`` for a gradient off the GPU ([Note: gradients off the GPU]), and
        whether it is the pool's: reserved in the pool where it has room (with back-pressure a first contribution
        waits for that), else pinned apart and charged nowhere."""
        if self.buffers is None:
            self.buffers = BufferPool({Tier.HOST: self.pool}, torch.device("cuda"), pin=True)
        what = f"gradient of {name!r}"
        nbytes = max(nbytes, 1)  # a mapping has at least one byte (charged as the gradient's bytes otherwise)
        try:
            if self.backpressure and first:
                with trace.span(f"wait for room: gradient of {name}", track="stall", cat="gradients"):
                    raw = self._reserve_pool(nbytes, name, lambda: self.buffers.alloc(Tier.HOST, nbytes, what=what))
            else:
                raw = self.buffers.alloc(Tier.HOST, nbytes, what=what)
        except BudgetError:
            if self.backpressure and first:
                raise
            return pinned_host_empty(nbytes), False
        return raw, True

    def _hold(self, name: str, g: torch.Tensor, raw: torch.Tensor | None = None, *,
              pinned_apart: bool = False) -> HeldGradient:
        """``g`` held in the pool. ``raw``: its buffer from the pool's buffers, reserved already; ``pinned_apart``:
        its buffer had no room in the pool ([Note: gradients off the GPU])."""
        nbytes = g.numel() * 4
        if raw is not None:
            return HeldGradient(g, raw.numel(), raw=raw)
        if pinned_apart:
            return HeldGradient(g, 0)  # spilled to the SSD once complete (spill_if_unpooled)
        if self.backpressure:
            # backpressure: backward waits for the optimizer to free room in the pool
            with trace.span(f"wait for room: gradient of {name}", track="stall", cat="gradients"):
                self._reserve_pool(nbytes, name)
            return HeldGradient(g if g.is_contiguous() else g.contiguous(), nbytes)
        try:
            self.pool.reserve(nbytes, what=f"gradient of {name!r}")
            return HeldGradient(g.contiguous(), nbytes)
        except BudgetError:
            return HeldGradient(g.contiguous(), 0)  # spilled to the SSD once complete (spill_if_unpooled)

    def _reserve_pool(self, nbytes: int, name: str, attempt=None):
        """``attempt()`` (by default: reserve ``nbytes`` in the pool) once the pool has room; its result."""
        deadline = self.timeout
        attempt = attempt or (lambda: self.pool.reserve(nbytes, what=f"gradient of {name!r}"))
        with self._cv:
            while True:
                try:
                    return attempt()
                except BudgetError:
                    self._failure.raise_if_failed()
                    if not self._executor.busy():
                        raise
                    if not self._cv.wait(timeout=deadline):
                        raise TimeoutError(f"gradient of {name!r} waited {deadline:.0f} s for room in the host "
                                           f"gradient pool ({self.pool})") from None

    def _add_to_sum(self, name: str) -> None:
        """A micro-batch's complete gradient of ``name`` joins its sum and leaves the gradient pool."""
        held = self._grads.pop(name)
        with trace.span(f"accumulate gradient {name}", track="gradients", cat="accumulate"):
            self.sums.add(name, self.settled(held).view(-1))
        held.tensor = held.raw = None  # not reused: a store write may still read it (its last reader drops it)
        if held.charged:
            with self._cv:
                self.pool.release(held.charged)
                self._cv.notify_all()

    def spill_if_unpooled(self, name: str) -> None:
        """A complete gradient that did not fit the pool goes to the SSD, in optimizer chunks."""
        held = self._grads[name]
        if held.charged or held.records:
            return
        flat = self.settled(held).view(-1)
        for k, (lo, hi) in enumerate(self.rt.chunk_ranges(name)):
            record = records.spilled_grad(name, k)
            self.rt.track_write(self.store.put(record, flat[lo:hi], home=Tier.SSD))
            held.records.append(record)
        held.tensor = None

    # ---------------------------------------------------------- for updates
    def spilled(self, name: str, k: int) -> list[str]:
        """The store record of chunk ``k`` of ``name``'s gradient when it was spilled to the SSD (else none)."""
        held = self._grads.get(name)
        return [held.records[k]] if held is not None and held.records else []

    def chunk(self, name: str, k: int, lo: int, hi: int) -> torch.Tensor:
        """Chunk ``k`` (``[lo, hi)``) of ``name``'s complete gradient in host memory, read back if spilled."""
        held = self._grads[name]
        if held.records:
            return read_to_host(self.rt, held.records[k], f"gradient (from the SSD) chunk {k} of {name!r}")
        return self.settled(held).view(-1)[lo:hi]

    def chunk_done(self, name: str, k: int) -> None:
        """Chunk ``k`` of ``name`` is updated: its spilled record, if any, is no longer needed."""
        held = self._grads[name]
        if held.records:
            self.store.delete(held.records[k])

    def release(self, name: str) -> None:
        """``name`` is updated: its gradient leaves the pool."""
        held = self._grads.pop(name)
        held.tensor = None
        if held.raw is not None:
            self.buffers.free(Tier.HOST, held.raw)  # releases its charge; kept for the next step's gradient
        elif held.charged:
            self.pool.release(held.charged)
