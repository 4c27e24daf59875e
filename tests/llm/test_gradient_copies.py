"""Gradients off the GPU ([Note: gradients off the GPU] in terastack.llm.engine.gradient_intake): a held gradient's
copy event is waited for by whoever reads it on the CPU first -- the optimizer thread reading a chunk, a second
contribution, its spill -- checked on the CPU with a stand-in event; then on a GPU, with the GPU made to lag.
Their pinned buffers are the gradient pool's, and a host copy of activations charges its pinned block's rounding
to the host ledger: checked on the CPU with the page-locking stood in for."""
import threading
from types import SimpleNamespace

import pytest
import torch

from terastack.io.buffers import aligned_empty
from terastack.llm.engine import gradient_intake as intake_module
from terastack.llm.engine.gradient_intake import GradientIntake, HeldGradient
from terastack.tiers import BudgetLedger, Tier, pool as pool_module


class Event:
    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


def _intake(n=8):
    rt = SimpleNamespace(store=None, chunk_ranges=lambda name: [(0, n)])
    tensors = {"w": SimpleNamespace(numel=n, users=["u0"], index=0)}
    return GradientIntake(rt, tensors, pool_bytes=1 << 20, backpressure=False, clipping=False, sum_homes={},
                          cv=threading.Condition(), executor=None, failure=None, timeout=5)


def test_optimizer_reads_a_chunk_only_after_the_copy_landed():
    intake = _intake()
    ready = Event()
    intake._grads["w"] = HeldGradient(torch.arange(8.0), 32, ready=ready)
    got = intake.chunk("w", 0, 2, 6)
    assert ready.synced == 1 and torch.equal(got, torch.arange(2.0, 6.0))
    intake.chunk("w", 0, 0, 8)
    assert ready.synced == 1  # once landed, not waited for again


def test_a_cpu_gradient_is_held_as_before():
    intake = _intake()
    intake.begin_step(accumulate=False)
    g = torch.arange(8.0, dtype=torch.float64)
    out = intake.accept("u0", {"w": g})
    assert out.ready == ["w"]
    held = intake._grads["w"]
    assert held.ready is None and held.tensor.dtype == torch.float32 and torch.equal(held.tensor, g.float())


class OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU: the accelerator's branches run on the CPU."""

    @property
    def device(self):
        return torch.device("cuda", 0)


@pytest.fixture
def pinning(monkeypatch):
    """Page-locking stood in for: the sizes asked for, plain aligned buffers; copies off the 'GPU' are CPU copies
    with a stand-in event."""
    asked = []

    def pinned(nbytes):
        asked.append(nbytes)
        return aligned_empty(nbytes, torch.uint8, as_tensor=True)

    def to_host(dst, src):
        dst.copy_(src.as_subclass(torch.Tensor))
        return Event()

    monkeypatch.setattr(pool_module, "pinned_host_empty", pinned)
    monkeypatch.setattr(intake_module, "pinned_host_empty", pinned)
    monkeypatch.setattr(intake_module, "to_host", to_host)
    return asked


def test_gradients_off_the_gpu_are_held_in_the_pools_pinned_buffers(pinning):
    intake = _intake()
    intake.tensors["w"].users = ["u0", "u1"]  # two contributions: the second is copied, added and given back
    for step in range(2):
        intake.begin_step(accumulate=False)
        intake.accept("u0", {"w": torch.arange(8.0).as_subclass(OnGpu)})
        assert intake.pool.used == 32  # reserved with its buffer, before the copy
        out = intake.accept("u1", {"w": torch.ones(8).as_subclass(OnGpu)})
        assert out.ready == ["w"] and intake.pool.used == 32
        assert torch.equal(intake.chunk("w", 0, 0, 8), torch.arange(8.0) + 1)
        intake.release("w")
        assert intake.pool.used == 0 and intake.buffers.pooled(Tier.HOST) == 64  # kept, within the pool's budget
        assert pinning == [32, 32]  # the second step reuses the first's buffers: nothing pinned anew


def test_a_gradient_without_room_in_the_pool_is_pinned_apart_and_charged_nowhere(pinning):
    intake = _intake()
    intake.pool = BudgetLedger("host (gradients in flight)", 16)  # less than the gradient's 32 bytes
    intake.begin_step(accumulate=False)
    intake.accept("u0", {"w": torch.arange(8.0).as_subclass(OnGpu)})
    held = intake._grads["w"]
    assert held.charged == 0 and held.raw is None and intake.pool.used == 0  # spilled once complete
    assert pinning == [32] and torch.equal(intake.settled(held), torch.arange(8.0))


@pytest.mark.gpu
def test_gradients_leave_the_gpu_without_blocking_and_are_read_after_landing():
    lag = 200_000_000  # GPU cycles: the CPU runs far ahead
    dev = torch.device("cuda", torch.cuda.current_device())
    intake = _intake(n=1 << 20)
    intake.tensors["w"].users = ["u0", "u1"]  # two contributions: the second is added on the CPU
    intake.begin_step(accumulate=False)
    x = torch.ones(1 << 20, device=dev, dtype=torch.bfloat16)
    torch.cuda._sleep(lag)
    g1 = x * 2                    # queued behind the sleep
    intake.accept("u0", {"w": g1})
    del g1                        # backward frees it at once: the block may be handed out again
    junk = torch.full((1 << 20,), 100, device=dev, dtype=torch.bfloat16)  # likely g1's block
    g2 = x * 3
    out = intake.accept("u1", {"w": g2})
    assert out.ready == ["w"]
    got = intake.chunk("w", 0, 0, 1 << 20)
    assert bool((got == 5).all()), "a gradient was read before its copy landed, or its block was reused"
    del junk
