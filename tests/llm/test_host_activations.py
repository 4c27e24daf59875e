"""[Note: host copies in the store's buffers]: activations swapped to host memory live in the store's host-tier
buffers, reserved in the host ledger by the pool and handed out again after the unit's backward."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from terastack.constants import padded_size
from terastack.llm.engine.activations import ActivationStash, SwapToHost
from terastack.llm.engine.runtime import StepRuntime
from terastack.tiers import Tier, TieredStore


class _Runtime:
    """What a stash asks of the step runtime: the store, the device, charges (the runtime's own)."""

    charge = StepRuntime.charge
    uncharge = StepRuntime.uncharge

    def __init__(self, store):
        self.store = store
        self.device = store.device
        self._lock = threading.Lock()

    def with_room(self, attempt, what):
        return attempt()


def _forward(stash, x, w):
    with stash.hooks():
        y = torch.tanh(x @ w)      # saves x (a weight ref for w) and tanh's output
        return (y * y).sum()


def test_host_copies_are_the_pools_buffers_and_the_ledger_holds_them(tmp_path):
    store = TieredStore(TieredStore.Config(root=str(tmp_path / "store"), host_budget=1 << 20, device_budget=0))
    try:
        rt = _Runtime(store)
        ledger, pool = store.budgets[Tier.HOST], store.pool
        w = torch.randn(8, 8, requires_grad=True)
        x = torch.randn(4, 8, requires_grad=True)
        ref = torch.autograd.grad(torch.tanh(x @ w).pow(2).sum(), (x, w))
        unit = SimpleNamespace(path="layers.0", index=0)
        handed_out = []
        for _ in range(2):
            stash = ActivationStash(rt, unit, SwapToHost(), {"w": w})
            loss = _forward(stash, x, w)
            used = ledger.used
            stash.seal()
            sizes = [padded_size(e.nbytes) for e in stash.entries.values()]
            assert sizes and ledger.used - used == sum(sizes)   # the host copies' padded bytes, in the ledger
            handed_out.append({e.buffer.data_ptr() for e in stash.entries.values()})
            got = torch.autograd.grad(loss, (x, w))
            stash.free()
            assert ledger.used == used and pool.pooled(Tier.HOST) == sum(sizes)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a, b)
        assert handed_out[0] == handed_out[1]   # the second forward's copies reuse the pool's buffers
    finally:
        store.close()
