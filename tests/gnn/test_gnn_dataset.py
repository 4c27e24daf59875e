"""Dataset format, generator, CSC construction, resumable builds and bad-input errors."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from terastack.gnn.storage import build as build_mod
from terastack.gnn.storage.build import BuildState, CSCBuilder, FeatureWriter
from terastack.gnn.storage.dataset import DatasetError, open_dataset
from terastack.gnn.storage.manifest import FILES, MANIFEST, write_manifest
from terastack.gnn.storage.gen import generate


def test_csc_builder_matches_numpy_with_many_buckets_and_subranges(tmp_path, reference_csc):
    n = 5000
    rng = np.random.default_rng(1)
    # skewed destinations: many edges into a few nodes, so some buckets must be split into sub-ranges
    dst = np.concatenate([rng.integers(0, n, 60_000), rng.integers(0, 40, 40_000)])
    src = rng.integers(0, n, len(dst))
    state = BuildState(tmp_path, {"t": 1})
    # 48 bytes per edge in the sort: 1 MiB holds ~21k edges, so ~5 buckets and skewed ones get split
    b = CSCBuilder(state, num_nodes=n, expected_edges=len(dst), memory_budget=1 << 20, progress=False)
    assert b.buckets > 1
    for s in range(0, len(dst), 25_000):
        b.add_chunk(src[s:s + 25_000], dst[s:s + 25_000])
    b.close_edges()
    assert any(len(b._subranges(k, k * b.nodes_per_bucket, min(n, (k + 1) * b.nodes_per_bucket))) > 1
               for k in range(b.buckets))
    edges = b.build()
    indptr = np.fromfile(tmp_path / FILES["indptr"], np.int64)
    indices = np.fromfile(tmp_path / FILES["indices"], np.int32)
    ref_ptr, ref_idx = reference_csc(src, dst, n, drop_self_loops=True)
    assert edges == len(ref_idx)
    np.testing.assert_array_equal(indptr, ref_ptr)
    np.testing.assert_array_equal(indices, ref_idx)


def test_generated_dataset_is_valid_and_learnable_structure(tiny):
    ds = open_dataset(tiny)
    assert ds.num_nodes == 3000 and ds.feat_dim == 16 and ds.num_classes == 4
    deg = np.diff(ds.indptr)
    assert deg.sum() == ds.num_edges > 0
    # undirected: the edge set equals its transpose
    dst = np.repeat(np.arange(ds.num_nodes), deg)
    fwd = set(zip(ds.indices.tolist(), dst.tolist()))
    assert fwd == {(b, a) for a, b in fwd}
    assert not any(a == b for a, b in fwd)  # no self-loops
    assert deg.max() > 5 * deg.mean()       # power law: hubs far above the mean
    # features carry the label signal: class means are far apart compared with their spread
    x = ds.read_features()
    means = np.stack([x[ds.labels == c].mean(0) for c in range(4)])
    assert np.linalg.norm(means[0] - means[1]) > 1.0
    splits = ds.splits
    assert len(splits["train"]) == 600 and len(splits["val"]) == 150 and len(splits["test"]) == 300
    assert not set(splits["train"]) & set(splits["test"])


def _digests(root) -> dict:
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in FILES.values()}


def test_interrupted_generation_resumes_to_identical_bytes(tmp_path, monkeypatch):
    kwargs = dict(avg_degree=10, feat_dim=64, classes=4, memory_budget="20MiB", progress=False)
    generate(tmp_path / "whole", 30_000, **kwargs)

    calls = {"chunks": 0, "commits": 0}
    real_add, real_commit = CSCBuilder.add_chunk, FeatureWriter._commit

    def failing_add(self, *a, **k):
        calls["chunks"] += 1
        if calls["chunks"] == 2:
            raise KeyboardInterrupt("simulated crash during edge generation")
        return real_add(self, *a, **k)

    def failing_commit(self, *a, **k):
        calls["commits"] += 1
        if calls["commits"] == 2:
            raise KeyboardInterrupt("simulated crash during feature writing")
        return real_commit(self, *a, **k)

    monkeypatch.setattr(CSCBuilder, "add_chunk", failing_add)
    monkeypatch.setattr(FeatureWriter, "_commit", failing_commit)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt, match="edge generation"):
        generate(out, 30_000, **kwargs)
    with pytest.raises(DatasetError, match="interrupted"):
        open_dataset(out)
    with pytest.raises(KeyboardInterrupt, match="feature writing"):
        generate(out, 30_000, **kwargs)
    state = json.loads((out / build_mod.STATE).read_text())
    assert state["stages"]["edges"]["done"] and 0 < state["stages"]["features"]["rows"] < 30_000
    result = generate(out, 30_000, **kwargs)
    assert result["status"] == "resumed and completed"
    assert _digests(out) == _digests(tmp_path / "whole")
    assert not (out / build_mod.STATE).exists()
    assert generate(out, 30_000, **kwargs)["status"] == "already complete"
    # the memory budget changes how the work is chunked, never the dataset
    generate(tmp_path / "roomy", 30_000, **{**kwargs, "memory_budget": "512MiB"})
    assert _digests(tmp_path / "roomy") == _digests(out)
    with pytest.raises(DatasetError, match="other parameters"):
        generate(out, 30_000, **{**kwargs, "classes": 5})


@pytest.fixture
def copy_of(tiny, tmp_path):
    def make():
        dst = tmp_path / "copy"
        shutil.copytree(tiny, dst)
        return dst
    return make


def test_missing_and_truncated_files_are_named(copy_of):
    root = copy_of()
    os.truncate(root / "features.bin", os.path.getsize(root / "features.bin") - 64)
    with pytest.raises(DatasetError, match=r"features\.bin: .*truncated"):
        open_dataset(root)
    (root / "labels.bin").unlink()
    with pytest.raises(DatasetError, match=r"labels\.bin: file is missing"):
        open_dataset(root)


def test_checksum_mismatch_is_caught_even_with_a_stamp(copy_of):
    root = copy_of()
    open_dataset(root)  # full check, writes the stamp
    with open(root / "features.bin", "r+b") as f:  # same size, one byte changed
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DatasetError, match=r"features\.bin: checksum mismatch in bytes 0\.\."):
        open_dataset(root)
    assert "not checked" in open_dataset(root, verify="size").verified


def test_ids_out_of_range_are_refused_even_with_valid_checksums(copy_of):
    root = copy_of()
    ds = open_dataset(root)
    indices = ds.indices.copy()
    indices[7] = ds.num_nodes + 3
    indices.tofile(root / "indices.bin")
    m = json.loads((root / MANIFEST).read_text())
    write_manifest(root, num_nodes=m["num_nodes"], num_edges=m["num_edges"], feat_dim=m["feat_dim"],
                   feat_dtype=m["feat_dtype"], num_classes=m["num_classes"], index_dtype="int32", origin=m["origin"])
    with pytest.raises(DatasetError, match=r"indices\.bin: neighbour id 3003 at position 7 is out of range"):
        open_dataset(root)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("num_nodes"), "field num_nodes is missing"),
    (lambda m: m.update(feat_dtype="int8"), "field feat_dtype must be one of"),
    (lambda m: m["files"]["labels"].update(path="../../etc/passwd"), "escapes its directory"),
    (lambda m: m["files"]["features"].update(shape=[3000, 17]), "field files.features: is float32"),
    (lambda m: m.update(version=99), "field version is 99"),
])
def test_bad_manifest_fields_are_named(copy_of, edit, message):
    root = copy_of()
    m = json.loads((root / MANIFEST).read_text())
    edit(m)
    (root / MANIFEST).write_text(json.dumps(m))
    with pytest.raises((DatasetError, ValueError), match=message):
        open_dataset(root)


@pytest.mark.parametrize("field, value, message", [
    ("verify", "crc", "verify: must be one of"),
    ("topology", "disk", "topology: must be one of"),
    ("indptr", "ram", "indptr: must be one of"),
    ("topology_budget", -1, "topology_budget: must be >= 0"),
])
def test_read_settings_errors_name_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        open_dataset(tmp_path, **{field: value})


def test_not_a_dataset(tmp_path):
    with pytest.raises(DatasetError, match="manifest is missing"):
        open_dataset(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        open_dataset(tmp_path)


@pytest.mark.parametrize("field, value, message", [
    ("nodes", 1, "nodes: must be an integer >= 2"),
    ("classes", 1, "classes: must be in 2.."),
    ("train_fraction", 0.0, "train_fraction"),
    ("memory_budget", "1MiB", "memory_budget"),
    ("dtype", "int8", "dtype"),
])
def test_generator_config_errors_name_the_field(tmp_path, field, value, message):
    kwargs = {"nodes": 1000, field: value}
    with pytest.raises(ValueError, match=message):
        generate(tmp_path / "x", **kwargs)
