"""What a unit keeps for its backward: the runtime side of each activation spec (terastack.plan.activation_specs).

The :class:`~terastack.llm.engine.streamed_units.UnitRunner` runs every unit the
same way and asks the unit's policy three things: run the forward, keeping what
backward needs (:meth:`UnitPolicy.forward`); give backward the graph to
differentiate (:meth:`UnitPolicy.graph`); free what was kept
(:meth:`UnitPolicy.free`). Units that save activations run their forward under
an :class:`~terastack.llm.engine.activations.ActivationStash` with the
:class:`~terastack.llm.engine.activations.Swap` of where their spec says they
rest; recomputed units keep their inputs and run the forward again
([Note: recomputation and randomness] in terastack.llm.engine.streamed_units).

A subclass naming its ``spec`` is registered by being defined;
:func:`unit_policy` finds it by the spec's name.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from terastack import trace
from terastack.llm.engine.activations import ActivationStash, KeepOnDevice, Swap, SwapToHost, SwapToSsd, storage_bytes
from terastack.llm.engine.streamed_units import ReplayRng, call_unit, rng_state
from terastack.plan.activation_specs import HOST, KEEP, RECOMPUTE, SSD, ActivationSpec, activation_spec

#: spec name -> the runtime policy (one instance each: they keep no state; a unit's is on its autograd ctx)
_POLICIES: dict[str, "UnitPolicy"] = {}

_EMPTY = {}


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A shared empty tensor of ``t``'s dtype and device (what a released leaf's ``data`` points at)."""
    key = (t.dtype, t.device)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(0, dtype=t.dtype, device=t.device)
    return _EMPTY[key]


class UnitPolicy:
    """The runtime side of one activation spec. ``rt`` is the step's services, ``ctx`` the unit's autograd ctx
    (its ``stash``: an ActivationStash whose swapped activations backward may bring back early, or None)."""

    spec: ClassVar[ActivationSpec]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:
            _POLICIES[cls.spec.name] = cls()

    def forward(self, rt, ctx, unit, call, xs, weights: dict) -> list[torch.Tensor]:
        raise NotImplementedError

    def graph(self, rt, ctx, unit, weights: dict) -> tuple[dict, list, list]:
        """(weight leaves, input leaves, outputs) of the unit's forward, with ``weights`` fetched for backward."""
        raise NotImplementedError

    def free(self, rt, ctx) -> None:
        raise NotImplementedError


class SavedActivations(UnitPolicy):
    """Autograd's saved tensors, through an ActivationStash with this policy's ``swap``."""

    swap: ClassVar[Swap]

    def forward(self, rt, ctx, unit, call, xs, weights: dict) -> list[torch.Tensor]:
        leaves = {n: w.detach().requires_grad_(unit.trainable[n]) for n, w in weights.items()}
        xs_in = [x.detach().requires_grad_(x.requires_grad) for x in xs]
        stash = ActivationStash(rt, unit, self.swap, leaves)
        with torch.enable_grad(), stash.hooks():
            outs = call.split_output(call_unit(unit, leaves, *call.arguments(xs_in)))
        stash.seal()
        for leaf in leaves.values():
            leaf.data = empty_like(leaf)  # the graph must not pin the working copy
        ctx.leaves, ctx.xs_in, ctx.inner_outs, ctx.stash = leaves, xs_in, outs, stash
        return [o.detach() for o in outs]

    def graph(self, rt, ctx, unit, weights: dict) -> tuple[dict, list, list]:
        for n, leaf in ctx.leaves.items():
            leaf.data = weights[n]
        return ctx.leaves, ctx.xs_in, ctx.inner_outs

    def free(self, rt, ctx) -> None:
        for leaf in ctx.leaves.values():
            leaf.data = empty_like(leaf)
        ctx.stash.free()
        ctx.leaves = ctx.xs_in = ctx.inner_outs = ctx.stash = None


class Keep(SavedActivations):
    spec = KEEP
    swap = KeepOnDevice()


class SwapHost(SavedActivations):
    spec = HOST
    swap = SwapToHost()


class SwapSsd(SavedActivations):
    spec = SSD
    swap = SwapToSsd()


class Recompute(UnitPolicy):
    """Only the unit's inputs are kept (charged to the device); backward runs its forward again, with the RNG
    state of the first forward."""

    spec = RECOMPUTE

    def forward(self, rt, ctx, unit, call, xs, weights: dict) -> list[torch.Tensor]:
        ctx.rng = rng_state(rt.device) if unit.module.training else None
        with torch.no_grad():
            outs = call.split_output(call_unit(unit, weights, *call.arguments(xs)))
        ctx.boundary = [x.detach() for x in xs]
        ctx.charges = []
        ctx.stash = None
        for x in ctx.boundary:
            ctx.charges.append(rt.charge_device(storage_bytes(x).numel(),
                                                f"inputs kept by {unit.path} to recompute it"))
        return [o.detach() for o in outs]

    def graph(self, rt, ctx, unit, weights: dict) -> tuple[dict, list, list]:
        leaves = {n: w.detach().requires_grad_(unit.trainable[n]) for n, w in weights.items()}
        xs_in = [b.detach().requires_grad_(g) for b, g in zip(ctx.boundary, ctx.x_grad)]
        with trace.span(f"recompute {unit.path}", track="compute", cat="recompute"):
            replay = ReplayRng(ctx.rng, rt.device) if ctx.rng is not None else None
            with torch.enable_grad():
                if replay is not None:
                    with replay:
                        outs = ctx.call.split_output(call_unit(unit, leaves, *ctx.call.arguments(xs_in)))
                else:
                    outs = ctx.call.split_output(call_unit(unit, leaves, *ctx.call.arguments(xs_in)))
        return leaves, xs_in, outs

    def free(self, rt, ctx) -> None:
        for charge in ctx.charges:
            rt.uncharge_device(charge)
        ctx.boundary = ctx.charges = None


def unit_policy(name: str) -> UnitPolicy:
    """The runtime policy of the activation spec named ``name``."""
    spec = activation_spec(name)
    policy = _POLICIES.get(spec.name)
    if policy is None:
        raise ValueError(f"policy: the engine has no runtime for the activation policy {spec.name!r}")
    return policy
