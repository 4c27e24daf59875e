"""What the LLM planner produces: an :class:`LLMPlan` (activation policy per unit, home per state tensor,
the capacities the engine runs under) with its :class:`StepPrediction`, or a :class:`PlanError`.

Policies and the optimizer mode are names from the registries in :mod:`terastack.plan.activation_specs` and
:mod:`terastack.plan.schedule_specs` (a plan reads and writes as plain names); :attr:`LLMPlan.schedule` and
:meth:`LLMPlan.activation_specs` give their specs. Homes are :class:`~terastack.tier.Tier` values.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from terastack.errors import BudgetError
from terastack.plan.accumulation_specs import AccumulationSpec, accumulation_spec, preference
from terastack.plan.activation_specs import ACTIVATIONS, ActivationSpec, activation_spec
from terastack.plan.llm_profile import ModelProfile
from terastack.plan.optimizer_formats import ADAMW, optimizer_format
from terastack.plan.schedule_specs import ScheduleSpec, schedule_spec
from terastack.tier import Tier
from terastack.units import format_bytes


#: what a step's SSD bytes are for (the engine's byte ledger, terastack.llm.engine.byte_ledger, counts the same)
BYTE_KINDS = ("weights_forward", "weights_backward", "masters", "moments", "compute_copies", "gradients",
              "activations", "other")


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
    #: SSD bytes by kind, "<kind>_read" and "<kind>_written" (the engine's byte ledger counts the same kinds)
    bytes_by_kind: dict = dataclasses.field(default_factory=dict)


#: predicted steps within this share of the fastest are a tie ([Note: ties go to the fewest bytes])
STEP_TIES = 0.02


def bytes_moved(pred: StepPrediction) -> int:
    """What a predicted step moves: SSD reads and writes, device-link bytes, host copies (as bytes at 1 GB/s)."""
    return pred.ssd_read_bytes + pred.ssd_write_bytes + pred.device_link_bytes + int(pred.host_copy_s * 1e9)


def candidate_rank(pred: StepPrediction, step_ceiling: float | None = None) -> tuple:
    """Sort key of a candidate's prediction, best first. [Note: ties go to the fewest bytes]
    The step-time model is no finer than its inputs: a machine's calibration of
    the same units moves by tens of percent between runs, so two candidates
    predicted a percent or two apart are equally fast as far as anyone can tell.
    What is not uncertain is the bytes each moves: at a given speed, fewer
    bytes leave the disk to other work, wear it less, and lose least when it
    is slower than probed (on an accelerator the step is those bytes). So a
    search first finds the fastest prediction, then, of the candidates within
    :data:`STEP_TIES` of it (under ``step_ceiling``), takes the one that moves
    the fewest bytes; the rest rank by step. Without a ceiling: fastest first,
    then fewest bytes, then the least device memory."""
    if step_ceiling is not None and pred.step_s <= step_ceiling:
        return (0, bytes_moved(pred), pred.step_s, pred.device_peak_bytes)
    return (1, round(pred.step_s, 6), bytes_moved(pred), pred.device_peak_bytes)


@dataclass(frozen=True, slots=True)
class LLMPlan:
    """A placement: activation policy per unit, home per state tensor, capacities, predicted step."""

    policies: tuple[str, ...]
    #: canonical tensor name -> Tier.HOST or Tier.SSD: where its fp32 master and moments rest
    state_home: dict[str, Tier] = field(compare=False)
    #: canonical tensor name -> Tier.HOST or Tier.SSD: where its compute copy rests (mixed precision / frozen);
    #: Tier.DEVICE for frozen weights that stay on the accelerator (the planner's [Note: frozen weights on the device])
    compute_home: dict[str, Tier] = field(compare=False)
    optimizer_schedule: str        # the optimizer schedule's name (its spec: :attr:`schedule`)
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
    #: canonical tensor name -> Tier.HOST or Tier.SSD: where its gradient summed over the micro-batches rests
    grad_home: dict[str, Tier] = field(default_factory=dict, compare=False)
    #: the order of the micro-batches (terastack.plan.accumulation_specs): vertical runs them as one pass
    accumulation: str = "horizontal"
    #: the optimizer state format (terastack.plan.optimizer_formats): what rests per trainable parameter
    optimizer: str = ADAMW.name
    #: host bytes a whole-matrix update's gather holds beyond the windows above (0 for chunked formats; see
    #: [Note: scheduling a whole-matrix gather] in terastack.llm.engine.optimizer_state)
    gather_bytes: int = 0

    @property
    def accumulation_spec(self) -> AccumulationSpec:
        """The order of the micro-batches' spec."""
        return accumulation_spec(self.accumulation)

    @property
    def search_rank(self) -> int:
        """The order of its micro-batches as AUTO ranks it (``preference``): over the splits of one memory budget
        (terastack.plan.budget_search) the order with the fewest passes wins wherever a split fits it, as it does
        for one split ([Note: vertical and horizontal accumulation]: each pass reads every weight twice; at 1.1B
        with 8 micro-batches the horizontal plan took 171.5 s a step against the vertical's 111.2 s)."""
        return preference(self.accumulation_spec, self.grad_accum)

    @property
    def sums_gradients(self) -> bool:
        """Gradients are summed across the step's passes in sums kept between them (:attr:`grad_home`)."""
        return self.accumulation_spec.sums_gradients(self.grad_accum)

    @property
    def schedule(self) -> ScheduleSpec:
        """The optimizer schedule's spec."""
        return schedule_spec(self.optimizer_schedule)

    def activation_specs(self) -> tuple[ActivationSpec, ...]:
        """The activation policy's spec of each unit (forward order)."""
        return tuple(activation_spec(p) for p in self.policies)

    def summary(self) -> dict:
        counts = {p: self.policies.count(p) for p in ACTIVATIONS}
        host_state = sum(1 for v in self.state_home.values() if v is Tier.HOST)
        return {"policies": counts, "state_tensors_on_host": host_state,
                "state_tensors_on_ssd": len(self.state_home) - host_state, "optimizer_schedule": self.optimizer_schedule,
                "prefetch_depth": self.prefetch_depth, "device_capacity": self.device_capacity,
                "host_capacity": self.host_capacity, "grad_pool_bytes": self.grad_pool_bytes,
                "masters_bytes": self.masters_bytes, "writeback_bytes": self.writeback_bytes,
                "optimizer_chunk": self.optimizer_chunk, "optimizer": self.optimizer,
                "read_ahead_bytes": self.read_ahead_bytes, "retained_units": len(self.retained_units),
                "grad_accum": self.grad_accum, "accumulation": self.accumulation,
                "grad_sums_on_host": sum(1 for v in self.grad_home.values() if v is Tier.HOST),
                **{f"predicted_{k}": v for k, v in dataclasses.asdict(self.prediction).items()}}

    def placement_bytes(self, profile: ModelProfile) -> dict[str, int]:
        """Bytes of the training state by kind and home: ``state_host``, ``state_ssd`` (fp32 masters and AdamW
        moments), ``compute_device``, ``compute_host``, ``compute_ssd`` (compute copies of mixed precision and
        frozen weights). They add up to ``profile.state_bytes()``, the total a plan reports."""
        out = {f"{kind}_{tier.value}": 0 for kind in ("state", "compute") for tier in _PLACES[kind]}
        fmt = optimizer_format(self.optimizer)
        for name, home in self.state_home.items():
            out[f"state_{home.value}"] += profile.tensor_numel[name] * 4 + fmt.state_bytes(
                profile.shape(name), full_width=profile.full_width_state(name))
        for name, home in self.compute_home.items():
            out[f"compute_{home.value}"] += (profile.tensor_numel[name] * profile.compute_bytes
                                             if name in self.state_home else profile.frozen_bytes(name))
        return out

    def bytes_per_parameter(self, profile: ModelProfile) -> dict:
        """The predicted SSD bytes per parameter per step, read and written (the figure that carries over to any
        hardware: on a GPU the step is these bytes at the disk's rates), and by kind."""
        n = max(profile.total_params, 1)
        p = self.prediction
        return {"read": p.ssd_read_bytes / n, "written": p.ssd_write_bytes / n,
                "by_kind": {k: v / n for k, v in (p.bytes_by_kind or {}).items() if v}}

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
        placed = self.placement_bytes(profile)
        lines.append(f"training state {format_bytes(sum(placed.values()))}:")
        fmt = optimizer_format(self.optimizer)
        lines.append(f"  fp32 masters + {fmt.state_words}: {_where(placed, 'state')}")
        if self.compute_home:
            rest = (f"; the frozen base's {len(profile.frozen_rest)} NF4 weights "
                    f"{sum(profile.frozen_rest.values()) / sum(profile.tensor_numel[t] for t in profile.frozen_rest):.3g}"
                    " B/param" if profile.frozen_rest else "")
            lines.append(f"  compute weights ({profile.compute_bytes} B/param{rest}): {_where(placed, 'compute')}")
        p = self.prediction
        calibrated = all(u.fwd_s is not None for u in profile.units)
        label = ("predicted" if p.prediction else
                 "predicted (calibrated on this machine)" if calibrated else "predicted on this machine")
        where = ", inline after each unit's backward" if self.inline_updates else ""
        lines.append(f"optimizer: {self.optimizer_schedule}{where}; prefetch depth {self.prefetch_depth}")
        if self.grad_accum > 1 and not self.sums_gradients:
            lines.append(f"gradient accumulation: {self.grad_accum} micro-batches per step, {self.accumulation}: "
                         "each unit runs all of them at once (weights read once forward, once backward)")
        elif self.grad_accum > 1:
            g_host = sum(profile.tensor_numel[n] for n, h in self.grad_home.items() if h is Tier.HOST)
            g_all = sum(profile.tensor_numel[n] for n in self.grad_home)
            spec = self.accumulation_spec
            passes = (f"{self.accumulation}: {spec.passes(self.grad_accum)} passes of {spec.group(self.grad_accum)} "
                      "stacked" if spec.group(self.grad_accum) > 1 else self.accumulation)
            lines.append(f"gradient accumulation: {self.grad_accum} micro-batches per step, {passes}; gradient sums "
                         f"{format_bytes(g_host * 4)} in host memory, {format_bytes((g_all - g_host) * 4)} on SSD")
        lines.append(f"{label} step {p.step_s:.3f} s, {p.tokens_per_s:.1f} tokens/s, bottleneck: {p.bottleneck}")
        lines.append(f"  compute {p.compute_s:.3f} s | device link {p.device_link_s:.3f} s | SSD {p.ssd_s:.3f} s "
                     f"({format_bytes(p.ssd_read_bytes)} read, {format_bytes(p.ssd_write_bytes)} written) | "
                     f"CPU {fmt.title} {p.optimizer_s:.3f} s | host copies {p.host_copy_s:.3f} s | "
                     f"compute slowed by SSD traffic {p.io_slowdown_s:.3f} s | not overlapped {p.exposed_s:.3f} s")
        lines.append(f"  device peak {format_bytes(p.device_peak_bytes + p.transient_bytes)} of "
                     f"{format_bytes(self.device_budget)}; host peak {format_bytes(p.host_peak_bytes)} of "
                     f"{format_bytes(self.host_budget)}")
        return "\n".join(lines)


#: the homes each kind of training state can have (compute copies may stay on the device)
_PLACES = {"state": (Tier.HOST, Tier.SSD), "compute": (Tier.DEVICE, Tier.HOST, Tier.SSD)}
_PLACE_WORDS = {Tier.DEVICE: "on the device", Tier.HOST: "in host memory", Tier.SSD: "on SSD"}


def _where(placed: dict[str, int], kind: str) -> str:
    """"1 GiB in host memory, 2 GiB on SSD" for one kind of state (the device only when something stays there)."""
    return ", ".join(f"{format_bytes(placed[f'{kind}_{tier.value}'])} {_PLACE_WORDS[tier]}" for tier in _PLACES[kind]
                     if tier is not Tier.DEVICE or placed[f"{kind}_{tier.value}"])


class PlanError(BudgetError):
    """No placement fits the budgets; the message names the budget and the shortfall."""
