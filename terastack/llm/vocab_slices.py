"""Vocabulary-sized embeddings and output heads in row slices, each slice its own streamed unit.

[Note: vocabulary slices]
A unit's weights and gradients are in memory whole while it computes. A decoder layer of an 8B model is 218M
parameters, but Llama 3's embedding and head are 128256 x 4096 each: 2 GiB of fp32 weights, and as much gradient,
more than the rest of a step's working set. So an ``nn.Embedding`` or ``nn.Linear`` outside the decoder stack whose
fp32 weight is larger than the job's ``offload.vocab_slice`` is replaced on the skeleton by :class:`RowSlices`,
whose parts hold consecutive row ranges of it; every part is a unit (terastack.llm.model's [Note: units]) and the
skeleton calls the container, which calls its parts in order:

* a head: the logits are the parts' outputs side by side (part k gives the logits of its vocabulary range);
* an embedding: part k looks up the tokens of its range and gives zeros at every other position; the parts'
  outputs are summed, and since exactly one part is nonzero at each position, the sum is exact.

Results equal the whole module's up to the order of float sums (the head's input gradient is summed over the
parts). A part holds a multiple of :data:`ROW_MULTIPLE` rows, so its elements are a multiple of 256 and the blocks
of a blockwise optimizer format (8-bit AdamW's 256) never straddle two parts: its state is the one the reference
library keeps for the whole tensor. Not sliced: a weight shared by two modules (tied embeddings: one tensor serves
two units already), subclasses (a scaled embedding's forward is its own), and formats whose update needs the whole
matrix (Adafactor: its column statistics are sums over all the rows).

Outside the engine the parameters keep the model's names: a checkpoint's ``lm_head.weight`` is split into its
parts on the way in and the parts are joined on the way out (:class:`Slicing`). A run's slicing is saved with its
checkpoints, so a resume slices as the run did whatever the setting says then.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

#: rows of a part are a multiple of this: 256 rows of any width are a multiple of 256 elements (the 8-bit block)
ROW_MULTIPLE = 256


class SliceParts(nn.ModuleList):
    """The parts of a :class:`RowSlices` (a list of identical modules that is not a decoder stack)."""


class RowSlices(nn.Module):
    """Stands in for an ``nn.Embedding`` or ``nn.Linear`` whose rows (output features, vocabulary entries) are split
    into ``parts``; it owns no parameters of its own. Attributes model code reads (``weight`` as a meta tensor of
    the whole shape, ``num_embeddings``, ``padding_idx``, ``out_features``...) are the whole module's."""

    def __init__(self, whole: nn.Module, rows: int):
        super().__init__()
        self.embedding = isinstance(whole, nn.Embedding)
        total = whole.weight.shape[0]
        self.bounds = [(lo, min(lo + rows, total)) for lo in range(0, total, rows)]
        self.parts = SliceParts(_part(whole, lo, hi) for lo, hi in self.bounds)
        self.whole_shape = tuple(whole.weight.shape)
        self.whole_dtype = whole.weight.dtype
        for attr in ("num_embeddings", "embedding_dim", "padding_idx", "in_features", "out_features"):
            if hasattr(whole, attr):
                setattr(self, attr, getattr(whole, attr))

    @property
    def weight(self) -> torch.Tensor:
        # model code asks for the weight's device or dtype (Llama 4 moves its input ids to it); the data is streamed
        return torch.empty(self.whole_shape, dtype=self.whole_dtype, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.embedding:
            return torch.cat([part(x) for part in self.parts], dim=-1)
        out = None
        for part in self.parts:
            y = part(x)
            out = y if out is None else out + y
        return out


class EmbeddingRows(nn.Embedding):
    """Rows ``lo:hi`` of an embedding: the tokens of that range are looked up, every other position gives zeros."""

    def __init__(self, rows: int, dim: int, lo: int, *, padding_idx: int | None, **factory):
        hi = lo + rows
        local_pad = padding_idx - lo if padding_idx is not None and lo <= padding_idx < hi else None
        super().__init__(rows, dim, padding_idx=local_pad, **factory)
        self.lo = lo

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.lo
        inside = (local >= 0) & (local < self.num_embeddings)
        out = super().forward(torch.where(inside, local, torch.zeros_like(local)))
        return out * inside.unsqueeze(-1).to(out.dtype)


def _part(whole: nn.Module, lo: int, hi: int) -> nn.Module:
    factory = {"device": whole.weight.device, "dtype": whole.weight.dtype}
    if isinstance(whole, nn.Embedding):
        part = EmbeddingRows(hi - lo, whole.embedding_dim, lo, padding_idx=whole.padding_idx, **factory)
    else:
        part = nn.Linear(whole.in_features, hi - lo, bias=whole.bias is not None, **factory)
    part.requires_grad_(whole.weight.requires_grad)
    return part


def slice_rows(module: nn.Module, max_bytes: int) -> int | None:
    """Rows per part for ``module`` under a bound of ``max_bytes`` of fp32 weight per part, or None when it stays
    whole (it fits, or it is not a plain embedding or linear layer)."""
    if type(module) not in (nn.Embedding, nn.Linear) or max_bytes <= 0:
        return None
    rows, width = module.weight.shape
    if rows * width * 4 <= max_bytes:
        return None
    per_part = max(ROW_MULTIPLE, (max_bytes // (width * 4)) // ROW_MULTIPLE * ROW_MULTIPLE)
    return per_part if per_part < rows else None


def slice_bound(max_bytes: int, optimizer: str) -> int:
    """The bound a job's ``offload.vocab_slice`` (``max_bytes``) sets under its optimizer format: 0 (nothing is
    sliced) for a format whose update needs a matrix whole, or when slicing is off."""
    from terastack.plan.optimizer_formats import optimizer_format

    return 0 if optimizer_format(optimizer).whole_tensor else max(0, max_bytes)


def decide(model: nn.Module, stack: nn.Module, *, max_bytes: int, optimizer: str) -> dict[str, int]:
    """Module path -> rows per part, for every module of ``model`` outside the decoder ``stack`` that is sliced
    ([Note: vocabulary slices]); ``optimizer``: the state format's name (see :func:`slice_bound`)."""
    max_bytes = slice_bound(max_bytes, optimizer)
    if max_bytes == 0:
        return {}
    in_stack = {id(m) for m in stack.modules()}
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    decision = {}
    for path, module in model.named_modules():
        if id(module) in in_stack or not path:
            continue
        rows = slice_rows(module, max_bytes)
        if rows is not None and all(uses[id(p)] == 1 for p in module.parameters(recurse=False)):
            decision[path] = rows
    return decision


@dataclass(frozen=True)
class PartOf:
    """A part's parameter: rows ``lo:hi`` of the model's parameter ``whole``."""

    whole: str
    lo: int
    hi: int


class Slicing:
    """The modules of one model that were sliced, and the names of their parameters both ways: the model's own
    (checkpoints, exports, ``Trainer.parameter``) and the parts' (the engine's canonical names)."""

    def __init__(self, decision: dict[str, int]):
        self.decision = dict(decision)
        self.part_of: dict[str, PartOf] = {}
        self.parts: dict[str, list[str]] = {}   # the model's parameter name -> its parts' names, in row order

    def __bool__(self) -> bool:
        return bool(self.decision)

    def _record(self, path: str, container: RowSlices) -> None:
        for k, (lo, hi) in enumerate(container.bounds):
            for local, _ in container.parts[k].named_parameters():
                whole = f"{path}.{local}"
                name = f"{path}.parts.{k}.{local}"
                self.part_of[name] = PartOf(whole, lo, hi)
                self.parts.setdefault(whole, []).append(name)

    def split(self, name: str, tensor: torch.Tensor):
        """(canonical name, tensor) for the model's parameter ``name``: its parts' row ranges, or itself."""
        if name not in self.parts:
            yield name, tensor
            return
        for part in self.parts[name]:
            rng = self.part_of[part]
            yield part, tensor[rng.lo:rng.hi]

    def join(self, name: str, read) -> torch.Tensor:
        """The model's parameter ``name`` from ``read(canonical name)``: its parts concatenated, or itself."""
        if name not in self.parts:
            return read(name)
        return torch.cat([read(part) for part in self.parts[name]], dim=0)

    def whole_name(self, name: str) -> str:
        rng = self.part_of.get(name)
        return name if rng is None else rng.whole


def slice_model(model: nn.Module, stack: nn.Module, *, max_bytes: int, optimizer: str,
                decision: dict[str, int] | None = None) -> Slicing:
    """Slice ``model`` (decoder ``stack``) in place: by ``decision`` when given (a checkpoint's), else as
    :func:`decide` chooses for the job's ``max_bytes`` and ``optimizer``."""
    if decision is None:
        decision = decide(model, stack, max_bytes=max_bytes, optimizer=optimizer)
    return apply(model, decision)


def apply(model: nn.Module, decision: dict[str, int]) -> Slicing:
    """Replace each module of ``decision`` (path -> rows per part) by its :class:`RowSlices`, in place."""
    slicing = Slicing(decision)
    for path, rows in decision.items():
        container = RowSlices(model.get_submodule(path), rows)
        model.set_submodule(path, container)
        slicing._record(path, container)
    return slicing
