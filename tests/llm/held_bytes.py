"""Bytes that torch tensors made on this thread hold, counted as they are made and freed (not from RSS, which
depends on the allocator and the machine): every storage an operator returns is noted with its size, and counts
until torch frees it. A test's peak is ``HeldBytes.peak`` inside ``with HeldBytes() as held: ...``.

What it does not see: storages made before it starts (they are not the measured work's), tensors made on other
threads (a dispatch mode is per thread), and memory that is not a torch storage (the store's buffers, which its
ledgers count)."""
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class HeldBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and (key not in self._live or self._live[key][0].expired()):
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.peak = max(self.peak, self.now)
        return out

    @property
    def now(self) -> int:
        """Bytes the storages noted so far hold now (those freed are forgotten)."""
        self._live = {k: v for k, v in self._live.items() if not v[0].expired()}
        return sum(n for _, n in self._live.values())
