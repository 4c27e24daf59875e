"""Where a parameter server keeps its slices: its fp32 weights and its optimizer state (the records of [Note: a
slice's optimizer state] in terastack.disdp.slice_state) in host memory, or resting in a tiered store on the SSD
with a few buckets in memory (``disdp.state``: memory or ssd). Each holder has the same small interface (get /
prefetch / release, load, flush, host_bytes, close), so the server's step reads the same whichever it has."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from terastack.tiers import Tier, TieredStore


class MemoryState:
    """Every slice's optimizer state in host memory (``state="memory"``): bucket -> record name -> tensor."""

    def __init__(self, slices: dict):
        self.t = {b: sl.zeros() for b, sl in slices.items()}

    def load(self, b: int, records: dict[str, torch.Tensor]) -> None:
        for name, value in records.items():
            self.t[b][name].copy_(value)

    def prefetch(self, b: int) -> None:
        pass

    def get(self, b: int, timeout: float) -> dict[str, torch.Tensor]:
        return self.t[b]

    def release(self, b: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for records in self.t.values() for t in records.values())

    def close(self) -> None:
        pass


class StateStore:
    """The tiered store a server's state rests in, under one host-memory budget ([Note: the server's host
    memory]): what a bucket's update or send needs is *taken* (read in, making room first), what may be needed
    next is *read ahead* only into free room, and what was taken is *put back* (written back when modified,
    then evicted)."""

    def __init__(self, root: Path, budget: int):
        if root.exists():
            shutil.rmtree(root)   # scratch space: the durable state is in the checkpoints
        self.store = TieredStore(TieredStore.Config(root=str(root), host_budget=budget, device_budget=0))
        self.ledger = self.store.budgets[Tier.HOST]
        self._ahead: dict[str, object] = {}    # read ahead and not taken yet: name -> future
        self._writing: list = []               # write-backs under way

    def read_ahead(self, name: str) -> None:
        if name in self._ahead or self.store.resident(name, Tier.HOST) is not None:
            return
        if self.ledger.free >= self.store.padded(name):   # only into free room: never at a take's expense
            self._ahead[name] = self.store.prefetch(name, Tier.HOST)

    def take(self, name: str, timeout: float) -> torch.Tensor:
        fut = self._ahead.pop(name, None)
        if fut is None:
            if self.store.resident(name, Tier.HOST) is None:
                self._room(self.store.padded(name), timeout)
            fut = self.store.prefetch(name, Tier.HOST)
        return fut.result(timeout)

    def put_back(self, name: str, *, dirty: bool) -> None:
        if dirty:
            self.store.mark_dirty(name)
        self._writing = [f for f in self._writing if not f.done()]
        self._writing.append(self.store.evict(name))

    def _room(self, nbytes: int, timeout: float) -> None:
        """Free ``nbytes`` of the budget for a take: finish the write-backs, then drop what was read ahead."""
        if self.ledger.free >= nbytes:
            return
        for f in self._writing:
            f.result(timeout)
        self._writing.clear()
        while self.ledger.free < nbytes and self._ahead:
            name, fut = self._ahead.popitem()
            fut.result(timeout)
            self.store.evict(name).result(timeout)   # unmodified: dropped at once

    def add(self, name: str, tensor: torch.Tensor, timeout: float) -> None:
        """A new tensor resting on the SSD, written from ``tensor`` itself (no host copy)."""
        self.store.put(name, tensor, home=Tier.SSD).result(timeout)

    def __contains__(self, name: str) -> bool:
        return name in self.store

    def delete(self, name: str) -> None:
        self.store.delete(name)

    def wait(self, timeout: float) -> None:
        for f in self._writing:
            f.result(timeout)
        self._writing.clear()
        self.store.wait(timeout)

    def host_bytes(self) -> int:
        return self.ledger.peak

    def close(self) -> None:
        self.store.wait(600)
        self.store.close()


class TieredState:
    """Every slice's optimizer state resting on SSD through the server's state store ([Note: where the optimizer
    state lives] in terastack.disdp.server): one record per bucket and record name."""

    def __init__(self, slices: dict, store: StateStore):
        self.store = store
        self.names = {b: list(sl.records) for b, sl in slices.items()}
        for b, sl in slices.items():
            for name, (dtype, n, _) in sl.records.items():
                store.store.create(self._key(b, name), (n,), dtype, home=Tier.SSD)

    @staticmethod
    def _key(b: int, name: str) -> str:
        return f"s{b}.{name}"

    def load(self, b: int, records: dict[str, torch.Tensor]) -> None:
        held = self.get(b, 600)
        for name, value in records.items():
            held[name].copy_(value)
        self.release(b)

    def prefetch(self, b: int) -> None:
        for name in self.names[b]:
            self.store.read_ahead(self._key(b, name))

    def get(self, b: int, timeout: float) -> dict[str, torch.Tensor]:
        return {name: self.store.take(self._key(b, name), timeout) for name in self.names[b]}

    def release(self, b: int) -> None:
        for name in self.names[b]:
            self.store.put_back(self._key(b, name), dirty=True)

    def flush(self) -> None:
        self.store.wait(600)

    def host_bytes(self) -> int:
        return self.store.host_bytes()

    def close(self) -> None:
        pass   # the server closes its store


class HostParams:
    """fp32 parameter slices in host memory (``state="memory"``)."""

    tiered = False

    def __init__(self, params: dict[int, torch.Tensor]):
        self.t = params

    def get(self, b: int, timeout: float = 0) -> torch.Tensor:
        return self.t[b]

    def prefetch(self, b: int) -> None:
        pass

    def release(self, b: int, *, dirty: bool = False) -> None:
        pass

    def numel(self, b: int) -> int:
        return self.t[b].numel()

    def host_bytes(self) -> int:
        return sum(t.numel() * 4 for t in self.t.values())

    def close(self) -> None:
        pass


class TieredParams:
    """fp32 parameter slices resting on SSD through the server's state store (``state="ssd"``): a bucket's slice
    is resident only while it is being sent or updated ([Note: where the optimizer state lives]); holders count,
    and the last release writes it back (when modified) and evicts it."""

    tiered = True

    def __init__(self, params, store: StateStore, *, sizes: dict[int, int]):
        """``params``: bucket -> this shard's slice, read one bucket at a time (a mapping that makes each slice when
        asked never holds them all); ``sizes``: bucket -> the slice's elements."""
        self.store = store
        self.sizes = dict(sizes)
        for b in sizes:
            store.add(f"p{b}", params[b], 600)
        self._holds: dict[int, int] = {}

    def get(self, b: int, timeout: float = 600) -> torch.Tensor:
        self._holds[b] = self._holds.get(b, 0) + 1
        return self.store.take(f"p{b}", timeout)

    def prefetch(self, b: int) -> None:
        if self._holds.get(b, 0) == 0:
            self.store.read_ahead(f"p{b}")

    def release(self, b: int, *, dirty: bool = False) -> None:
        if dirty:
            self.store.store.mark_dirty(f"p{b}")
        self._holds[b] -= 1
        if self._holds[b] == 0:
            del self._holds[b]
            self.store.put_back(f"p{b}", dirty=False)   # marked above: a modified slice is written back

    def numel(self, b: int) -> int:
        return self.sizes[b]

    def host_bytes(self) -> int:
        return self.store.host_bytes()

    def close(self) -> None:
        pass   # the server closes its store
