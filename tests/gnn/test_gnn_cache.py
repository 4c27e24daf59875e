"""The unified static cache: gathering equals direct indexing for every tier mix, placement by hotness within
budgets, one batched SSD request per batch, and the baselines' feature sources."""
from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from terastack.constants import BLOCK
from terastack.gnn.storage.baselines import InMemoryFeatures, MmapFeatures
from terastack.gnn.storage.baselines import _mincore
from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.hotness import presample, rank_nodes
from terastack.gnn.storage.rows import RowReader
from terastack.gnn.sampling.sampler import NeighborSampler
from terastack.io import File
from terastack.errors import BudgetError


def _ranking(ds, seed=0):
    s = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 5), seed=seed)
    return presample(s, ds.splits["train"], 64, epochs=2, seed=seed)["node"]


def _budgets(ds):
    rb, table = ds.row_bytes, ds.num_nodes * 4
    quarter = ds.num_nodes // 4 * rb
    return {
        "no cache (all SSD)": (0, 0),
        "host only": (0, table + quarter),
        "device + host": (quarter // 2, table + quarter),
        "device-heavy": (2 * quarter, table + rb * 10),
        "everything cached": (ds.feature_bytes, table + ds.feature_bytes),
    }


@pytest.mark.parametrize("which", ["tiny", "straddle", "half", "wide"])
def test_gather_equals_direct_indexing_for_every_tier_mix(request, which):
    ds = open_dataset(request.getfixturevalue(which))
    reference = torch.from_numpy(ds.read_features())
    hot = _ranking(ds)
    rng = np.random.default_rng(0)
    for name, (dev, host) in _budgets(ds).items():
        with UnifiedCache(ds, hot.order(), device_budget=dev, host_budget=host) as cache:
            for trial in range(3):
                ids = rng.choice(ds.num_nodes, size=min(700, ds.num_nodes), replace=False)
                if trial == 2:
                    ids = np.concatenate([ids, ids[:50], [0, ds.num_nodes - 1]])  # repeats and the file's ends
                out = torch.empty(len(ids), ds.feat_dim, dtype=reference.dtype)
                cache.gather(ids, out)
                assert torch.equal(out, reference[torch.from_numpy(ids)]), (which, name, trial)
            snap = cache.stats.snapshot()
            assert snap["device_hits"] + snap["host_hits"] + snap["misses"] == snap["rows"]
            mix = {k: snap[k] > 0 for k in ("device_hits", "host_hits", "misses")}
            if name == "no cache (all SSD)":
                assert mix == {"device_hits": False, "host_hits": False, "misses": True}
            if name == "device + host":
                assert all(mix.values()), mix
            if name == "everything cached":
                assert snap["misses"] == 0 and snap["ssd_calls"] == 0


def test_placement_follows_hotness_within_budgets(tiny):
    ds = open_dataset(tiny)
    hot = _ranking(ds)
    order = hot.order()
    rb = ds.row_bytes
    dev, host = 100 * rb + 7, ds.num_nodes * 4 + 300 * rb + 5
    with UnifiedCache(ds, order, device_budget=dev, host_budget=host) as cache:
        assert cache.device_rows == 100 and cache.host_rows == 300
        assert set(cache.device_ids.tolist()) == set(order[:100].tolist())
        assert set(cache.host_ids.tolist()) == set(order[100:400].tolist())
        for name, ledger in cache.budgets.items():
            assert ledger.used <= ledger.limit, name
        # hottest first: every device row was accessed at least as often as any host row, and so on down
        c = hot.counts
        assert c[cache.device_ids].min() >= c[cache.host_ids].max()
        uncached = np.setdiff1d(np.arange(ds.num_nodes), np.concatenate([cache.device_ids, cache.host_ids]))
        assert c[cache.host_ids].min() >= c[uncached].max()
    # the ranking: counts first, then degree
    counts = np.array([0, 5, 5, 0, 1])
    degree = np.array([9, 1, 2, 3, 0])
    np.testing.assert_array_equal(rank_nodes(counts, degree), [2, 1, 4, 0, 3])


def test_hit_rate_curve_is_estimated_out_of_sample(tiny):
    ds = open_dataset(tiny)
    hot = _ranking(ds)
    touched = int(np.count_nonzero(hot.counts))
    assert hot.hit_rate(0) == 0.0 and hot.hit_rate(ds.num_nodes) == pytest.approx(1.0)
    # the ranking built from epoch 1 does not know every node epoch 2 touches
    assert hot.hit_rate(touched) < 1.0
    ks, hits = hot.curve()
    assert np.all(np.diff(hits) >= -1e-12)


def test_one_batched_ssd_request_per_gather_and_o_direct(straddle, monkeypatch):
    ds = open_dataset(straddle)
    calls = []
    real = File.pread_many

    def counting(self, *a, **k):
        calls.append(len(a[1]))
        return real(self, *a, **k)

    with UnifiedCache(ds, _ranking(ds).order(), host_budget=ds.num_nodes * 4 + 50 * ds.row_bytes) as cache:
        monkeypatch.setattr(File, "pread_many", counting)
        for _ in range(4):
            ids = np.random.default_rng(len(calls)).choice(ds.num_nodes, 60, replace=False)
            cache.gather(ids, torch.empty(60, ds.feat_dim))
        assert len(calls) == 4 and all(n > 10 for n in calls)  # one call, many extents
        snap = cache.stats.snapshot()
        assert snap["ssd_calls"] == 4 and snap["ssd_blocks"] >= snap["ssd_extents"]
        assert cache.reader.direct, cache.reader.direct_reason  # ext4/xfs allow O_DIRECT; the reason says if not
        assert cache.describe()["io"] == "O_DIRECT"


def test_fill_by_scan_and_by_block_reads_agree(tiny):
    ds = open_dataset(tiny)
    order = _ranking(ds).order()
    table = ds.num_nodes * 4
    dense = UnifiedCache(ds, order, host_budget=table + ds.feature_bytes // 2)  # > 1/4 of blocks: scan
    sparse = UnifiedCache(ds, order[::40], host_budget=table + 20 * ds.row_bytes)  # few rows: block reads
    ref = ds.read_features()
    for cache in (dense, sparse):
        np.testing.assert_array_equal(cache.host_cache, ref[cache.host_ids])
        # the fill's read buffer is not kept for the run (at 48M nodes it was 320 MB); a gather grows its own
        assert cache.reader.staging_bytes == 0 and cache.describe()["staging_bytes"] == 0
        ids = np.arange(0, ds.num_nodes, 7)
        np.testing.assert_array_equal(cache.gather(ids, torch.empty(len(ids), ds.feat_dim)).numpy(), ref[ids])
        assert 0 < cache.describe()["staging_bytes"] <= 2 * len(ids) * BLOCK
        cache.close()


def test_budget_errors_name_the_budget(tiny):
    ds = open_dataset(tiny)
    order = np.arange(ds.num_nodes)
    with pytest.raises(BudgetError, match="host"):
        UnifiedCache(ds, order, host_budget="100TiB")
    with pytest.raises(BudgetError, match="host budget exceeded for the cache lookup table"):
        UnifiedCache(ds, order, device_budget="1MiB", host_budget=0)
    with pytest.raises(ValueError, match="device_budget"):
        UnifiedCache(ds, order, device_budget="lots")
    with pytest.raises(ValueError, match="ranking"):
        UnifiedCache(ds, [ds.num_nodes], host_budget="1MiB")


def test_row_reader_scan_and_block_math(straddle):
    ds = open_dataset(straddle)
    ref = ds.read_features()
    reader = RowReader(ds.features_path, num_rows=ds.num_nodes, row_len=ds.feat_dim, dtype=ds.feat_dtype)
    seen = np.concatenate([rows.numpy().copy() for _, rows in reader.scan(chunk_bytes=64 << 10)])
    np.testing.assert_array_equal(seen, ref)
    rows = np.array([0, 10, 11, 1999])
    blocks = reader.blocks_for(rows)
    expected = sorted({b for r in rows for b in range(r * 400 // 4096, (r * 400 + 399) // 4096 + 1)})
    assert blocks.tolist() == expected
    np.testing.assert_array_equal(reader.read(rows).numpy(), ref[rows])
    reader.close()


@pytest.mark.parametrize("threads", [1, 3])  # 3: the gather split over threads, as several loader workers do
def test_baseline_sources_match_and_mmap_stays_in_budget(tiny, threads):
    ds = open_dataset(tiny)
    ref = torch.from_numpy(ds.read_features())
    ids = np.random.default_rng(2).choice(ds.num_nodes, 900, replace=False)
    mem = InMemoryFeatures(ref.numpy())
    out = torch.empty(900, ds.feat_dim)
    assert torch.equal(mem.gather(ids, out), ref[torch.from_numpy(ids)])
    budget = 16 * mmap.PAGESIZE
    mm = MmapFeatures(ds.features_path, num_rows=ds.num_nodes, row_len=ds.feat_dim, dtype=ds.feat_dtype,
                      budget=budget, threads=threads)
    mm.new_epoch()
    for k in range(3):
        part = ids[k * 300:(k + 1) * 300]
        got = mm.gather(part, torch.empty(300, ds.feat_dim))
        assert torch.equal(got, ref[torch.from_numpy(part)])
        assert int(_mincore(mm.address, mm.length).sum()) * mmap.PAGESIZE <= budget
    assert mm.evicted_pages > 0
    mm.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_tier_gathers_bit_identical_rows(straddle):
    ds = open_dataset(straddle)
    ref = torch.from_numpy(ds.read_features())
    hot = _ranking(ds)
    with UnifiedCache(ds, hot.order(), device_budget=300 * ds.row_bytes,
                      host_budget=ds.num_nodes * 4 + 300 * ds.row_bytes, device="cuda") as cache:
        for seed in range(3):
            ids = np.random.default_rng(seed).choice(ds.num_nodes, 800, replace=False)
            out = torch.empty(800, ds.feat_dim, device="cuda")
            cache.gather(ids, out)
            torch.cuda.synchronize()
            assert torch.equal(out.cpu(), ref[torch.from_numpy(ids)])
        snap = cache.stats.snapshot()
        assert snap["device_hits"] and snap["host_hits"] and snap["misses"]
