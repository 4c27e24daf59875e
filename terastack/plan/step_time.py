"""The step-time model of the LLM planner (:class:`~terastack.plan.llm_planner.LLMPlanner`): a placement's
predicted step, pipeline by pipeline.

[Note: the step-time model]
A training step moves through four pipelines that overlap each other:

* compute: forward + backward of every unit, plus a second forward of every
  recomputed unit;
* the device link (accelerator <-> host): compute weights streamed in twice
  (forward and backward), gradients out, activations swapped to host or SSD
  out and back;
* the SSD: state read (weights, fp32 masters, AdamW moments) and written
  (masters, moments, low-precision copies), activations swapped to SSD;
  reads and writes share the drives: their time is what the probe measured
  the disk to give both at once (``Hardware.ssd_seconds``, [Note: reads and
  writes at once] in terastack.plan.hardware), or their sum where it did not;
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
the whole optimizer runs after backward (active offloading off): each
schedule's spec says how much (``ScheduleSpec.exposed_s`` in
terastack.plan.schedule_specs), as it says what its updates hold and move.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from terastack.plan.hardware import Hardware
from terastack.plan.llm_plan import BYTE_KINDS, StepPrediction
from terastack.plan.llm_profile import ModelProfile, UnitProfile
from terastack.plan.schedule_specs import Exposure
from terastack.plan.state_homes import Homes
from terastack.tier import Tier


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitTimes:
    """Seconds one unit computes, measured or from its FLOPs."""

    fwd_s: float
    bwd_s: float


class StepTimeModel:
    """Seconds a unit computes, a pass's compute and a placement's predicted step (a part of the LLM planner,
    which provides ``self.config``, ``self.schedule``, ``self._passes``, ``self._memo`` and
    ``self._frozen_on_device``)."""

    def _unit_times(self, u: UnitProfile, hw: Hardware) -> UnitTimes:
        if u.fwd_s is not None and u.bwd_s is not None:
            return UnitTimes(fwd_s=u.fwd_s, bwd_s=u.bwd_s)
        rate = hw.compute_flops * self.config.compute_efficiency
        if rate <= 0:
            raise ValueError("hardware: no compute rate (cpu_flops or gpu_flops) to predict a step time from")
        return UnitTimes(fwd_s=u.fwd_flops / rate, bwd_s=u.bwd_flops / rate)

    def _compute_s(self, profile: ModelProfile, hw: Hardware) -> tuple[float, float]:
        """Seconds of one pass's forward and backward over every unit."""
        fwd = bwd = 0.0
        for u in profile.units:
            times = self._unit_times(u, hw)
            fwd += times.fwd_s
            bwd += times.bwd_s
        return fwd, bwd

    @staticmethod
    def _bytes_by_kind(homes: Homes, *, retained_read_saved: int, masters_reread: int, spill: int,
                       activations: int) -> dict:
        """The step's SSD bytes by byte-ledger kind: the homes' own, less the weights a retained unit need not read
        again, plus the masters read again, the gradients spilled and the activations swapped through the SSD."""
        by_kind = {f"{kind}_{op}": 0 for kind in BYTE_KINDS for op in ("read", "written")}
        by_kind.update(homes.bytes_by_kind)
        by_kind["weights_forward_read"] -= retained_read_saved
        by_kind["masters_read"] += masters_reread
        for kind, n in (("gradients", spill), ("activations", activations)):
            by_kind[f"{kind}_read"] += n
            by_kind[f"{kind}_written"] += n
        return by_kind

    def _predict(self, profile: ModelProfile, hw: Hardware, split, homes: Homes, read: int,
                 write: int, depth: int, *, device_peak: int, host_peak: int, transient: int,
                 state_waits_s: float = 0.0, retained_read_saved: int = 0,
                 masters_reread: int = 0) -> StepPrediction:
        """See [Note: the step-time model]. ``state_waits_s``: what inline updates wait for the disk beyond their
        window (the CPU waits; the disk does not: it is part of the SSD's time already)."""
        cb = profile.compute_bytes
        mixed = profile.mixed_precision
        gpu = hw.has_gpu
        fwd, bwd = self._memo(profile, hw, "compute", lambda: self._compute_s(profile, hw))
        micro = self._passes  # every pass computes and moves activations and weights; AdamW runs once
        compute = (fwd + bwd + split.recompute_s) * micro
        # sums over every unit and tensor: once per profile (the planner scores thousands of candidates)
        grad_unit, trainable = self._memo(profile, None, "trainable sizes", lambda: (
            max(u.trainable * 4 for u in profile.units), profile.trainable_params))
        # without back-pressure, gradients beyond the pool travel through the SSD and back
        spill = self.schedule.spill_traffic(trainable * 4, grad_unit)
        read += spill
        write += spill
        read += split.ssd_acts * micro
        write += split.ssd_acts * micro
        by_kind = self._bytes_by_kind(homes, retained_read_saved=retained_read_saved, masters_reread=masters_reread,
                                      spill=spill, activations=split.ssd_acts * micro)
        read_bw = hw.ssd_read_total or 1e9
        ssd = hw.ssd_seconds(read, write)
        link_bytes = 0
        link = host_copy = 0.0
        # weights that come in for every forward and backward (not those resting on the device)
        weights = self._memo(profile, None, ("frozen on the device", depth + 1), lambda: self._frozen_on_device(
            profile, depth + 1))[2] if homes.frozen_on_device else self._memo(
            profile, None, "moved weights", lambda: sum(map(profile.moved_weight_bytes, profile.units)))
        if gpu:
            h2d = (2 * weights + split.host_acts + split.ssd_acts) * micro
            d2h = (trainable * cb + split.host_acts + split.ssd_acts) * micro
            link_bytes = h2d + d2h
            link = max(h2d, d2h) / (hw.pcie_bytes_per_s or 16e9)
        else:
            host_copy = split.host_acts * micro / (hw.memcpy_bytes_per_s or 5e9)
        adam_rate = hw.update_rate(self.format.name) or 2e8
        optimizer = trainable / adam_rate
        # ---- the part no schedule hides
        first = profile.units[0]
        per_param = 4 + self._memo(profile, None, "optimizer state bytes", lambda: profile.optimizer_state_bytes(
            self.format)) / max(trainable, 1)  # AdamW: 12
        first_state = first.trainable * (per_param + (cb if mixed else 0))
        first_io = (hw.ssd_seconds(first_state, first_state)
                    if any(homes.state_home.get(t) is Tier.SSD for t in first.tensors) else 0.0)
        state_ssd = homes.ssd_state_bytes
        exposed = self.schedule.exposed_s(Exposure(
            optimizer_apart_s=optimizer if gpu else 0.0,
            first_update_apart_s=first.trainable / adam_rate if gpu else 0.0, first_state_io_s=first_io,
            forward_s=fwd, state_io_s=hw.ssd_seconds(state_ssd, state_ssd)))
        if depth == 0:
            # no prefetch: every unit's weights arrive while compute waits
            exposed += weights * 2 * micro / read_bw
        io_slowdown = 0.0
        if gpu:
            pipes = {"compute": compute, "device link": link, "SSD": ssd, f"CPU {self.format.title}": optimizer}
        else:
            cpu = compute + optimizer + host_copy
            k, gigabytes = hw.cpu_io_slowdown_per_gbps, (read + write) / 1e9
            if k > 0 and gigabytes > 0:
                slowed = (cpu + math.sqrt(cpu * cpu + 4 * k * compute * gigabytes)) / 2
                io_slowdown, cpu = slowed - cpu, slowed
            pipes = {f"CPU (compute + {self.format.title} + host copies)": cpu + state_waits_s, "SSD": ssd}
        bottleneck = max(pipes, key=pipes.get)
        step = pipes[bottleneck] + exposed
        exposed += state_waits_s
        return StepPrediction(step_s=step, tokens_per_s=profile.tokens * micro / step if step > 0 else 0.0,
                              bottleneck=bottleneck, compute_s=compute, device_link_s=link, ssd_s=ssd,
                              optimizer_s=optimizer, host_copy_s=host_copy, exposed_s=exposed,
                              io_slowdown_s=io_slowdown,
                              ssd_read_bytes=int(read), ssd_write_bytes=int(write),
                              device_link_bytes=int(link_bytes), device_peak_bytes=int(device_peak),
                              host_peak_bytes=int(host_peak), transient_bytes=int(transient),
                              prediction=not hw.measured, bytes_by_kind={k: int(v) for k, v in by_kind.items()})
