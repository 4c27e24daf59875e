"""The LLM planner: where each tensor rests and what each layer does with its activations.

Inputs are a :class:`ModelProfile` (per streamed unit: parameters, FLOPs,
saved-activation bytes, optionally measured compute times; built by
``terastack.llm.engine.profile``), a :class:`~terastack.plan.hardware.Hardware` and
the device and host budgets. The output is an :class:`LLMPlan`: an activation
policy per unit, a home (host or SSD) per training-state tensor, the ledger
capacities the engine runs under, and a :class:`StepPrediction`.

[Note: the step-time model]
A training step moves through four pipelines that overlap each other:

* compute: forward + backward of every unit, plus a second forward of every
  recomputed unit;
* the device link (accelerator <-> host): compute weights streamed in twice
  (forward and backward), gradients out, activations swapped to host or SSD
  out and back;
* the SSD: state read (weights, fp32 masters, AdamW moments) and written
  (masters, moments, low-precision copies), activations swapped to SSD;
  reads and writes share the drives, so their times add;
* the CPU optimizer: AdamW over every trainable parameter.

With an accelerator the pipelines run on different hardware and the step takes
the longest of them. Without one, compute, the optimizer and host-memory copies
all run on the same cores, so their times add, and only the SSD overlaps --
though not for free: SSD traffic slows the CPU's compute by the probe's
``cpu_io_slowdown_per_gbps`` per GB/s it moves (measured on the 2-core bench
VM: 6-8% per GB/s). With C the compute time, O the optimizer and copies and B
the gigabytes moved per step, the step s satisfies s = O + C (1 + k B / s),
so s = ((C + O) + sqrt((C + O)^2 + 4 k C B)) / 2.
Added to that is the part no schedule hides: the first unit of the next
forward needs the update of the last unit of this backward (eager updates) or
the whole optimizer runs after backward (active offloading off).

[Note: planning gradient accumulation]
With ``grad_accum`` N > 1 one step is N forwards and backwards and one AdamW
update. The plan is made for that step: compute, activation traffic and
compute-weight reads are N times those of one micro-batch (so a weight's
bytes per byte held grow with N when homes are chosen), the optimizer's work
is once. Each trainable tensor gets a gradient sum (4 bytes per parameter,
in optimizer chunks) that lives from the first micro-batch's backward to the
last one's; sums compete with the rest of the state for host room by bytes
moved per byte held (on the SSD a sum is written N-1 times and read N-1
times), and two chunk-sized host buffers are kept for the sums on the SSD
(one being added to, one on its way back). The gradient pool is that of one
micro-batch: a micro-batch's gradient leaves the pool as soon as it is in
its sum. See terastack.llm's [Note: gradient accumulation].

[Note: choosing the activation policy]
Decoder layers are identical, so a policy is a count per option: ``n_ssd``
layers swap their saved activations to the SSD, ``n_host`` to host memory,
``n_rec`` keep only their input and recompute, the rest keep everything on the
device. Every split is scored by the step-time model under the device and host
budgets and the fastest feasible one wins (ties: less device memory). Layers
that run first in forward swap first (their activations have the longest
time to travel and return); the last layers keep theirs (backward needs them
first). Units outside the decoder stack (embeddings, final norm, head) save
little and keep.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from terastack.constants import BLOCK, padded_size
from terastack.io.errors import BudgetError
from terastack.plan.hardware import Hardware
from terastack.units import format_bytes, parse_bytes

#: what a unit does with the activations its autograd graph saves: keep them on the device, swap them to host
#: memory or to the SSD, or keep only its inputs and recompute the rest in backward
POLICIES = ("keep", "host", "ssd", "recompute")
#: when the CPU optimizer updates a tensor: "eager" (as soon as backward has its whole gradient, overlapped
#: with the backward of earlier units), "deferred" (for clipping: once backward has the global gradient norm,
#: in forward order, overlapped with the next forward), "after_backward" (every update after backward, which
#: waits for them all: active offloading off). The one definition: terastack.llm's optimizer checks its mode
#: against it (see that module's [Note: active gradient offloading] and [Note: clipping with eager updates]).
MODES = ("eager", "deferred", "after_backward")
#: fp32 master + AdamW exp_avg + exp_avg_sq, bytes per trainable parameter
STATE_BYTES = 12
#: elements per optimizer chunk at most when the host budget is too small for the configured chunks
LEAN_CHUNK = 256 << 10

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
    logits_bytes: int = 0

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

    def state_bytes(self) -> int:
        """Training state on the store: masters + moments (+ compute copies when they differ)."""
        total = 0
        for name, n in self.tensor_numel.items():
            if self.tensor_trainable[name]:
                total += n * (STATE_BYTES + (self.compute_bytes if self.mixed_precision else 0))
            else:
                total += n * self.compute_bytes
        return total

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelProfile":
        data = dict(data)
        data["units"] = [UnitProfile(**{**u, "tensors": tuple(u["tensors"])}) for u in data["units"]]
        return cls(**data)


@dataclass(kw_only=True, slots=True)
class StepPrediction:
    step_s: float
    tokens_per_s: float
    bottleneck: str
    compute_s: float
    device_link_s: float
    ssd_s: float
    optimizer_s: float
    host_copy_s: float
    exposed_s: float
    ssd_read_bytes: int
    ssd_write_bytes: int
    device_link_bytes: int
    device_peak_bytes: int
    host_peak_bytes: int
    transient_bytes: int
    prediction: bool = True        # from a hypothetical machine (not measured)
    io_slowdown_s: float = 0.0     # CPU compute lost to SSD traffic beside it (no accelerator)


@dataclass(frozen=True, slots=True)
class LLMPlan:
    """A placement: activation policy per unit, home per state tensor, capacities, predicted step."""

    policies: tuple[str, ...]
    #: canonical tensor name -> "host" or "ssd": where its fp32 master and moments rest
    state_home: dict = field(compare=False)
    #: canonical tensor name -> "host" or "ssd": where its compute copy rests (mixed precision / frozen)
    compute_home: dict = field(compare=False)
    mode: str
    prefetch_depth: int
    device_capacity: int           # the store's device ledger: weights in flight + activations
    host_capacity: int             # the store's host ledger: host-resting state + working sets
    grad_pool_bytes: int           # part of the host ledger held for gradients in flight
    masters_bytes: int             # whole fp32 masters the optimizer may hold (handed over, read, being written)
    writeback_bytes: int           # updated optimizer chunks the optimizer may have in flight to the SSD
    optimizer_chunk: int           # elements per optimizer chunk (smaller when the host budget is tight)
    read_ahead_bytes: int          # optimizer state being updated or read ahead (inline updates group by this)
    retained_units: tuple          # units whose updated fp32 masters stay in the device tier for the next forward
    prediction: StepPrediction
    device_budget: int
    host_budget: int
    inline_updates: bool = False   # eager updates on the training thread (no accelerator)
    #: micro-batches per optimizer step (gradient accumulation; see [Note: planning gradient accumulation])
    grad_accum: int = 1
    #: canonical tensor name -> "host" or "ssd": where its gradient summed over the micro-batches rests
    grad_home: dict = field(default_factory=dict, compare=False)

    def summary(self) -> dict:
        counts = {p: self.policies.count(p) for p in POLICIES}
        host_state = sum(1 for v in self.state_home.values() if v == "host")
        return {"policies": counts, "state_tensors_on_host": host_state,
                "state_tensors_on_ssd": len(self.state_home) - host_state, "mode": self.mode,
                "prefetch_depth": self.prefetch_depth, "device_capacity": self.device_capacity,
                "host_capacity": self.host_capacity, "grad_pool_bytes": self.grad_pool_bytes,
                "masters_bytes": self.masters_bytes, "writeback_bytes": self.writeback_bytes,
                "optimizer_chunk": self.optimizer_chunk,
                "read_ahead_bytes": self.read_ahead_bytes, "retained_units": len(self.retained_units),
                "grad_accum": self.grad_accum,
                "grad_sums_on_host": sum(1 for v in self.grad_home.values() if v == "host"),
                **{f"predicted_{k}": v for k, v in dataclasses.asdict(self.prediction).items()}}

    def describe(self, profile: ModelProfile) -> str:
        """Human-readable placement, policy ranges and prediction."""
        lines = []
        ranges: list[tuple[str, int, int]] = []
        layer_names = [u.name for u in profile.units]
        for i, pol in enumerate(self.policies):
            if ranges and ranges[-1][0] == pol and ranges[-1][2] == i - 1:
                ranges[-1] = (pol, ranges[-1][1], i)
            else:
                ranges.append((pol, i, i))
        lines.append("activations (per unit, forward order):")
        for pol, a, b in ranges:
            span = layer_names[a] if a == b else f"{layer_names[a]} .. {layer_names[b]}"
            lines.append(f"  {pol:9s} {span}")
        st_host = sum(profile.tensor_numel[n] for n, h in self.state_home.items() if h == "host")
        st_all = sum(profile.tensor_numel[n] for n in self.state_home)
        lines.append(f"fp32 masters + AdamW moments: {format_bytes(st_host * STATE_BYTES)} in host memory, "
                     f"{format_bytes((st_all - st_host) * STATE_BYTES)} on SSD")
        if self.compute_home:
            cb = profile.compute_bytes
            c_host = sum(profile.tensor_numel[n] for n, h in self.compute_home.items() if h == "host")
            c_all = sum(profile.tensor_numel[n] for n in self.compute_home)
            lines.append(f"compute weights ({cb} B/param): {format_bytes(c_host * cb)} in host memory, "
                         f"{format_bytes((c_all - c_host) * cb)} on SSD")
        p = self.prediction
        label = "predicted" if p.prediction else "predicted (calibrated on this machine)"
        where = ", inline after each unit's backward" if self.inline_updates else ""
        lines.append(f"optimizer: {self.mode}{where}; prefetch depth {self.prefetch_depth}")
        if self.grad_accum > 1:
            g_host = sum(profile.tensor_numel[n] for n, h in self.grad_home.items() if h == "host")
            g_all = sum(profile.tensor_numel[n] for n in self.grad_home)
            lines.append(f"gradient accumulation: {self.grad_accum} micro-batches per step; gradient sums "
                         f"{format_bytes(g_host * 4)} in host memory, {format_bytes((g_all - g_host) * 4)} on SSD")
        lines.append(f"{label} step {p.step_s:.3f} s, {p.tokens_per_s:.1f} tokens/s, bottleneck: {p.bottleneck}")
        lines.append(f"  compute {p.compute_s:.3f} s | device link {p.device_link_s:.3f} s | SSD {p.ssd_s:.3f} s "
                     f"({format_bytes(p.ssd_read_bytes)} read, {format_bytes(p.ssd_write_bytes)} written) | "
                     f"CPU AdamW {p.optimizer_s:.3f} s | host copies {p.host_copy_s:.3f} s | "
                     f"compute slowed by SSD traffic {p.io_slowdown_s:.3f} s | not overlapped {p.exposed_s:.3f} s")
        lines.append(f"  device peak {format_bytes(p.device_peak_bytes + p.transient_bytes)} of "
                     f"{format_bytes(self.device_budget)}; host peak {format_bytes(p.host_peak_bytes)} of "
                     f"{format_bytes(self.host_budget)}")
        return "\n".join(lines)


class PlanError(BudgetError):
    """No placement fits the budgets; the message names the budget and the shortfall."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Shortfall:
    """Why a candidate does not fit: the budget it overruns, by how much, and what it would hold."""

    budget: str          # "device" or "host"
    needed: int          # bytes the candidate needs in that budget
    available: int
    limit: int
    what: str            # what the needed bytes are made of (for the error message)

    @property
    def shortfall(self) -> int:
        return self.needed - self.available

    def error(self) -> PlanError:
        return PlanError(self.budget, needed=self.needed, available=self.available, limit=self.limit,
                         what=self.what)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Split:
    """What a set of activation policies adds up to (the planner's search works on these sums)."""

    kept: int            # activations kept on the device
    boundary: int        # inputs kept by recomputed units
    host_acts: int       # activations swapped to host memory
    ssd_acts: int        # activations swapped to the SSD
    max_swapped: int     # the largest swapped unit (in flight out and back at once)
    recompute_s: float   # the second forward of recomputed units
    policies: tuple = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class _UnitTimes:
    """Seconds one unit computes, measured or from its FLOPs."""

    fwd_s: float
    bwd_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class _OptimizerSizes:
    """Host memory the optimizer side holds for its own work, and the chunk it works in (see _optimizer_sizes)."""

    grad_pool: int       # gradients in flight from backward to the optimizer
    read_ahead: int      # state chunks being updated or read ahead (with inline updates: a whole unit's state)
    writeback: int       # updated state chunks in flight back to the SSD
    masters: int         # whole fp32 masters held: handed over by backward, read, being updated or written
    chunk: int           # elements per optimizer chunk
    accumulate: int = 0  # gradient sums on the SSD being added to or written back (gradient accumulation)

    @property
    def host_bytes(self) -> int:
        """Host bytes all of the above take: the part of the host ledger that no resting state can use."""
        return self.grad_pool + self.read_ahead + self.writeback + self.masters + self.accumulate


@dataclass(frozen=True, kw_only=True, slots=True)
class _Homes:
    """Where the training state rests and what that costs per step (see _homes)."""

    state_home: dict     # tensor -> "host" or "ssd": its fp32 master and moments
    compute_home: dict   # tensor -> "host" or "ssd": its compute copy (mixed precision, or a frozen tensor)
    grad_home: dict      # tensor -> "host" or "ssd": its gradient summed over micro-batches (accumulation only)
    host_bytes: int      # host memory taken by the state that rests there
    ssd_read_bytes: int  # read per step for the state that rests on the SSD
    ssd_write_bytes: int  # written per step for the state that rests on the SSD


@dataclass(frozen=True, kw_only=True, slots=True)
class _Retention:
    """Units whose updated fp32 masters stay in the device tier for the next forward (see _retention)."""

    units: tuple         # their names, in forward order
    ssd_read_saved: int  # SSD bytes per step the next forward no longer reads for them
    device_peak: int     # peak of the device ledger while they wait (0: none retained)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Scored:
    """A candidate that fits both budgets: its predicted step and what its plan is built from."""

    prediction: StepPrediction
    homes: _Homes
    sizes: _OptimizerSizes
    retained_units: tuple  # _Retention.units


class LLMPlanner:
    """Chooses activation policies and state homes that minimize the predicted step time."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        device_budget: int | str
        host_budget: int | str
        #: "auto" (search), one of POLICIES for every decoder layer, a comma-separated cycle of them over the
        #: decoder layers ("keep,ssd"), or a tuple with one policy per unit
        policy: str | tuple = "auto"
        mode: str = "eager"
        prefetch_depth: int = 1
        #: fraction of the peak matmul rate reached by training (used when units have no measured times)
        compute_efficiency: float = 0.5
        #: "auto": state goes to host memory while it fits; "ssd": everything rests on the SSD
        state_placement: str = "auto"
        #: elements per optimizer chunk (the optimizer reads and writes its state in chunks of this size)
        optimizer_chunk: int = 1 << 20
        #: keep updated fp32 masters of the first units in the device tier for the next forward (when they fit)
        retain_weights: bool = True
        #: eager updates run on the training thread, a unit's state at a time (see the optimizer's
        #: [Note: inline updates without an accelerator]); False: on the optimizer thread, a chunk at a time
        inline_updates: bool = False
        #: micro-batches per optimizer step (gradient accumulation); see [Note: planning gradient accumulation]
        grad_accum: int = 1

        def __post_init__(self) -> None:
            if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) or self.grad_accum < 1:
                raise ValueError(f"grad_accum: must be an integer >= 1, got {self.grad_accum!r}")
            self.device_budget = parse_bytes(self.device_budget, field="device_budget")
            self.host_budget = parse_bytes(self.host_budget, field="host_budget")
            if isinstance(self.policy, str):
                bad = [p for p in self.policy.split(",") if p not in POLICIES]
                if self.policy != "auto" and bad:
                    raise ValueError(f"policy: must be auto, one of {', '.join(POLICIES)}, or a comma-separated "
                                     f"cycle of them over the decoder layers; got {self.policy!r}")
            else:
                self.policy = tuple(self.policy)
                bad = [p for p in self.policy if p not in POLICIES]
                if bad:
                    raise ValueError(f"policy: unknown per-unit policies {bad}; choose from {', '.join(POLICIES)}")
            if self.mode not in MODES:
                raise ValueError(f"mode: must be one of {', '.join(MODES)}; got {self.mode!r}")
            if self.prefetch_depth < 0:
                raise ValueError(f"prefetch_depth: must be >= 0, got {self.prefetch_depth}")
            if not 0 < self.compute_efficiency <= 1:
                raise ValueError(f"compute_efficiency: must be in (0, 1], got {self.compute_efficiency}")
            if self.state_placement not in ("auto", "ssd"):
                raise ValueError(f"state_placement: must be auto or ssd; got {self.state_placement!r}")
            if self.optimizer_chunk < 1024:
                raise ValueError(f"optimizer_chunk: must be >= 1024 elements, got {self.optimizer_chunk}")

    def __init__(self, config: "LLMPlanner.Config"):
        self.config = config
        # _homes results of the last profile planned, by (host room, chunk): every candidate of a search asks again
        self._homes_profile: ModelProfile | None = None
        self._homes_cache: dict[tuple[int, int], _Homes] = {}

    # ------------------------------------------------------------------ plan
    def plan(self, profile: ModelProfile, hw: Hardware) -> LLMPlan:
        """The fastest placement that fits, or :class:`PlanError` naming the budget that is short."""
        cfg = self.config
        units = profile.units
        if not units:
            raise ValueError(f"{profile.model}: the profile has no units")
        shortfall = None  # of the candidate closest to fitting: host shortfalls first (no policy helps those)
        for depth in sorted({cfg.prefetch_depth, 0}, reverse=True):
            best = None
            for policies in self._policy_choices(profile, hw):
                scored = self._score(profile, hw, self._split(profile, hw, policies), depth)
                if isinstance(scored, _Shortfall):
                    rank = (scored.budget != "host", scored.shortfall)
                    if shortfall is None or rank < (shortfall.budget != "host", shortfall.shortfall):
                        shortfall = scored
                    continue
                pred = scored.prediction
                # fastest first; among equally fast splits the one that moves fewer bytes, then uses less memory
                key = (round(pred.step_s, 6), pred.ssd_read_bytes + pred.ssd_write_bytes + pred.device_link_bytes
                       + int(pred.host_copy_s * 1e9), pred.device_peak_bytes)
                if best is None or key < best[0]:
                    best = (key, policies, scored)
            if best is not None:
                _, policies, scored = best
                homes, sizes = scored.homes, scored.sizes
                return LLMPlan(policies=tuple(policies), state_home=homes.state_home,
                               compute_home=homes.compute_home, mode=cfg.mode, prefetch_depth=depth,
                               device_capacity=cfg.device_budget - scored.prediction.transient_bytes,
                               host_capacity=cfg.host_budget, grad_pool_bytes=sizes.grad_pool,
                               masters_bytes=sizes.masters, writeback_bytes=sizes.writeback,
                               optimizer_chunk=sizes.chunk, read_ahead_bytes=sizes.read_ahead,
                               retained_units=scored.retained_units,
                               prediction=scored.prediction,
                               device_budget=cfg.device_budget, host_budget=cfg.host_budget,
                               inline_updates=cfg.inline_updates and cfg.mode == "eager",
                               grad_accum=cfg.grad_accum, grad_home=homes.grad_home)
        raise shortfall.error()

    def predict(self, profile: ModelProfile, hw: Hardware, policies: tuple[str, ...],
                depth: int | None = None) -> StepPrediction:
        """The predicted step of given policies (for ablations); raises PlanError if they do not fit."""
        scored = self._score(profile, hw, self._split(profile, hw, tuple(policies)),
                             self.config.prefetch_depth if depth is None else depth)
        if isinstance(scored, _Shortfall):
            raise scored.error()
        return scored.prediction

    def _policy_choices(self, profile: ModelProfile, hw: Hardware):
        """Candidate policy tuples. See [Note: choosing the activation policy]."""
        cfg = self.config
        units = profile.units
        if isinstance(cfg.policy, tuple):
            if len(cfg.policy) != len(units):
                raise ValueError(f"policy: {len(cfg.policy)} per-unit policies given for {len(units)} units")
            yield cfg.policy
            return
        layers = [i for i, u in enumerate(units) if u.kind == "layer"]
        if cfg.policy != "auto":
            cycle = cfg.policy.split(",")
            out = ["keep"] * len(units)
            for j, i in enumerate(layers):
                out[i] = cycle[j % len(cycle)]
            yield tuple(out)
            return
        n = len(layers)
        # Deep stacks: splits that differ by a layer or two score nearly alike, so counts step by `stride`
        # (the last step lands on n, so all-keep and all-of-one-kind stay candidates).
        stride = max(1, n // 24)
        counts = sorted(set(range(0, n + 1, stride)) | {n})
        for n_ssd in counts:
            for n_host in (c for c in counts if c <= n - n_ssd):
                for n_rec in (c for c in counts if c <= n - n_ssd - n_host):
                    order = (["ssd"] * n_ssd + ["host"] * n_host + ["recompute"] * n_rec
                             + ["keep"] * (n - n_ssd - n_host - n_rec))
                    out = ["keep"] * len(units)
                    for i, pol in zip(layers, order):
                        out[i] = pol
                    yield tuple(out)

    def _split(self, profile: ModelProfile, hw: Hardware, policies: tuple[str, ...]) -> _Split:
        kept = boundary = host_acts = ssd_acts = max_swapped = 0
        recompute_s = 0.0
        for u, pol in zip(profile.units, policies):
            if pol == "keep":
                kept += u.act_bytes
            elif pol == "recompute":
                boundary += u.boundary_bytes
                recompute_s += self._unit_times(u, hw).fwd_s
            else:
                max_swapped = max(max_swapped, u.act_bytes + (u.act_tensors * BLOCK if pol == "ssd" else 0))
                if pol == "host":
                    host_acts += u.act_bytes
                else:
                    ssd_acts += u.act_bytes
        return _Split(kept=kept, boundary=boundary, host_acts=host_acts, ssd_acts=ssd_acts, max_swapped=max_swapped,
                      recompute_s=recompute_s, policies=tuple(policies))

    # -------------------------------------------------------------- scoring
    def _score(self, profile: ModelProfile, hw: Hardware, split: _Split, depth: int) -> _Scored | _Shortfall:
        """The candidate's predicted step and what its plan is built from, or the _Shortfall that rules it out."""
        cfg = self.config
        units = profile.units
        cb = profile.compute_bytes
        # ---- device ledger: weights in flight + activations that stay on the device
        window = depth + 1
        wbytes = [u.weight_bytes for u in units]
        weights_ws = max(sum(wbytes[i:i + window]) for i in range(len(units)))
        swap_flight = 2 * split.max_swapped
        device_ledger = weights_ws + split.kept + split.boundary + swap_flight
        # working memory of the unit computing (outside the ledger): its activations while its forward runs or is
        # recomputed, its weight gradients before they leave, and the loss over the logits
        transient = int(max(u.act_bytes + u.trainable * cb for u in units) + 3 * profile.logits_bytes)
        if device_ledger + transient > cfg.device_budget:
            return _Shortfall(
                budget="device", needed=device_ledger + transient, available=cfg.device_budget, limit=cfg.device_budget,
                what=f"{profile.model}: weights of {window} unit(s) in flight ({format_bytes(weights_ws)}), "
                     f"activations ({format_bytes(split.kept + split.boundary)} kept, {format_bytes(swap_flight)} "
                     f"in flight) and one unit's working memory ({format_bytes(transient)})")
        # ---- host ledger: gradient pool, optimizer working set, host-swapped activations, then state
        for lean in (False, True):
            sizes = self._optimizer_sizes(profile, lean)
            host_fixed = sizes.host_bytes + split.host_acts
            if host_fixed <= cfg.host_budget:
                break
        if host_fixed > cfg.host_budget:
            return _Shortfall(
                budget="host", needed=host_fixed, available=cfg.host_budget, limit=cfg.host_budget,
                what=f"{profile.model}: gradients in flight ({format_bytes(sizes.grad_pool)}), the optimizer's "
                     f"working set ({format_bytes(sizes.host_bytes - sizes.grad_pool)}) and activations swapped "
                     f"to host ({format_bytes(split.host_acts)})")
        room = cfg.host_budget - host_fixed if cfg.state_placement == "auto" else 0
        homes = self._homes(profile, room, sizes.chunk)
        retention = self._retention(profile, split, homes.state_home, capacity=cfg.device_budget - transient,
                                    base=weights_ws + swap_flight)
        pred = self._predict(profile, hw, split, homes.state_home, homes.ssd_read_bytes - retention.ssd_read_saved,
                             homes.ssd_write_bytes, depth, device_peak=max(device_ledger, retention.device_peak),
                             host_peak=host_fixed + homes.host_bytes, transient=transient)
        return _Scored(prediction=pred, homes=homes, sizes=sizes, retained_units=retention.units)

    def _retention(self, profile: ModelProfile, split: _Split, state_home: dict, *, capacity: int,
                   base: int) -> _Retention:
        """[Note: weights kept for the next forward]

        The first units of the forward are the last ones backward updates. With fp32 compute their updated
        masters can stay in the device tier (written back to the SSD, but not dropped) until the next forward
        uses them, which then reads nothing for them. They share the device tier with the activations the
        forward keeps, so units are retained from the front of the forward order while, at every point of that
        forward, the masters still waiting plus the activations already kept fit the device ledger.
        """
        if profile.mixed_precision or self.config.mode == "after_backward" or not self.config.retain_weights:
            return _Retention(units=(), ssd_read_saved=0, device_peak=0)
        units = profile.units
        held = [sum(held_bytes(profile.tensor_numel[t] * 4) for t in dict.fromkeys(u.tensors)
                    if profile.tensor_trainable[t] and state_home.get(t) == "ssd") for u in units]
        stays = [u.act_bytes if p == "keep" else (u.boundary_bytes if p == "recompute" else 0)
                 for u, p in zip(units, split.policies or ("keep",) * len(units))]
        # Retaining the first k units, at unit j < k of the forward the device holds the masters of units j..k-1
        # and the activations of units before j: H(k) - H(j) + S(j) (H, S: prefix sums); after unit k, only
        # activations, at most S(n). So peak(k) = H(k) + max over j < k of (S(j) - H(j)), or S(n).
        best_k, best_peak = 0, 0
        h = s_ = 0
        worst = float("-inf")
        final = sum(stays)
        for k in range(1, len(units) + 1):
            worst = max(worst, s_ - h)        # j = k - 1
            h += held[k - 1]
            s_ += stays[k - 1]
            peak = max(h + worst, final)
            if peak + base > capacity:
                break
            if held[k - 1]:
                best_k, best_peak = k, peak + base
        return _Retention(units=tuple(u.name for u, h in zip(units[:best_k], held[:best_k]) if h),
                          ssd_read_saved=sum(held[:best_k]), device_peak=best_peak)

    def _optimizer_sizes(self, profile: ModelProfile, lean: bool) -> _OptimizerSizes:
        """Host bytes the optimizer side needs (gradient pool, chunks being updated or read ahead, chunks being
        written back, whole fp32 masters) and the chunk size. ``lean``: no unit of slack in the gradient pool and
        chunks of at most ``LEAN_CHUNK`` elements (a slower step when the optimizer falls behind backward, for host
        budgets too small for more)."""
        cfg = self.config
        cb = profile.compute_bytes
        mixed = profile.mixed_precision
        units = profile.units
        grad_pool = gradients_in_flight(profile, slack=not lean)
        largest = max(profile.tensor_numel.values())
        chunk = min(cfg.optimizer_chunk, LEAN_CHUNK) if lean else cfg.optimizer_chunk
        chunk_held = min(chunk, largest)
        per_chunk = 2 + (1 if mixed else 0) + (1 if cfg.mode != "eager" else 0)  # records per chunk
        job = per_chunk * held_bytes(chunk_held * 4)
        jobs = 2 * job  # the chunk being updated and the one read ahead
        writeback = job if lean else jobs
        if cfg.inline_updates and cfg.mode == "eager" and not lean:
            # one unit's state read ahead (then updated in one call) while the previous unit's is written back
            per_unit = max(sum((2 + (1 if mixed else 0)) * chunked_bytes(profile.tensor_numel[t], 4, chunk)
                               for t in u.tensors if profile.tensor_trainable[t]) for u in units)
            jobs = writeback = max(jobs, per_unit)
        masters = 0
        if mixed:
            jobs += largest * cb  # the compute copy rebuilt from the new master
        else:
            # [Note: optimizer chunks]: an fp32 master is one whole record: one read (or handed over) and
            # updated at a time, plus, when not lean, those backward hands over before the optimizer gets to them
            masters = held_bytes(4 * largest)
            if not lean:
                if cfg.mode == "eager":
                    held = sorted((sum(held_bytes(profile.tensor_numel[t] * 4) for t in u.tensors
                                       if profile.tensor_trainable[t]) for u in units), reverse=True) + [0]
                    masters += held[0] + held[1]
                else:
                    masters *= 2
        # gradient accumulation: a sum on the SSD is read, added to and written back a chunk at a time
        accumulate = 2 * held_bytes(chunk_held * 4) if cfg.grad_accum > 1 else 0
        return _OptimizerSizes(grad_pool=grad_pool, read_ahead=jobs, writeback=writeback, masters=masters,
                               chunk=chunk, accumulate=accumulate)

    def _homes(self, profile: ModelProfile, room: int, chunk: int) -> _Homes:
        """Fill ``room`` host bytes with the state that moves the most bytes per byte held; the rest rests on SSD."""
        if self._homes_profile is not profile:
            self._homes_profile, self._homes_cache = profile, {}
        # keyed by the room asked for, which the fill below leaves as it is (it counts what it spends in ``host``)
        key = (room, chunk)
        if key in self._homes_cache:
            return self._homes_cache[key]
        cb = profile.compute_bytes
        mixed = profile.mixed_precision
        micro = self.config.grad_accum  # compute weights are read in forward and backward of every micro-batch
        items = []  # (SSD bytes per step per byte held, kind, name, bytes held, read, written)
        for name, n in profile.tensor_numel.items():
            if profile.tensor_trainable[name]:
                moments = 2 * chunked_bytes(n, 4, chunk)
                if mixed:
                    state = moments + chunked_bytes(n, 4, chunk)
                    items.append((2.0 * micro, "compute", name, held_bytes(n * cb), 2 * micro * n * cb, n * cb))
                    items.append((2.0, "state", name, state, n * STATE_BYTES, n * STATE_BYTES))
                else:
                    # fp32: the master is the compute copy: read in forward and backward (backward hands it to
                    # the optimizer), moments read once; all three written once
                    items.append(((8 * micro + 20) / 12, "state", name, moments + held_bytes(n * 4),
                                  n * (8 * micro + 8), n * STATE_BYTES))
                if micro > 1:
                    # [Note: planning gradient accumulation]: the sum on the SSD is written by micro-batches
                    # 1..N-1 and read by 2..N
                    sums = chunked_bytes(n, 4, chunk)
                    moved = (micro - 1) * n * 4
                    items.append((2 * moved / sums, "grad", name, sums, moved, moved))
            else:
                items.append((2.0 * micro, "compute", name, held_bytes(n * cb), 2 * micro * n * cb, 0))
        items.sort(key=lambda it: -it[0])
        state_home, compute_home, grad_home = {}, {}, {}
        host = read = write = 0
        for _, kind, name, held, r, w in items:
            if host + held <= room:
                host += held
                home = "host"
            else:
                home = "ssd"
                read += r
                write += w
            {"state": state_home, "compute": compute_home, "grad": grad_home}[kind][name] = home
        self._homes_cache[key] = homes = _Homes(state_home=state_home, compute_home=compute_home,
                                                grad_home=grad_home, host_bytes=host, ssd_read_bytes=read,
                                                ssd_write_bytes=write)
        return homes

    def _unit_times(self, u: UnitProfile, hw: Hardware) -> _UnitTimes:
        if u.fwd_s is not None and u.bwd_s is not None:
            return _UnitTimes(fwd_s=u.fwd_s, bwd_s=u.bwd_s)
        rate = hw.compute_flops * self.config.compute_efficiency
        if rate <= 0:
            raise ValueError("hardware: no compute rate (cpu_flops or gpu_flops) to predict a step time from")
        return _UnitTimes(fwd_s=u.fwd_flops / rate, bwd_s=u.bwd_flops / rate)

    def _predict(self, profile: ModelProfile, hw: Hardware, split: _Split, state_home: dict, read: int,
                 write: int, depth: int, *, device_peak: int, host_peak: int, transient: int) -> StepPrediction:
        """See [Note: the step-time model]."""
        cfg = self.config
        cb = profile.compute_bytes
        mixed = profile.mixed_precision
        gpu = hw.has_gpu
        fwd = bwd = 0.0
        for u in profile.units:
            times = self._unit_times(u, hw)
            fwd += times.fwd_s
            bwd += times.bwd_s
        micro = cfg.grad_accum  # every micro-batch computes and moves activations and weights; AdamW runs once
        compute = (fwd + bwd + split.recompute_s) * micro
        grad_unit = max(u.trainable * 4 for u in profile.units)
        if cfg.mode != "eager":
            # gradients wait for the norm; those beyond the pool travel through the SSD and back
            spill = max(0, profile.trainable_params * 4 - 2 * grad_unit)
            read += spill
            write += spill
        read += split.ssd_acts * micro
        write += split.ssd_acts * micro
        read_bw = hw.ssd_read_total or 1e9
        write_bw = hw.ssd_write_total or 1e9
        ssd = read / read_bw + write / write_bw
        link_bytes = 0
        link = host_copy = 0.0
        if gpu:
            weights = sum(u.weight_bytes for u in profile.units)
            h2d = (2 * weights + split.host_acts + split.ssd_acts) * micro
            d2h = (profile.trainable_params * cb + split.host_acts + split.ssd_acts) * micro
            link_bytes = h2d + d2h
            link = max(h2d, d2h) / (hw.pcie_bytes_per_s or 16e9)
        else:
            host_copy = split.host_acts * micro / (hw.memcpy_bytes_per_s or 5e9)
        adam_rate = hw.cpu_adam_params_per_s or 2e8
        optimizer = profile.trainable_params / adam_rate
        # ---- the part no schedule hides
        first = profile.units[0]
        first_state = first.trainable * (STATE_BYTES + (cb if mixed else 0))
        first_io = (first_state / read_bw + first_state / write_bw
                    if any(state_home.get(t) == "ssd" for t in first.tensors) else 0.0)
        if cfg.mode == "after_backward":
            state_ssd = sum(profile.tensor_numel[n] for n, h in state_home.items() if h == "ssd") * STATE_BYTES
            exposed = max(optimizer if gpu else 0.0, state_ssd / read_bw + state_ssd / write_bw)
        elif cfg.mode == "deferred":
            exposed = max(0.0, (optimizer if gpu else 0.0) - fwd) + first_io
        else:
            exposed = first_io + (first.trainable / adam_rate if gpu else 0.0)
        if depth == 0:
            # no prefetch: every unit's weights arrive while compute waits
            exposed += sum(u.weight_bytes for u in profile.units) * 2 * micro / read_bw
        io_slowdown = 0.0
        if gpu:
            pipes = {"compute": compute, "device link": link, "SSD": ssd, "CPU optimizer": optimizer}
        else:
            cpu = compute + optimizer + host_copy
            k, gigabytes = hw.cpu_io_slowdown_per_gbps, (read + write) / 1e9
            if k > 0 and gigabytes > 0:
                slowed = (cpu + math.sqrt(cpu * cpu + 4 * k * compute * gigabytes)) / 2
                io_slowdown, cpu = slowed - cpu, slowed
            pipes = {"CPU (compute + AdamW + host copies)": cpu, "SSD": ssd}
        bottleneck = max(pipes, key=pipes.get)
        step = pipes[bottleneck] + exposed
        return StepPrediction(step_s=step, tokens_per_s=profile.tokens * micro / step if step > 0 else 0.0,
                              bottleneck=bottleneck, compute_s=compute, device_link_s=link, ssd_s=ssd,
                              optimizer_s=optimizer, host_copy_s=host_copy, exposed_s=exposed,
                              io_slowdown_s=io_slowdown,
                              ssd_read_bytes=int(read), ssd_write_bytes=int(write),
                              device_link_bytes=int(link_bytes), device_peak_bytes=int(device_peak),
                              host_peak_bytes=int(host_peak), transient_bytes=int(transient),
                              prediction=not hw.measured)
