"""Streamed units: the stand-ins the model calls, and the autograd function that runs each one.

A :class:`StreamedUnit` replaces one submodule of the skeleton. The model's
own ``forward`` calls it with its usual arguments; it hands them to
:class:`_UnitFunction`, whose forward and backward are the steady state of the
step's schedule for that unit (see [Note: the step schedule] in terastack.llm.engine.step):

forward of unit k   prefetch weights of k+1 | acquire weights of k | compute
                    (saving activations by policy) | release weights of k
backward of unit k  prefetch weights (and swapped activations) of k-1 | acquire
                    weights of k | recompute if the policy says so | gradients
                    | release weights of k | hand the gradients to the optimizer

[Note: recomputation and randomness]
A recomputed unit runs its forward twice. Dropout must draw the same mask
both times, so the RNG state (CPU and the accelerator's) at the first forward
is saved and restored for the second, and the caller's RNG stream continues
as if the forward had run once (the same approach as torch.utils.checkpoint).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from terastack import trace
from terastack.llm.engine.activations import ActivationStash, storage_bytes


class UnitCall:
    """A unit call's arguments, flattened: tensors needing a gradient travel through autograd, the rest are kept."""

    def __init__(self, args: tuple, kwargs: dict):
        self.flat, self.spec = pytree.tree_flatten((args, kwargs))
        self.grad_idx = [i for i, a in enumerate(self.flat) if isinstance(a, torch.Tensor) and a.requires_grad]
        self.out_spec = None
        self.out_flat: list | None = None
        self.out_idx: list[int] = []

    def grad_inputs(self) -> list[torch.Tensor]:
        return [self.flat[i] for i in self.grad_idx]

    def arguments(self, xs) -> tuple[tuple, dict]:
        flat = list(self.flat)
        for i, x in zip(self.grad_idx, xs):
            flat[i] = x
        return pytree.tree_unflatten(flat, self.spec)

    def split_output(self, out) -> list[torch.Tensor]:
        """Differentiable tensors of ``out``; the rest of its structure is kept for :meth:`rebuild`."""
        flat, self.out_spec = pytree.tree_flatten(out)
        self.out_idx = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        self.out_flat = [None if i in self.out_idx else o for i, o in enumerate(flat)]
        return [flat[i] for i in self.out_idx]

    def rebuild(self, tensors) -> object:
        flat = list(self.out_flat)
        for i, t in zip(self.out_idx, tensors):
            flat[i] = t
        self.out_flat = None  # the call's non-tensor outputs are not needed again
        return pytree.tree_unflatten(flat, self.out_spec)


class _UnitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runtime, unit, call, dummy, *xs):
        return tuple(runtime.unit_forward(ctx, unit, call, xs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outs):
        return (None, None, None, None, *ctx.runtime.unit_backward(ctx, grad_outs))


class StreamedUnit(nn.Module):
    """Stands in for one submodule; weights come from the store each time it runs. A call goes to ``target``
    (anything with ``run(unit, args, kwargs)``): the step runtime, or the profiler's recorder."""

    def __init__(self, unit, target):
        super().__init__()
        self.inner = unit.module                 # registered, so the skeleton still lists its (meta) parameters
        self.__dict__["unit"] = unit
        self.__dict__["target"] = target

    def forward(self, *args, **kwargs):
        return self.target.run(self.unit, args, kwargs)

    def __getattr__(self, name):
        # Model code may read attributes of the module it calls (padding_idx, weight.dtype, ...).
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


def install_units(model: nn.Module, units, target) -> None:
    """Put a :class:`StreamedUnit` calling ``target`` at every unit's place in ``model`` (replacing the module, or
    a stand-in installed before for another target)."""
    from terastack.llm.model import set_submodule

    for unit in units:
        set_submodule(model, unit.path, StreamedUnit(unit, target))


def call_unit(unit, weights: dict[str, torch.Tensor], args: tuple, kwargs: dict):
    """Run the unit's module with ``weights`` (local names) and its own buffers."""
    return functional_call(unit.module, {**weights, **unit.buffers}, args, kwargs, tie_weights=False,
                           strict=False)


def _rng_state(device: torch.device):
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


class _ReplayRng:
    """Restore the RNG state of a first forward for its recomputation; leave the caller's stream as it was."""

    def __init__(self, state: dict, device: torch.device):
        self.state, self.device = state, device

    def __enter__(self):
        self.saved = _rng_state(self.device)
        torch.set_rng_state(self.state["cpu"])
        if "cuda" in self.state:
            torch.cuda.set_rng_state(self.state["cuda"], self.device)

    def __exit__(self, *exc):
        torch.set_rng_state(self.saved["cpu"])
        if "cuda" in self.saved:
            torch.cuda.set_rng_state(self.saved["cuda"], self.device)


_EMPTY = {}


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    key = (t.dtype, t.device)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(0, dtype=t.dtype, device=t.device)
    return _EMPTY[key]


class UnitRunner:
    """Forward and backward of one unit under its activation policy (the per-unit steady state)."""

    def __init__(self, runtime):
        self.rt = runtime
        self._dummy = torch.empty(0, requires_grad=True)

    def run(self, unit, args: tuple, kwargs: dict):
        rt = self.rt
        rt.fetcher.observe(unit)
        call = UnitCall(args, kwargs)
        if not torch.is_grad_enabled() or not (call.grad_idx or unit.has_trainable):
            # evaluation, or nothing to differentiate: plain streamed forward
            weights = self._acquire_forward(unit)
            try:
                with torch.no_grad():
                    out = call_unit(unit, weights, *call.arguments(call.grad_inputs()))
            finally:
                rt.fetcher.release(unit)
            return out
        # A unit whose inputs need no gradient (an embedding) still has trainable weights: the dummy input makes
        # autograd call its backward.
        dummy = self._dummy if unit.has_trainable else None
        outs = _UnitFunction.apply(rt, unit, call, dummy, *call.grad_inputs())
        return call.rebuild(outs)

    def _acquire_forward(self, unit):
        rt = self.rt
        for nxt in rt.fetcher.neighbours(unit, "forward"):
            rt.fetcher.prefetch(nxt)
        return rt.fetcher.acquire(unit, "forward")

    # ---------------------------------------------------------------- forward
    def forward(self, ctx, unit, call: UnitCall, xs) -> list[torch.Tensor]:
        rt = self.rt
        policy = rt.policy(unit)
        ctx.runtime, ctx.unit, ctx.call, ctx.policy = rt, unit, call, policy
        ctx.x_grad = [x.requires_grad for x in xs]
        with trace.span(f"forward {unit.path}", track="compute", cat="forward", policy=policy):
            weights = self._acquire_forward(unit)
            try:
                if policy == "recompute":
                    ctx.rng = _rng_state(rt.device) if unit.module.training else None
                    with torch.no_grad():
                        outs = call.split_output(call_unit(unit, weights, *call.arguments(xs)))
                    ctx.boundary = [x.detach() for x in xs]
                    ctx.charges = []
                    for x in ctx.boundary:
                        ctx.charges.append(rt.charge_device(storage_bytes(x).numel(),
                                                            f"inputs kept by {unit.path} to recompute it"))
                    return [o.detach() for o in outs]
                leaves = {n: w.detach().requires_grad_(unit.trainable[n]) for n, w in weights.items()}
                xs_in = [x.detach().requires_grad_(x.requires_grad) for x in xs]
                stash = ActivationStash(rt, unit, policy, leaves)
                with torch.enable_grad(), stash.hooks():
                    outs = call.split_output(call_unit(unit, leaves, *call.arguments(xs_in)))
                stash.seal()
                for leaf in leaves.values():
                    leaf.data = _empty_like(leaf)  # the graph must not pin the working copy
                ctx.leaves, ctx.xs_in, ctx.inner_outs, ctx.stash = leaves, xs_in, outs, stash
                return [o.detach() for o in outs]
            finally:
                rt.fetcher.release(unit)

    # --------------------------------------------------------------- backward
    def backward(self, ctx, grad_outs) -> tuple:
        rt, unit = ctx.runtime, ctx.unit
        with trace.span(f"backward {unit.path}", track="compute", cat="backward", policy=ctx.policy):
            for prev in rt.fetcher.neighbours(unit, "backward"):
                rt.fetcher.prefetch(prev)
                rt.prefetch_activations(prev)
            rt.optimizer.prepare(unit)
            weights = rt.fetcher.acquire(unit, "backward")
            handoff: set[str] = set()
            try:
                if ctx.policy == "recompute":
                    leaves = {n: w.detach().requires_grad_(unit.trainable[n]) for n, w in weights.items()}
                    xs_in = [b.detach().requires_grad_(g) for b, g in zip(ctx.boundary, ctx.x_grad)]
                    with trace.span(f"recompute {unit.path}", track="compute", cat="recompute"):
                        replay = _ReplayRng(ctx.rng, rt.device) if ctx.rng is not None else None
                        with torch.enable_grad():
                            if replay is not None:
                                with replay:
                                    outs = ctx.call.split_output(call_unit(unit, leaves,
                                                                           *ctx.call.arguments(xs_in)))
                            else:
                                outs = ctx.call.split_output(call_unit(unit, leaves, *ctx.call.arguments(xs_in)))
                else:
                    leaves, xs_in, outs = ctx.leaves, ctx.xs_in, ctx.inner_outs
                    for n, leaf in leaves.items():
                        leaf.data = weights[n]
                pairs = [(o, g) for o, g in zip(outs, grad_outs) if g is not None and o.requires_grad]
                trainable = [n for n in leaves if unit.trainable[n]]
                inputs = [x for x in xs_in if x.requires_grad] + [leaves[n] for n in trainable]
                if pairs and inputs:
                    grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs],
                                                allow_unused=True)
                else:
                    grads = [None] * len(inputs)
                n_x = len(inputs) - len(trainable)
                x_grads = iter(grads[:n_x])
                result = tuple(next(x_grads) if g else None for g in ctx.x_grad)
                param_grads: dict[str, torch.Tensor | None] = {}
                for n, g in zip(trainable, grads[n_x:]):
                    cname = unit.tensors[n]
                    prev = param_grads.get(cname)
                    param_grads[cname] = g if prev is None else (prev if g is None else prev + g)
                handoff = rt.optimizer.handoff(unit)
            finally:
                self._free_ctx(ctx)
                rt.fetcher.release(unit, handoff=handoff)
            rt.optimizer.accept(unit, param_grads)
            return result

    def _free_ctx(self, ctx) -> None:
        rt = self.rt
        if ctx.policy == "recompute":
            for charge in ctx.charges:
                rt.uncharge_device(charge)
            ctx.boundary = ctx.charges = None
        else:
            for leaf in ctx.leaves.values():
                leaf.data = _empty_like(leaf)
            ctx.stash.free()
            ctx.leaves = ctx.xs_in = ctx.inner_outs = ctx.stash = None
        ctx.call = None
