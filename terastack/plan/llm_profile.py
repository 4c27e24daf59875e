"""What the LLM planner plans from: a profile of the model's streamed units at one batch shape.

Built by ``terastack.llm.engine.profile`` (parameters, FLOPs and saved-activation bytes per unit, optionally
measured compute times); read by :class:`terastack.plan.llm_planner.LLMPlanner`. The byte rules here
(:func:`held_bytes`, :func:`chunked_bytes`) are the store's own, so that plan and store cannot disagree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from terastack.constants import padded_size

#: fp32 master + AdamW exp_avg + exp_avg_sq, bytes per trainable parameter
STATE_BYTES = 12
#: fp32 bytes of the logit rows the engine's loss works on at once ([Note: the loss in place] in
#: terastack.llm.engine.causal_loss)
LOSS_CHUNK_BYTES = 16 << 20
#: the int64 tensors of a micro-batch that a step holds: token ids, labels, attention mask, position ids
BATCH_TENSORS = 4


def data_bytes(micro_tokens: int, micro_batches: int, *, stacked: bool) -> int:
    """[Note: the batch is priced]
    The step's own data, beside the units' working memory for the whole step: each of its ``micro_batches``
    micro-batches of ``micro_tokens`` tokens as :data:`BATCH_TENSORS` int64 tensors (the job loop holds a step's
    micro-batches together), and a second copy when passes stack them (vertical and grouped accumulation).
    With the activations, the logits and the loss's buffers (:attr:`ModelProfile.working_bytes`) this is all a
    batch's shape adds, so a batch the budgets cannot hold is refused by the plan before any of it exists."""
    one = micro_tokens * micro_batches * 8 * BATCH_TENSORS
    return 2 * one if stacked else one

#: Bytes a record of ``nbytes`` takes in a tier of the store: the store's own padding rule (whole O_DIRECT
#: blocks, at least one, so small tensors cost a block each), so that plan and store cannot disagree.
held_bytes = padded_size


def chunked_bytes(numel: int, elem: int, chunk: int) -> int:
    """Bytes the optimizer chunks of a ``numel``-element tensor take (each chunk its own record)."""
    full, rest = divmod(max(numel, 1), chunk)
    return full * held_bytes(chunk * elem) + (held_bytes(rest * elem) if rest else 0)


def gradients_in_flight(profile: ModelProfile, *, slack: bool = True) -> int:
    """Host bytes of gradients the pool must hold at once. [Note: gradients in flight]

    Backward hands each unit's weight gradients to the optimizer as one batch, and a tensor's gradient stays
    in the pool from its first contribution until its update is done. Most tensors have one user, so that is
    one unit's gradients; a tensor several units share (tied input and output embeddings) is held from the
    backward of its last user in forward order (the head, first in backward) to that of its first (the
    embedding, last in backward): every unit's backward in between adds its own gradients to it. Updates
    keep up at best (inline on the training thread; the optimizer thread when backward waits for it), so the
    pool needs, at some unit's backward, the gradients of that unit plus those still partial: ``live`` below.
    ``slack``: room for one more unit's completed gradients, so that backward runs on while the optimizer
    thread still works through them (the second-largest unit, as when every tensor has one user).
    """
    units = profile.units
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for i, u in enumerate(reversed(units)):  # backward order
        for t in dict.fromkeys(u.tensors):
            if profile.tensor_trainable[t]:
                start.setdefault(t, i)
                end[t] = i
    held = [0] * len(units)      # gradients in the pool during the backward of each unit (backward order)
    completed = [0] * len(units)  # gradients each unit's backward completes
    for t, first in start.items():
        nbytes = profile.tensor_numel[t] * 4
        for i in range(first, end[t] + 1):
            held[i] += nbytes
        completed[end[t]] += nbytes
    live = max(held, default=0)
    return live + (sorted(completed, reverse=True) + [0, 0])[1] if slack else live


@dataclass(frozen=True, slots=True)
class CalibrationBytes:
    """What timing one unit on this machine holds at once ([Note: calibrating within the budget] in
    terastack.llm.engine.profile): ``at_rest``, one copy of its weights as the step holds them at rest (an NF4 base
    as its records); ``working``, the copy it computes with (NF4 weights dequantized), its inputs, output,
    activations and gradients."""

    at_rest: int
    working: int

    def held(self, copies: int) -> int:
        """Bytes held when it is timed over ``copies`` copies of its weights."""
        return copies * self.at_rest + self.working


@dataclass(kw_only=True, slots=True)
class UnitProfile:
    """One streamed unit (an embedding, a decoder layer, the final norm, the head) at one batch shape."""

    name: str
    kind: str                      # "pre", "layer" or "post" (before, in, after the decoder stack)
    tensors: tuple[str, ...]       # canonical names of the parameters it uses
    params: int                    # parameters it uses (shared ones counted in each user)
    trainable: int                 # trainable parameters it owns (counted in one unit only)
    weight_bytes: int              # its compute weights in the compute dtype
    fwd_flops: float
    bwd_flops: float
    act_bytes: int                 # activations its autograd graph saves (weights excluded)
    boundary_bytes: int            # its inputs that need a gradient (what recompute keeps)
    out_bytes: int = 0
    act_tensors: int = 0           # saved storages (each a padded store record when swapped to the SSD)
    #: measured on this machine (seconds); None: from FLOPs and the hardware's rate
    fwd_s: float | None = None
    bwd_s: float | None = None


@dataclass(kw_only=True, slots=True)
class ModelProfile:
    model: str
    batch: int
    seq_len: int
    compute_bytes: int             # bytes per element of the compute weights (4 fp32, 2 bf16/fp16)
    units: list[UnitProfile]
    tensor_numel: dict[str, int]
    tensor_trainable: dict[str, bool]
    #: the logits of the whole head at one batch shape, in fp32
    logits_bytes: int = 0
    #: the engine computes the loss over the logits in place ([Note: the loss in place] in
    #: terastack.llm.engine.causal_loss); False: the model's own loss code runs
    loss_in_place: bool = False
    #: the head's parts when it streams in vocabulary slices (terastack.llm.vocab_slices): their outputs and the
    #: logits they are joined into live at once
    head_parts: int = 1
    #: {micro: [(fwd_s, bwd_s) per unit, in ``units``' order]}: the units timed on ``micro`` x ``batch`` rows at
    #: once, as vertical accumulation runs them ([Note: vertical and horizontal accumulation] in
    #: terastack.plan.accumulation_specs); a width absent here is priced as ``micro`` times one batch's time
    stacked_times: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    #: parameter shapes (an optimizer format's state may depend on them: Adafactor's factored statistics); a
    #: tensor absent here is priced as a vector of its elements
    tensor_shape: dict[str, tuple] = dataclasses.field(default_factory=dict)
    #: bytes at rest of the frozen tensors that rest in another format than the compute dtype (a LoRA base in NF4:
    #: about 0.56 bytes a parameter); a frozen tensor absent here rests in the compute dtype
    frozen_rest: dict[str, int] = dataclasses.field(default_factory=dict)
    #: trainable tensors whose optimizer state the format keeps at full width ([Note: optimizer state formats]:
    #: bitsandbytes' 32-bit override of an embedding)
    full_width: tuple[str, ...] = ()

    def full_width_state(self, name: str) -> bool:
        """Whether trainable ``name``'s optimizer state is kept at the format's full width."""
        return name in self.full_width

    def frozen_bytes(self, name: str) -> int:
        """Bytes of frozen tensor ``name`` as it rests on the store and streams from it."""
        rest = self.frozen_rest.get(name)
        return self.tensor_numel[name] * self.compute_bytes if rest is None else rest

    def moved_weight_bytes(self, unit: "UnitProfile") -> int:
        """Bytes of ``unit``'s weights as they travel to where it computes (an NF4 base's as its NF4 bytes; the
        unit dequantizes them there)."""
        saved = sum(held_bytes(self.tensor_numel[t] * self.compute_bytes) - held_bytes(self.frozen_rest[t])
                    for t in dict.fromkeys(unit.tensors) if t in self.frozen_rest)
        return unit.weight_bytes - saved

    def shape(self, name: str) -> tuple:
        """The shape of parameter ``name`` (a vector of its elements when the profile does not say)."""
        return tuple(self.tensor_shape.get(name) or (self.tensor_numel[name],))

    @property
    def loss_bytes(self) -> int:
        """Working memory of the loss over the logits beyond the last unit's own: the logits, their log-softmax
        and its gradient in fp32 for the model's own loss; in place, the logits once in the compute dtype (twice
        while a sliced head joins them) and a chunk's fp32 rows four times (the rows, their log-softmax, the
        gradient flowing in and the gradient computed)."""
        if not self.loss_in_place:
            return 3 * self.logits_bytes
        held = self.logits_bytes * self.compute_bytes // 4 * (2 if self.head_parts > 1 else 1)
        return held + 4 * min(self.logits_bytes, LOSS_CHUNK_BYTES)

    @property
    def working_bytes(self) -> int:
        """The working memory of the unit computing, beside what the plan holds: its activations while its forward
        runs or is recomputed and its weight gradients before they leave; for the head's units, also the loss over
        the logits, which lives from the head's forward to the end of its backward and so beside no other unit's
        computation."""
        own = [u.act_bytes + u.trainable * self.compute_bytes for u in self.units]
        body = len(own) - self.head_parts
        return max(max(own[:body], default=0), max(own[body:], default=0) + self.loss_bytes)

    @property
    def total_params(self) -> int:
        return sum(self.tensor_numel.values())

    @property
    def trainable_params(self) -> int:
        return sum(n for name, n in self.tensor_numel.items() if self.tensor_trainable[name])

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def mixed_precision(self) -> bool:
        return self.compute_bytes != 4

    def state_bytes(self, fmt=None) -> int:
        """Training state on the store: masters + the optimizer format's state (``fmt``; None: AdamW's two
        moments) (+ compute copies when they differ)."""
        total = self.optimizer_state_bytes(fmt) - (STATE_BYTES - 4) * self.trainable_params  # AdamW's counted below
        for name, n in self.tensor_numel.items():
            if self.tensor_trainable[name]:
                total += n * (STATE_BYTES + (self.compute_bytes if self.mixed_precision else 0))
            else:
                total += self.frozen_bytes(name)
        return total

    def optimizer_state_bytes(self, fmt=None) -> int:
        """Bytes of the optimizer format's state (``fmt``, a :class:`~terastack.plan.optimizer_formats.
        OptimizerFormat`; None: AdamW's two fp32 moments) over every trainable parameter, besides the masters."""
        if fmt is None:
            return (STATE_BYTES - 4) * self.trainable_params
        return sum(fmt.state_bytes(self.shape(n), full_width=self.full_width_state(n))
                   for n, t in self.tensor_trainable.items() if t)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelProfile":
        data = dict(data)
        data["units"] = [UnitProfile(**{**u, "tensors": tuple(u["tensors"])}) for u in data["units"]]
        data["stacked_times"] = {int(k): [tuple(t) for t in v] for k, v in data.get("stacked_times", {}).items()}
        data["tensor_shape"] = {k: tuple(v) for k, v in data.get("tensor_shape", {}).items()}
        return cls(**data)
