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
from terastack.plan.activation_specs import ACTIVATIONS, ActivationSpec, activation_spec
from terastack.plan.llm_profile import STATE_BYTES, ModelProfile
from terastack.plan.schedule_specs import ScheduleSpec, schedule_spec
from terastack.tier import Tier
from terastack.units import format_bytes


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
    #: canonical tensor name -> Tier.HOST or Tier.SSD: where its fp32 master and moments rest
    state_home: dict[str, Tier] = field(compare=False)
    #: canonical tensor name -> Tier.HOST or Tier.SSD: where its compute copy rests (mixed precision / frozen)
    compute_home: dict[str, Tier] = field(compare=False)
    mode: str                      # the optimizer schedule's name (its spec: :attr:`schedule`)
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

    @property
    def schedule(self) -> ScheduleSpec:
        """The optimizer schedule's spec."""
        return schedule_spec(self.mode)

    def activation_specs(self) -> tuple[ActivationSpec, ...]:
        """The activation policy's spec of each unit (forward order)."""
        return tuple(activation_spec(p) for p in self.policies)

    def summary(self) -> dict:
        counts = {p: self.policies.count(p) for p in ACTIVATIONS}
        host_state = sum(1 for v in self.state_home.values() if v is Tier.HOST)
        return {"policies": counts, "state_tensors_on_host": host_state,
                "state_tensors_on_ssd": len(self.state_home) - host_state, "mode": self.mode,
                "prefetch_depth": self.prefetch_depth, "device_capacity": self.device_capacity,
                "host_capacity": self.host_capacity, "grad_pool_bytes": self.grad_pool_bytes,
                "masters_bytes": self.masters_bytes, "writeback_bytes": self.writeback_bytes,
                "optimizer_chunk": self.optimizer_chunk,
                "read_ahead_bytes": self.read_ahead_bytes, "retained_units": len(self.retained_units),
                "grad_accum": self.grad_accum,
                "grad_sums_on_host": sum(1 for v in self.grad_home.values() if v is Tier.HOST),
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
        st_host = sum(profile.tensor_numel[n] for n, h in self.state_home.items() if h is Tier.HOST)
        st_all = sum(profile.tensor_numel[n] for n in self.state_home)
        lines.append(f"fp32 masters + AdamW moments: {format_bytes(st_host * STATE_BYTES)} in host memory, "
                     f"{format_bytes((st_all - st_host) * STATE_BYTES)} on SSD")
        if self.compute_home:
            cb = profile.compute_bytes
            c_host = sum(profile.tensor_numel[n] for n, h in self.compute_home.items() if h is Tier.HOST)
            c_all = sum(profile.tensor_numel[n] for n in self.compute_home)
            lines.append(f"compute weights ({cb} B/param): {format_bytes(c_host * cb)} in host memory, "
                         f"{format_bytes((c_all - c_host) * cb)} on SSD")
        p = self.prediction
        label = "predicted" if p.prediction else "predicted (calibrated on this machine)"
        where = ", inline after each unit's backward" if self.inline_updates else ""
        lines.append(f"optimizer: {self.mode}{where}; prefetch depth {self.prefetch_depth}")
        if self.grad_accum > 1:
            g_host = sum(profile.tensor_numel[n] for n, h in self.grad_home.items() if h is Tier.HOST)
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
