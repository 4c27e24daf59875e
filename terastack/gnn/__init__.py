"""terastack.gnn: out-of-core GNN training (features and topology on SSD, a unified static cache,
a pipeline that overlaps sampling, I/O and training, and a throughput-per-cost model).

Train your own PyG model on a dataset larger than memory::

    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv
    from terastack.gnn import NeighborSampler, Pipeline, UnifiedCache, open_dataset, presample

    class MyModel(torch.nn.Module):                    # any PyG model taking (x, edge_index)
        def __init__(self, d_in, d_hidden, d_out):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv(d_in, d_hidden), SAGEConv(d_hidden, d_out)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    ds = open_dataset(DATA_DIR)                        # checks sizes, structure and checksums
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(15, 10), seed=0)
    train = ds.splits["train"]
    hot = presample(sampler, train, batch_size=1024)   # access counts -> cache placement
    cache = UnifiedCache(ds, hot.order(), device_budget="64MiB", host_budget="256MiB")
    loader = Pipeline(sampler, cache, ds.labels)       # samples k+2 | gathers k+1 | you train k
    model = MyModel(ds.feat_dim, 128, ds.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(2):
        for batch in loader.epoch(train, batch_size=1024, epoch=epoch):   # a torch_geometric Data
            opt.zero_grad()
            out = model(batch.x.float(), batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
    print(cache.stats.snapshot())                      # per-tier hit rates, SSD bytes
    cache.close()

``batch.x`` is valid until the next batch is requested (its memory is reused).
Make a dataset with ``terastack gnn gen`` or ``terastack gnn import --from DIR`` (an OGB
``ogbn_*`` directory in its CSV or npz form, an IGB ``<root>/<size>`` directory, or ``.npy``
arrays; see docs/gnn.md), or from a PyG graph in memory with ``from_pyg(data, out_dir)``; train
from the shell with ``terastack gnn train`` (``--save-model``), predict every node with full
neighbourhoods, layer by layer out of core, with ``terastack gnn infer``; ask which hardware gives the most
epochs per dollar with ``terastack gnn advise``. Heterogeneous graphs (ogbn-mag, MAG240M, IGBH, a PyG
``HeteroData``) import into a heterogeneous dataset (``open_hetero_dataset``) and train with
the same ``GnnTrainer`` (R-GCN or ``to_hetero(GraphSAGE)``; per-relation fanouts) through the same commands. PyG's own ``NodeLoader`` runs
over the same storage through :mod:`terastack.gnn.pyg`.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "open_dataset": "terastack.gnn.storage.dataset", "GraphDataset": "terastack.gnn.storage.dataset",
    "DatasetError": "terastack.gnn.storage.dataset",
    "GraphGenerator": "terastack.gnn.storage.gen", "generate": "terastack.gnn.storage.gen",
    "GraphImporter": "terastack.gnn.importer", "import_arrays": "terastack.gnn.importer",
    "NeighborSampler": "terastack.gnn.sampling.sampler", "SampledBatch": "terastack.gnn.sampling.sampler",
    "SsdTopology": "terastack.gnn.storage.topology", "ArrayTopology": "terastack.gnn.storage.topology",
    "DiskArray": "terastack.gnn.storage.topology",
    "presample": "terastack.gnn.storage.hotness", "Hotness": "terastack.gnn.storage.hotness",
    "UnifiedCache": "terastack.gnn.storage.cache", "InMemoryFeatures": "terastack.gnn.storage.baselines",
    "MmapFeatures": "terastack.gnn.storage.baselines", "FeatureSource": "terastack.gnn.storage.cache",
    "Pipeline": "terastack.gnn.sampling.pipeline", "PipelineError": "terastack.gnn.sampling.pipeline",
    "GNN": "terastack.gnn.training.models", "GnnTrainer": "terastack.gnn.training.train", "GnnInference": "terastack.gnn.training.infer",
    "save_model": "terastack.gnn.training.models", "load_model": "terastack.gnn.training.models",
    "TerastackFeatureStore": "terastack.gnn.pyg", "CSCGraphStore": "terastack.gnn.pyg",
    "PygNeighborSampler": "terastack.gnn.pyg",
    "from_pyg": "terastack.gnn.formats.pyg_data", "import_directory": "terastack.gnn.formats.detect",
    "detect_layout": "terastack.gnn.formats.detect",
    "HeteroDataset": "terastack.gnn.storage.hetero_dataset", "open_hetero_dataset": "terastack.gnn.storage.hetero_dataset",
    "HeteroNeighborSampler": "terastack.gnn.sampling.hetero_sampler", "hetero_presample": "terastack.gnn.storage.hotness",
    "HeteroGNN": "terastack.gnn.training.hetero_net", "HeteroPipeline": "terastack.gnn.sampling.pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Imported on first use, so `terastack --help` does not pay for torch_geometric.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'terastack.gnn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
