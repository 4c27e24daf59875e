"""Profile a model for the planner without materializing it, and calibrate unit times on this machine.

[Note: profiling on the meta device]
The model's own forward runs once with real (tiny) glue tensors -- input ids,
masks, rotary tables -- while every unit runs on the meta device: its
parameters are the skeleton's meta parameters and its inputs are meta copies.
Under ``FlopCounterMode`` and a saved-tensor hook this gives, per unit and
exactly for this batch shape, the forward and backward FLOPs and the bytes its
autograd graph saves (with the kernels training takes, [Note: the profile's kernels
are training's kernels] in ``meta_kernels``), for any size of model (OPT-175B profiles in seconds on a
laptop). A unit returns real zeros of its output's shape, so the glue between
units (residual adds, reshapes) runs as in training; the order units run in is
recorded too. Calibration then times one real instance of each distinct unit
(random weights, this shape) forward and backward, so a plan made on this
machine predicts from measured times rather than peak FLOP rates.

[Note: stable calibrated times]
A unit of a small model computes in well under a millisecond, and on a shared
machine (two cores, other processes beside) one such timing can be many times
the unit's own time: the threads of a matmul wait for a core. Timed five times,
the fastest of them still moved a tiny job's predicted step by several times from
one run of ``terastack plan llm --calibrate`` to the next. So a unit is timed
until it has run for a while (``_MIN_TIMED_S``, up to ``_MAX_RUNS`` runs), and
its fastest run is its time; and the times are kept in a file beside the
machine's probe (:func:`unit_times_path`), by ``terastack plan llm`` and by
every trainer, so the same question asked again gets the same answer and a
resumed or later run does not time its units again (``plan llm --recalibrate``
times again; ``terastack probe --refresh`` measures the machine, and then its
units, anew).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from terastack.training.hf.model_files import check_seq_len
from terastack.plan.base_formats import nf4_bytes
from terastack.llm.engine import causal_loss
from terastack.llm.engine.meta_kernels import MetaKernels, register_flop_formulas
from terastack.llm.engine.streamed_units import UnitCall, check_real_arguments, install_units
from terastack.llm.engine.timing_memory import calibration_bytes, timing_copies, weights_at_rest
from terastack.plan.llm_profile import ModelProfile, UnitProfile, held_bytes

#: unit outputs come back as allocated zeros until this many bytes of them were made in one pass, then as
#: broadcast zeros (the head's logits; every output of a batch too wide to hold): the pass runs before the plan
#: has priced the batch, so what it allocates stays bounded whatever the batch ([Note: the batch is priced] in
#: terastack.plan.llm_profile)
_MATERIALIZE_LIMIT = 64 << 20


class _Recorder:
    """Stands in for the runtime during the profile pass."""

    def __init__(self):
        self.records: dict[int, dict] = {}
        self.order: list[int] = []
        self.calls: dict[int, tuple] = {}
        self.materialized = 0  # bytes of unit outputs allocated so far

    def run(self, unit, args, kwargs):
        call = UnitCall(args, kwargs)
        check_real_arguments(unit, call)
        floating_in = [i for i, a in enumerate(call.flat) if isinstance(a, torch.Tensor) and a.requires_grad]
        meta_flat = []
        for a in call.flat:
            if isinstance(a, torch.Tensor):
                # a broadcast output of an earlier unit stands for a whole tensor: its meta copy is one
                m = (torch.empty(a.shape, dtype=a.dtype, device="meta") if _broadcast(a)
                     else a.detach().to("meta"))
                meta_flat.append(m.requires_grad_(a.requires_grad))
            else:
                meta_flat.append(a)
        leaves = {n: p.detach().requires_grad_(unit.trainable[n]) for n, p in unit.module.named_parameters(
            remove_duplicate=False)}
        leaf_ids = {id(v) for v in leaves.values()}
        saved: dict[int, int] = {}

        def pack(t):
            base = t._base if t._base is not None else t
            if id(t) in leaf_ids or id(base) in leaf_ids:
                return t
            saved.setdefault(id(base), base.numel() * base.element_size())
            return t

        buffers = {n: b.to("meta") for n, b in unit.buffers.items()}
        from torch.utils import _pytree as pytree

        m_args, m_kwargs = pytree.tree_unflatten(meta_flat, call.spec)
        keep = []  # saved tensors stay alive until the backward count is done (ids must not be reused)
        register_flop_formulas()
        with FlopCounterMode(display=False) as fc, MetaKernels():
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: (keep.append(t), pack(t))[1],
                                                                              lambda t: t):
                out = torch.func.functional_call(unit.module, {**leaves, **buffers}, m_args, m_kwargs,
                                                 tie_weights=False, strict=False)
            fwd = fc.get_total_flops()
            outs = call.split_output(out)
            inputs = [meta_flat[i] for i in floating_in] + [v for n, v in leaves.items() if unit.trainable[n]]
            diff = [o for o in outs if o.requires_grad]
            if diff and inputs:
                # backward() rather than autograd.grad(): FlopCounterMode's module tracker refuses the latter
                torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])
            bwd = fc.get_total_flops() - fwd
        if unit.index not in self.records:
            self.order.append(unit.index)
        self.records[unit.index] = {
            "fwd_flops": float(fwd), "bwd_flops": float(bwd), "act_bytes": int(sum(saved.values())),
            "boundary_bytes": int(sum(meta_flat[i].numel() * meta_flat[i].element_size() for i in floating_in)),
            "out_bytes": int(sum(o.numel() * o.element_size() for o in outs)), "act_tensors": len(saved)}
        # real arguments, kept for calibration (grad inputs are replaced by random data there)
        self.calls[unit.index] = (call.flat, call.spec, floating_in)
        real = []
        for o in outs:
            nbytes = o.numel() * o.element_size()
            grad = o.is_floating_point()  # what the next unit takes needs a gradient, broadcast or not
            if self.materialized + nbytes > _MATERIALIZE_LIMIT:
                z = torch.zeros((), dtype=o.dtype).requires_grad_(grad).expand(o.shape)
            else:
                self.materialized += nbytes
                z = torch.zeros(o.shape, dtype=o.dtype).requires_grad_(grad)
            real.append(z)
        return call.rebuild(real)


def _broadcast(t: torch.Tensor) -> bool:
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def head_units(units, order: list[int]) -> list[int]:
    """The units whose outputs are the logits: the last to run, or every part of a head streamed in vocabulary
    slices (terastack.llm.vocab_slices), which run last, one after another."""
    path = units[order[-1]].path
    container, sep, _ = path.rpartition(".parts.")
    if not sep:
        return [order[-1]]
    return [i for i in order if units[i].path.startswith(container + sep)]


def profile_model(model, units, tensors, *, batch: int, seq_len: int, compute_bytes: int, name: str,
                  calibrate: bool = False, device: torch.device | None = None, packed: bool = False,
                  times_file: Path | None = None, recalibrate: bool = False,
                  time_missing: bool = True, budget: tuple[str, int] | None = None) -> ModelProfile:
    """Profile the skeleton ``model`` with its ``units`` (``find_units``) at ``batch`` x ``seq_len``. The units'
    places hold stand-ins calling the profiler's recorder afterwards; a trainer installs its own. ``packed``: rows
    of several examples (position ids restarting), whose explicit block-diagonal attention mask each layer's
    attention also saves. ``budget``: (name, bytes) the calibration holds itself within ([Note: calibrating
    within the budget])."""
    check_seq_len(model.config, seq_len)
    rec = _Recorder()
    install_units(model, units, rec)
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    extra = {}
    if packed and seq_len > 1:
        half = seq_len // 2
        extra["position_ids"] = torch.cat([torch.arange(half), torch.arange(seq_len - half)]).expand(batch, -1)
    with torch.enable_grad():
        model(input_ids=ids, use_cache=False, **extra)
    order = rec.order + [u.index for u in units if u.index not in rec.records]
    missing = [units[i].path for i in order if i not in rec.records]
    if missing:
        raise RuntimeError(f"profile: units {missing[:3]} never ran in the model's forward")
    nf4_local = {u.index: frozenset(lname for lname, c in u.tensors.items() if tensors[c].nf4) for u in units}
    times = _calibrate(rec, units, device or torch.device("cpu"), compute_bytes, times_file=times_file,
                       recalibrate=recalibrate, nf4_local=nf4_local, time_missing=time_missing,
                       budget=budget) if calibrate else {}
    owner: dict[str, int] = {}
    for i in order:
        for cname in units[i].tensors.values():
            owner.setdefault(cname, i)
    out_units = []
    for i in order:
        u = units[i]
        r = rec.records[i]
        names = tuple(dict.fromkeys(u.tensors.values()))
        params = sum(tensors[c].numel for c in names)
        trainable = sum(tensors[c].numel for c in names if tensors[c].trainable and owner[c] == i)
        weight_bytes = sum(held_bytes(tensors[c].numel * compute_bytes) for c in names)  # records are padded
        fwd_s, bwd_s = times.get(i, (None, None))
        out_units.append(UnitProfile(name=u.path, kind=u.kind, tensors=names, params=params, trainable=trainable,
                                     weight_bytes=weight_bytes, fwd_flops=r["fwd_flops"], bwd_flops=r["bwd_flops"],
                                     act_bytes=r["act_bytes"], boundary_bytes=r["boundary_bytes"],
                                     out_bytes=r["out_bytes"], act_tensors=r["act_tensors"], fwd_s=fwd_s,
                                     bwd_s=bwd_s))
    head = head_units(units, order)
    logits_bytes = sum(rec.records[i]["out_bytes"] for i in head) * (4 // compute_bytes if compute_bytes < 4 else 1)
    return ModelProfile(model=name, batch=batch, seq_len=seq_len, compute_bytes=compute_bytes, units=out_units,
                        tensor_numel={c: t.numel for c, t in tensors.items()},
                        tensor_trainable={c: t.trainable for c, t in tensors.items()}, logits_bytes=int(logits_bytes),
                        loss_in_place=causal_loss.applies(model), head_parts=len(head),
                        tensor_shape={c: tuple(t.shape) for c, t in tensors.items()},
                        frozen_rest={c: nf4_bytes(t.numel) for c, t in tensors.items() if t.nf4},
                        full_width=tuple(c for c, t in tensors.items() if t.full_width))


def with_stacked_times(profile: ModelProfile, model, units, tensors, *, micro: int, **kw) -> ModelProfile:
    """``profile`` with its units also timed on ``micro`` x ``profile.batch`` rows at once, as vertical
    accumulation runs them (``ModelProfile.stacked_times``; ``kw``: ``profile_model``'s other arguments)."""
    wide = profile_model(model, units, tensors, batch=profile.batch * micro, seq_len=profile.seq_len,
                         name=profile.model, calibrate=True, **kw)
    if [u.name for u in wide.units] != [u.name for u in profile.units]:
        raise RuntimeError("profile: the units ran in another order at the stacked width")
    return dataclasses.replace(profile, stacked_times={**profile.stacked_times,
                                                       micro: [(u.fwd_s, u.bwd_s) for u in wide.units]})


def _signature(unit) -> tuple:
    return (type(unit.module).__name__, tuple((n, tuple(p.shape)) for n, p in unit.module.named_parameters(
        remove_duplicate=False)))


_CALIBRATED: dict[tuple, tuple[float, float]] = {}
#: a unit is timed for at least this long (after two warm-up runs) ... see [Note: stable calibrated times]
_MIN_TIMED_S = 0.3
#: ... in at most this many runs; a unit slower than a second per run is timed three times
_MAX_RUNS = 200


def unit_times_path() -> Path:
    """The file keeping this machine's calibrated unit times, beside its probe (``$TERASTACK_CACHE``)."""
    from terastack.plan.hardware import probe_cache_path

    return probe_cache_path().with_name("unit_times.json")


def _times_key(sig: tuple) -> str:
    """A unit's key in the times file: its signature, and what else decides its time in this process."""
    return f"{sig!r} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def _read_times(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a damaged cache is measured again (and rewritten)
    return {k: tuple(v) for k, v in data.items() if isinstance(v, list) and len(v) == 2} \
        if isinstance(data, dict) else {}


def _time_unit(unit, flat, spec, floating_in, *, device: torch.device, dtype: torch.dtype, compute_bytes: int,
               gen: torch.Generator, reps: int, nf4_names: frozenset = frozenset(), copies: int = 1) -> tuple[float, float]:
    """(forward, backward) seconds of one unit on random weights and inputs of the recorded call's shapes, over
    ``copies`` copies of its weights ([Note: calibrating with weights from memory]). ``nf4_names``: its weights
    resting as NF4, held as their records only and dequantized inside each timed forward and backward as the
    step dequantizes them on every acquire ([Note: a frozen NF4 base] in terastack.llm.engine.fetcher)."""
    from torch.utils import _pytree as pytree

    from terastack.training.hf import nf4

    shapes = [(n, p.shape) for n, p in unit.module.named_parameters(remove_duplicate=False)]
    weight_sets = [weights_at_rest(unit, shapes, nf4_names, device=device, dtype=dtype, gen=gen)
                   for _ in range(copies)]
    shape_of = dict(shapes)

    def acquire(k: int) -> dict:
        """Copy ``k``'s weights as a step acquires them: its NF4 records dequantized."""
        return {n: nf4.decode(w, tuple(shape_of[n]), dtype) if n in nf4_names else w
                for n, w in weight_sets[k].items()}

    buffers = {n: b.to(device) for n, b in unit.buffers.items()}
    real = [a.to(device) if isinstance(a, torch.Tensor) else a for a in flat]
    for j in floating_in:
        real[j] = torch.randn(real[j].shape, generator=gen, dtype=torch.float32).to(device, dtype)
        real[j].requires_grad_(True)
    args, kwargs = pytree.tree_unflatten(real, spec)
    fwds, fbs = [], []
    spent = 0.0

    def more() -> bool:
        """Two warm-up runs first, then at least `reps` timed runs and _MIN_TIMED_S ([Note: stable
        calibrated times]); a slow unit (a second per run) is timed once. The warm-ups do not count
        against the time: a first call can take long (lazy kernels, a cold allocator)."""
        if len(fwds) < 3:
            return True
        timed = spent - sum(fwds[:2]) - sum(fbs[:2])
        return len(fwds) < _MAX_RUNS + 2 and timed < 1.0 and (len(fwds) < reps + 2 or timed < _MIN_TIMED_S)

    while more():
        k = len(fwds) % copies
        grad_in = [real[j] for j in floating_in] + [w for n, w in weight_sets[k].items()
                                                    if unit.trainable[n] and n not in nf4_names]
        t0 = time.perf_counter()
        with torch.no_grad():
            torch.func.functional_call(unit.module, {**acquire(k), **buffers}, args, kwargs,
                                       tie_weights=False, strict=False)
        _sync(device)
        t1 = time.perf_counter()
        o = torch.func.functional_call(unit.module, {**acquire(k), **buffers}, args, kwargs,
                                       tie_weights=False, strict=False)
        diff = [x for x in pytree.tree_leaves(o) if isinstance(x, torch.Tensor) and x.requires_grad]
        if diff and grad_in:
            torch.autograd.grad(diff, grad_in, [torch.ones_like(x) for x in diff], allow_unused=True)
        _sync(device)
        t2 = time.perf_counter()
        fwds.append(t1 - t0)
        fbs.append(t2 - t1)
        spent += t2 - t0
    # the fastest run: on a shared machine the others measure the neighbours, not the unit
    fwd = min(fwds[2:])
    fb = min(fbs[2:])
    return fwd, max(fb - fwd, 0.0)


def _calibrate(rec: _Recorder, units, device: torch.device, compute_bytes: int, reps: int = 5, *,
               times_file: Path | None = None, recalibrate: bool = False, nf4_local: dict | None = None,
               time_missing: bool = True, budget: tuple[str, int] | None = None) -> dict:
    """Time each distinct unit forward and backward on random weights: {unit index: (fwd_s, bwd_s)}.
    ``times_file``: read times kept there (unless ``recalibrate``) and keep new ones there; ``nf4_local``: per
    unit index, the local names of its weights resting as NF4; ``time_missing=False``: only the times kept (or
    measured earlier in this process), a unit without one left out; ``budget``: (its name, bytes) that timing a
    unit holds itself within ([Note: calibrating within the budget])."""

    dtype = {4: torch.float32, 2: torch.bfloat16}.get(compute_bytes, torch.float32)
    done = _CALIBRATED  # one measurement per unit kind, shape and device for the life of the process
    kept = _read_times(times_file)
    fresh: set[str] = set()  # keys timed (or first used) by this call
    changed = False
    out = {}
    gen = torch.Generator().manual_seed(0)
    for i, (flat, spec, floating_in) in rec.calls.items():
        unit = units[i]
        nf4_names = (nf4_local or {}).get(i, frozenset())
        sig = _signature(unit) + (tuple(tuple(a.shape) for a in flat if isinstance(a, torch.Tensor)), str(device),
                                  str(dtype)) + ((("nf4",) + tuple(sorted(nf4_names)),) if nf4_names else ())
        key = _times_key(sig)
        if key not in fresh:
            fresh.add(key)
            if recalibrate:
                done.pop(sig, None)
            elif key in kept:
                done[sig] = kept[key]  # the times this machine gave before: the same question, the same answer
        if sig not in done and not time_missing:
            continue
        if sig not in done:
            need = calibration_bytes(unit, rec.records[i], flat, floating_in, compute_bytes=compute_bytes,
                                     nf4_names=nf4_names)
            done[sig] = _time_unit(unit, flat, spec, floating_in, device=device, dtype=dtype,
                                   compute_bytes=compute_bytes, gen=gen, reps=reps, nf4_names=nf4_names,
                                   copies=timing_copies(unit, need, device=device, compute_bytes=compute_bytes,
                                                  budget=budget))
        if kept.get(key) != done[sig]:
            kept[key] = done[sig]
            changed = True
        out[i] = done[sig]
    if changed and times_file is not None:
        from terastack.atomic import atomic_write_json

        times_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(times_file, {k: list(v) for k, v in kept.items()})
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_config(hf_config, *, batch: int, seq_len: int, dtype: torch.dtype, name: str, lora=None,
                   calibrate: bool = False, device: torch.device | None = None, times_file: Path | None = None,
                   recalibrate: bool = False, vocab_slice: int = 0, optimizer: str = "adamw", packed: bool = False,
                   time_missing: bool = True, budget: tuple[str, int] | None = None) -> ModelProfile:
    """Profile a model from its config alone (``terastack plan llm``). A deep stack is profiled with two decoder
    layers and the second one repeated: decoder layers of one model are identical. ``times_file``,
    ``recalibrate``, ``time_missing``, ``budget``: see :func:`_calibrate`; ``vocab_slice``, ``optimizer``: the
    job's, which decide the vocabulary slices (terastack.llm.vocab_slices); ``packed``: as :func:`profile_model`."""
    import copy

    from terastack.llm import vocab_slices
    from terastack.llm.model import find_decoder_stack, find_units
    from terastack.training.hf.model_files import build_skeleton

    layers = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    small = hf_config
    if layers > 4:
        small = copy.deepcopy(hf_config)
        small.num_hidden_layers = 2
        if isinstance(getattr(small, "layer_types", None), list):
            small.layer_types = small.layer_types[:2]
    model = build_skeleton(small, dtype=dtype)
    if lora is not None:
        from terastack.llm.lora import apply_lora

        model, handle = apply_lora(model, lora)
    vocab_slices.slice_model(model, find_decoder_stack(model)[1], max_bytes=vocab_slice, optimizer=optimizer)
    units, tensors = find_units(model)
    if lora is not None:
        handle.mark_base(tensors)
    profile = profile_model(model, units, tensors, batch=batch, seq_len=seq_len,
                            compute_bytes=torch.empty((), dtype=dtype).element_size(), name=name,
                            calibrate=calibrate, device=device, times_file=times_file, recalibrate=recalibrate,
                            packed=packed, time_missing=time_missing, budget=budget)
    return profile if small is hf_config else repeat_layers(profile, layers)


def repeat_layers(profile: ModelProfile, layers: int) -> ModelProfile:
    """``profile`` (two decoder layers) with its second layer repeated to ``layers`` layers."""
    import dataclasses

    stack = [u for u in profile.units if u.kind == "layer"]
    if len(stack) != 2:
        raise ValueError(f"repeat_layers: expected a two-layer profile, got {len(stack)} layers")
    template = stack[1]
    base = template.name.rsplit(".", 1)[0]
    old_prefixes = (f"{stack[0].name}.", f"{template.name}.")

    def rename(name: str, i: int) -> str:
        return name.replace(f"{template.name}.", f"{base}.{i}.", 1)

    numel = {n: c for n, c in profile.tensor_numel.items() if not n.startswith(old_prefixes)}
    trainable = {n: t for n, t in profile.tensor_trainable.items() if not n.startswith(old_prefixes)}
    shapes = {n: s for n, s in profile.tensor_shape.items() if not n.startswith(old_prefixes)}
    rest = {n: b for n, b in profile.frozen_rest.items() if not n.startswith(old_prefixes)}
    new_layers = []
    for i in range(layers):
        names = tuple(rename(t, i) for t in template.tensors)
        for t_old, t_new in zip(template.tensors, names):
            numel[t_new] = profile.tensor_numel[t_old]
            trainable[t_new] = profile.tensor_trainable[t_old]
            if t_old in profile.tensor_shape:
                shapes[t_new] = profile.tensor_shape[t_old]
            if t_old in profile.frozen_rest:
                rest[t_new] = profile.frozen_rest[t_old]
        new_layers.append(dataclasses.replace(template, name=f"{base}.{i}", tensors=names))
    units = []
    for u in profile.units:
        if u.kind != "layer":
            units.append(u)
        elif u is stack[0]:
            units.extend(new_layers)
    return dataclasses.replace(profile, units=units, tensor_numel=numel, tensor_trainable=trainable,
                               tensor_shape=shapes, frozen_rest=rest)
