"""Checkpoint key names through transformers' own conversions, in both directions.

[Note: checkpoint keys]
A checkpoint's keys are not always the model's parameter names: transformers 5
renames some on load (GPT-NeoX stores its head as ``embed_out.weight``, the
model calls it ``lm_head.weight``) and converts others (Mixtral and Qwen-MoE
checkpoints hold one tensor per expert, ``experts.N.w1.weight``; the model
stacks them into one ``experts.gate_up_proj``). terastack keeps no list of its
own: the transforms are ``transformers.conversion_mapping.get_model_conversion_mapping``
of the (meta) model, applied with ``transformers.core_model_loading``'s
``rename_source_key`` and the transforms' own ``convert``, grouped as
``convert_and_load_state_dict_in_model`` groups them on load and as
``revert_weight_conversion`` groups them on save. Weights still stream: one
group is read at a time, and a group is what one parameter (or, for a split,
the few parameters made from one checkpoint tensor) needs -- never the model.
"""
from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch


@dataclass(eq=False, slots=True)
class KeyGroup:
    """One transform applied to a set of tensors: checkpoint keys -> parameter names (load), or parameter names
    -> exported keys (save). ``members``: (source name, source pattern, renamed key) in add order."""

    first: str                          # the (first) name the transform produces; transformers' layer name
    transform: object                   # a WeightRenaming or WeightConverter, unused (copied for each run)
    members: list[tuple[str, str, str]] = field(default_factory=list)
    converter: bool = False

    @property
    def sources(self) -> list[str]:
        return [m[0] for m in self.members]

    def run(self, model, fetch: Callable[[str], torch.Tensor], renamings=()) -> dict[str, torch.Tensor]:
        """Read this group's sources with ``fetch`` (one name -> tensor) and apply the transform; {name: tensor}.
        ``renamings`` are applied to a converter's outputs (the save direction, as transformers does)."""
        transform = deepcopy(self.transform)
        read_errors: list[BaseException] = []

        def read(source: str) -> torch.Tensor:
            try:
                return fetch(source)
            except BaseException as exc:
                read_errors.append(exc)
                raise

        for source, pattern, renamed in self.members:
            # a callable is read when the transform materializes its inputs (transformers' synchronous loading)
            transform.add_tensor(renamed, source, pattern, (lambda s=source: read(s)))
        try:
            out = transform.convert(self.first, model=model, config=model.config)
        except Exception as exc:  # noqa: BLE001 - name the transform rather than a stack inside transformers
            if read_errors:           # reading a source failed (a missing file, a full disk): that error, as is
                raise read_errors[0] from None
            raise ValueError(f"{model.config.model_type}: transformers' {type(self.transform).__name__} "
                             f"{self.transform!r} cannot be applied to {self.sources[:4]} one group at a time "
                             f"({type(exc).__name__}: {exc}); terastack cannot stream this checkpoint") from None
        result = {}
        for name, value in out.items():
            value = value[0] if isinstance(value, list) else value
            if self.converter and renamings:
                from transformers.core_model_loading import apply_renamings

                name = apply_renamings(name, list(renamings))
            result[name] = value
        return result


def _conversions(model, *, saving: bool) -> list:
    from transformers.conversion_mapping import get_model_conversion_mapping

    if not saving:
        return get_model_conversion_mapping(model)
    from transformers.core_model_loading import PrefixChange

    # As revert_weight_conversion does for a model that was not loaded by from_pretrained: no legacy renamings,
    # and no PrefixChange (it would add a prefix the checkpoint may never have had).
    return [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]


def _split(transforms):
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    return renamings, converters, {p: c for c in converters for p in c.source_patterns}


def load_groups(model, checkpoint_keys) -> tuple[list[KeyGroup], list[str]]:
    """Group the checkpoint's keys by the model parameter(s) they become; also the keys no parameter takes."""
    from transformers.core_model_loading import WeightRenaming, dot_natural_key, rename_source_key

    renamings, converters, by_pattern = _split(_conversions(model, saving=False))
    prefix = model.base_model_prefix
    meta_state = dict(model.named_parameters(remove_duplicate=False))
    groups: dict[str, KeyGroup] = {}
    unused = []
    for key in sorted(checkpoint_keys, key=dot_natural_key):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta_state)
        if renamed not in meta_state and key in meta_state:
            renamed, pattern = rename_source_key(key, [], [], prefix, meta_state)
        if renamed not in meta_state:
            unused.append(key)        # a buffer or a tensor of another head: transformers ignores it too
            continue
        if pattern is not None:
            group = groups.setdefault(renamed, KeyGroup(renamed, by_pattern[pattern], converter=True))
        else:
            group = groups.setdefault(renamed, KeyGroup(renamed, WeightRenaming(key, renamed)))
            pattern = key
        group.members.append((key, pattern, renamed))
    return list(groups.values()), unused


def save_groups(model, names) -> tuple[list[KeyGroup], list]:
    """Group parameter ``names`` by the checkpoint tensors ``save_pretrained`` would write for them; also the
    reverse renamings (applied to a converter's outputs)."""
    from transformers.core_model_loading import WeightRenaming, apply_converters, apply_renamings, dot_natural_key

    reverse = [t.reverse_transform() for t in _conversions(model, saving=True)[::-1]]
    renamings, converters, by_pattern = _split(reverse)
    groups: dict[str, KeyGroup] = {}
    for name in sorted(names, key=dot_natural_key):
        renamed, pattern = apply_converters(name, converters)
        if pattern is not None:
            group = groups.setdefault(renamed, KeyGroup(renamed, by_pattern[pattern], converter=True))
        else:
            renamed = apply_renamings(name, renamings)
            group = groups.setdefault(renamed, KeyGroup(renamed, WeightRenaming(name, renamed)))
            pattern = name
        group.members.append((name, pattern, renamed))
    return list(groups.values()), renamings


class CheckpointKeys:
    """Parameters of a model from a checkpoint's tensors, one group at a time. See [Note: checkpoint keys]."""

    def __init__(self, model, checkpoint_keys):
        self.model = model
        self.groups, self.unused = load_groups(model, checkpoint_keys)
        #: every parameter name (tied aliases too) -> its canonical name (model.named_parameters' first)
        canonical: dict[int, str] = {}
        self.canonical: dict[str, str] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            self.canonical[name] = canonical.setdefault(id(p), name)

    def tensors(self, fetch: Callable[[str], torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """(canonical parameter name, tensor) for every parameter the checkpoint holds, each once."""
        done = set()
        for group in self.groups:
            for name, tensor in group.run(self.model, fetch).items():
                cname = self.canonical.get(name)
                if cname is None:
                    raise ValueError(f"{self.model.config.model_type}: transformers' conversion of "
                                     f"{group.sources[:4]} made {name!r}, which is no parameter of the model")
                if cname not in done:   # a checkpoint may hold both names of tied weights
                    done.add(cname)
                    yield cname, tensor


def export_layout(model, tensors: dict) -> list[tuple[list[str], Callable, dict[str, tuple[int, ...]]]]:
    """What ``save_pretrained`` writes for ``model``, group by group, in file order: (canonical parameter names
    read, run, {checkpoint key: shape}) where ``run(fetch)`` gives {checkpoint key: tensor} from ``fetch(name)``.
    ``tensors``: canonical name -> TensorInfo (tied weights appear once, as save_pretrained writes them). The
    shapes come from running each group on meta tensors."""
    groups, renamings = save_groups(model, list(tensors))
    out = []
    for group in groups:
        def run(fetch, g=group):
            return g.run(model, fetch, renamings)

        shapes = {k: tuple(v.shape) for k, v in run(lambda n: torch.empty(tensors[n].shape, device="meta")).items()}
        out.append((group.sources, run, shapes))
    return out
