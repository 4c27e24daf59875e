"""`terastack gnn train / infer / verify` on a heterogeneous dataset: per-relation fanouts from the command line,
train/val/test accuracy per epoch, a saved model, and full-neighbourhood predictions for the target type equal to
the model applied to the whole graph in memory."""
from __future__ import annotations

from terastack.gnn.storage.dataset import open_dataset

import json

import numpy as np
import pytest
import torch

from terastack.cli import main
from terastack.gnn.training.models import load_model


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("model", ["sage", "rgcn"])
def test_train_then_infer_equals_the_whole_graph(hetero, tmp_path, capsys, model):
    ckpt = tmp_path / "model.pt"
    code, out, _ = run(capsys, "gnn", "train", "--data", str(hetero), "--model", model, "--hidden", "16",
                       "--fanouts", "cites=4,3;written_by=0,2;*=3,2", "--batch-size", "128", "--epochs", "2",
                       "--eval-nodes", "200", "--host-cache", "96KiB", "--topology", "ssd", "--save-model",
                       str(ckpt), "--json", "--quiet", "--threads", "1")
    assert code == 0
    result = json.loads(out)
    assert result["fanouts"]["paper___cites___paper"] == [4, 3]
    assert result["fanouts"]["paper___written_by___author"] == [0, 2]
    assert len(result["epochs"]) == 2 and all(len(result[f"{k}_acc_per_epoch"]) == 2 for k in ("train", "val", "test"))
    assert result["test_acc"] > 0.5  # 4 classes; the features and the cited papers predict them
    ds = open_dataset(hetero)
    net, meta = load_model(ckpt)
    assert meta["test_acc"] == result["test_acc"]

    preds, logits = tmp_path / "preds.npy", tmp_path / "logits.npy"
    code, out, _ = run(capsys, "gnn", "infer", "--data", str(hetero), "--checkpoint", str(ckpt), "--out", str(preds),
                       "--embeddings", str(logits), "--chunk-nodes", "300", "--host-cache", "64KiB", "--json",
                       "--quiet", "--threads", "1")
    assert code == 0
    inferred = json.loads(out)
    x = {t: torch.from_numpy(ds.read_type_features(t)).float() for t in ds.node_types}
    ei = {}
    for et, topo in ds.topologies.items():
        dst = np.repeat(np.arange(len(topo.indptr) - 1), np.diff(topo.indptr))
        ei[et] = torch.from_numpy(np.stack([topo.indices.astype(np.int64), dst]))
    with torch.no_grad():
        full = net(x, ei).numpy()
    got = np.load(logits)
    assert got.shape == (ds.node_counts["paper"], ds.num_classes)
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.load(preds), full.argmax(1))
    test = ds.splits["test"]
    assert inferred["test_acc"] == pytest.approx(float(np.mean(full.argmax(1)[test] == ds.target_labels[test])))


def test_train_prints_accuracies_and_verify(hetero, capsys):
    code, out, _ = run(capsys, "gnn", "train", "--data", str(hetero), "--model", "rgcn", "--hidden", "8", "--fanouts",
                       "2,2", "--batch-size", "200", "--epochs", "1", "--eval-nodes", "50", "--quiet", "--threads", "1")
    assert code == 0
    assert "epoch 0:" in out and "train acc" in out and "val acc" in out and "test acc" in out
    code, out, _ = run(capsys, "gnn", "verify", "--data", str(hetero), "--json")
    assert code == 0 and json.loads(out)["verified"] == "checksums (full)"


def test_homogeneous_models_are_refused_by_name(hetero, capsys):
    code, _, err = run(capsys, "gnn", "train", "--data", str(hetero), "--model", "gat", "--quiet")
    assert code == 2 and "model" in err and "sage, rgcn" in err


def test_advise_refuses_a_heterogeneous_dataset_in_one_line_naming_what_it_serves(hetero, capsys):
    code, out, err = run(capsys, "gnn", "advise", "--data", str(hetero), "--no-calibrate")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert "is a heterogeneous dataset" in lines[0] and "predicts the epochs of homogeneous ones" in lines[0]
    assert "terastack-gnn-hetero" not in lines[0]  # not the manifest's format, as it once said
