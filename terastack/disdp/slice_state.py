"""What a parameter server keeps beside its slice of a bucket for the job's optimizer format, and how it updates
the slice: the same format specs ``terastack finetune`` updates its chunks with (terastack.plan.optimizer_formats).

[Note: a slice's optimizer state]
A server's slice of a bucket holds *pieces* of the bucket's parameters (a parameter whole, or the part of it the
slice covers: [Note: slices the optimizer can update apart] in terastack.disdp.buckets). Each of the format's
state parts of each piece lies in a *record* of the slice: one flat tensor per part key and dtype (AdamW:
``exp_avg`` and ``exp_avg_sq``; 8-bit AdamW: ``state1.uint8``, ``absmax1``... and, for parameters under its
``min_8bit_size``, fp32 ``state1``/``state2``; Adafactor: ``row_var``, ``col_var``, ``variance``), the pieces'
spans side by side in the slice's order. Laid end to end over the servers in order, a record is the bucket's
record: every parameter's part whole, in the bucket's order, however many servers share the bucket (a piece
starts on its format's cut, so a blockwise part's spans neither overlap nor leave a gap). That is what a
checkpoint holds per bucket, so a job resumes on any number of servers.

An update hands the format the slice's pieces as the chunks ``finetune``'s optimizer hands it (a parameter's
name, shape and element range, its master and gradient, its state parts), at most :data:`UPDATE_CHUNK` elements
each where the format updates parts of a parameter apart: the same library call on the same elements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from terastack.disdp.buckets import Layout, ParamSlot
from terastack.plan.optimizer_formats import OptimizerFormat, StatePart, optimizer_format

#: elements of a piece updated at once where the format allows it (AdamW's temporaries: 16 MiB); a multiple of
#: every format's block
UPDATE_CHUNK = 4 << 20


def record_name(part: StatePart) -> str:
    """A record's name: the part's key, with its dtype where it is not fp32 (8-bit AdamW keeps fp32 moments for
    small parameters and uint8 ones for the others, under the same keys)."""
    return part.key if part.dtype == torch.float32 else f"{part.key}.{str(part.dtype).removeprefix('torch.')}"


def _part_span(part: StatePart, shape: tuple, lo: int, hi: int) -> int:
    """Elements of ``part`` a piece ``[lo, hi)`` of a parameter of ``shape`` holds (an unchunked part: whole,
    with the piece that starts the parameter)."""
    if part.chunked:
        a, b = part.span(lo, hi)
        return b - a
    return math.prod(part.shape(shape)) if lo == 0 else 0


@dataclass(frozen=True, slots=True)
class Piece:
    slot: ParamSlot
    lo: int            # its elements of the parameter
    hi: int
    at: int            # where it starts in the slice
    state: tuple       # (part, record name, offset in the record, elements) per state part


class SliceState:
    """The pieces of server ``server``'s slice of bucket ``b`` and the records of their state ([Note: a slice's
    optimizer state])."""

    def __init__(self, layout: Layout, b: int, server: int):
        self.format: OptimizerFormat = optimizer_format(layout.optimizer)
        self.bucket = layout.buckets[b]
        lo, hi = layout.shard(b, server)
        self.numel = hi - lo
        #: record name -> (dtype, elements in this slice, where this slice's part starts in the bucket's record)
        self.records: dict[str, tuple[torch.dtype, int, int]] = {}
        before = {name: n for name, (_, n) in bucket_records(layout, b, upto=lo).items()}
        pieces = []
        for slot in self.bucket.params:
            a, z = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
            if a >= z:
                continue
            state = []
            for part in self.format.parts(slot.shape):
                name = record_name(part)
                dtype, used, start = self.records.get(name, (part.dtype, 0, before.get(name, 0)))
                n = _part_span(part, slot.shape, a - slot.offset, z - slot.offset)
                state.append((part, name, used, n))
                self.records[name] = (dtype, used + n, start)
            pieces.append(Piece(slot, a - slot.offset, z - slot.offset, a - lo, tuple(state)))
        self.pieces = tuple(pieces)

    def zeros(self) -> dict[str, torch.Tensor]:
        """The state before the first update (every format starts from zeros, as its library does)."""
        return {name: torch.zeros(n, dtype=dtype) for name, (dtype, n, _) in self.records.items()}

    def nbytes(self) -> int:
        return sum(n * dtype.itemsize for dtype, n, _ in self.records.values())

    def chunks(self, param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor]) -> list:
        """The slice as the format's chunks over ``param`` and ``grad`` (the slice's) and ``state`` (its records)."""
        out = []
        for piece in self.pieces:
            views = [(part, state[name][at:at + n]) for part, name, at, n in piece.state]
            step = piece.hi - piece.lo if self.format.whole_tensor else UPDATE_CHUNK
            for lo in range(piece.lo, piece.hi, step):
                hi = min(lo + step, piece.hi)
                parts = {}
                for part, view in views:
                    if not part.chunked:   # only formats that update a parameter whole have these: one chunk
                        parts[part.key] = view.view(part.shape(piece.slot.shape))
                        continue
                    first, (a, z) = part.span(piece.lo, piece.hi)[0], part.span(lo, hi)
                    parts[part.key] = view[a - first:z - first]
                at = piece.at + lo - piece.lo
                out.append(SimpleNamespace(name=piece.slot.name, lo=lo, hi=hi, shape=piece.slot.shape,
                                           param=param[at:at + hi - lo], grad=grad[at:at + hi - lo], state=parts))
        return out

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], *, step: int,
               lr: float, hyper) -> None:
        """One update of the slice (``step``: the updates made before it) by the format's own ``update``."""
        chunks = self.chunks(param, grad, state)
        if chunks:
            self.format.update(chunks, [step] * len(chunks), lr=lr, hyper=hyper, impl={"foreach": False})


def bucket_records(layout: Layout, b: int, *, upto: int | None = None) -> dict[str, tuple[torch.dtype, int]]:
    """Bucket ``b``'s records whole (name -> (dtype, elements)): what a checkpoint holds per bucket ([Note: a
    slice's optimizer state]); ``upto``: only of the bucket's elements before that one."""
    fmt = optimizer_format(layout.optimizer)
    out: dict[str, tuple[torch.dtype, int]] = {}
    end = layout.buckets[b].numel if upto is None else upto
    for slot in layout.buckets[b].params:
        hi = min(end, slot.offset + slot.numel) - slot.offset
        if hi <= 0:
            break
        for part in fmt.parts(slot.shape):
            name = record_name(part)
            out[name] = (part.dtype, out.get(name, (part.dtype, 0))[1] + _part_span(part, slot.shape, 0, hi))
    return out
