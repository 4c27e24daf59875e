"""Where an LLM's training state rests, for the planner (:class:`~terastack.plan.llm_planner.LLMPlanner`): host
memory filled with the state that moves the most SSD bytes per byte held, frozen weights on the device where
they fit, and the updated weights kept there for the next forward.

:class:`StateHomes` is the planner's half that decides homes; it reads the planner's config, format, schedule,
passes and memo (``self.config``, ``self.format``, ``self.schedule``, ``self._passes``, ``self._memo``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from terastack.plan.activation_specs import DEFAULT, activation_spec
from terastack.plan.llm_profile import ModelProfile, chunked_bytes, held_bytes
from terastack.tier import Tier


@dataclass(frozen=True, kw_only=True, slots=True)
class Homes:
    """Where the training state rests and what that costs per step (see _homes)."""

    state_home: dict     # tensor -> Tier: where its fp32 master and moments rest
    compute_home: dict   # tensor -> Tier: its compute copy (mixed precision, or a frozen tensor)
    grad_home: dict      # tensor -> Tier: its gradient summed over micro-batches (accumulation only)
    host_bytes: int      # host memory taken by the state that rests there
    ssd_read_bytes: int  # read per step for the state that rests on the SSD
    ssd_write_bytes: int  # written per step for the state that rests on the SSD
    ssd_state_params: int  # trainable parameters whose fp32 master and moments rest on the SSD
    ssd_state_bytes: int = 0  # their fp32 masters and optimizer state (the format's), unpadded
    frozen_on_device: bool = False  # every frozen weight rests in the device tier (compute_home: Tier.DEVICE)
    bytes_by_kind: dict = dataclasses.field(default_factory=dict)  # the SSD bytes above by kind (byte ledger's)


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    """Units whose updated fp32 masters stay in the device tier for the next forward (see _retention)."""

    units: tuple         # their names, in forward order
    ssd_read_saved: int  # SSD bytes per step the next forward no longer reads for them
    device_peak: int     # peak of the device ledger while they wait (0: none retained)


class StateHomes:
    """Homes of the training state and the weights kept for the next forward (a part of the LLM planner)."""

    def _frozen_on_device(self, profile: ModelProfile, window: int, rounding=None) -> tuple[int, int, int]:
        """[Note: frozen weights on the device]

        A frozen weight (the base model of a LoRA fine-tune) never changes, so with an accelerator it need not
        travel: resting in the device tier it is read by every forward and backward without crossing the device
        link or leaving the SSD. When all of them fit beside the step's working memory they rest there (a 7B
        base in bf16 is 12.6 GiB; streaming it twice a step over PCIe while an 80 GB GPU holds 1.7 GiB is the
        slow answer); otherwise they stream in with the trainable weights. Returns the bytes of the frozen
        weights and of the weights then in flight (``window`` units'), each tensor's ``rounding`` in the device
        tier added, and of those every pass then brings in."""
        cb, extra = profile.compute_bytes, rounding or dict.fromkeys(profile.tensor_numel, 0)
        frozen_of = [sum(held_bytes(profile.tensor_numel[t] * cb) for t in dict.fromkeys(u.tensors)
                         if not profile.tensor_trainable[t]) for u in profile.units]
        # an NF4 base rests in its own bytes, and the unit computing holds its weights dequantized beside them
        frozen = sum(held_bytes(profile.frozen_bytes(t)) + extra[t] for t in profile.tensor_numel
                     if not profile.tensor_trainable[t]) + (max(frozen_of) if profile.frozen_rest else 0)
        streamed = [max(u.weight_bytes - f, 0) for u, f in zip(profile.units, frozen_of)]
        held = [s + sum(extra[t] for t in u.tensors if profile.tensor_trainable[t])
                for s, u in zip(streamed, profile.units)]
        return frozen, max(sum(held[i:i + window]) for i in range(len(held))), sum(streamed)

    def _retention(self, profile: ModelProfile, split, state_home: dict, *, capacity: int,
                   base: int, rounding: dict) -> Retention:
        """[Note: weights kept for the next forward]

        The first units of the forward are the last ones backward updates. With fp32 compute their updated
        masters can stay in the device tier (written back to the SSD, but not dropped) until the next forward
        uses them, which then reads nothing for them. They share the device tier with the activations the
        forward keeps, so units are retained from the front of the forward order while, at every point of that
        forward, the masters still waiting plus the activations already kept fit the device ledger.
        """
        if profile.mixed_precision or not self.schedule.retains_masters or not self.config.retain_weights:
            return Retention(units=(), ssd_read_saved=0, device_peak=0)
        units = profile.units
        # per homes (the state_home dict of a cached Homes: the entry keeps it alive, so its id is not reused)
        held = self._memo(profile, None, ("held", id(state_home)), lambda: (state_home, [
            sum(held_bytes(profile.tensor_numel[t] * 4) + rounding[t] for t in dict.fromkeys(u.tensors)
                if profile.tensor_trainable[t] and state_home.get(t) is Tier.SSD) for u in units]))[1]
        policies = split.policies or (DEFAULT.name,) * len(units)
        stays = [activation_spec(p).device_bytes(u) for u, p in zip(units, policies)]
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
        return Retention(units=tuple(u.name for u, h in zip(units[:best_k], held[:best_k]) if h),
                          ssd_read_saved=sum(held[:best_k]), device_peak=best_peak)

    def _homes(self, profile: ModelProfile, room: int, chunk: int, *, frozen_on_device: bool = False) -> Homes:
        """Fill ``room`` host bytes with the state that moves the most bytes per byte held; the rest rests on SSD.
        ``frozen_on_device``: frozen weights rest in the device tier (see [Note: frozen weights on the device])."""
        if self._homes_profile is not profile:
            self._homes_profile, self._homes_cache = profile, {}
        # keyed by the room asked for, which the fill below leaves as it is (it counts what it spends in ``host``)
        key = (room, chunk, self._passes, frozen_on_device)
        if key in self._homes_cache:
            return self._homes_cache[key]
        cb = profile.compute_bytes
        mixed = profile.mixed_precision
        micro = self._passes  # compute weights are read in forward and backward of every pass
        # (SSD bytes per step per byte held, kind, name, bytes held, {byte-ledger kind: (read, written)}); bytes as
        # the store moves them (records padded for direct I/O), so the prediction and the ledger count alike
        items = []
        for name, n in profile.tensor_numel.items():
            low = held_bytes(n * cb if profile.tensor_trainable[name] else profile.frozen_bytes(name))
            weights = {"weights_forward": (micro * low, 0), "weights_backward": (micro * low, 0)}
            if profile.tensor_trainable[name]:
                wide = profile.full_width_state(name)
                moments = self.format.held_bytes(profile.shape(name), chunk, full_width=wide)  # the format's state
                if mixed:
                    master = chunked_bytes(n, 4, self.format.chunk_elements(chunk))
                    items.append((2.0 * micro, "compute", name, low, {**weights, "compute_copies": (0, low)}))
                    items.append((2.0, "state", name, moments + master,
                                  {"masters": (master, master), "moments": (moments, moments)}))
                else:
                    # fp32: the master is the compute copy: read in forward and backward (backward hands it to
                    # the optimizer), the state (s bytes a parameter; AdamW's 8) read once; all written once
                    s = self.format.bytes_per_param(profile.shape(name), full_width=wide)
                    items.append(((8 * micro + 4 + 2 * s) / (4 + s), "state", name, moments + low,
                                  {**weights, "masters": (0, low), "moments": (moments, moments)}))
                if micro > 1:
                    # [Note: planning gradient accumulation]: the sum on the SSD is written by micro-batches
                    # 1..N-1 and read by 2..N
                    sums = chunked_bytes(n, 4, chunk)
                    moved = (micro - 1) * sums
                    items.append((2 * moved / sums, "grad", name, sums, {"gradients": (moved, moved)}))
            elif not frozen_on_device:
                items.append((2.0 * micro, "compute", name, low, weights))
        items.sort(key=lambda it: -it[0])
        state_home, compute_home, grad_home = {}, {}, {}
        if frozen_on_device:
            compute_home.update((n, Tier.DEVICE) for n, t in profile.tensor_trainable.items() if not t)
        host = read = write = 0
        by_kind: dict[str, int] = {}
        for _, kind, name, held, parts in items:
            if host + held <= room:
                host += held
                home = Tier.HOST
            else:
                home = Tier.SSD
                for part, (pr, pw) in parts.items():
                    read += pr
                    write += pw
                    by_kind[f"{part}_read"] = by_kind.get(f"{part}_read", 0) + pr
                    by_kind[f"{part}_written"] = by_kind.get(f"{part}_written", 0) + pw
            {"state": state_home, "compute": compute_home, "grad": grad_home}[kind][name] = home
        ssd_state = sum(profile.tensor_numel[n] for n, h in state_home.items() if h is Tier.SSD)
        ssd_state_bytes = sum(4 * profile.tensor_numel[n] + self.format.state_bytes(
            profile.shape(n), full_width=profile.full_width_state(n)) for n, h in state_home.items() if h is Tier.SSD)
        self._homes_cache[key] = homes = Homes(state_home=state_home, compute_home=compute_home,
                                                grad_home=grad_home, host_bytes=host, ssd_read_bytes=read,
                                                ssd_write_bytes=write, ssd_state_params=ssd_state,
                                                ssd_state_bytes=ssd_state_bytes,
                                                frozen_on_device=frozen_on_device, bytes_by_kind=by_kind)
        return homes
