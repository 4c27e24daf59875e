"""Record names in the store: built and parsed here, nowhere else.

One store record per tensor (or per optimizer chunk of one, see the runtime's
[Note: optimizer chunks]). ``NAME`` is a parameter's canonical name, ``k`` the
chunk index:

=================  ===================================================================
``p:NAME``         fp32 master of trainable parameter NAME, whole: with fp32 compute it is
                   also the compute weight
``p:NAME#k``       chunk k of that master (mixed precision: only the optimizer reads it)
``m:NAME#k``       chunk k of AdamW's exp_avg (always chunked, also for one chunk)
``v:NAME#k``       chunk k of AdamW's exp_avg_sq (other formats: their first and second moment, in
                   the format's dtype)
``o.PART:NAME#k``  chunk k of another state part of the optimizer format (its block scales...), or,
                   without ``#k``, one for the whole parameter (factored statistics)
``w:NAME``         compute copy in the compute dtype (mixed precision), or the weight of a
                   frozen tensor
``g:NAME#k``       chunk k of a gradient spilled to the SSD while the step waits for the
                   global norm (deferred and after-backward schedules)
``s:NAME#k``       chunk k of NAME's gradient summed over the micro-batches of an accumulated
                   step so far (gradient accumulation; gone when the step's updates start)
``a:U:S``          an activation storage of unit index U swapped to the SSD (S: serial)
=================  ===================================================================

Parameter names are dotted PyTorch module paths (no ``#``), so :func:`parse`
splits the kind at the first ``:`` and the chunk at the last ``#``.
"""
from __future__ import annotations

from typing import NamedTuple

MASTER = "p"
EXP_AVG = "m"
EXP_AVG_SQ = "v"
COMPUTE = "w"
SPILLED_GRAD = "g"
ACCUMULATED_GRAD = "s"
ACTIVATION = "a"
OPTIMIZER_STATE = "o"
KINDS = (MASTER, EXP_AVG, EXP_AVG_SQ, COMPUTE, SPILLED_GRAD, ACCUMULATED_GRAD, ACTIVATION, OPTIMIZER_STATE)
#: the kinds holding an optimizer format's state besides the master (terastack.plan.optimizer_formats)
STATE_KINDS = (EXP_AVG, EXP_AVG_SQ, OPTIMIZER_STATE)


class Record(NamedTuple):
    """A parsed record name: ``kind`` (one of :data:`KINDS`), ``name`` (a parameter; for an activation
    ``"U:S"``) and ``chunk`` (None for a whole tensor). An ``o`` record's part is not kept (nothing reads it
    back from the name: the runtime knows each parameter's parts)."""

    kind: str
    name: str
    chunk: int | None


def _build(kind: str, name: str, chunk: int | None) -> str:
    return f"{kind}:{name}" if chunk is None else f"{kind}:{name}#{chunk}"


def master(name: str, chunk: int | None = None) -> str:
    """The fp32 master of ``name``: whole (``chunk`` None) or one optimizer chunk of it."""
    return _build(MASTER, name, chunk)


def moment(name: str, which: int, chunk: int) -> str:
    """Chunk ``chunk`` of AdamW's first (``which`` 1: exp_avg) or second (2: exp_avg_sq) moment of ``name``."""
    if which not in (1, 2):
        raise ValueError(f"which: must be 1 (exp_avg) or 2 (exp_avg_sq), got {which!r}")
    return _build(EXP_AVG if which == 1 else EXP_AVG_SQ, name, chunk)


def state_part(name: str, kind: str, part: str, chunk: int | None) -> str:
    """Optimizer state part ``part`` of ``name`` (``kind``: the part's record kind, one of
    :data:`STATE_KINDS`): AdamW's moments keep their names (``m``/``v``); another part is ``o.PART``."""
    if kind not in STATE_KINDS:
        raise ValueError(f"kind: must be one of {STATE_KINDS}, got {kind!r}")
    if kind != OPTIMIZER_STATE:
        return _build(kind, name, chunk)
    if not part or not part.isidentifier():
        raise ValueError(f"part: must be a name, got {part!r}")
    return _build(f"{kind}.{part}", name, chunk)


def compute(name: str) -> str:
    """The compute-dtype copy of ``name`` (mixed precision), or the weight of a frozen tensor."""
    return _build(COMPUTE, name, None)


def spilled_grad(name: str, chunk: int) -> str:
    """Chunk ``chunk`` of ``name``'s gradient, spilled to the SSD."""
    return _build(SPILLED_GRAD, name, chunk)


def accumulated_grad(name: str, chunk: int) -> str:
    """Chunk ``chunk`` of ``name``'s gradient summed over the micro-batches of an accumulated step so far."""
    return _build(ACCUMULATED_GRAD, name, chunk)


def activation(unit_index: int, serial: int) -> str:
    """An activation storage of unit ``unit_index`` swapped to the SSD."""
    return f"{ACTIVATION}:{unit_index}:{serial}"


def parse(record: str) -> Record:
    """``parse(moment("x.weight", 2, 3)) == Record("v", "x.weight", 3)``; a name of no kind above is refused."""
    kind, sep, rest = record.partition(":")
    kind, dot, part = kind.partition(".")
    if dot and (kind != OPTIMIZER_STATE or not part):
        kind = ""
    if not sep or kind not in KINDS or not rest or (kind == OPTIMIZER_STATE and not dot):
        raise ValueError(f"{record!r} is not a terastack.llm store record name")
    if kind == ACTIVATION:
        return Record(kind, rest, None)
    name, sep, chunk = rest.rpartition("#")
    if not sep:
        return Record(kind, rest, None)
    return Record(kind, name, int(chunk))


def kind(record: str) -> str:
    """The kind of ``record`` (see :func:`parse`)."""
    return parse(record).kind
