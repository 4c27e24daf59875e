"""A parameter server's slice of a job's starting weights, made one bucket at a time.

[Note: a server's starting weights]
A server keeps its slice of every bucket; with ``state="ssd"`` each slice goes
to the SSD as soon as it is made. :class:`StreamedShard` is the mapping the
server reads (bucket -> slice): it makes a bucket's slice when asked, from a
stream of (parameter name, tensor) pairs, and keeps only the slices of the
buckets the stream has started but the server has not taken yet. Without a
model directory the stream is :func:`random_init`, bucket by bucket, so no
more than one bucket is ever whole in memory (the whole model and a whole shard
would be 8.8 GB at 1.1B). A model directory streams its checkpoint group by
group, in the files' order.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

from terastack.disdp.buckets import Bucket, Layout
from terastack.training.hf.model_files import materialized, seeded


class StreamedShard(Mapping):
    """Server ``server``'s slice of every bucket, made from ``tensors`` ((name, tensor) pairs) as the server asks
    for them ([Note: a server's starting weights]). ``source`` names where the weights come from (for errors);
    ``close`` is called once the stream is spent."""

    def __init__(self, layout: Layout, server: int, tensors: Iterator[tuple[str, torch.Tensor]], *, source: str,
                 close=None):
        self.layout, self.server, self.source = layout, server, source
        self._tensors = tensors
        self._close = close
        self._where = {slot.name: (b, slot) for b, bucket in enumerate(layout.buckets) for slot in bucket.params}
        self._missing = [{slot.name for slot in bucket.params} for bucket in layout.buckets]
        self._partial: dict[int, torch.Tensor] = {}
        self._taken: set[int] = set()
        #: the most bytes of slices held at once (what the stream made ahead of the server's asking)
        self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self.layout.buckets)

    def __iter__(self):
        return iter(range(len(self.layout.buckets)))

    def __getitem__(self, b: int) -> torch.Tensor:
        if b in self._taken:
            raise KeyError(f"bucket {b}'s slice was made once and handed over (the stream does not keep it)")
        while self._missing[b]:
            item = next(self._tensors, None)
            if item is None:
                self.close()
                names = sorted(self._missing[b])
                raise ValueError(f"model {self.source}: no weights for {', '.join(names[:3])} in its checkpoint")
            self._place(*item)
        self._taken.add(b)
        return self._partial.pop(b)

    def _place(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self._where:
            return
        b, slot = self._where[name]
        lo, hi = self.layout.shard(b, self.server)
        if b not in self._partial:
            self._partial[b] = torch.empty(hi - lo)
            self.peak_bytes = max(self.peak_bytes, sum(t.numel() * 4 for t in self._partial.values()))
        start, end = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if start < end:
            self._partial[b][start - lo:end - lo] = tensor.detach().reshape(-1)[start - slot.offset:end - slot.offset]
        self._missing[b].discard(name)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


def random_init(model: nn.Module, layout: Layout, *, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 tensor) for every parameter of ``model`` (a skeleton on the meta device), bucket by bucket:
    the modules holding a bucket's parameters get real storage and the model's own ``_init_weights``, under a
    generator seeded by ``seed`` and the bucket (so every server makes the same values), and go back to the meta
    device before the next bucket."""
    for bucket in layout.buckets:
        yield from _init_bucket(model, bucket, seed=seed * 1_000_003 + bucket.index)


def _init_bucket(model: nn.Module, bucket: Bucket, *, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    names = {slot.name for slot in bucket.params}
    owners = []
    for mname, module in model.named_modules():
        for pname, p in module._parameters.items():
            if p is not None and (f"{mname}.{pname}" if mname else pname) in names:
                owners.append(module)
                break
    out = {}
    with seeded(seed), materialized(owners), torch.no_grad():
        for module in owners:
            model._init_weights(module)
        for slot in bucket.params:
            out[slot.name] = model.get_parameter(slot.name).detach()   # its module lets go of it below
    yield from out.items()
