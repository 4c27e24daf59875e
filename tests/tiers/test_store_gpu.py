"""The store's device tier on a GPU, with the GPU made to lag the CPU: reads into blocks the caching allocator
hands back while queued kernels still read them, records above the old 256 MiB staging cap, device indexes
(skipped without CUDA; two GPUs for the last)."""
import threading

import pytest
import torch

from terastack.tiers import Tier, TieredStore

#: GPU cycles of torch.cuda._sleep: long enough (tens of ms) that the CPU runs far ahead
LAG = 200_000_000


def _store(tmp_path, **kw):
    kw.setdefault("device_budget", "2GiB")
    kw.setdefault("host_budget", "2GiB")
    kw.setdefault("pinned_budget", "64MiB")
    kw.setdefault("device", "cuda")
    return TieredStore(TieredStore.Config(root=str(tmp_path / "s"), **kw))


@pytest.mark.gpu
def test_read_into_a_reused_block_waits_for_the_kernels_still_reading_it(tmp_path):
    n = 8 << 20
    with _store(tmp_path) as store:
        store.put("x", torch.full((n,), 7, dtype=torch.uint8)).result()
        padded = store.padded("x")
        for _ in range(3):
            victim = torch.ones(padded, dtype=torch.uint8, device=store.device)
            torch.cuda._sleep(LAG)                   # the GPU lags ...
            doubled = victim.to(torch.int32) * 2     # ... so this still has to read victim's block
            del victim                               # free on the CPU side: the allocator may hand it out now
            got = store.get("x", Tier.DEVICE)        # a read into (likely) that very block
            torch.cuda.synchronize()
            assert int(doubled.min()) == 2 and int(doubled.max()) == 2, "the read overwrote a block in use"
            assert bool((got == 7).all())
            store.evict("x").result()


@pytest.mark.gpu
def test_record_above_the_old_staging_cap_moves_both_ways(tmp_path):
    n = 300 << 20  # above 256 MiB, and far above this store's 64 MiB of staging
    g = torch.Generator().manual_seed(0)
    ref = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    with _store(tmp_path) as store:
        store.put("big", ref).result()
        dev = store.get("big", Tier.DEVICE)
        assert dev.is_cuda and torch.equal(dev.cpu(), ref)
        assert store.usage()["pinned"]["peak"] <= 64 << 20
        dev.add_(1)
        store.mark_dirty("big")
        store.evict("big").result()
        assert torch.equal(store.get("big", Tier.HOST), ref + 1)
        assert store.usage()["host"]["used"] >= store.pinned.allocated_bytes > 0  # staging in the host ledger


@pytest.mark.gpu
def test_concurrent_device_reads_share_the_staging(tmp_path):
    with _store(tmp_path, pinned_budget="8MiB") as store:
        refs = {f"t{i}": torch.randn(3 << 20) for i in range(8)}  # 12 MiB each, 8 in flight through 8 MiB
        for name, t in refs.items():
            store.put(name, t).result()
        futs = {name: store.prefetch(name, Tier.DEVICE) for name in refs}
        for name, fut in futs.items():
            assert torch.equal(fut.result(60).cpu(), refs[name])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_by_index(tmp_path):
    with _store(tmp_path, device="cuda:1") as store:
        assert store.device == torch.device("cuda", 1)
        store.put("x", torch.arange(1000.0)).result()
        got = {}
        # from a thread whose current device is 0: the transfer must still land on cuda:1
        th = threading.Thread(target=lambda: got.setdefault("x", store.get("x", Tier.DEVICE)))
        th.start()
        th.join(60)
        assert got["x"].device == torch.device("cuda", 1)
        assert torch.equal(got["x"].cpu(), torch.arange(1000.0))


# ------------------------------------------------------------------ copies between the host and device tiers
def _lag_side_stream(device, direction):
    """Make the side stream of ``direction`` lag: a copy queued on it runs tens of ms from now."""
    from terastack.io.cuda import side_stream

    with torch.cuda.stream(side_stream(device, direction)):
        torch.cuda._sleep(LAG)


@pytest.mark.gpu
def test_host_tier_is_pinned_and_counted_once(tmp_path):
    with _store(tmp_path, pinned_budget="8KiB") as store:
        store.put("w", torch.randn(1000), home=Tier.HOST).result()
        host = store.tensor("w")
        assert host.is_pinned()  # an upload from it is asynchronous, at pinned bandwidth
        assert store.usage()["host"]["used"] == store.padded("w") + store.pinned.allocated_bytes


@pytest.mark.gpu
def test_upload_of_a_host_copy_is_read_by_compute_after_it_landed_and_fences_the_source(tmp_path):
    from terastack.io.cuda import UP

    ref = torch.arange(1 << 20, dtype=torch.float32)
    with _store(tmp_path) as store:
        store.put("w", ref, home=Tier.HOST).result()
        store.commit()  # clean: an evict goes back to the resting copy without copying into it
        for _ in range(3):
            _lag_side_stream(store.device, UP)
            dev = store.get("w", Tier.DEVICE)       # the upload waits behind the lag; this thread does not
            doubled = dev * 2                        # queued on the compute stream: must wait for the upload
            del dev
            store.evict("w").result()                # back to its resting copy
            store.tensor("w").fill_(-1)              # a CPU writer of the resting copy waits for the upload
            torch.cuda.synchronize()
            assert torch.equal(doubled.cpu(), ref * 2), "the upload read its source after a CPU write, or " \
                                                        "compute read the copy before it landed"
            store.tensor("w").copy_(ref)


@pytest.mark.gpu
def test_download_of_a_device_copy_waits_for_the_kernels_writing_it(tmp_path):
    ref = torch.arange(1 << 20, dtype=torch.float32)
    with _store(tmp_path) as store:
        store.put("w", ref, home=Tier.HOST).result()
        dev = store.get("w", Tier.DEVICE)
        torch.cuda._sleep(LAG)
        dev.add_(1)                                  # still queued when the download is asked for
        store.mark_dirty("w")
        fut = store.prefetch("w", Tier.HOST)         # not blocking this thread ...
        got = fut.result(30)                         # ... its future completes once the download has landed
        assert got.is_pinned() and torch.equal(got, ref + 1)


@pytest.mark.gpu
def test_put_of_a_device_tensor_is_staged_after_the_kernels_writing_it(tmp_path):
    n = 4 << 20
    with _store(tmp_path) as store:
        for i in range(3):
            t = torch.ones(n, dtype=torch.uint8, device=store.device)
            torch.cuda._sleep(LAG)
            t.mul_(3)                                # queued: the staged write must copy its result
            fut = store.put(f"a{i}", t, home="ssd")  # an activation swapped to the SSD
            del t                                    # freed by its owner at once ...
            junk = torch.full((n,), 9, dtype=torch.uint8, device=store.device)  # ... and (likely) handed out
            fut.result(60)
            assert bool((store.get(f"a{i}", Tier.HOST) == 3).all()), "the write read a reused or unfinished block"
            del junk


@pytest.mark.gpu
def test_device_ledger_charges_what_the_allocator_takes(tmp_path):
    from terastack.allocator import allocator_bytes, expandable_segments

    with _store(tmp_path) as store:
        n = (11 << 20) + 8192                        # a segment of its own without expandable segments
        store.put("w", torch.zeros(n, dtype=torch.uint8)).result()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(store.device), torch.cuda.memory_reserved(store.device)
        store.get("w", Tier.DEVICE)
        charged = store.usage()["device"]["used"]
        assert charged == allocator_bytes(store.padded("w"), expandable=expandable_segments())
        assert torch.cuda.memory_allocated(store.device) - before[0] >= allocator_bytes(n, expandable=True)
        if not expandable_segments() and before[1] - before[0] < n:  # no cached block could serve it
            assert torch.cuda.memory_reserved(store.device) - before[1] == charged  # a segment of its own
