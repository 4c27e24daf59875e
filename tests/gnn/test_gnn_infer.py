"""`terastack gnn infer`: layer-wise full-graph inference out of core equals the PyG model applied to the
whole graph in memory, for SAGE, GCN and GAT; checkpoints load only weights and refuse damaged files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from terastack.cli import main
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.storage.gen import generate
from terastack.gnn.training.infer import GnnInference
from terastack.gnn.training.models import load_model
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.train import GnnTrainer


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """500 nodes (a few with self-loops from R-MAT), 12 fp32 features, 3 classes."""
    out = tmp_path_factory.mktemp("infer") / "small"
    generate(out, 500, progress=False, memory_budget="64MiB", avg_degree=6, feat_dim=12, classes=3,
             train_fraction=0.4, val_fraction=0.2, test_fraction=0.2)
    return out


def _in_memory_logits(model, data) -> torch.Tensor:
    """The reference: the PyG model applied to the whole graph's edge_index, everything in memory."""
    ds = open_dataset(data)
    dst = np.repeat(np.arange(ds.num_nodes), np.diff(ds.indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(ds.indices, np.int64), dst]))
    with torch.no_grad():
        return model.eval()(torch.from_numpy(ds.read_features()).float(), edge_index)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_infer_equals_full_graph_in_memory(small, tmp_path, kind):
    ckpt = tmp_path / "model.pt"
    trained = GnnTrainer(gnn_job(data=str(small), model=kind, hidden=16, fanouts=(4, 3), batch_size=64,
                                           epochs=1, host_cache="16KiB", eval_nodes=50, save_model=str(ckpt)), progress=False).run()
    assert trained["saved_model"] == str(ckpt) and (tmp_path / "model.pt.json").is_file()
    model, meta = load_model(ckpt)
    assert meta["model"]["kind"] == kind and meta["dataset"]["nodes"] == 500
    # chunks of 37 destination nodes: most in-neighbours lie outside the chunk; the cache holds few rows
    result = GnnInference(GnnInference.Config(data=str(small), checkpoint=str(ckpt), out=str(tmp_path / "p.npy"),
                                              embeddings=str(tmp_path / "e.npy"), chunk_nodes=37,
                                              host_cache="8KiB", work_dir=str(tmp_path / "work"),
                                              progress=False)).run()
    ref = _in_memory_logits(model, small)
    logits = np.load(tmp_path / "e.npy", mmap_mode="r")
    preds = np.load(tmp_path / "p.npy", mmap_mode="r")
    assert isinstance(preds, np.memmap) and preds.dtype == np.int64 and preds.shape == (500,)
    assert logits.shape == (500, 3) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, ref.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(preds, ref.argmax(dim=-1).numpy())
    assert result["input_reads"]["miss_rate"] > 0 and len(result["layers"]) == 2
    assert list((tmp_path / "work").iterdir()) == []  # the layers' outputs are removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "model.pt", "model.pt.json", "p.npy", "work"]


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_infer_with_self_loops_and_isolated_nodes(tmp_path, kind):
    """Self-loops (which GCN's normalisation replaces) and nodes without in-edges, imported from PyG."""
    from torch_geometric.data import Data

    from terastack.gnn import from_pyg, save_model
    from terastack.gnn.training.models import GNN

    gen = torch.Generator().manual_seed(1)
    n = 300
    src, dst = torch.randint(0, n, (2, 1500), generator=gen)
    keep = dst >= 20  # nodes 0..19 have no in-edges
    loops = torch.arange(40, 120)
    edge_index = torch.cat([torch.stack([src[keep], dst[keep]]), torch.stack([loops, loops])], dim=1)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[:100] = True
    data = Data(x=torch.randn(n, 6, generator=gen), edge_index=edge_index, y=torch.randint(0, 4, (n,), generator=gen),
                train_mask=mask, val_mask=torch.roll(mask, 100), test_mask=torch.roll(mask, 200))
    from_pyg(data, tmp_path / "d")
    torch.manual_seed(2)
    model = GNN(kind, 6, 10, 4, 3)
    save_model(model, tmp_path / "m.pt")
    GnnInference(GnnInference.Config(data=str(tmp_path / "d"), checkpoint=str(tmp_path / "m.pt"),
                                     embeddings=str(tmp_path / "e.npy"), chunk_nodes=29, host_cache="4KiB",
                                     progress=False)).run()
    ref = _in_memory_logits(model, tmp_path / "d")
    np.testing.assert_allclose(np.load(tmp_path / "e.npy", mmap_mode="r"), ref.numpy(), rtol=0, atol=1e-5)


def test_train_reports_val_and_test_per_epoch_and_infer_cli(small, tmp_path, capsys):
    ckpt = tmp_path / "m.pt"
    argv = ["gnn", "train", "--data", str(small), "--fanouts", "4,3", "--batch-size", "64", "--epochs", "2",
            "--hidden", "16", "--host-cache", "16KiB", "--eval-nodes", "40", "--save-model", str(ckpt), "--quiet"]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["epochs"]) == 2
    for e in r["epochs"]:
        assert 0 <= e["val_acc"] <= 1 and 0 <= e["test_acc"] <= 1
    assert r["accuracy"] == r["test_acc"] == r["epochs"][-1]["test_acc"]
    assert r["val_acc_per_epoch"] == [e["val_acc"] for e in r["epochs"]]
    assert main(argv + ["--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "val acc" in out and "test acc" in out and f"model saved to {ckpt}" in out
    assert main(["gnn", "infer", "--data", str(small), "--checkpoint", str(ckpt), "--out", str(tmp_path / "p.npy"),
                 "--quiet", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["out"] == str(tmp_path / "p.npy") and r["embeddings"] is None and 0 <= r["test_acc"] <= 1
    assert np.load(tmp_path / "p.npy", mmap_mode="r").shape == (500,)


def test_checkpoint_errors_name_the_file(small, tmp_path, capsys):
    ckpt = tmp_path / "m.pt"
    GnnTrainer(gnn_job(data=str(small), hidden=8, fanouts=(2,), epochs=0, eval_nodes=0,
                                 save_model=str(ckpt)), progress=False).run()
    data = bytearray(ckpt.read_bytes())
    data[-30] ^= 1
    ckpt.write_bytes(bytes(data))
    code = main(["gnn", "infer", "--data", str(small), "--checkpoint", str(ckpt), "--out", str(tmp_path / "p.npy")])
    err = capsys.readouterr().err
    assert code == 2 and "m.pt: size or SHA-256 differs from m.pt.json" in err
    assert not (tmp_path / "p.npy").exists()
    with pytest.raises(ValueError, match="ends in .json"):
        gnn_job(data=str(small), save_model=str(tmp_path / "m.json"))
    with pytest.raises(ValueError, match="out, embeddings"):
        GnnInference.Config(data=str(small), checkpoint=str(ckpt))


def test_a_checkpoint_of_the_other_graph_kind_is_refused(small, hetero, tmp_path):
    ckpt = tmp_path / "m.pt"
    GnnTrainer(gnn_job(data=str(small), hidden=8, fanouts=(2,), epochs=0, eval_nodes=0,
                                 save_model=str(ckpt)), progress=False).run()
    with pytest.raises(ValueError, match="holds a homogeneous model; .* is a heterogeneous dataset"):
        GnnInference(GnnInference.Config(data=str(hetero), checkpoint=str(ckpt), out=str(tmp_path / "p.npy"),
                                         progress=False)).run()
    assert not (tmp_path / "p.npy").exists()


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_infer_with_topology_on_ssd_equals_topology_in_memory(small, tmp_path, kind):
    ckpt = tmp_path / "model.pt"
    GnnTrainer(gnn_job(data=str(small), model=kind, hidden=8, fanouts=(3, 3), batch_size=64, epochs=1,
                                 host_cache="16KiB", eval_nodes=0, save_model=str(ckpt)), progress=False).run()
    outs = {}
    for topology in ("memory", "ssd"):
        GnnInference(GnnInference.Config(data=str(small), checkpoint=str(ckpt), embeddings=str(tmp_path / f"{topology}.npy"),
                                         chunk_nodes=37, host_cache="8KiB", topology=topology, progress=False)).run()
        outs[topology] = np.load(tmp_path / f"{topology}.npy")
    np.testing.assert_array_equal(outs["ssd"], outs["memory"])
