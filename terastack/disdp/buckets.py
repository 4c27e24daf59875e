"""How a model's parameters are cut into buckets and server shards, and the order every role moves them.

A *bucket* is the unit of prefetch and gradient push: bucket 0 ("root") holds
every parameter outside the repeated layers (embeddings, final norm, head) and
buckets 1..L hold one layer each. Each bucket is one flat fp32 vector;
server ``s`` of ``S`` owns the contiguous slice ``[n*s//S, n*(s+1)//S)`` of it.

[Note: one schedule for every role]
Messages carry no headers: the order in which a server sends parameters, an
agent receives them and a worker consumes them is :meth:`Schedule.fetch_order`,
and the order of gradients is :meth:`Schedule.grad_order`. Every role derives
both from the same layout, so a mismatch is impossible unless the layouts
differ, which start-up checks with :meth:`Layout.fingerprint`.

[Note: what stays resident on a worker]
The root bucket is held from the start of a step's forward to the end of its
backward (its embedding is used first and its head last, as FSDP2 does for its
root). With ``reshard=True`` each layer is released after its forward and
fetched again for its backward, except the last layer, whose backward follows
its forward at once. Between steps a worker holds no parameters at all.
"""
from __future__ import annotations

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


class Layout:
    """Buckets of a model's parameters and their split over ``servers`` shards."""

    def __init__(self, buckets: list[Bucket], servers: int):
        if servers < 1:
            raise ValueError(f"servers: need at least 1, got {servers}")
        self.buckets = buckets
        self.servers = servers
        small = [b.name for b in buckets if b.numel < servers]
        if small:
            raise ValueError(f"servers: {servers} shards but bucket {small[0]!r} has fewer parameters than that")

    @classmethod
    def of(cls, model: nn.Module, servers: int) -> "Layout":
        layers_name, layers = find_layers(model)
        layer_param_ids = [{id(p) for p in layer.parameters()} for layer in layers]
        seen: set[int] = set()
        per_bucket: list[list[tuple[str, nn.Parameter]]] = [[] for _ in range(len(layers) + 1)]
        for name, p in model.named_parameters():   # deduplicated: a tied weight appears once
            if id(p) in seen:
                continue
            seen.add(id(p))
            where = next((i + 1 for i, ids in enumerate(layer_param_ids) if id(p) in ids), 0)
            per_bucket[where].append((name, p))
        buckets = []
        for index, params in enumerate(per_bucket):
            slots, offset = [], 0
            for name, p in params:
                slots.append(ParamSlot(name, tuple(p.shape), offset, p.numel()))
                offset += p.numel()
            buckets.append(Bucket(index, "root" if index == 0 else f"{layers_name}.{index - 1}", tuple(slots)))
        return cls(buckets, servers)

    @property
    def layers(self) -> int:
        return len(self.buckets) - 1

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    def shard(self, bucket: int, server: int) -> tuple[int, int]:
        n = self.buckets[bucket].numel
        return n * server // self.servers, n * (server + 1) // self.servers

    def to_dict(self) -> dict:
        return {"servers": self.servers, "buckets": [
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
        forward = [Fetch(b, 0) for b in range(L + 1)]            # root, then layers in order
        backward = [Fetch(b, 1) for b in range(L - 1, 0, -1)] if reshard else []
        self.fetch_order: list[Fetch] = forward + backward
        self.grad_order: list[int] = list(range(L, 0, -1)) + [0]  # layers last-to-first, root at the end

    def refetched(self, bucket: int) -> bool:
        """Whether ``bucket`` is released after its forward and fetched again for its backward."""
        return self.reshard and 1 <= bucket < self.layout.layers
