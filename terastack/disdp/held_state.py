"""What a worker process holds beyond its model: the census behind ``worker_state_bytes``.

[Note: state a worker holds]
A worker's optimizer state is whatever it keeps, after its steps, to update the parameters with: a
``torch.optim`` optimizer's moments, a dict of tensors of its own, numpy arrays, a flat buffer its schedule
owns. :class:`StateCensus` finds all of it the same way, whatever holds it: every torch tensor and numpy
array the process can reach (the garbage collector's tracked objects, and what they and the untracked tuples,
lists and dicts among their referents refer to), each storage counted once, less the storages of every
``nn.Module``'s own parameters, their gradients and the module's buffers (a DTensor's local shard included), and
less what was there before the worker began (the libraries' own tables: the census starts when the worker
does). It is taken once the worker's steps are over and their locals are gone (the step's batch, loss and
gradients in flight with them), before anything is torn down: what is left is what the worker holds between
steps. FSDP2's and ZeRO-3's workers hold their moments (and ZeRO-3 its fp32 master shards) this way, so their
census counts them; a worker of the disaggregated job should hold nothing.
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import torch

#: containers whose referents the census looks into when the garbage collector does not track them
_CONTAINERS = (tuple, list, dict)
#: what holds bytes the census counts (``issubclass(type(o), ...)``: ``isinstance`` would ask deprecated module
#: attributes for their ``__class__`` and warn)
_KINDS = (torch.Tensor, np.ndarray)
#: the largest holdings listed in the census's result
_LISTED = 8


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's storage, or None for one without memory of its own here."""
    if hasattr(t, "to_local") and type(t).__name__ == "DTensor":
        t = t.to_local()
    try:
        if t.is_meta or t.layout != torch.strided:
            return None
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else None


def _array(a: np.ndarray) -> tuple[int, int] | None:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return (a.__array_interface__["data"][0], a.nbytes) if a.nbytes else None


def _reachable() -> list:
    """Every tensor and array reachable from the garbage collector's tracked objects (see [Note: state a worker
    holds])."""
    tracked = gc.get_objects()
    found = {id(o): o for o in tracked if issubclass(type(o), _KINDS)}
    frontier = [r for r in gc.get_referents(*tracked) if not gc.is_tracked(r)]
    for _ in range(3):   # untracked containers of untracked containers: a few levels are all CPython makes
        nested = []
        for obj in frontier:
            if issubclass(type(obj), _KINDS):
                found.setdefault(id(obj), obj)
            elif type(obj) in _CONTAINERS:
                nested += gc.get_referents(obj)
        frontier = [r for r in nested if not gc.is_tracked(r)]
    return list(found.values())


def _model_storages() -> set[int]:
    """Addresses of every live module's parameters, gradients and buffers."""
    out: set[int] = set()
    for module in (o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)):
        tensors = [*module._parameters.values(), *module._buffers.values()]
        tensors += [p.grad for p in module._parameters.values() if p is not None]
        for t in tensors:
            if isinstance(t, torch.Tensor) and (where := _storage(t)) is not None:
                out.add(where[0])
    return out


class StateCensus:
    """What this process holds beyond its modules, among the tensors and arrays it made after the census began
    ([Note: state a worker holds])."""

    def __init__(self):
        gc.collect()
        self._before = {id(o): weakref.ref(o) for o in _reachable()}

    def _new(self, obj) -> bool:
        ref = self._before.get(id(obj))
        return ref is None or ref() is not obj

    def held_beyond_model(self) -> dict:
        """``{"bytes": total, "largest": [{"kind", "shape", "dtype", "bytes"}, ...]}``: the storage bytes of the
        tensors and arrays made since the census began and alive now, less every module's parameters, gradients
        and buffers."""
        gc.collect()
        model = _model_storages()
        held: dict[int, tuple[int, object]] = {}
        for obj in _reachable():
            if not self._new(obj):
                continue
            where = _storage(obj) if isinstance(obj, torch.Tensor) else _array(obj)
            if where is None or where[0] in model:
                continue
            if where[1] > held.get(where[0], (0, None))[0]:
                held[where[0]] = (where[1], obj)
        largest = sorted(held.values(), key=lambda item: -item[0])[:_LISTED]
        return {"bytes": sum(n for n, _ in held.values()),
                "largest": [{"kind": type(o).__name__, "shape": list(o.shape), "dtype": str(o.dtype), "bytes": n}
                            for n, o in largest]}
