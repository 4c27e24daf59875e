"""Training out of core equals training in memory: identical loss curves and accuracy for SAGE, GCN and GAT;
the trainer, PyG's own NodeLoader over the feature/graph stores, and the documented example."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import terastack.gnn as gnn_pkg
from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.hotness import presample
from terastack.gnn.training.models import GNN
from terastack.gnn.sampling.pipeline import Pipeline
from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.train import GnnTrainer, train_epoch


def in_memory_pyg(ds, sampler, kind, epochs, batch_size, lr=0.01):
    """Reference: all features in a tensor, the plain PyG loop (sample, index, train)."""
    x_all = torch.from_numpy(ds.read_features())
    y_all = torch.from_numpy(ds.labels).long()
    torch.manual_seed(0)
    model = GNN(kind, ds.feat_dim, 32, ds.num_classes, sampler.hops)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        for k, seeds in enumerate(epoch_batches(ds.splits["train"], batch_size, seed=sampler.config.seed,
                                                epoch=epoch)):
            b = sampler.sample(seeds, sampler.batch_rng(epoch, k))
            n_id = torch.from_numpy(b.n_id)
            data = b.to_data(x_all[n_id], y_all[n_id])
            opt.zero_grad()
            out = model(data.x, data.edge_index)[: data.batch_size]
            loss = F.cross_entropy(out, data.y[: data.batch_size])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return losses, model


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_out_of_core_loss_curve_is_identical_to_in_memory(tiny, kind):
    ds = open_dataset(tiny)
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 3), seed=4)
    ref, ref_model = in_memory_pyg(ds, sampler, kind, epochs=2, batch_size=100)
    hot = presample(sampler, ds.splits["train"], 100, seed=4)["node"]
    with UnifiedCache(ds, hot.order(), device_budget=80 * ds.row_bytes,
                      host_budget=ds.num_nodes * 4 + 300 * ds.row_bytes) as cache:
        torch.manual_seed(0)
        model = GNN(kind, ds.feat_dim, 32, ds.num_classes, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        pipe = Pipeline(sampler, cache, ds.labels)
        epochs = [train_epoch(pipe, model, opt, ds.splits["train"], batch_size=100, epoch=e, progress=False)
                  for e in range(2)]
        assert min(e["miss_rate"] for e in epochs) > 0  # the SSD really served part of every epoch
    losses = [loss for e in epochs for loss in e["losses"]]
    assert losses == ref  # bit-identical features, same seeds: the very same curve
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def test_trainer_end_to_end_learns_and_reports(tiny):
    result = GnnTrainer(gnn_job(data=str(tiny), fanouts="5,5", batch_size=64, epochs=3, hidden=32,
                                          lr=0.01, device_cache="4KiB", host_cache="40KiB", eval_nodes=-1), progress=False).run()
    assert result["accuracy"] > 0.25 + 0.2  # 4 classes: chance is 0.25
    e = result["epochs"][-1]
    assert e["device_hit_rate"] > 0 and e["host_hit_rate"] > 0 and e["miss_rate"] > 0
    assert e["ssd_calls_per_batch"] == pytest.approx(1.0)
    assert result["cache"]["io"] == "O_DIRECT"
    assert np.mean(result["loss_curve"][-10:]) < np.mean(result["loss_curve"][:10])


def test_trainer_config_errors_name_the_field(tiny):
    for field, value, message in [("fanouts", "5,0", "fanouts"), ("model", "mlp", "model"),
                                  ("host_cache", "-1", "host_cache"), ("batch_size", 0, "batch_size")]:
        with pytest.raises(ValueError, match=message):
            gnn_job(data=str(tiny), **{field: value})


def test_stores_serve_pyg_s_own_loader_path(tiny):
    """PyG's loader over (FeatureStore, GraphStore) joins a sampler's output with the stores through
    ``filter_custom_store``; over terastack's stores it gives the dataset's rows, labels and edges."""
    from torch_geometric.loader.utils import filter_custom_store

    from terastack.gnn.pyg import stores

    ds = open_dataset(tiny)
    ref = torch.from_numpy(ds.read_features())
    fs, gs = stores(ds, host_cache=ds.num_nodes * 4 + 500 * ds.row_bytes)
    try:
        assert torch.equal(fs[None, "x", torch.tensor([3, 1, 2999])], ref[[3, 1, 2999]])
        assert fs.get_tensor_size(attr_name="x", group_name=None) == (ds.num_nodes, ds.feat_dim)
        row, colptr = gs.get_edge_index(edge_type=None, layout="csc")
        assert torch.equal(colptr, torch.from_numpy(ds.indptr)) and len(row) == ds.num_edges
        sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(4, 2))
        b = sampler.sample(ds.splits["train"][:50], np.random.default_rng(0))
        batch = filter_custom_store(fs, gs, torch.from_numpy(b.n_id), torch.from_numpy(b.row),
                                    torch.from_numpy(b.col), None)
        assert torch.equal(batch.x, ref[b.n_id]) and torch.equal(batch.y, torch.from_numpy(ds.labels).long()[b.n_id])
        assert fs.placed.features.stats.snapshot()["misses"] > 0
        with pytest.raises(ValueError, match="read-only"):
            fs[None, "x", None] = torch.zeros(2, 2)
    finally:
        fs.placed.close()


def test_the_documented_example_runs(tiny):
    code = re.search(r"Train your own PyG model.*?::\n\n(.*?)\n\nThe loader samples", gnn_pkg.__doc__, re.S).group(1)
    code = "\n".join(line[4:] for line in code.splitlines())
    namespace = {"DATA_DIR": str(tiny)}
    exec(compile(code, "terastack.gnn docstring", "exec"), namespace)  # noqa: S102 - our own docstring
    stats = namespace["loader"].placed.features.stats.snapshot()
    assert stats["rows"] > 0 and stats["batches"] == 2 * -(-600 // 1024)


def test_memory_mapped_topology_trains_identically(tiny):
    common = dict(data=str(tiny), fanouts="4,3", batch_size=100, epochs=1, hidden=16, host_cache="30KiB",
                  eval_nodes=0)
    a = GnnTrainer(gnn_job(**common), progress=False).run()
    b = GnnTrainer(gnn_job(topology="mmap", **common), progress=False).run()
    assert a["loss_curve"] == b["loss_curve"]
