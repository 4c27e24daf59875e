"""The unified cache's GPU gather, with the GPU made to lag: back-to-back gathers without synchronising must each
equal direct indexing (the side stream's row and position buffers must not be reused while an earlier
scatter still reads them). Skipped without CUDA."""
import numpy as np
import pytest
import torch

from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.hotness import presample
from terastack.gnn.sampling.sampler import NeighborSampler


@pytest.mark.gpu
def test_back_to_back_gathers_without_synchronising(half):
    ds = open_dataset(half)
    reference = torch.from_numpy(ds.read_features())
    s = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 5), seed=0)
    hot = presample(s, ds.splits["train"], 64, epochs=2, seed=0)["node"]
    quarter = ds.num_nodes // 4 * ds.row_bytes
    rng = np.random.default_rng(0)
    with UnifiedCache(ds, hot.order(), device_budget=quarter // 2, host_budget=ds.num_nodes * 4 + quarter,
                      device="cuda") as cache:
        outs = []
        for trial in range(12):
            ids = rng.choice(ds.num_nodes, size=min(700, ds.num_nodes), replace=False)
            out = torch.empty(len(ids), ds.feat_dim, dtype=reference.dtype, device="cuda")
            torch.cuda._sleep(50_000_000)  # the GPU lags the CPU: the next gather is issued before this one ran
            cache.gather(ids, out)
            outs.append((ids, out))
        torch.cuda.synchronize()
        for ids, out in outs:
            assert torch.equal(out.cpu(), reference[torch.from_numpy(ids)])
        snap = cache.stats.snapshot()
        assert snap["device_hits"] and snap["host_hits"] and snap["misses"]
