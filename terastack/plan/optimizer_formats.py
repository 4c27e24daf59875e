"""Optimizer state formats: what rests in the store per trainable parameter, and how a chunk of it is updated.

[Note: optimizer state formats]
A format is one spec object, registered by name (``TrainerConfig.optimizer``), that the planner, the store
layout, the byte ledger, the optimizer and the checkpoint all read; nothing branches on its name:

* :attr:`OptimizerFormat.parts`: the state tensors a parameter's update keeps beside its fp32 master, each a
  :class:`StatePart` (its dtype, how many of its elements cover a chunk of the parameter, whether it is stored
  per optimizer chunk or as one record for the whole parameter);
* :meth:`OptimizerFormat.chunk_elements`: the optimizer chunk the format can work in (a multiple of its block);
* :meth:`OptimizerFormat.update`: one update over gathered chunks, equal to the reference implementation;
* :attr:`OptimizerFormat.whole_tensor`: the update needs every chunk of a parameter at once (statistics over
  the whole matrix); the optimizer then gathers all chunks of a parameter before updating any of them.
* :meth:`OptimizerFormat.scratch_bytes`: the host memory an update allocates beyond its chunks (pieces joined
  into one tensor for the library's call), which the optimizer charges to the host ledger while it runs;
* :meth:`OptimizerFormat.library_state`: a parameter's state as the reference library keeps it
  (``Trainer.optimizer_state``).

Every method that reads a parameter's parts takes ``full_width``: the parameter keeps its state at the format's
full width where the reference library lets a parameter be overridden so (bitsandbytes' ``optim_bits=32`` for a
module's weight, which transformers' Trainer sets for every ``nn.Embedding`` under its 8-bit optimizers); a format
without a narrower state ignores it.

The formats:

``adamw`` (the default)
    ``torch.optim.AdamW`` through torch's own functional ``adam``: two fp32 moments per element, exact.
``adamw8bit``
    ``bitsandbytes.optim.AdamW8bit``: both moments in 8 bits (the signed and unsigned dynamic maps) with one
    fp32 absmax per block of 256 elements; parameters smaller than ``min_8bit_size`` (4096) keep fp32 moments
    and the library's 32-bit update, as bitsandbytes does. Each chunk is updated by bitsandbytes' own
    ``optimizer_update_8bit_blockwise`` / ``optimizer_update_32bit``: quantization is local to a block, so
    chunks that start on a block boundary give the library's bytes ([Note: 8-bit chunks]).
``adafactor``
    ``torch.optim.Adafactor`` through torch's own functional ``adafactor``: for a parameter of two or more
    dimensions a row and a column second-moment statistic (the last two dimensions), for a vector a full one;
    no first moment. Its step reads the parameter's norm, the gradient's row and column sums and the norm of
    the whole update, so a parameter is updated as one group ([Note: whole-matrix updates]).

Global-norm clipping is the same for every format: the clip coefficient (``clip_grad_norm_``'s) scales each
gradient chunk before the format's update, as ``clip_grad_norm_`` followed by ``optimizer.step()`` does; the
libraries' own clipping (bitsandbytes' ``percentile_clipping``, ``max_unorm``; Adafactor's update clipping
``d``, which is part of its step) is left at the reference's defaults.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from terastack.constants import padded_size
from terastack.plan.optimizer_names import OPTIMIZER_NAMES
from terastack.plan.lowbit_library import bitsandbytes_functional

#: record kinds of state parts (the names of :mod:`terastack.llm.engine.records`): AdamW's two moments keep
#: their own kinds; every other part is an "o" record named by its key
EXP_AVG_KIND, EXP_AVG_SQ_KIND, OTHER_KIND = "m", "v", "o"


@dataclass(frozen=True, kw_only=True, slots=True)
class StatePart:
    """One state tensor a format keeps per parameter. ``per``: parameter elements one element of the part
    covers (1: elementwise; 256: one scale per block); ``chunked`` False: one record for the whole parameter
    (its shape :meth:`shape` gives), read and written with the parameter's first chunk."""

    key: str                       # its name in checkpoints ("exp_avg", "state1", "absmax1", "row_var"...)
    dtype: torch.dtype
    kind: str = OTHER_KIND
    per: int = 1
    chunked: bool = True
    factored: int = 0              # unchunked: 0 the full shape, -1 the row statistic, -2 the column statistic

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The elements of this part that chunk ``[lo, hi)`` of the parameter uses."""
        return lo // self.per, -(-hi // self.per)

    def shape(self, shape: tuple) -> tuple:
        """The part's whole shape for a parameter of ``shape`` (an elementwise part: the parameter's own, as
        checkpoints have always held AdamW's moments)."""
        numel = math.prod(shape)
        if self.chunked:
            return tuple(shape) if self.per == 1 else (-(-numel // self.per),)
        if self.factored == -1:
            return (*shape[:-1], 1)
        if self.factored == -2:
            return (*shape[:-2], 1, shape[-1])
        return tuple(shape)

    def nbytes(self, shape: tuple) -> int:
        return math.prod(self.shape(shape)) * self.dtype.itemsize


class OptimizerFormat:
    """One optimizer state format: see [Note: optimizer state formats]. Subclasses set the class attributes and
    implement :meth:`parts` and :meth:`update`."""

    name: ClassVar[str] = ""
    #: what the format equals (for messages and docs)
    reference: ClassVar[str] = ""
    #: the optimizer and its state as plans and progress lines name them
    title: ClassVar[str] = ""
    state_words: ClassVar[str] = ""
    #: the update needs all chunks of a parameter at once ([Note: whole-matrix updates])
    whole_tensor: ClassVar[bool] = False
    #: optimizer chunks start on multiples of this many elements
    block: ClassVar[int] = 1

    def __repr__(self) -> str:
        return f"<optimizer format {self.name}>"

    def parts(self, shape: tuple, *, full_width: bool = False) -> tuple[StatePart, ...]:
        """The state tensors a trainable parameter of ``shape`` keeps beside its fp32 master (``full_width``: see
        [Note: optimizer state formats])."""
        raise NotImplementedError

    def require(self) -> None:
        """Refuse (ImportError naming the setting) when what the update needs is not installed."""

    def piece_unit(self, numel: int) -> int:
        """Where a parameter of ``numel`` elements may be cut into pieces updated apart (a parameter server's
        slices, terastack.disdp): at multiples of this many elements from its start (its last piece may be
        shorter). A blockwise format's block, so no block straddles two pieces; the whole parameter for a format
        that updates parameters whole ([Note: whole-matrix updates])."""
        return max(numel, 1) if self.whole_tensor else self.block

    def chunk_elements(self, chunk: int) -> int:
        """The optimizer chunk (elements) used for a configured ``chunk``: a multiple of :attr:`block`."""
        return max(self.block, chunk - chunk % self.block)

    def state_bytes(self, shape: tuple, *, full_width: bool = False) -> int:
        """Bytes of state (not counting the fp32 master) a parameter of ``shape`` keeps, unpadded."""
        return sum(p.nbytes(shape) for p in self.parts(shape, full_width=full_width))

    def chunk_state_bytes(self, shape: tuple, lo: int, hi: int, *, full_width: bool = False) -> int:
        """Bytes of state the chunk ``[lo, hi)`` reads (unchunked parts counted with the first chunk)."""
        out = 0
        for p in self.parts(shape, full_width=full_width):
            if p.chunked:
                a, b = p.span(lo, hi)
                out += (b - a) * p.dtype.itemsize
            elif lo == 0:
                out += p.nbytes(shape)
        return out

    def held_bytes(self, shape: tuple, chunk: int, *, full_width: bool = False) -> int:
        """Bytes a parameter of ``shape``'s state records take in a tier of the store (each record padded as the
        store pads it), in optimizer chunks of ``chunk`` elements (:meth:`chunk_elements` applied here)."""
        chunk = self.chunk_elements(chunk)  # a multiple of every chunked part's ``per``
        full, rest = divmod(max(math.prod(shape), 1), chunk)
        out = 0
        for p in self.parts(shape, full_width=full_width):
            if not p.chunked:
                out += padded_size(p.nbytes(shape))
                continue
            out += full * padded_size(-(-chunk // p.per) * p.dtype.itemsize)
            out += padded_size(-(-rest // p.per) * p.dtype.itemsize) if rest else 0
        return out

    def chunk_held_bytes(self, shape: tuple, elements: int, *, full_width: bool = False) -> int:
        """Bytes one chunk of ``elements`` takes in the store, chunked parts only (what an update holds per chunk
        besides its master and gradient chunks)."""
        return sum(padded_size(-(-elements // p.per) * p.dtype.itemsize)
                   for p in self.parts(shape, full_width=full_width) if p.chunked)

    def bytes_per_param(self, shape: tuple, *, full_width: bool = False) -> float:
        """State bytes per element of a parameter of ``shape``, unpadded (AdamW: 8)."""
        return self.state_bytes(shape, full_width=full_width) / max(math.prod(shape), 1)

    def library_state(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A parameter's state as the reference library keeps it, from its whole ``parts`` (key -> tensor in
        :meth:`StatePart.shape`): the parts, and what the library keeps beside them."""
        return dict(parts)

    def scratch_bytes(self, chunks: list, steps: list[int]) -> int:
        """Host bytes :meth:`update` allocates at most at once over ``chunks`` (the copies it joins pieces into,
        where they are not adjacent in memory already); the optimizer charges them to the host ledger."""
        return 0

    def scratch_bound(self) -> int:
        """The most bytes :meth:`scratch_bytes` charges for one update call of a format that updates chunk by chunk
        (the planner adds it to the optimizer's working set); 0 where it joins nothing."""
        return 0

    def gather_bytes(self, shape: tuple, chunk: int, *, master_is_compute: bool, gradient_spilled: bool) -> int:
        """Host bytes one update of a whole parameter of ``shape`` holds at once where the format updates
        parameters whole (:attr:`whole_tensor`; [Note: scheduling a whole-matrix gather] in
        terastack.llm.engine.optimizer_state): its state records, its fp32 master (whole, or its chunk records in
        mixed precision), a spilled gradient's chunk records, and the copies :meth:`scratch_bytes` charges at most
        (the master joined from its chunks in mixed precision, a spilled gradient joined from its chunks). The
        engine's up-front check and the planner's working set both read it. 0 for a format that updates chunk by
        chunk: what it holds is its chunks, within the plan's windows."""
        if not self.whole_tensor:
            return 0
        numel = max(math.prod(shape), 1)
        chunk = self.chunk_elements(chunk)
        full, rest = divmod(numel, chunk)
        chunks = full * padded_size(4 * chunk) + (padded_size(4 * rest) if rest else 0)  # fp32 chunk records
        out = self.held_bytes(shape, chunk) + (padded_size(4 * numel) if master_is_compute else chunks + 4 * numel)
        return out + (chunks + 4 * numel if gradient_spilled else 0)

    def update(self, chunks: list, steps: list[int], *, lr: float, hyper, impl: dict) -> None:
        """One update over ``chunks`` (each with ``name``, ``lo``, ``hi``, ``shape``, ``param``, ``grad`` and
        ``state``: part key -> tensor, updated in place); ``steps``: each chunk's parameter's step count before
        it; ``hyper``: betas, eps and weight_decay; ``impl``: torch's foreach/fused flags (AdamW)."""
        raise NotImplementedError


class AdamWFormat(OptimizerFormat):
    name = "adamw"
    reference = "torch.optim.AdamW"
    title, state_words = "AdamW", "AdamW moments"

    _PARTS = (StatePart(key="exp_avg", dtype=torch.float32, kind=EXP_AVG_KIND),
              StatePart(key="exp_avg_sq", dtype=torch.float32, kind=EXP_AVG_SQ_KIND))

    def parts(self, shape: tuple, *, full_width: bool = False) -> tuple[StatePart, ...]:
        return self._PARTS

    def update(self, chunks: list, steps: list[int], *, lr: float, hyper, impl: dict) -> None:
        from torch.optim.adam import adam

        with torch.no_grad():
            adam([c.param for c in chunks], [c.grad for c in chunks], [c.state["exp_avg"] for c in chunks],
                 [c.state["exp_avg_sq"] for c in chunks], [], [torch.tensor(float(s)) for s in steps],
                 decoupled_weight_decay=True, amsgrad=False, beta1=hyper.betas[0], beta2=hyper.betas[1], lr=lr,
                 weight_decay=hyper.weight_decay, eps=hyper.eps, maximize=False, **impl)


class AdamW8bitFormat(OptimizerFormat):
    """[Note: 8-bit chunks]
    bitsandbytes' blockwise update (its CPU kernel) dequantizes each block of 256 elements with the block's
    absmax, updates it in fp32 and quantizes it again with the block's new absmax: nothing crosses a block.
    So an optimizer chunk that starts on a multiple of 256 elements, updated with the absmax entries of its
    blocks, gives exactly the bytes the library gives the whole tensor (the last block of a tensor may be
    short, as in the library). The optimizer chunk is rounded down to a multiple of the block. The chunks of
    one update call are put together into runs for the library (:meth:`_runs`): its CPU kernels cost tens of
    milliseconds per call on a busy 2-core machine whatever the size."""

    name = "adamw8bit"
    reference = "bitsandbytes.optim.AdamW8bit"
    title, state_words = "8-bit AdamW", "8-bit AdamW moments"
    block = 256
    #: parameters with fewer elements keep fp32 moments (bitsandbytes' ``min_8bit_size`` default)
    min_8bit_size = 4096
    #: the most bytes of chunks (master, gradient and state) one library call takes: the call copies a run of
    #: chunks that are not adjacent into one piece, so a run is bounded, not a whole update group (a group is up
    #: to the read-ahead window: hundreds of MiB at 1.1B, which the host ledger cannot hold twice). At 32 MiB a
    #: call covers about 3M parameters, so its fixed cost stays small beside its elements.
    max_run_bytes = 32 << 20

    _PARTS_8BIT = (StatePart(key="state1", dtype=torch.uint8, kind=EXP_AVG_KIND),
                   StatePart(key="state2", dtype=torch.uint8, kind=EXP_AVG_SQ_KIND),
                   StatePart(key="absmax1", dtype=torch.float32, per=256),
                   StatePart(key="absmax2", dtype=torch.float32, per=256))
    _PARTS_32BIT = (StatePart(key="state1", dtype=torch.float32, kind=EXP_AVG_KIND),
                    StatePart(key="state2", dtype=torch.float32, kind=EXP_AVG_SQ_KIND))

    def __init__(self) -> None:
        self._qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    def parts(self, shape: tuple, *, full_width: bool = False) -> tuple[StatePart, ...]:
        # full width: the library's optim_bits=32 override, its 32-bit update on fp32 moments
        return self._PARTS_8BIT if math.prod(shape) >= self.min_8bit_size and not full_width else self._PARTS_32BIT

    def require(self) -> None:
        bitsandbytes_functional(f"optimizer {self.name}")

    def library_state(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parts, and with 8-bit moments the two quantization maps (the library keeps them per parameter)."""
        out = dict(parts)
        if parts["state1"].dtype == torch.uint8:
            q1, q2 = self.qmaps()
            out.update(qmap1=q1.clone(), qmap2=q2.clone())
        return out

    def qmaps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The signed and unsigned dynamic quantization maps of the two moments (the library's ``fill_qmap``)."""
        if self._qmaps is None:
            F = bitsandbytes_functional(f"optimizer {self.name}")
            self._qmaps = (F.create_dynamic_map(signed=True), F.create_dynamic_map(signed=False))
        return self._qmaps

    def update(self, chunks: list, steps: list[int], *, lr: float, hyper, impl: dict) -> None:
        F = bitsandbytes_functional(f"optimizer {self.name}")
        (b1, b2), eps, wd = hyper.betas, hyper.eps, hyper.weight_decay
        with torch.no_grad():
            eight = []
            for c, step in zip(chunks, steps):
                s = c.state
                if s["state1"].dtype == torch.uint8:
                    eight.append((c, step))
                    continue
                F.optimizer_update_32bit("adam", c.grad, c.param, s["state1"], b1, eps, step + 1, lr, s["state2"],
                                         b2, 0.0, 0.0, wd, 1.0, None, max_unorm=0.0, skip_zeros=False)
            q1, q2 = self.qmaps() if eight else (None, None)
            for run, step in self._runs(eight):
                joined = {key: _joined([c.state[key] for c in run]) for key in run[0].state}
                joined["param"] = _joined([c.param for c in run])
                F.optimizer_update_8bit_blockwise("adam", _joined([c.grad for c in run]), joined["param"],
                                                  joined["state1"], joined["state2"], b1, b2, 0.0, 0.0, eps, step + 1,
                                                  lr, q1, q2, joined["absmax1"], joined["absmax2"], wd,
                                                  gnorm_scale=1.0, skip_zeros=False)
                for key, value in joined.items():  # the joined copies back into the chunks
                    _scatter(value, [c.param if key == "param" else c.state[key] for c in run])

    def scratch_bytes(self, chunks: list, steps: list[int]) -> int:
        runs = self._runs([(c, step) for c, step in zip(chunks, steps) if c.state["state1"].dtype == torch.uint8])
        return max((sum(_copy_bytes([c.param if key == "param" else c.state[key] for c in run])
                        for key in ("param", *run[0].state)) + _copy_bytes([c.grad for c in run])
                    for run, _ in runs), default=0)

    def _runs(self, items: list) -> list[tuple[list, int]]:
        """``items`` ((chunk, step) of 8-bit chunks) in runs updated by one call each: the library's CPU update
        costs a fixed time per call besides its elements, and a run of chunks that each (but the last) hold
        whole blocks, at one step count, is blockwise the same as the chunks one by one. A run holds at most
        :attr:`max_run_bytes` of chunks (a chunk larger than that is a run of its own, and is not copied)."""
        out: list[tuple[list, int]] = []
        run_bytes = 0
        for c, step in items:
            size = _chunk_bytes(c)
            if (out and out[-1][1] == step and (out[-1][0][-1].hi - out[-1][0][-1].lo) % self.block == 0
                    and run_bytes + size <= self.max_run_bytes):
                out[-1][0].append(c)
                run_bytes += size
            else:
                out.append(([c], step))
                run_bytes = size
        return out

    def scratch_bound(self) -> int:
        return self.max_run_bytes


class AdafactorFormat(OptimizerFormat):
    """[Note: whole-matrix updates]
    ``torch.optim.Adafactor``'s step for one parameter reads three things of the whole parameter: its norm
    (the relative step size), its gradient's row and column mean squares (the factored statistics, from which
    every element's estimate follows) and the norm of the whole update (the update clipping ``d``). A chunk
    cannot be updated before all three are known, and the last is known only when every element's update is.
    So the optimizer gathers all optimizer chunks of a parameter (its master and gradient chunks; the state is
    one small record per parameter, read with the first chunk) and updates the parameter as one group with
    torch's own functional ``adafactor`` over the whole tensor, then writes the chunks back: the result equals
    the library's bit for bit. The group's gradient and master are put together in one piece for the call: a
    view where the chunks are adjacent (a whole fp32 master, a gradient held whole), else a copy (a spilled
    gradient; the master chunks in mixed precision), at most one parameter's size, charged to the host ledger
    while the call runs. How the engine schedules the gather and bounds it: [Note: scheduling a whole-matrix
    gather] in terastack.llm.engine.optimizer_state. The state is what the format saves: a matrix keeps rows +
    columns fp32 values, a vector its elements."""

    name = "adafactor"
    reference = "torch.optim.Adafactor"
    title, state_words = "Adafactor", "Adafactor's factored second moments"
    whole_tensor = True
    #: torch.optim.Adafactor's defaults (its lr comes from the job; AdamW's betas and eps do not apply)
    beta2_decay = -0.8
    eps = (None, 1e-3)
    d = 1.0

    _FACTORED = (StatePart(key="row_var", dtype=torch.float32, chunked=False, factored=-1),
                 StatePart(key="col_var", dtype=torch.float32, chunked=False, factored=-2))
    _FULL = (StatePart(key="variance", dtype=torch.float32, chunked=False),)

    def parts(self, shape: tuple, *, full_width: bool = False) -> tuple[StatePart, ...]:
        return self._FACTORED if len(shape) > 1 else self._FULL

    def update(self, chunks: list, steps: list[int], *, lr: float, hyper, impl: dict) -> None:
        from torch.optim._adafactor import adafactor

        with torch.no_grad():
            for name, parts in self._groups(chunks, steps).items():
                first, step = parts[0]
                numel = math.prod(first.shape)
                if first.lo != 0 or parts[-1][0].hi != numel:
                    raise RuntimeError(f"adafactor: the update of {name!r} was given part of its chunks")
                pieces = [c.param for c, _ in parts]
                param = _joined(pieces).view(first.shape)
                grad = _joined([c.grad for c, _ in parts]).view(first.shape)
                s = first.state
                factored = len(first.shape) > 1
                adafactor([param], [grad], [s["row_var"] if factored else None],
                          [s["col_var"] if factored else None], [None if factored else s["variance"]],
                          [torch.tensor(float(step))], foreach=False, d=self.d, lr=lr, beta2_decay=self.beta2_decay,
                          weight_decay=hyper.weight_decay, eps1=self.eps[0], eps2=self.eps[1], maximize=False)
                _scatter(param.view(-1), pieces)  # a joined copy back into the chunks
                del param, grad  # one matrix's copies at a time (scratch_bytes)

    def scratch_bytes(self, chunks: list, steps: list[int]) -> int:
        return max((_copy_bytes([c.param for c, _ in parts]) + _copy_bytes([c.grad for c, _ in parts])
                    for parts in self._groups(chunks, steps).values()), default=0)

    @staticmethod
    def _groups(chunks: list, steps: list[int]) -> dict[str, list]:
        """name -> its (chunk, step) pairs in order: one group per parameter."""
        groups: dict[str, list] = {}
        for c, step in zip(chunks, steps):
            groups.setdefault(c.name, []).append((c, step))
        return {name: sorted(members, key=lambda m: m[0].lo) for name, members in groups.items()}


def _adjacent(pieces: list[torch.Tensor]) -> bool:
    """Whether ``pieces`` lie one after the other in one contiguous stretch of memory (the chunks of a whole fp32
    master, or of a gradient held whole): then their joined tensor is a view, and no copy."""
    first = pieces[0]
    end = first.data_ptr()
    for p in pieces:
        if (p.dtype != first.dtype or not p.is_contiguous() or p.data_ptr() != end
                or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return False
        end += p.numel() * p.element_size()
    return True


def _joined(pieces: list[torch.Tensor]) -> torch.Tensor:
    """One flat tensor of ``pieces``: the piece itself when there is one, a view over them when they are adjacent,
    else a copy (:func:`_copy_bytes` counts it)."""
    if len(pieces) == 1:
        return pieces[0].reshape(-1)
    if _adjacent(pieces):
        first = pieces[0]
        return first.as_strided((sum(p.numel() for p in pieces),), (1,), first.storage_offset())
    return torch.cat([p.reshape(-1) for p in pieces])


def _chunk_bytes(c) -> int:
    """Bytes of one gathered chunk's master, gradient and state."""
    return sum(t.numel() * t.element_size() for t in (c.param, c.grad, *c.state.values()))


def _copy_bytes(pieces: list[torch.Tensor]) -> int:
    """Bytes :func:`_joined` allocates for ``pieces``."""
    return 0 if len(pieces) == 1 or _adjacent(pieces) else sum(p.numel() * p.element_size() for p in pieces)


def _scatter(joined: torch.Tensor, pieces: list[torch.Tensor]) -> None:
    """Copy ``joined`` (made by :func:`_joined`) back into its ``pieces``, unless it is a view of them."""
    if len(pieces) == 1 or _adjacent(pieces):
        return
    at = 0
    for p in pieces:
        p.view(-1).copy_(joined[at:at + p.numel()])
        at += p.numel()


FORMATS: dict[str, OptimizerFormat] = {f.name: f for f in (AdamWFormat(), AdamW8bitFormat(), AdafactorFormat())}
if tuple(FORMATS) != OPTIMIZER_NAMES:   # the names a job may give are the specs registered here
    raise TypeError(f"optimizer formats {tuple(FORMATS)} differ from the job's names {OPTIMIZER_NAMES}")
ADAMW = FORMATS["adamw"]


def optimizer_format(name: str) -> OptimizerFormat:
    """The registered format ``name`` (ValueError naming ``optimizer`` and the choices otherwise)."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"optimizer: must be one of {', '.join(FORMATS)}; got {name!r}") from None
