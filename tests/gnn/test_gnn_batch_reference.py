"""Homogeneous batches are bit-equal to a recorded reference.

``data/homogeneous_batches.json`` holds SHA-256 digests of the batches the homogeneous path gave (the sampled
node ids, the edge index, the hops' counts, the gathered feature rows and the labels of every batch of an
epoch), of the pre-sampled hotness ranking and of the cache placement it led to, on a small generated graph
with fixed seeds. It was recorded with the code as it stood before the homogeneous and heterogeneous paths
were made one (terastack.gnn.sampling.sampler [Note: sampling semantics]); the one path must give the same
bytes. The dataset's own arrays are digested too, so that a change of the generator is told apart from a
change of the sampler. Never re-record it to make this test pass.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

REFERENCE = Path(__file__).parent / "data" / "homogeneous_batches.json"

#: (name, topology, fanouts, replace, overlap, samplers, epoch, split, shuffle)
CASES = [
    ("memory-epoch0", "memory", (4, 3), False, True, 1, 0, "train", True),
    ("memory-epoch1-replace", "memory", (3, 2, 2), True, False, 1, 1, "train", True),
    ("ssd-every-neighbour", "ssd", (5, -1), False, True, 2, 0, "train", True),
    ("memory-eval", "memory", (4, 3), False, True, 1, 1 << 30, "val", False),
]
BATCH_SIZE = 64
HOST = 48 << 10


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def batch_digest(data) -> str:
    """One batch: node ids, edge index, hop counts, feature rows, labels."""
    return digest(data.n_id.numpy(), data.edge_index.numpy(), np.asarray(data.num_sampled_nodes),
                  np.asarray(data.num_sampled_edges), data.x.numpy(), data.y.numpy(), np.asarray([data.batch_size]))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from terastack.gnn.storage.gen import generate

    out = tmp_path_factory.mktemp("gnn") / "reference"
    generate(out, 1500, avg_degree=6, feat_dim=8, classes=4, train_fraction=0.2, val_fraction=0.1,
             test_fraction=0.1, seed=0, progress=False, memory_budget="64MiB")
    return out


def observe(root) -> dict:
    """The digests of the homogeneous path through the one placement call: placement and every case's batches."""
    from terastack.gnn.graph_placement import Placement
    from terastack.gnn.storage.dataset import open_dataset

    out = {"cases": {}}
    for name, topology, fanouts, replace, overlap, samplers, epoch, split, shuffle in CASES:
        ds = open_dataset(root, topology=topology, indptr="ssd", topology_budget=HOST)
        if name == CASES[0][0]:
            out["dataset"] = digest(np.asarray(ds.indptr), np.asarray(ds.indices), ds.read_features(), ds.labels,
                                    ds.splits["train"], ds.splits["val"])
        with Placement(ds, fanouts=fanouts, replace=replace, seed=3, batch_size=BATCH_SIZE, presample_epochs=2,
                       device_cache=8 << 10, host_cache=HOST, device="cpu", overlap=overlap, samplers=samplers) as p:
            cache = p.features.sources[ds.target]
            placement = {"ranking": digest(p.hot.order()), "counts": digest(p.hot.counts, p.hot.expansions),
                         "device_rows": digest(cache.device_ids), "host_rows": digest(cache.host_ids)}
            if topology == "ssd":
                placement["lists"] = digest(ds.topology.hot.ids)
            batches = [batch_digest(b) for b in p.pipeline.epoch(ds.splits[split], BATCH_SIZE, epoch=epoch,
                                                                 shuffle=shuffle, shard=False)]
        ds.close()
        out["cases"][name] = {"placement": placement, "batches": batches}
    return out


def test_homogeneous_batches_equal_the_recorded_reference(graph):
    expected = json.loads(REFERENCE.read_text())
    seen = observe(graph)
    assert seen["dataset"] == expected["dataset"], "the generator changed: the reference graph is another graph"
    for name, case in expected["cases"].items():
        assert seen["cases"][name]["placement"] == case["placement"], name
        assert len(seen["cases"][name]["batches"]) == len(case["batches"]), name
        differ = [k for k, (a, b) in enumerate(zip(seen["cases"][name]["batches"], case["batches"])) if a != b]
        assert differ == [], f"{name}: batches {differ} differ from the reference"
