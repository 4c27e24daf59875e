"""How a model's parameters are cut into buckets and server shards, and the order every role moves them.

A *bucket* is the unit of prefetch and gradient push: bucket 0 ("root") holds
the parameters registered before the repeated layers (the embeddings), buckets
1..L hold one layer each, and the *head* buckets after them hold the
parameters registered after the layers, one bucket per module that holds them
(``head.model.norm``, ``head.lm_head``). Each bucket is one flat fp32 vector;
server ``s`` of ``S`` owns a contiguous slice of it, about ``[n*s//S, n*(s+1)//S)``
([Note: slices the optimizer can update apart]).

[Note: slices the optimizer can update apart]
A server updates its slice with the job's optimizer format (terastack.plan.optimizer_formats), and a format
may not update any part of a parameter apart from the rest: 8-bit AdamW quantizes blocks of 256 elements from
the parameter's start, and Adafactor's statistics are over the whole matrix. So a slice boundary falls where
the format can cut a parameter (:meth:`~terastack.plan.optimizer_formats.OptimizerFormat.piece_unit`: anywhere
for AdamW, a block boundary for 8-bit AdamW, a parameter's end for Adafactor), the one nearest to the even
share. A server's slice of a small bucket may then be empty (Adafactor's one-parameter head bucket on two
servers): it sends, receives and updates nothing of it.

[Note: the root and the head apart]
With a 32K vocabulary the embedding and the head are each larger than a
decoder layer (at 1.1B: 262 MB each in fp32, a layer 176 MB). In one bucket
they would be the largest unit every role holds: a worker would keep both from
its first layer to its last gradient, and a server's buffers (its tiered
store's working set, its gradient receives) are multiples of the largest
bucket. Apart, the head is fetched after the last layer and its gradient is
the first to leave. One bucket per module after the layers, because a bucket's
gradient leaves as one flat vector: a bucket of the final norm and the output
head would copy the head's gradient into it (262 MB more on every worker at
1.1B), where a bucket of one parameter sends that parameter's gradient as is.
A model whose output head *is* its input embedding (tied weights: one
parameter registered under both names) keeps one root bucket, used first and
last.

[Note: one schedule for every role]
Messages carry no headers: the order in which a server sends parameters, an
agent receives them and a worker consumes them is :meth:`Schedule.fetch_order`,
and the order of gradients is :meth:`Schedule.grad_order`. Every role derives
both from the same layout, so a mismatch is impossible unless the layouts
differ, which start-up checks with :meth:`Layout.fingerprint`.

[Note: what stays resident on a worker]
The root bucket is held from the start of a step's forward (with tied weights,
to the end of its backward, as FSDP2 does for its root); a root of embedding
tables only is released once they have run, since an embedding's backward
needs its indices, not its weights. A head bucket is fetched when its module
runs, after the last layer, and released once its gradient has left. With
``reshard=True`` each layer is released after its forward and fetched again
for its backward, except the last layer, whose backward follows its forward at
once. Between steps a worker holds no parameters at all.
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class ParamSlot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    name: str
    params: tuple[ParamSlot, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


def find_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's repeated layers: its ModuleList holding the most parameters."""
    best, best_name, best_count = None, "", 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            count = sum(p.numel() for p in module.parameters())
            if count > best_count:
                best, best_name, best_count = module, name, count
    if best is None:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of layers to shard by (a model whose "
                         "repeated blocks live in an nn.ModuleList, like every transformers causal LM)")
    return best_name, best


ROOT, HEAD = "root", "head"


class Layout:
    """Buckets of a model's parameters and their split over ``servers`` shards, cut where ``optimizer``'s format
    can update the pieces apart ([Note: slices the optimizer can update apart])."""

    def __init__(self, buckets: list[Bucket], servers: int, *, optimizer: str = "adamw"):
        """``buckets``: the root, one per layer, then the head's (named ``head.<module>``), if any."""
        from terastack.plan.optimizer_formats import optimizer_format

        if servers < 1:
            raise ValueError(f"servers: need at least 1, got {servers}")
        self.buckets = buckets
        self.servers = servers
        self.optimizer = optimizer
        fmt = optimizer_format(optimizer)
        if fmt.block == 1 and not fmt.whole_tensor:
            small = [b.name for b in buckets if b.numel < servers]
            if small:
                raise ValueError(f"servers: {servers} shards but bucket {small[0]!r} has fewer parameters than that")
        self._cuts = [_cuts(b, servers, fmt) for b in buckets]

    @classmethod
    def of(cls, model: nn.Module, servers: int, *, optimizer: str = "adamw") -> "Layout":
        """The root, one bucket per layer and the head ([Note: the root and the head apart]), sliced for
        ``optimizer``'s format."""
        layers_name, layers = find_layers(model)
        layer_param_ids = [{id(p) for p in layer.parameters()} for layer in layers]
        in_layers = set().union(*layer_param_ids)
        # named_parameters lists a module's parameters in registration order: a causal LM registers its
        # embeddings, then its layers, then its final norm and head
        before: set[int] = set()
        after: set[int] = set()
        past = False
        for _, p in model.named_parameters(remove_duplicate=False):
            if id(p) in in_layers:
                past = True
            else:
                (after if past else before).add(id(p))
        split = bool(after) and not (before & after)   # a tied weight is registered on both sides
        owner = {id(p): mname for mname, module in model.named_modules() for p in module._parameters.values()
                 if p is not None}
        seen: set[int] = set()
        per_bucket: list[list[tuple[str, nn.Parameter]]] = [[] for _ in range(len(layers) + 1)]
        tail: dict[str, list[tuple[str, nn.Parameter]]] = {}   # module -> its parameters, in registration order
        for name, p in model.named_parameters():   # deduplicated: a tied weight appears once
            if id(p) in seen:
                continue
            seen.add(id(p))
            where = next((i + 1 for i, ids in enumerate(layer_param_ids) if id(p) in ids), None)
            if where is None and split and id(p) in after:
                tail.setdefault(owner[id(p)], []).append((name, p))
                continue
            per_bucket[where or 0].append((name, p))
        per_bucket += tail.values()
        names = ([ROOT] + [f"{layers_name}.{i}" for i in range(len(layers))]
                 + [f"{HEAD}.{module or 'model'}" for module in tail])
        buckets = []
        for index, params in enumerate(per_bucket):
            slots, offset = [], 0
            for name, p in params:
                slots.append(ParamSlot(name, tuple(p.shape), offset, p.numel()))
                offset += p.numel()
            buckets.append(Bucket(index, names[index], tuple(slots)))
        return cls(buckets, servers, optimizer=optimizer)

    @property
    def tail(self) -> int:
        """How many buckets after the layers hold the parameters registered after them (one per module)."""
        return sum(1 for b in self.buckets[1:] if b.name.startswith(HEAD + "."))

    @property
    def head(self) -> bool:
        """Whether the parameters after the layers have buckets of their own (the last ones)."""
        return self.tail > 0

    @property
    def layers(self) -> int:
        return len(self.buckets) - 1 - self.tail

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    def shard(self, bucket: int, server: int) -> tuple[int, int]:
        cuts = self._cuts[bucket]
        return cuts[server], cuts[server + 1]

    def to_dict(self) -> dict:
        return {"servers": self.servers, "optimizer": self.optimizer, "buckets": [
            {"name": b.name, "params": [[p.name, list(p.shape)] for p in b.params]} for b in self.buckets]}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def flatten(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """One flat fp32 vector per bucket from named parameter tensors (the inverse of :meth:`unflatten`)."""
        return [torch.cat([params[p.name].detach().reshape(-1) for p in b.params]).float() for b in self.buckets]

    def unflatten(self, flats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named parameter tensors from one flat vector per bucket."""
        out = {}
        for b, flat in zip(self.buckets, flats):
            for p in b.params:
                out[p.name] = flat[p.offset:p.offset + p.numel].view(p.shape)
        return out

    @staticmethod
    def bucket_dicts_from(data: dict) -> list[Bucket]:
        """Buckets from :meth:`to_dict` output (for reading a checkpoint without the model)."""
        buckets = []
        for index, b in enumerate(data["buckets"]):
            slots, offset = [], 0
            for name, shape in b["params"]:
                numel = 1
                for s in shape:
                    numel *= int(s)
                slots.append(ParamSlot(str(name), tuple(int(s) for s in shape), offset, numel))
                offset += numel
            buckets.append(Bucket(index, str(b["name"]), tuple(slots)))
        return buckets


def _cuts(bucket: Bucket, servers: int, fmt) -> list[int]:
    """Where the servers' slices of ``bucket`` start, and its end: each the point ``fmt`` can cut a parameter at
    nearest to an even share ([Note: slices the optimizer can update apart])."""
    n = bucket.numel
    cuts = [0]
    starts = [p.offset for p in bucket.params]
    for s in range(1, servers):
        even = n * s // servers
        i = max(0, bisect.bisect_right(starts, even) - 1)
        slot = bucket.params[i] if bucket.params else None
        if slot is None:
            cut = even
        else:
            unit = fmt.piece_unit(slot.numel)
            cut = slot.offset + min(slot.numel, round((even - slot.offset) / unit) * unit)
        cuts.append(min(n, max(cut, cuts[-1])))
    return cuts + [n]


@dataclass(frozen=True, slots=True)
class Fetch:
    """One parameter delivery: ``bucket`` for the forward (phase 0) or the backward (phase 1)."""
    bucket: int
    phase: int


class Schedule:
    """The order of parameter fetches and gradient pushes within one step ([Note: one schedule for every role])."""

    def __init__(self, layout: Layout, *, reshard: bool):
        self.layout = layout
        self.reshard = reshard
        L = layout.layers
        head = list(range(L + 1, L + 1 + layout.tail))
        forward = [Fetch(b, 0) for b in [0, *range(1, L + 1), *head]]   # root, layers in order, head
        backward = [Fetch(b, 1) for b in range(L - 1, 0, -1)] if reshard else []
        self.fetch_order: list[Fetch] = forward + backward
        # the head's buckets in reverse, the layers last-to-first, the root
        self.grad_order: list[int] = head[::-1] + list(range(L, 0, -1)) + [0]

    def refetched(self, bucket: int) -> bool:
        """Whether ``bucket`` is released after its forward and fetched again for its backward."""
        return self.reshard and 1 <= bucket < self.layout.layers
