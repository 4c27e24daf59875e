"""Benchmarks on a GPU machine, checked without one: with device "auto" resolving to CUDA every contender's model
sits where its batches arrive, and the in-memory feature source fills a batch on another device. A fake
accelerator stands in: torch.cuda.is_available patched, the "meta" device taking CUDA's place for tensors."""
from types import SimpleNamespace

import numpy as np
import torch

from terastack.gnn.bench import reference as bench
from terastack.gnn.storage.baselines import InMemoryFeatures


def test_bench_device_follows_auto(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert bench.bench_device() == torch.device("cuda", 1)  # by index: the pipeline's threads would pick 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.bench_device() == torch.device("cpu")


def test_models_and_plain_batches_go_to_the_bench_device(monkeypatch):
    args = SimpleNamespace(seed=0, model="sage", hidden=8, fanouts="2,2", lr=0.01)
    ds = SimpleNamespace(feat_dim=4, num_classes=3)
    monkeypatch.setattr(bench, "bench_device", lambda: torch.device("meta"))
    model, _ = bench.bench_model(args, ds)
    assert all(p.device.type == "meta" for p in model.parameters())
    cpu_model, _ = bench.bench_model(args, ds, torch.device("cpu"))
    moved = []
    data = SimpleNamespace(x=torch.zeros(5, 4), to=lambda device: moved.append(device) or "moved")  # a PyG batch
    assert bench.on_model(model, data) == "moved" and moved == [torch.device("meta")]
    assert bench.on_model(cpu_model, data) is data  # the CPU path is unchanged


def test_in_memory_features_fill_a_batch_on_another_device():
    feats = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    src = InMemoryFeatures(feats)
    ids = np.array([3, 1, 7])
    out = src.gather(ids, torch.empty(3, 4, device="meta"))  # a CUDA batch on a GPU machine
    assert out.device.type == "meta"
    host = src.gather(ids, torch.empty(3, 4))
    assert torch.equal(host, feats[[3, 1, 7]])
