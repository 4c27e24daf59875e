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

[Note: the skeleton's meta device]
The skeleton's parameters are meta tensors, and some families' glue moves a
real tensor to a parameter's device: Llama 4 calls
``input_ids.to(self.embed_tokens.weight.device)``, T5-style and vision code
``.to(self.x.weight.device)``. In the unmodified model that is a no-op; on the
skeleton it would move the batch to meta, where its data is gone, and an
embedding given meta indices and real weights returns whatever memory it
reads (a model trained on garbage, without an error). So while the skeleton's
own forward runs (outside every unit), moving a real tensor to the meta
device leaves it where it is (:class:`KeepOffMeta`, entered by the wrapper
:func:`install_units` puts around the model's ``forward``); and a unit that
still receives a meta tensor is refused by name (:func:`check_real_arguments`)
rather than run on data that does not exist.
"""
from __future__ import annotations

import functools
import threading

import torch
from torch import nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from terastack import trace
from terastack.llm.engine.step_points import StopForward


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
        # complex outputs too: a gradient reaching one must come back through the unit like any other
        self.out_idx = [i for i, o in enumerate(flat)
                        if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())]
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
    def forward(ctx, runner, unit, call, dummy, *xs):
        return tuple(runner.forward(ctx, unit, call, xs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outs):
        return (None, None, None, None, *ctx.runner.backward(ctx, grad_outs))


class StreamedUnit(nn.Module):
    """Stands in for one submodule; weights come from the store each time it runs. A call goes to ``target``
    (anything with ``run(unit, args, kwargs)``): the step's :class:`UnitRunner`, or the profiler's recorder."""

    def __init__(self, unit, target):
        super().__init__()
        self.inner = unit.module                 # registered, so the skeleton still lists its (meta) parameters
        self.__dict__["unit"] = unit
        self.__dict__["target"] = target

    def forward(self, *args, **kwargs):
        _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
        try:
            return self.target.run(self.unit, args, kwargs)
        finally:
            _INSIDE.depth -= 1

    def __getattr__(self, name):
        # Model code may read attributes of the module it calls (padding_idx, weight.dtype, ...).
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


#: per thread: how many stand-ins are running (their own code may move tensors to meta: the profile pass does)
_INSIDE = threading.local()


class KeepOffMeta(torch.overrides.TorchFunctionMode):
    """``Tensor.to`` of a real tensor onto the meta device returns it unchanged (cast to a requested dtype), outside
    every unit. See [Note: the skeleton's meta device]."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and not getattr(_INSIDE, "depth", 0) and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type != "meta":
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "meta":
                return args[0] if dtype is None else args[0].to(dtype)
        return func(*args, **kwargs)


def _off_meta_forward(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        with KeepOffMeta():
            return forward(*args, **kwargs)

    run.keeps_off_meta = True
    return run


def install_units(model: nn.Module, units, target) -> None:
    """Put a :class:`StreamedUnit` calling ``target`` at every unit's place in ``model`` (replacing the module, or
    a stand-in installed before for another target), and keep the model's glue off the meta device ([Note: the
    skeleton's meta device])."""
    from terastack.llm.model import set_submodule

    for unit in units:
        set_submodule(model, unit.path, StreamedUnit(unit, target))
    if not getattr(model.forward, "keeps_off_meta", False):
        model.forward = _off_meta_forward(model.forward)


def check_real_arguments(unit, call: "UnitCall") -> None:
    """Refuse a unit call with a meta tensor among its arguments ([Note: the skeleton's meta device])."""
    for i, a in enumerate(call.flat):
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            raise RuntimeError(f"{unit.family}: {unit.path} was called with a meta tensor (argument {i}, shape {tuple(a.shape)}): "
                               "the model's code made it from a parameter of the skeleton, whose weights are "
                               "streamed; terastack cannot stream this family's forward as written")


def call_unit(unit, weights: dict[str, torch.Tensor], args: tuple, kwargs: dict):
    """Run the unit's module with ``weights`` (local names) and its own buffers."""
    return functional_call(unit.module, {**weights, **unit.buffers}, args, kwargs, tie_weights=False,
                           strict=False)


def rng_state(device: torch.device):
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


class ReplayRng:
    """Restore the RNG state of a first forward for its recomputation; leave the caller's stream as it was."""

    def __init__(self, state: dict, device: torch.device):
        self.state, self.device = state, device

    def __enter__(self):
        self.saved = rng_state(self.device)
        torch.set_rng_state(self.state["cpu"])
        if "cuda" in self.state:
            torch.cuda.set_rng_state(self.state["cuda"], self.device)

    def __exit__(self, *exc):
        torch.set_rng_state(self.saved["cpu"])
        if "cuda" in self.saved:
            torch.cuda.set_rng_state(self.saved["cuda"], self.device)


class UnitRunner:
    """Forward and backward of one unit under its activation policy (the per-unit steady state). Everything it
    needs is handed in: the step's services ``rt`` (store, ledgers, waiting), the weight ``fetcher``, the
    ``optimizer`` and ``policies`` (unit path -> the runtime side of its activation spec,
    terastack.llm.engine.unit_policies; ``default`` for units not named)."""

    def __init__(self, rt, *, fetcher, optimizer, policies: dict, default):
        self.rt = rt
        self.fetcher = fetcher
        self.optimizer = optimizer
        self.policies = policies
        self.default = default
        self._dummy = torch.empty(0, requires_grad=True)
        #: unit index -> the stash of its forward, until its backward (to bring swapped activations back early)
        self._stashes: dict[int, object] = {}
        #: told after each unit's backward (a PointTaker, terastack.llm.engine.step_points), when set
        self.points = None
        #: a resumed step's forward stops at this unit (StopForward), when set
        self.stop_at: int | None = None

    def run(self, unit, args: tuple, kwargs: dict):
        """A stand-in was called (see :func:`install_units`)."""
        call = UnitCall(args, kwargs)
        check_real_arguments(unit, call)
        if unit.index == self.stop_at:
            raise StopForward(call.grad_inputs())
        self.fetcher.observe(unit)
        if not torch.is_grad_enabled() or not (call.grad_idx or unit.has_trainable):
            # evaluation, or nothing to differentiate: plain streamed forward
            weights = self._acquire_forward(unit)
            try:
                with torch.no_grad():
                    out = call_unit(unit, weights, *call.arguments(call.grad_inputs()))
            finally:
                self.fetcher.release(unit)
            return out
        # A unit whose inputs need no gradient (an embedding) still has trainable weights: the dummy input makes
        # autograd call its backward.
        dummy = self._dummy if unit.has_trainable else None
        outs = _UnitFunction.apply(self, unit, call, dummy, *call.grad_inputs())
        return call.rebuild(outs)

    def _acquire_forward(self, unit):
        for nxt in self.fetcher.neighbours(unit, "forward"):
            self.fetcher.prefetch(nxt)
        return self.fetcher.acquire(unit, "forward")

    # ---------------------------------------------------------------- forward
    def forward(self, ctx, unit, call: UnitCall, xs) -> list[torch.Tensor]:
        policy = self.policies.get(unit.path, self.default)
        ctx.runner, ctx.unit, ctx.call, ctx.policy = self, unit, call, policy
        ctx.x_grad = [x.requires_grad for x in xs]
        with trace.span(f"forward {unit.path}", track="compute", cat="forward", policy=policy.spec.name):
            weights = self._acquire_forward(unit)
            try:
                outs = policy.forward(self.rt, ctx, unit, call, xs, weights)
            finally:
                self.fetcher.release(unit)
        if ctx.stash is not None:
            self._stashes[unit.index] = ctx.stash
        return outs

    # --------------------------------------------------------------- backward
    def backward(self, ctx, grad_outs) -> tuple:
        unit, fetcher = ctx.unit, self.fetcher
        self._stashes.pop(unit.index, None)
        with trace.span(f"backward {unit.path}", track="compute", cat="backward", policy=ctx.policy.spec.name):
            for prev in fetcher.neighbours(unit, "backward"):
                fetcher.prefetch(prev, "backward")
                stash = self._stashes.get(prev)
                if stash is not None:
                    stash.prefetch()
            self.optimizer.prepare(unit)
            weights = fetcher.acquire(unit, "backward")
            handoff: set[str] = set()
            try:
                leaves, xs_in, outs = ctx.policy.graph(self.rt, ctx, unit, weights)
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
                handoff = self.optimizer.handoff(unit)
            finally:
                ctx.policy.free(self.rt, ctx)
                ctx.call = None
                fetcher.release(unit, handoff=handoff)
            self.optimizer.accept(unit, param_grads)
            if self.points is not None:
                self.points.after_unit(unit, result)
            return result
