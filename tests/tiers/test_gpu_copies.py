"""The CUDA paths between the host and device tiers, checked on the CPU at the torch.cuda seam: which buffers are
asked for page-locked, that the host ledger counts them once, that a buffer an asynchronous copy still uses is
waited for before it is handed out, dropped or read, and the request for expandable segments (the caching
allocator's rounding: tests/test_allocator.py; tests/tiers/test_store_gpu.py for the same paths on a GPU)."""
import gc
import mmap

import pytest
import torch

from terastack.allocator import expandable_segments
from terastack.io import cuda
from terastack.io.buffers import aligned_empty
from terastack.tiers import Tier, TieredStore, pool as pool_module
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.pool import BufferPool

KiB, MiB = 1 << 10, 1 << 20


class FakeEvent:
    """A copy's event: records when it is waited for."""

    def __init__(self, log=None):
        self.synced = 0
        self.log = log

    def synchronize(self):
        self.synced += 1
        if self.log is not None:
            self.log.append("synchronize")


# ------------------------------------------------------------------ the caching allocator's settings
def test_expandable_segments_are_not_asked_for_without_cuda_or_over_the_users_settings(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    assert not cuda.prefer_expandable_segments()
    assert cuda.os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"  # the user's settings stand
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert cuda.prefer_expandable_segments()
    assert expandable_segments()
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # too late: the allocator has read it
    assert not cuda.prefer_expandable_segments()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in cuda.os.environ


# ------------------------------------------------------------------ pinned host buffers
def test_pinned_host_buffer_is_registered_once_and_unregistered_after_its_last_view(monkeypatch):
    calls = []
    monkeypatch.setattr(cuda, "host_register", lambda address, n: calls.append(("register", address, n)) or True)
    monkeypatch.setattr(cuda, "host_unregister", lambda address: calls.append(("unregister", address)))
    buf = cuda.pinned_host_empty(3 * 4096)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 * 4096 and buf.data_ptr() % mmap.PAGESIZE == 0
    assert int(buf.sum()) == 0  # zero-filled, like aligned_empty
    assert calls == [("register", buf.data_ptr(), 3 * 4096)]  # its own pages, not a power of two
    address = buf.data_ptr()
    view = buf[4096:].view(torch.int32)  # a typed view outlives the buffer
    view.fill_(7)
    del buf
    gc.collect()
    assert calls[1:] == []
    assert int(view[0]) == 7
    del view
    gc.collect()
    assert calls[1:] == [("unregister", address)]


def test_pinned_host_buffer_registration_failure_is_said(monkeypatch):
    monkeypatch.setattr(cuda, "host_register", lambda address, n: False)
    monkeypatch.setattr(cuda, "host_unregister", lambda address: pytest.fail("never registered"))
    with pytest.raises(RuntimeError, match="cudaHostRegister of 4096 bytes"):
        cuda.pinned_host_empty(4096)


def test_host_tier_buffers_are_asked_for_pinned_and_counted_once(monkeypatch):
    asked = []

    def fake_pinned(n):
        asked.append(n)
        return aligned_empty(n, torch.uint8, as_tensor=True)
    monkeypatch.setattr(pool_module, "pinned_host_empty", fake_pinned)
    budgets = {Tier.DEVICE: BudgetLedger("device", 1 * MiB), Tier.HOST: BudgetLedger("host", 1 * MiB)}
    pool = BufferPool(budgets, torch.device("cpu"), pin=True)
    host = pool.alloc(Tier.HOST, 8 * KiB, what="t")
    pool.alloc(Tier.DEVICE, 4 * KiB, what="d")  # the device tier is not host-pinned
    assert asked == [8 * KiB]
    assert budgets[Tier.HOST].used == 8 * KiB  # the pinned bytes are the buffer's own: counted once
    pool.free(Tier.HOST, host)
    again = pool.alloc(Tier.HOST, 8 * KiB, what="t")  # reused: not pinned again
    assert again.data_ptr() == host.data_ptr() and asked == [8 * KiB]
    assert BufferPool(budgets, torch.device("cpu")).pin is False  # no accelerator: nothing pinned


def test_a_buffer_a_copy_still_uses_is_waited_for_before_reuse():
    log = []
    budgets = {Tier.DEVICE: BudgetLedger("device", 1 * MiB), Tier.HOST: BudgetLedger("host", 1 * MiB)}
    pool = BufferPool(budgets, torch.device("cpu"))
    raw = pool.alloc(Tier.HOST, 4 * KiB, what="t")
    done = FakeEvent(log)
    pool.free(Tier.HOST, raw, after=done)  # an upload still reads it
    assert done.synced == 0
    again = pool.alloc(Tier.HOST, 4 * KiB, what="t")
    assert again.data_ptr() == raw.data_ptr() and done.synced == 1
    pool.settle(again)  # once only
    pool.settle(None)
    assert done.synced == 1


def test_a_buffer_a_copy_still_uses_is_waited_for_before_it_is_dropped():
    budgets = {Tier.DEVICE: BudgetLedger("device", 1 * MiB), Tier.HOST: BudgetLedger("host", 8 * KiB)}
    pool = BufferPool(budgets, torch.device("cpu"))
    raw = pool.alloc(Tier.HOST, 4 * KiB, what="t")
    done = FakeEvent()
    pool.free(Tier.HOST, raw, after=done)
    pool.alloc(Tier.HOST, 8 * KiB, what="big")  # no room to keep it pooled: dropped, after its copy
    assert done.synced == 1 and pool.pooled(Tier.HOST) == 0


def test_a_host_working_copy_is_settled_before_the_store_hands_it_out(tmp_path):
    with TieredStore(TieredStore.Config(root=str(tmp_path / "s"), device_budget="1MiB", host_budget="1MiB",
                                        device="cpu")) as store:
        ref = torch.arange(100.0)
        store.put("w", ref, home=Tier.HOST).result()
        for read in (lambda: store.tensor("w"), lambda: store.resident("w", Tier.HOST),
                     lambda: store.get("w", Tier.HOST)):
            upload = FakeEvent()
            store.pool.fence(store.tensor("w"), upload)  # an upload from the resting copy still in flight
            got = read()
            assert upload.synced == 1  # the CPU reader (a writer: the optimizer) waited for it
            assert torch.equal(got, ref)


def test_event_future_reports_the_copy_and_its_failure():
    assert cuda.event_future(FakeEvent(), result=5).result(5) == 5

    class Failing:
        def synchronize(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        cuda.event_future(Failing()).result(5)


def test_host_tier_falls_back_to_pageable_memory_when_pinning_fails(monkeypatch):
    def refused(n):
        raise RuntimeError("cudaHostRegister of 4096 bytes of host memory failed")
    monkeypatch.setattr(pool_module, "pinned_host_empty", refused)
    budgets = {Tier.DEVICE: BudgetLedger("device", 1 * MiB), Tier.HOST: BudgetLedger("host", 1 * MiB)}
    pool = BufferPool(budgets, torch.device("cpu"), pin=True)
    with pytest.warns(RuntimeWarning, match="not page-locked"):
        raw = pool.alloc(Tier.HOST, 4 * KiB, what="t")
    assert raw.numel() == 4 * KiB and budgets[Tier.HOST].used == 4 * KiB and pool.pin is False
