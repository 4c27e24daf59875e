"""Gradient sums on the SSD ([Note: gradient accumulation], [Note: reading the sums ahead] in
terastack.llm.engine.accumulate): read ahead within the window when a backward begins, added in micro-batch order."""
import torch

from terastack.llm.engine import records
from terastack.llm.engine.accumulate import GradientSums
from terastack.tiers import State, TieredStore

CHUNK = 1024  # elements: one 4 KiB record per chunk


class _Runtime:
    """What GradientSums asks of the engine's runtime: chunk ranges, waits, room and write tracking."""

    def __init__(self, store, numel: int):
        self.store = store
        self.numel = numel

    def chunk_ranges(self, name):
        return [(lo, min(lo + CHUNK, self.numel)) for lo in range(0, self.numel, CHUNK)]

    @staticmethod
    def with_room(fn, what):
        return fn()

    @staticmethod
    def wait(fut, what):
        return fut.result(timeout=30)

    @staticmethod
    def track_write(fut):
        return fut


def test_a_backward_that_accumulates_reads_its_sums_ahead_within_the_window(tmp_path):
    numel = 4 * CHUNK
    with TieredStore(TieredStore.Config(root=str(tmp_path / "s"), device_budget=0, host_budget="1MiB")) as store:
        rt = _Runtime(store, numel)
        window = 2 * 4096
        sums = GradientSums(rt, {}, read_ahead_bytes=window, writeback_bytes=window)
        g = [torch.randn(numel) for _ in range(3)]
        sums.add("w", g[0].clone())
        store.wait()
        recs = [records.accumulated_grad("w", k) for k in range(4)]
        assert all(store.record(r).state is State.ON_SSD for r in recs)
        sums.read_ahead(["w", "not accumulated"])
        # the first two chunks are coming in (or in), within the window; the others wait for the addition
        assert [store.record(r).state is not State.ON_SSD for r in recs] == [True, True, False, False]
        sums.add("w", g[1].clone())
        store.wait()
        total = g[2].clone()
        sums.take_into("w", total)
        torch.testing.assert_close(total, (g[0] + g[1]) + g[2], rtol=0, atol=0)
        assert not any(r in store.names() for r in recs)  # taken: the sums are gone


def test_without_a_window_the_sums_are_read_one_chunk_at_a_time(tmp_path):
    numel = 3 * CHUNK
    with TieredStore(TieredStore.Config(root=str(tmp_path / "s"), device_budget=0, host_budget="1MiB")) as store:
        sums = GradientSums(_Runtime(store, numel), {})
        sums.add("w", torch.ones(numel))
        store.wait()
        sums.read_ahead(["w"])
        assert all(store.record(records.accumulated_grad("w", k)).state is State.ON_SSD for k in range(3))
        total = torch.ones(numel)
        sums.take_into("w", total)
        torch.testing.assert_close(total, torch.full((numel,), 2.0))
