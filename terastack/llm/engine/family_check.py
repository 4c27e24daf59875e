"""The check before training a model family no test verifies: streamed units equal the model's own modules.

[Note: the family check]
terastack streams any causal LM whose decoder layers are a ``ModuleList`` of
one class ([Note: units] in terastack.llm.model), but a family may do
something a streamed unit cannot see: model code that reads a layer's
weights outside the layer, a layer whose forward depends on state the
stand-in does not carry, an output autograd cannot follow through the unit's
boundary. Such a model would train wrongly without an error. So a model
whose family is not among those the tests verify
(:data:`terastack.llm.model.TESTED_FAMILIES`) is checked before its first
step, on one small probe batch (one row of ``PROBE_TOKENS`` tokens):

1. the engine's streamed forward and backward run as in a step -- the step's
   own runner, weight fetcher and activation policies -- except that the
   gradients are kept rather than applied (:class:`_KeptGradients` stands
   where the optimizer does), and every unit call's arguments, outputs and
   output gradients are recorded;
2. in the backward of each unit, while the engine still holds that unit's
   weights (:class:`_HoldInBackward` defers their release), the unit's own
   module -- its real class, its weights put in as parameters, called as the
   model calls it -- runs forward and backward in memory on the recorded
   arguments and output gradients, under the RNG state of the engine's
   forward of it (the same dropout masks);
3. its outputs, the gradients of its inputs and of every weight it uses
   must equal the engine's within the compute dtype's tolerance
   (:data:`TOLERANCE`, relative to the reference tensor's largest value);
   an output that carries a gradient in memory must carry one out of the
   streamed unit too, and a unit whose outputs received a gradient must
   have run its streamed backward (a forward can be right while the
   gradients never reach the weights). Units with nothing to differentiate
   (a frozen embedding) are compared forward only, on weights fetched again.

One unit is in memory at a time, so the model never is whole; the cost is
one step's weight traffic at the probe's size (reading each unit's weights
for forward and for backward) and one more forward and backward of each unit
at that size. The engine's loss is the model's own code applied to the last
unit's outputs, which the check compares. The first tensor that differs
stops the run with one line naming the family, the tensor and the
difference (:class:`FamilyCheckError`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils import _pytree as pytree

from terastack.llm.engine.streamed_units import ReplayRng, UnitCall, UnitRunner, install_units, rng_state

#: tokens in the probe batch's one row
PROBE_TOKENS = 16
#: largest difference allowed, relative to the reference tensor's largest magnitude, by compute dtype
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2, torch.float16: 2e-3}
#: "auto": check a family the tests do not verify; "always": check any; "never": skip the check
CHECK_FAMILY_SETTINGS = ("auto", "always", "never")


class FamilyCheckError(RuntimeError):
    """A streamed unit differs from the model's own module (one line: family, tensor, difference)."""


@dataclass(kw_only=True, slots=True)
class FamilyCheckReport:
    """What a passed check compared: unit calls, tensors, the largest relative difference and where."""

    family: str
    unit_calls: int = 0
    tensors: int = 0
    worst: float = 0.0
    worst_tensor: str = ""
    seconds: float = 0.0


def needs_check(family: str, setting: str, verified) -> bool:
    """Whether a model of ``family`` is checked under ``setting`` (``check_family``), ``verified``: the families
    the tests prove."""
    if setting not in CHECK_FAMILY_SETTINGS:
        raise ValueError(f"check_family: must be one of {', '.join(CHECK_FAMILY_SETTINGS)}; got {setting!r}")
    return setting == "always" or (setting == "auto" and family not in verified)


@dataclass(eq=False, slots=True)
class _CallRecord:
    """One unit call of the engine's forward: what went in, what came out, the gradients that came back."""

    unit: object
    rng: dict
    flat: list
    spec: object
    grad_idx: list[int]
    position: int                               # its place among the forward's unit calls
    outputs: list = field(default_factory=list)
    #: per output: whether the engine's carries a gradient back into the unit
    out_grad: list[bool] = field(default_factory=list)
    grad_outs: dict[int, torch.Tensor] = field(default_factory=dict)
    checked: bool = False


class _HoldInBackward:
    """The step's weight fetcher, except that a unit's weights acquired for backward stay until :meth:`finish`
    (the reference runs on them after the engine's backward of the unit)."""

    def __init__(self, fetcher):
        self.fetcher = fetcher
        self.held: dict[int, dict] = {}

    def __getattr__(self, name):
        return getattr(self.fetcher, name)

    def acquire(self, unit, phase: str):
        weights = self.fetcher.acquire(unit, phase)
        if phase == "backward":
            self.held[unit.index] = weights
        return weights

    def release(self, unit, *, handoff=frozenset()) -> None:
        if unit.index not in self.held:
            self.fetcher.release(unit, handoff=handoff)

    def finish(self, unit) -> None:
        if self.held.pop(unit.index, None) is not None:
            self.fetcher.release(unit)


class _KeptGradients:
    """Stands where the step's optimizer does: keeps each unit's weight gradients, updates nothing."""

    def __init__(self):
        self.grads: dict[int, list[dict]] = {}

    def prepare(self, unit) -> None:
        pass

    def handoff(self, unit) -> set[str]:
        return set()

    def accept(self, unit, grads: dict) -> None:
        # autograd made these tensors for this call alone: kept as they are
        self.grads.setdefault(unit.index, []).append(dict(grads))


class _Checker:
    """The stand-ins' target for the probe pass (records each call, runs it with the engine's runner) and, as the
    runner's ``points``, the per-unit comparison after each unit's backward."""

    def __init__(self, rt, family: str):
        self.rt = rt
        self.family = family
        self.fetcher = _HoldInBackward(rt.fetcher)
        self.kept = _KeptGradients()
        self.runner = UnitRunner(rt, fetcher=self.fetcher, optimizer=self.kept, policies=rt.runner.policies,
                                 default=rt.runner.default)
        self.runner.points = self
        self.calls: dict[int, list[_CallRecord]] = {}
        self.report = FamilyCheckReport(family=family)
        self.tol = TOLERANCE.get(rt.compute_dtype, 1e-5)
        #: (position of the unit call, message) of each call with a tensor that differs (its first one)
        self.failures: list[tuple[int, str]] = []
        self._position = 0

    # ------------------------------------------------------------ recording
    def run(self, unit, args: tuple, kwargs: dict):
        call = UnitCall(args, kwargs)
        rec = _CallRecord(unit=unit, rng=rng_state(self.rt.device), spec=call.spec, grad_idx=call.grad_idx,
                          position=sum(len(r) for r in self.calls.values()),
                          flat=[a.detach().clone() if isinstance(a, torch.Tensor) else a for a in call.flat])
        self.calls.setdefault(unit.index, []).append(rec)
        out = self.runner.run(unit, args, kwargs)
        flat_out, _ = pytree.tree_flatten(out)
        rec.outputs = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in flat_out]
        rec.out_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in flat_out]
        for i, o in enumerate(flat_out):
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(lambda g, i=i, rec=rec: rec.grad_outs.__setitem__(i, g.detach().clone()))
        return out

    # ----------------------------------------------------------- comparing
    def after_unit(self, unit, input_grads) -> None:
        """The engine's backward of ``unit`` is done (``input_grads``: the gradients of its grad inputs)."""
        try:
            pending = [r for r in self.calls.get(unit.index, ()) if not r.checked]
            grads = self.kept.grads.get(unit.index, [])
            if pending and grads:
                self._compare(pending[-1], self.fetcher.held.get(unit.index), input_grads, grads.pop())
        finally:
            self.fetcher.finish(unit)

    def check_forward_only(self) -> None:
        """Calls whose backward never ran (nothing to differentiate): their outputs, on weights fetched again."""
        for recs in self.calls.values():
            for rec in recs:
                if not rec.checked:
                    if rec.grad_outs and (rec.grad_idx or rec.unit.has_trainable):
                        self._position = rec.position
                        self._fail_as(f"a gradient reached the outputs of {rec.unit.path}, but its streamed backward "
                                      "never ran")
                    weights = self.rt.fetcher.acquire(rec.unit, "forward")
                    try:
                        self._compare(rec, weights, None, None)
                    finally:
                        self.rt.fetcher.release(rec.unit)

    def _compare(self, rec: _CallRecord, weights, input_grads, weight_grads) -> None:
        rec.checked = True
        self.report.unit_calls += 1
        self._position = rec.position
        if weights is None:
            return
        unit = rec.unit
        flat = list(rec.flat)
        backward = input_grads is not None
        # the engine ran the unit with gradients on: its outputs carry them wherever the module's own do
        graded = backward or bool(rec.grad_idx) or unit.has_trainable
        for i in rec.grad_idx:
            flat[i] = rec.flat[i].detach().clone().requires_grad_(True)
        args, kwargs = pytree.tree_unflatten(flat, rec.spec)
        with _OwnWeights(unit, weights) as params:
            with torch.set_grad_enabled(graded), ReplayRng(rec.rng, self.rt.device):
                out = unit.module(*args, **kwargs)
            ref_out, _ = pytree.tree_flatten(out)
            if len(ref_out) != len(rec.outputs):
                self._fail_as(f"{unit.path} gives {len(rec.outputs)} values streamed, {len(ref_out)} in memory")
                return
            for i, (e, r) in enumerate(zip(rec.outputs, ref_out)):
                if isinstance(r, torch.Tensor) and (r.is_floating_point() or r.is_complex()):
                    if not self._same(f"{unit.path} output {i}", e, r.detach()):
                        return
            for i, r in enumerate(ref_out):
                if isinstance(r, torch.Tensor) and r.requires_grad and not rec.out_grad[i]:
                    # a gradient reaching this output would not reach the unit's weights and inputs
                    self._fail_as(f"{unit.path} output {i} carries no gradient back into the streamed unit (the "
                                  "module's own does)")
                    return
            if not backward:
                return
            pairs = [(ref_out[i], g) for i, g in sorted(rec.grad_outs.items())
                     if isinstance(ref_out[i], torch.Tensor) and ref_out[i].requires_grad]
            xs = [flat[i] for i in rec.grad_idx]
            names = [c for c, p in params.items() if p.requires_grad]
            targets = xs + [params[c] for c in names]
            ref_grads = (torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
                         if pairs and targets else [None] * len(targets))
        for k, (e, r) in enumerate(zip(input_grads, ref_grads[:len(xs)])):
            if not self._same(f"{unit.path} gradient of input {k}", e, r):
                return
        for c, r in zip(names, ref_grads[len(xs):]):
            if not self._same(f"gradient of {c} (in {unit.path})", weight_grads.get(c), r):
                return

    def _same(self, what: str, engine, ref) -> bool:
        if engine is None and ref is None:
            return True
        # a gradient one side does not give is a zero one
        engine = torch.zeros_like(ref) if engine is None else engine.detach()
        ref = torch.zeros_like(engine) if ref is None else ref.detach()
        if engine.shape != ref.shape:
            self._fail_as(f"{what} has shape {tuple(engine.shape)} streamed, {tuple(ref.shape)} in memory")
            return False
        e, r = (torch.view_as_real(t) if t.is_complex() else t for t in (engine, ref))
        if e.element_size() < 4:  # half precision: compared in fp32 (a whole weight's gradient: no fp64 copies)
            e, r = e.float(), r.float()
        diff = float(torch.sub(e, r).abs_().amax()) if e.numel() else 0.0
        scale = float(r.abs().amax()) if r.numel() else 0.0
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        self.report.tensors += 1
        if rel > self.report.worst or not self.report.worst_tensor:
            self.report.worst, self.report.worst_tensor = rel, what
        if not rel <= self.tol:  # NaN fails too
            self._fail(what, diff, rel)
            return False
        return True

    @property
    def failure(self) -> str | None:
        """The message of the first unit call (in forward order) with a tensor that differs; None: all equal."""
        return min(self.failures)[1] if self.failures else None

    def _fail(self, what: str, diff: float, rel: float) -> None:
        dtype = str(self.rt.compute_dtype).removeprefix("torch.")
        self._fail_as(f"{what} differs between terastack's streamed units and the model's own modules by {diff:.3g} "
                      f"(relative {rel:.3g}, tolerance {self.tol:g} for {dtype})")

    def _fail_as(self, how: str) -> None:
        self.failures.append((self._position, f"check_family: {self.family}: {how}; terastack would not train this "
                                              "family exactly"))


class _OwnWeights:
    """The unit's module with ``weights`` (local name -> tensor) as its real parameters (one per canonical
    tensor, so ties within the unit hold) for the duration; its meta parameters come back afterwards. Entering
    gives {canonical name: parameter}."""

    def __init__(self, unit, weights: dict):
        self.unit, self.weights = unit, weights
        self.saved: list[tuple[nn.Module, str, nn.Parameter]] = []

    def __enter__(self) -> dict:
        params: dict[str, nn.Parameter] = {}
        for local, cname in self.unit.tensors.items():
            if cname not in params:
                params[cname] = nn.Parameter(self.weights[local].detach(), requires_grad=self.unit.trainable[local])
            owner, _, leaf = local.rpartition(".")
            mod = self.unit.module.get_submodule(owner)
            self.saved.append((mod, leaf, mod._parameters[leaf]))
            mod._parameters[leaf] = params[cname]
        return params

    def __exit__(self, *exc) -> None:
        for mod, leaf, p in reversed(self.saved):
            mod._parameters[leaf] = p
        self.saved.clear()


def check_family(model, units, rt, *, family: str, vocab_size: int, seq_len: int, seed: int = 0) -> FamilyCheckReport:
    """Run the check of [Note: the family check] on ``model`` (the skeleton, its stand-ins calling ``rt.runner``,
    every weight in the store); raises :class:`FamilyCheckError` on the first tensor that differs. The RNG
    streams are left as they were; the stand-ins call ``rt.runner`` again afterwards."""
    start = time.perf_counter()
    checker = _Checker(rt, family)
    tokens = max(2, min(PROBE_TOKENS, seq_len))
    ids = torch.randint(0, vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed)).to(rt.device)
    saved_rng = rng_state(rt.device)
    install_units(model, units, checker)
    try:
        with ReplayRng(saved_rng, rt.device):
            rt.fetcher.begin_forward()
            out = model(input_ids=ids, labels=ids, use_cache=False)
            rt.fetcher.end_forward()
            out.loss.backward()
            del out
            checker.check_forward_only()
    finally:
        for unit in list(checker.fetcher.held):
            checker.fetcher.finish(units[unit])
        install_units(model, units, rt.runner)
        rt.fetcher.sweep()
    if checker.failure is not None:
        raise FamilyCheckError(checker.failure)
    checker.report.seconds = time.perf_counter() - start
    return checker.report
