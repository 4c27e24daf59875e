"""The pinned staging cap: sized from the records and the host budget, counted in the host ledger, any record
staged through it chunk by chunk (see tests/io/test_staging.py for the chunking itself)."""
import pytest
import torch

from terastack.io.cuda import MIN_CHUNK, PinnedStaging
from terastack.tiers import Tier, TieredStore
from terastack.plan.staging import staging_cap


def test_cap_fits_two_of_the_largest_records_within_an_eighth_of_the_host_budget():
    assert staging_cap(16 << 20, 4 << 30) == 32 << 20
    # a 1 GB embedding: the cap is bounded by the host budget, not by the record (it is staged in chunks)
    assert staging_cap(1 << 30, 8 << 30) == 1 << 30
    assert staging_cap(1 << 30, 2 << 30) == 256 << 20
    assert staging_cap(0, 0) == 2 * MIN_CHUNK  # at least two chunks, never zero
    for largest, host in [(3 << 20, 100 << 20), (12345, 1 << 20), (1 << 34, 1 << 40)]:
        cap = staging_cap(largest, host)
        assert cap & (cap - 1) == 0 and cap <= max(1 << 30, 2 * MIN_CHUNK)
    with pytest.raises(ValueError, match="largest_record"):
        staging_cap(-1, 0)


def test_store_stages_through_chunks_counted_in_its_host_ledger(tmp_path):
    with TieredStore(TieredStore.Config(root=str(tmp_path / "s"), host_budget="2MiB", device_budget="2MiB",
                                        pinned_budget="64KiB", device="cpu")) as store:
        assert isinstance(store.pinned, PinnedStaging)
        assert store.pinned.ledger is store.budgets[Tier.HOST]
        assert store.pinned.cap == 64 << 10
        assert store.usage()["pinned"]["limit"] == 64 << 10
        # a record far above the cap still moves (without CUDA nothing is staged; results as before)
        big = torch.arange(300_000, dtype=torch.float32)
        store.put("big", big).result()
        assert torch.equal(store.get("big", Tier.HOST), big)
        assert store.usage()["pinned"]["allocated"] == 0  # no pinned pages taken without an accelerator


def test_pinned_budget_below_one_chunk_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pinned_budget"):
        TieredStore.Config(root=str(tmp_path / "s"), pinned_budget=100)
