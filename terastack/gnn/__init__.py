"""terastack.gnn: out-of-core GNN training (features and topology on SSD, a unified static cache, a pipeline that
overlaps sampling, I/O and training, and a throughput-per-cost model), one path for homogeneous and
heterogeneous graphs.

Train your own PyG model on a dataset larger than memory::

    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv
    from terastack.gnn import open_dataset
    from terastack.gnn.pyg import NeighborLoader

    class MyModel(torch.nn.Module):                    # any PyG model taking (x, edge_index)
        def __init__(self, d_in, d_hidden, d_out):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv(d_in, d_hidden), SAGEConv(d_hidden, d_out)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    ds = open_dataset(DATA_DIR)                        # checks sizes, structure and checksums
    loader = NeighborLoader(ds, num_neighbors=[15, 10], input_nodes=ds.splits["train"], batch_size=1024,
                            shuffle=True, device_cache="64MiB", host_cache="512MiB")  # PyG's loader, on the SSD
    model = MyModel(ds.feat_dim, 128, ds.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(2):
        for batch in loader:                           # a torch_geometric Data, as PyG's NeighborLoader gives
            opt.zero_grad()
            out = model(batch.x.float(), batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
    print(loader.placed.features.stats.snapshot())    # per-tier hit rates, SSD bytes
    loader.close()

The loader samples and gathers the next batches while the model trains on this one. Make a dataset with
``terastack gnn gen`` or ``terastack gnn import --from DIR`` (OGB, IGB, ogbn-mag, MAG240M, IGBH, ``.npy``; see
docs/gnn.md) or ``from_pyg(data, out_dir)``; train from the shell with ``terastack gnn train`` (a job: flags, a
``--config`` file, overrides, ``--checkpoint`` / ``--resume``, ``--save-model``), predict every node out of core
with ``terastack gnn infer``, ask which hardware gives the most epochs per dollar with ``terastack gnn advise``. A
heterogeneous dataset goes through the same calls (``NeighborLoader`` yields ``HeteroData``; R-GCN or
``to_hetero(GraphSAGE)`` train on it); :func:`terastack.gnn.pyg.stores` serves either kind to PyG's own loaders.
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
    "presample": "terastack.gnn.sampling.hotness", "Hotness": "terastack.gnn.sampling.hotness",
    "UnifiedCache": "terastack.gnn.storage.cache", "InMemoryFeatures": "terastack.gnn.storage.baselines",
    "MmapFeatures": "terastack.gnn.storage.baselines", "FeatureSource": "terastack.gnn.storage.cache",
    "TypedFeatures": "terastack.gnn.storage.features", "Placement": "terastack.gnn.graph_placement",
    "Pipeline": "terastack.gnn.sampling.pipeline", "PipelineError": "terastack.gnn.sampling.pipeline",
    "GNN": "terastack.gnn.training.models", "HeteroGNN": "terastack.gnn.training.hetero_net",
    "GnnTrainer": "terastack.gnn.training.train", "GnnInference": "terastack.gnn.training.infer",
    "GnnJob": "terastack.gnn.settings", "gnn_job": "terastack.gnn.settings",
    "save_model": "terastack.gnn.training.models", "load_model": "terastack.gnn.training.models",
    "NeighborLoader": "terastack.gnn.pyg", "stores": "terastack.gnn.pyg",
    "from_pyg": "terastack.gnn.formats.pyg_data", "import_directory": "terastack.gnn.formats.detect",
    "detect_layout": "terastack.gnn.formats.detect",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Imported on first use, so `terastack --help` does not pay for torch_geometric.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'terastack.gnn' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
