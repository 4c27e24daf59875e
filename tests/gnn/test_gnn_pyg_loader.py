"""``terastack.gnn.pyg.NeighborLoader`` as a PyG user drops it in: over a homogeneous and a heterogeneous dataset it
hands out the dataset's rows, labels and edges (checked against the dataset read directly) in PyG's batch
layout, and a small PyG model of the user's own trains on it above chance; ``stores`` serves either kind."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from terastack.gnn.pyg import NeighborLoader, stores
from terastack.gnn.storage.dataset import open_dataset


def in_neighbours(topology, v: int) -> set:
    return set(np.asarray(topology.indices[topology.indptr[v]:topology.indptr[v + 1]]).tolist())


def test_homogeneous_batches_are_the_dataset_s_rows_labels_and_edges(tiny):
    ds = open_dataset(tiny)
    x, y = torch.from_numpy(ds.read_features()), torch.from_numpy(ds.labels).long()
    train = torch.from_numpy(ds.splits["train"])
    with NeighborLoader(str(tiny), num_neighbors=[4, 3], input_nodes=train, batch_size=128, shuffle=True,
                        host_cache=ds.num_nodes * 4 + 300 * ds.row_bytes, seed=1) as loader:
        seen = []
        for batch in loader:
            assert {"x", "y", "edge_index", "n_id", "num_sampled_nodes", "num_sampled_edges", "input_id",
                    "batch_size"} <= set(batch.keys())
            bs = batch.batch_size
            assert torch.equal(batch.x, x[batch.n_id]) and torch.equal(batch.y, y[batch.n_id])
            assert torch.equal(train[batch.input_id], batch.n_id[:bs])  # PyG: input_id indexes input_nodes
            assert sum(batch.num_sampled_nodes) == len(batch.n_id) and sum(batch.num_sampled_edges) == \
                batch.edge_index.shape[1]
            src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
            assert all(s in in_neighbours(ds.topology, d) for s, d in zip(src.tolist()[:300], dst.tolist()[:300]))
            seen.append(batch.n_id[:bs])
        assert len(seen) == len(loader) == -(-len(train) // 128)
        assert torch.equal(torch.sort(torch.cat(seen)).values, torch.sort(train).values)  # every seed once
        first = next(iter(loader))  # the next epoch: another order
        assert not torch.equal(first.n_id[:first.batch_size], seen[0]) and loader.placed.pipeline.config.overlap
        assert loader.placed.features.stats.snapshot()["misses"] > 0  # the SSD served part of it


def test_a_pyg_model_trains_above_chance_on_it(tiny):
    from torch_geometric.nn import SAGEConv

    ds = open_dataset(tiny)

    class Net(torch.nn.Module):  # what a PyG user writes
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv(ds.feat_dim, 32), SAGEConv(32, ds.num_classes)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train = NeighborLoader(ds, [5, 5], input_nodes=torch.from_numpy(ds.splits["train"]), batch_size=64, shuffle=True)
    for _ in range(4):
        for batch in train:
            opt.zero_grad()
            F.cross_entropy(model(batch.x, batch.edge_index)[:batch.batch_size], batch.y[:batch.batch_size]).backward()
            opt.step()
    correct = total = 0
    with torch.no_grad():
        for batch in NeighborLoader(ds, [5, 5], input_nodes=torch.from_numpy(ds.splits["test"]), batch_size=300):
            pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(-1)
            correct, total = correct + int((pred == batch.y[:batch.batch_size]).sum()), total + batch.batch_size
    assert total == len(ds.splits["test"]) and correct / total > 0.25 + 0.2  # 4 classes


def test_heterogeneous_batches_are_the_dataset_s_rows_labels_and_edges(hetero):
    ds = open_dataset(hetero)
    feats = {t: torch.from_numpy(ds.read_type_features(t)) for t in ds.node_types if ds.feature_dims[t]}
    y = torch.from_numpy(ds.target_labels).long()
    mask = torch.zeros(ds.node_counts["paper"], dtype=torch.bool)
    mask[torch.from_numpy(ds.splits["train"])] = True
    fanouts = {et: [3, 2] for et in ds.edge_types}
    loader = NeighborLoader(ds, fanouts, input_nodes=("paper", mask), batch_size=100, host_cache="64KiB", seed=2)
    try:
        total = 0
        for batch in loader:
            paper = batch["paper"]
            assert set(batch.node_types) == set(ds.node_types) and set(batch.edge_types) == set(ds.edge_types)
            for t in ds.node_types:
                if t in feats:
                    assert torch.equal(batch[t].x, feats[t][batch[t].n_id]), t
                else:
                    assert "x" not in batch[t]  # no features, no x, as in PyG
                assert sum(batch[t].num_sampled_nodes) == len(batch[t].n_id)
            assert torch.equal(paper.y, y[paper.n_id]) and torch.equal(paper.input_id, paper.n_id[:paper.batch_size])
            assert mask[paper.n_id[:paper.batch_size]].all()
            for et in ds.edge_types:
                ei = batch[et].edge_index
                src, dst = batch[et[0]].n_id[ei[0]], batch[et[2]].n_id[ei[1]]
                assert all(s in in_neighbours(ds.topologies[et], d) for s, d in zip(src.tolist(), dst.tolist())), et
            total += paper.batch_size
        assert total == len(ds.splits["train"])
    finally:
        loader.close()
    with pytest.raises(ValueError, match="input_nodes: .*type"):
        NeighborLoader(ds, [2], input_nodes=torch.arange(5), batch_size=4)
    with pytest.raises(ValueError, match="disjoint: not served"):
        NeighborLoader(ds, [2], input_nodes="paper", batch_size=4, disjoint=True)


def test_a_heterogeneous_pyg_model_trains_above_chance_on_it(hetero):
    from torch_geometric.nn import SAGEConv

    ds = open_dataset(hetero)
    cites = ("paper", "cites", "paper")

    class Net(torch.nn.Module):  # a user's model over the papers and their citations
        def __init__(self):
            super().__init__()
            self.lin, self.conv = torch.nn.Linear(ds.feature_dims["paper"], 32), SAGEConv(32, ds.num_classes)

        def forward(self, batch):
            return self.conv(F.relu(self.lin(batch["paper"].x)), batch[cites].edge_index)

    torch.manual_seed(0)
    model, fanouts = Net(), {et: [4] if et == cites else [0] for et in ds.edge_types}
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NeighborLoader(ds, fanouts, input_nodes=("paper", torch.from_numpy(ds.splits["train"])), batch_size=64,
                            shuffle=True)
    for _ in range(3):
        for batch in loader:
            bs = batch["paper"].batch_size
            opt.zero_grad()
            F.cross_entropy(model(batch)[:bs], batch["paper"].y[:bs]).backward()
            opt.step()
    test = NeighborLoader(ds, fanouts, input_nodes=("paper", torch.from_numpy(ds.splits["test"])), batch_size=1000)
    with torch.no_grad():
        batch = next(iter(test))
        bs = batch["paper"].batch_size
        acc = float((model(batch)[:bs].argmax(-1) == batch["paper"].y[:bs]).float().mean())
    assert bs == len(ds.splits["test"]) and acc > 0.25 + 0.2  # 4 classes


def test_stores_give_either_kind_to_pyg(hetero):
    ds = open_dataset(hetero)
    fs, gs = stores(ds, host_cache="32KiB")
    try:
        ids = torch.tensor([5, 0, 899])
        assert torch.equal(fs["author", "x", ids], torch.from_numpy(ds.read_type_features("author"))[ids])
        assert torch.equal(fs["paper", "y", ids], torch.from_numpy(ds.target_labels).long()[ids])
        assert fs.get_tensor_size(group_name="paper", attr_name="x") == (1200, 16)
        assert {a.group_name for a in fs.get_all_tensor_attrs()} == {"paper", "author", "fos"}
        attrs = {a.edge_type: a for a in gs.get_all_edge_attrs()}
        assert set(attrs) == set(ds.edge_types) and attrs[("paper", "written_by", "author")].size == (1200, 900)
        row, colptr = gs.get_edge_index(edge_type=("paper", "cites", "paper"), layout="csc")
        topo = ds.topologies[("paper", "cites", "paper")]
        assert torch.equal(colptr, torch.from_numpy(np.asarray(topo.indptr))) and len(row) == len(topo.indices)
    finally:
        fs.placed.close()
