"""An unmodified Hugging Face causal LM as a skeleton plus streamed units.

The skeleton is the ``transformers`` model built with every parameter on the
meta device (no memory) and its buffers real (rotary frequencies and the like
are small and computed at construction). Training weights never live in it:
they rest in the store, and each *unit* (an embedding, a decoder layer, the
final norm, the head) is run with its weights passed in by
``torch.func.functional_call``.

[Note: units]
Units are found without a per-family table: the decoder stack is the largest
``nn.ModuleList`` whose children share a class; every decoder layer is a unit,
and every other child module that owns parameters and does not contain the
stack is a unit too (embeddings, positional embeddings, final norm, lm_head,
OPT's projections). Modules without parameters (rotary embedding, dropout)
keep running as they are. A parameter shared by several units (tied input
and output embeddings) is one tensor in the store, used by each of them; its
gradients are summed before its update.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from terastack.llm.vocab_slices import RowSlices, SliceParts
from terastack.training.hf.model_files import materialized, seeded
from terastack.units import format_bytes

#: Families (transformers model_type) whose results are tested against plain PyTorch training
#: (tests/llm/test_families.py, whose test_verified_families_are_the_tested_ones keeps the two lists equal; docs/llm.md
#: lists them). Any other family is checked before its first step (terastack.llm.engine.family_check).
TESTED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
                   "phi3", "gpt2", "gpt_neox", "gptj", "opt", "falcon", "olmo2", "starcoder2", "llama4_text")


@dataclass(eq=False, slots=True)
class Unit:
    """One streamed submodule. ``tensors`` maps its local parameter names to canonical store names."""

    index: int
    path: str
    module: nn.Module
    kind: str                                   # "pre", "layer" or "post"
    tensors: dict[str, str]
    trainable: dict[str, bool]
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    family: str = "?"                           # the model's, as errors name it (family_name)

    @property
    def has_trainable(self) -> bool:
        return any(self.trainable.values())


@dataclass(eq=False, slots=True)
class TensorInfo:
    """A canonical parameter: its shape, whether it trains, and the units that use it."""

    name: str
    index: int                                  # position in model.named_parameters() (the reference order)
    shape: tuple[int, ...]
    trainable: bool
    users: list[int] = field(default_factory=list)
    #: a frozen weight resting and streaming as NF4 (terastack.training.hf.nf4's [Note: the NF4 record])
    nf4: bool = False
    #: its optimizer state kept at the format's full width ([Note: optimizer state formats])
    full_width: bool = False
    numel: int = field(init=False)  # elements (asked for thousands of times a step: computed once)

    def __post_init__(self) -> None:
        n = 1
        for s in self.shape:
            n *= s
        self.numel = n


def find_decoder_stack(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder stack: the longest ``nn.ModuleList`` (owning parameters) whose children share a class. A longer
    list of mixed classes is a hybrid stack (Jamba's attention and Mamba layers): refused, naming the family,
    since its layers are not interchangeable units."""
    best = mixed = None
    for name, mod in model.named_modules():
        if isinstance(mod, SliceParts):
            continue  # a sliced embedding's or head's parts ([Note: vocabulary slices])
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and any(True for _ in mod.parameters()):
            if len({type(c) for c in mod}) == 1:
                if best is None or len(mod) > len(best[1]):
                    best = (name, mod)
            elif mixed is None or len(mod) > len(mixed[1]):
                mixed = (name, mod)
    family = family_name(model)
    if mixed is not None and (best is None or len(mixed[1]) > len(best[1])):
        kinds = ", ".join(sorted({type(c).__name__ for c in mixed[1]}))
        raise ValueError(f"{family}: its layer stack {mixed[0]!r} mixes layer kinds ({kinds}); terastack streams "
                         "a stack of identical decoder layers, so this family is not supported yet")
    if best is None:
        raise ValueError(f"{family}: no decoder layer stack (a ModuleList of identical layers) found; terastack "
                         "streams decoder-only causal LMs")
    return best


def family_name(model: nn.Module) -> str:
    """The model's family as errors name it: its config's model_type and its class."""
    return f"{getattr(getattr(model, 'config', None), 'model_type', '?')} ({type(model).__name__})"


def find_units(model: nn.Module) -> tuple[list[Unit], dict[str, TensorInfo]]:
    """The model's units in module order and its canonical tensors. See [Note: units]."""
    stack_name, stack = find_decoder_stack(model)
    family = family_name(model)
    canonical: dict[int, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        canonical[id(p)] = name
        tensors[name] = TensorInfo(name=name, index=i, shape=tuple(p.shape), trainable=p.requires_grad)
    units: list[Unit] = []
    seen_stack = [False]

    def add(path: str, module: nn.Module, kind: str) -> None:
        local = {}
        trainable = {}
        for lname, p in module.named_parameters(remove_duplicate=False):
            local[lname] = canonical[id(p)]
            trainable[lname] = p.requires_grad
        buffers = {bname: b for bname, b in module.named_buffers(remove_duplicate=False)}
        unit = Unit(index=len(units), path=path, module=module, kind=kind, tensors=local, trainable=trainable,
                    buffers=buffers, family=family)
        for cname in set(local.values()):
            tensors[cname].users.append(unit.index)
        units.append(unit)

    def walk(prefix: str, module: nn.Module) -> None:
        if any(True for _ in module.parameters(recurse=False)):
            raise ValueError(f"{family_name(model)}: module {prefix or type(module).__name__!r} owns parameters "
                             "directly and also contains the decoder stack; terastack cannot stream this family")
        for cname, child in module.named_children():
            path = f"{prefix}.{cname}" if prefix else cname
            if child is stack:
                seen_stack[0] = True
                for i, layer in enumerate(child):
                    add(f"{path}.{i}", layer, "layer")
            elif _contains(child, stack):
                walk(path, child)
            elif isinstance(child, RowSlices):  # [Note: vocabulary slices]: every part is a unit
                for k, part in enumerate(child.parts):
                    add(f"{path}.parts.{k}", part, "post" if seen_stack[0] else "pre")
            elif any(True for _ in child.parameters()):
                add(path, child, "post" if seen_stack[0] else "pre")

    walk("", model)
    missing = [n for n, t in tensors.items() if not t.users]
    if missing:
        raise ValueError(f"{family_name(model)}: parameters outside every streamed unit ({missing[:5]}); terastack "
                         "cannot stream this family")
    return units, tensors


def _contains(module: nn.Module, target: nn.Module) -> bool:
    return any(m is target for m in module.modules())


def parent_and_attr(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parts = path.split(".")
    parent = model
    for p in parts[:-1]:
        parent = getattr(parent, p) if not p.isdigit() else parent[int(p)]
    return parent, parts[-1]


def set_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, attr = parent_and_attr(model, path)
    if attr.isdigit():
        parent[int(attr)] = new
    else:
        setattr(parent, attr, new)


# ---------------------------------------------------------------- weights in


#: a unit whose fp32 weights exceed this many bytes is initialized in parts ([Note: a random initialization in
#: bounded memory])
WHOLE_UNIT_INIT_BYTES = 1 << 30


def random_init(model: nn.Module, units: list[Unit], tensors: dict[str, TensorInfo], seed: int, *,
                wanted: set[str] | None = None):
    """Yield (name, fp32 tensor) for every canonical parameter (those in ``wanted``, if given), initialized unit by
    unit with the model's own ``_init_weights``, so no more than one unit is ever materialized.

    [Note: a random initialization in bounded memory]
    A unit larger than :data:`WHOLE_UNIT_INIT_BYTES` (a 70B decoder layer is 3.4 GB in fp32) is initialized in
    parts: each submodule whose parameters fit together, and each larger module alone (its own parameters, before
    its children's), in the order of the unit's ``modules()``. That draws the random numbers the whole unit would,
    in the same order, unless a module too large to be a part sets its submodules' parameters (GPT-2 rescales its
    projections from the enclosing module): a write to a parameter that is not materialized stops the run, naming
    the module, and so does a parameter left unset (its storage starts as NaN in parts), rather than train on a
    different initialization or on uninitialized memory. Modules whose parameters are all outside ``wanted`` (a
    LoRA model's adapters, which peft initializes) are left out, so a LoRA model's random base is the one the
    plain model gets from the same seed.
    """
    done: set[str] = set()
    with seeded(seed):
        for unit in units:
            prefixes = {id(mod): prefix for prefix, mod in unit.module.named_modules()}
            parts = list(_init_parts(unit.module, set()))
            for part in parts:
                group = []
                for mod in part:
                    prefix = prefixes[id(mod)]
                    owned = [(mod, pname, unit.tensors[f"{prefix}.{pname}" if prefix else pname])
                             for pname, p in mod._parameters.items() if p is not None]
                    if not (owned and wanted is not None and not any(c in wanted for _, _, c in owned)):
                        group.append((mod, owned))
                yield from _init_modules(model, unit, group, wanted, done, check=len(parts) > 1)


def largest_init_part(units: list[Unit]) -> int:
    """The fp32 bytes of the largest part :func:`random_init` materializes at once."""
    return max((4 * sum(p.numel() for m in part for p in m.parameters(recurse=False))
                for unit in units for part in _init_parts(unit.module, set())), default=0)


def _init_parts(module: nn.Module, seen: set[int]):
    """``module``'s subtree as lists of modules initialized together: the whole subtree if its fp32 parameters fit
    :data:`WHOLE_UNIT_INIT_BYTES`, else the module alone and then its children's parts."""
    if id(module) in seen:
        return
    if 4 * sum(p.numel() for p in module.parameters()) <= WHOLE_UNIT_INIT_BYTES:
        subtree = [m for m in module.modules() if id(m) not in seen]
        seen.update(id(m) for m in subtree)
        yield subtree
        return
    seen.add(id(module))
    yield [module]
    for child in module.children():
        yield from _init_parts(child, seen)


class _MetaWrites(TorchFunctionMode):
    """Notes an in-place write to a meta tensor: a parameter the call was not given storage for."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes its tensor by keyword
        if isinstance(target, torch.Tensor) and target.is_meta and getattr(func, "__name__", "").endswith("_"):
            self.seen = True
        return func(*args, **kwargs)


def _init_modules(model, unit: Unit, group, wanted, done: set[str], *, check: bool):
    """Initialize ``group`` ((module, [(module, parameter name, canonical name)])) together and yield its
    parameters' values not yielded before; ``check``: refuse a write outside the group and a parameter left unset."""
    with materialized([mod for mod, _ in group], fill=float("nan") if check else None), torch.no_grad():
        for mod, _ in group:
            for flag_holder in (mod, *mod._parameters.values()):
                # transformers skips what it believes is initialized already
                if flag_holder is not None and hasattr(flag_holder, "_is_hf_initialized"):
                    try:
                        del flag_holder._is_hf_initialized
                    except AttributeError:
                        pass
            with _MetaWrites() if check else nullcontext() as writes:
                model._init_weights(mod)
            if check and writes.seen:
                raise ValueError(f"{unit.family}: the initialization of {mod.__class__.__name__} in unit {unit.path} "
                                 "sets its submodules' parameters, so this unit (over "
                                 f"{format_bytes(WHOLE_UNIT_INIT_BYTES)} in fp32) cannot be initialized in parts; "
                                 "give the model's weights (a checkpoint) instead")
        for _, owned in group:
            for mod, pname, cname in owned:
                if cname in done or (wanted is not None and cname not in wanted):
                    continue
                done.add(cname)
                value = mod._parameters[pname].detach()  # fresh storage: nothing writes it once yielded
                if check and torch.isnan(value).any():
                    raise ValueError(f"{unit.family}: {cname} is not set by its own module's initialization, so "
                                     f"unit {unit.path} (over {format_bytes(WHOLE_UNIT_INIT_BYTES)} in fp32) cannot be "
                                     "initialized in parts; give the model's weights (a checkpoint) instead")
                yield cname, value
                del value  # not held while the next part is made (a 70B projection is 0.9 GB in fp32)
