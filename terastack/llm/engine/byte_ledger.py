"""Every SSD byte of a step, by what it is for.

[Note: the byte ledger]
The store reports each SSD transfer it submits with the record's name
(``TieredStore.traffic``); the name says what the bytes are (the runtime's
records: :mod:`terastack.llm.engine.records`), and who asked says the rest --
an fp32 master read by the weight fetcher is a compute weight for forward or
backward, the same record read by the optimizer is a master for its update.
The fetcher marks its reads with :meth:`ByteLedger.reading` (the current
context's activity: a fetch a finished update starts runs on the optimizer's
thread, so the fetcher names the phase itself rather than trusting the thread;
and a read the store chains behind a write-back still in flight is issued by
the write's completion, on an I/O thread, in the context of the request that
chained it, so it keeps that request's phase at any pace of the disk).

Kinds, each read and written:

====================  ===================================================
``weights_forward``   compute weights read for forward
``weights_backward``  compute weights read for backward
``masters``           fp32 masters read and written by the optimizer
``moments``           the optimizer format's state: AdamW's two moments; the 8-bit
                      moments with their block scales; Adafactor's statistics
``compute_copies``    mixed precision: compute copies rebuilt after updates
``gradients``         gradients spilled for the norm, and accumulation sums
``activations``       activations swapped to the SSD
``other``             any record of none of these kinds
====================  ===================================================

The planner predicts the same kinds (``StepPrediction.bytes_by_kind``), so a
benchmark can put the two side by side.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar

from terastack.llm.engine import records
from terastack.plan.llm_plan import BYTE_KINDS as KINDS  # one list for the plan's prediction and the engine

_BY_RECORD = {records.EXP_AVG: "moments", records.EXP_AVG_SQ: "moments", records.OPTIMIZER_STATE: "moments",
              records.SPILLED_GRAD: "gradients",
              records.ACCUMULATED_GRAD: "gradients", records.ACTIVATION: "activations"}
#: the phase ("forward", "backward") compute weights are read for in the current context
_PHASE: ContextVar[str | None] = ContextVar("terastack_weights_phase", default=None)


class ByteLedger:
    """Bytes read and written per kind since the ledger was made (a step's are the difference of two
    :meth:`snapshot` calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = {f"{kind}_{op}": 0 for kind in KINDS for op in ("read", "written")}

    @contextmanager
    def reading(self, phase: str):
        """Reads of compute weights in this context are for ``phase`` ("forward" or "backward")."""
        token = _PHASE.set(phase)
        try:
            yield
        finally:
            _PHASE.reset(token)

    def observe(self, record: str, op: str, nbytes: int) -> None:
        """The store's ``traffic`` callback: ``op`` "read" or "write" of ``nbytes`` for ``record``."""
        try:
            kind = records.kind(record)
        except ValueError:
            kind = None
        label = _BY_RECORD.get(kind)
        if kind is None:
            label = "other"
        elif label is None:
            phase = _PHASE.get()
            if op == "read" and phase is not None:
                label = f"weights_{phase}"
            elif kind == records.COMPUTE:
                label = "compute_copies" if op == "write" else "weights_forward"
            else:
                label = "masters"
        key = f"{label}_{'read' if op == 'read' else 'written'}"
        with self._lock:
            self._bytes[key] += nbytes

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes)


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}
