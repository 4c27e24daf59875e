"""Heterogeneous imports: tiny datasets in the exact on-disk layouts of ogbn-mag (OGB raw CSV), MAG240M and IGBH,
and ``from_pyg(HeteroData)``: every relation's CSC, every type's features and labels and the target's split equal
the sources (reverse edges as PyG's ToUndirected adds them), each import trains, and damaged sources are refused
with one line naming the file."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from terastack.cli import main
from terastack.gnn import from_pyg
from terastack.gnn.storage.dataset import DatasetError, open_dataset

C = 3
COUNTS = {"paper": 50, "author": 40, "institution": 7, "field_of_study": 11}
OGB_RELATIONS = [("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
                 ("paper", "cites", "paper"), ("paper", "has_topic", "field_of_study")]


def edges(seed, n_src, n_dst, e):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_src, e), rng.integers(0, n_dst, e)


def hetero_graph(relations=OGB_RELATIONS, counts=COUNTS, featured=("paper",), dim=6, dtype=np.float32):
    rng = np.random.default_rng(0)
    rel = {et: edges(i + 1, counts[et[0]], counts[et[2]], 3 * counts[et[2]]) for i, et in enumerate(relations)}
    feats = {t: rng.standard_normal((counts[t], dim + i)).astype(dtype) for i, t in enumerate(featured)}
    labels = rng.integers(0, C, counts["paper"])
    perm = rng.permutation(counts["paper"])
    split = {"train": np.sort(perm[:30]), "valid": np.sort(perm[30:40]), "test": np.sort(perm[40:])}
    return rel, feats, labels, split


def gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def rows(array):
    return "".join(",".join(repr(float(v)) if isinstance(v, (float, np.floating)) else str(int(v)) for v in np.atleast_1d(r))
                   + "\n" for r in array)


def write_ogb_mag(root):
    """ogbn-mag as ogb's download leaves it (read_csv_heterograph_raw, read_node_label_hetero, split/time)."""
    rel, feats, labels, split = hetero_graph()
    raw = root / "raw"
    gz(raw / "num-node-dict.csv.gz", ",".join(COUNTS) + "\n" + ",".join(str(v) for v in COUNTS.values()) + "\n")
    gz(raw / "triplet-type-list.csv.gz", "".join(",".join(et) + "\n" for et in OGB_RELATIONS))
    for et, (s, d) in rel.items():
        folder = raw / "relations" / "___".join(et)
        gz(folder / "edge.csv.gz", rows(np.stack([s, d], 1)))
        gz(folder / "num-edge-list.csv.gz", f"{len(s)}\n")
        gz(folder / "edge_reltype.csv.gz", rows(np.zeros((len(s), 1), int)))
    gz(raw / "nodetype-has-feat.csv.gz", ",".join(COUNTS) + "\n" + ",".join(str(t in feats) for t in COUNTS) + "\n")
    for t, x in feats.items():
        gz(raw / "node-feat" / t / "node-feat.csv.gz", rows(x))
        gz(raw / "node-feat" / t / "node_year.csv.gz", rows(np.full((len(x), 1), 2020)))
    gz(raw / "nodetype-has-label.csv.gz", ",".join(COUNTS) + "\n" + ",".join(str(t == "paper") for t in COUNTS) + "\n")
    gz(raw / "node-label" / "paper" / "node-label.csv.gz", rows(labels[:, None]))
    folder = root / "split" / "time"
    gz(folder / "nodetype-has-split.csv.gz", ",".join(COUNTS) + "\n" + ",".join(str(t == "paper") for t in COUNTS) + "\n")
    for part, ids in split.items():
        gz(folder / "paper" / f"{part}.csv.gz", rows(ids[:, None]))
    return rel, feats, labels, split


MAG_RELATIONS = [("author", "affiliated_with", "institution"), ("author", "writes", "paper"), ("paper", "cites", "paper")]
MAG_COUNTS = {"paper": 50, "author": 40, "institution": 7}


def write_mag240m(root, numpy_split=True):
    """MAG240M as OGB-LSC ships it: meta.pt, split_dict.pt (numpy arrays), processed/... (2 x E edges, fp16)."""
    rel, feats, labels, split = hetero_graph(MAG_RELATIONS, MAG_COUNTS, dtype=np.float16)
    processed = root / "processed"
    (processed / "paper").mkdir(parents=True)
    np.save(processed / "paper" / "node_feat.npy", feats["paper"])
    y = labels.astype(np.float64)
    y[split["test"]] = np.nan  # the release withholds the test labels
    np.save(processed / "paper" / "node_label.npy", y)
    np.save(processed / "paper" / "node_year.npy", np.full(MAG_COUNTS["paper"], 2019, np.int64))
    for et, (s, d) in rel.items():
        (processed / "___".join(et)).mkdir()
        np.save(processed / "___".join(et) / "edge_index.npy", np.stack([s, d]))
    torch.save({**MAG_COUNTS, "num_paper_features": 6, "num_classes": C}, root / "meta.pt")
    conv = (lambda a: a) if numpy_split else torch.from_numpy
    torch.save({k: conv(v) for k, v in split.items()}, root / "split_dict.pt")
    return rel, feats, labels, split


IGBH_COUNTS = {"paper": 50, "author": 40, "institute": 7, "fos": 11}
IGBH_RELATIONS = [("author", "affiliated_to", "institute"), ("paper", "cites", "paper"), ("paper", "topic", "fos"),
                  ("paper", "written_by", "author")]


def write_igbh(size_dir):
    """IGBH tiny as IGB's download leaves it: processed/<type>/node_feat.npy, E x 2 edge files named src__rel__dst."""
    rel, feats, labels, split = hetero_graph(IGBH_RELATIONS, IGBH_COUNTS, featured=tuple(IGBH_COUNTS), dim=4)
    processed = size_dir / "processed"
    for t, x in feats.items():
        (processed / t).mkdir(parents=True)
        np.save(processed / t / "node_feat.npy", x)
    np.save(processed / "paper" / "node_label_19.npy", labels.astype(np.float32))
    for et, (s, d) in rel.items():
        (processed / "__".join(et)).mkdir()
        np.save(processed / "__".join(et) / "edge_index.npy", np.stack([s, d], 1))
    return rel, feats, labels, split


def check_relation(ds, et, s, d, reference_csc):
    indptr, indices = reference_csc(s, d, ds.node_counts[et[2]], False)
    topo = ds.topologies[et]
    np.testing.assert_array_equal(topo.indptr, indptr)
    np.testing.assert_array_equal(topo.indices, indices)


def check_undirected(ds, rel, reference_csc):
    """Reverse edges as PyG's ToUndirected: (dst, rev_rel, src) between types, both ways within one type."""
    expected = set()
    for (a, r, b), (s, d) in rel.items():
        if a == b:
            check_relation(ds, (a, r, b), np.concatenate([s, d]), np.concatenate([d, s]), reference_csc)
            expected.add((a, r, b))
        else:
            check_relation(ds, (a, r, b), s, d, reference_csc)
            check_relation(ds, (b, f"rev_{r}", a), d, s, reference_csc)
            expected |= {(a, r, b), (b, f"rev_{r}", a)}
    assert set(ds.edge_types) == expected


def train_a_little(root, **extra):
    from terastack.gnn.settings import gnn_job
    from terastack.gnn.training.train import GnnTrainer

    result = GnnTrainer(gnn_job(data=str(root), fanouts="4,3", batch_size=8, epochs=2, hidden=8,
                                                host_cache="64KiB", **extra), progress=False).run()
    losses = result["loss_curve"]
    assert len(losses) == 2 * 4 and np.isfinite(losses).all()  # 30 training papers, batches of 8, two epochs
    assert all(0.0 <= e[k] <= 1.0 for e in result["epochs"] for k in ("train_acc", "val_acc", "test_acc")
               if e[k] is not None)
    return result


def test_ogb_mag_layout(tmp_path, capsys, reference_csc):
    src = tmp_path / "dataset" / "ogbn_mag"
    rel, feats, labels, split = write_ogb_mag(src)
    out = tmp_path / "mag"
    assert main(["gnn", "import", "--from", str(tmp_path / "dataset"), "--out", str(out), "--json", "--quiet",
                 "--undirected"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["layout"] == "ogb-mag" and result["target"] == "paper" and result["classes"] == 349
    ds = open_dataset(out, verify="full")
    check_undirected(ds, rel, reference_csc)
    assert ds.feature_dims == {"paper": 6, "author": 0, "institution": 0, "field_of_study": 0}
    np.testing.assert_array_equal(ds.read_type_features("paper"), feats["paper"])
    np.testing.assert_array_equal(ds.target_labels, labels)
    for name, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        np.testing.assert_array_equal(ds.splits[name], split[key])
    train_a_little(out, model="rgcn")
    # as stored (OGB's add_inverse_edge is off for mag): the four relations, nothing added
    plain = tmp_path / "plain"
    assert main(["gnn", "import", "--from", str(src), "--out", str(plain), "--quiet"]) == 0
    ds = open_dataset(plain)
    assert ds.edge_types == sorted(OGB_RELATIONS)
    for et, (s, d) in rel.items():
        check_relation(ds, et, s, d, reference_csc)
    # to_hetero(GraphSAGE) needs every sending type to receive: refused by name, with the remedy
    from terastack.gnn.settings import gnn_job
    from terastack.gnn.training.train import GnnTrainer

    with pytest.raises(ValueError, match="author.*--undirected"):
        GnnTrainer(gnn_job(data=str(plain), fanouts="2,2"), progress=False).run()


@pytest.mark.parametrize("numpy_split", [True, False])
def test_mag240m_layout(tmp_path, capsys, reference_csc, numpy_split):
    src = tmp_path / "mag240m_kddcup2021"
    rel, feats, labels, split = write_mag240m(src, numpy_split)
    out = tmp_path / "out"
    assert main(["gnn", "import", "--from", str(tmp_path), "--out", str(out), "--json", "--quiet",
                 "--undirected"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["layout"] == "mag240m" and result["classes"] == C
    ds = open_dataset(out)
    check_undirected(ds, rel, reference_csc)
    assert ds.manifest.node_types["paper"].feat_dtype == "float16"  # as the source stores them
    np.testing.assert_array_equal(ds.read_type_features("paper"), feats["paper"])
    np.testing.assert_array_equal(ds.splits["train"], split["train"])
    np.testing.assert_array_equal(ds.splits["val"], split["valid"])
    assert len(ds.splits["test"]) == 0  # withheld labels: left out
    np.testing.assert_array_equal(ds.target_labels[split["train"]], labels[split["train"]])
    assert ds.node_counts == MAG_COUNTS
    train_a_little(out, model="sage")


def test_mag240m_split_with_objects_is_refused_by_name(tmp_path, capsys):
    src = tmp_path / "mag240m_kddcup2021"
    write_mag240m(src)
    torch.save({"train": np.arange(3), "valid": [DatasetError("x")], "test": np.arange(2)}, src / "split_dict.pt")
    assert main(["gnn", "import", "--from", str(src), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "split_dict.pt" in err and "weights_only" in err


def test_igbh_layout(tmp_path, capsys, reference_csc):
    size = tmp_path / "igbh" / "tiny"
    rel, feats, labels, split = write_igbh(size)
    out = tmp_path / "out"
    assert main(["gnn", "import", "--from", str(tmp_path / "igbh"), "--out", str(out), "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["layout"] == "igbh" and result["classes"] == 19 and result["undirected"]
    ds = open_dataset(out)
    check_undirected(ds, rel, reference_csc)
    for t, x in feats.items():
        np.testing.assert_array_equal(ds.read_type_features(t), x)
    # IGB's split: torch.randperm(N) from seed 0, 60/20/20
    perm = torch.randperm(IGBH_COUNTS["paper"], generator=torch.Generator().manual_seed(0)).numpy()
    np.testing.assert_array_equal(ds.splits["train"], np.sort(perm[:30]))
    np.testing.assert_array_equal(ds.splits["val"], np.sort(perm[30:40]))
    np.testing.assert_array_equal(ds.target_labels, labels)
    train_a_little(out, model="sage")


def test_from_pyg_hetero(tmp_path, reference_csc):
    from torch_geometric.data import HeteroData

    rel, feats, labels, split = hetero_graph(featured=("paper", "author"))
    data = HeteroData()
    for t, n in COUNTS.items():
        data[t].num_nodes = n
    for t, x in feats.items():
        data[t].x = torch.from_numpy(x)
    data["paper"].y = torch.from_numpy(labels)
    for name, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        mask = torch.zeros(COUNTS["paper"], dtype=torch.bool)
        mask[torch.from_numpy(split[key])] = True
        data["paper"][f"{name}_mask"] = mask
    for et, (s, d) in rel.items():
        data[et].edge_index = torch.from_numpy(np.stack([s, d]))
    result = from_pyg(data, tmp_path / "out", undirected=True)
    assert result["status"] == "imported"
    ds = open_dataset(tmp_path / "out")
    check_undirected(ds, rel, reference_csc)
    # the same graph through PyG's own ToUndirected: the same relations, the same edges (as sets)
    import torch_geometric.transforms as T

    ref = T.ToUndirected()(data.clone())
    assert set(ref.edge_types) == set(ds.edge_types)
    for et in ref.edge_types:
        topo = ds.topologies[et]
        dst = np.repeat(np.arange(ds.node_counts[et[2]]), np.diff(topo.indptr))
        got = set(zip(np.asarray(topo.indices).tolist(), dst.tolist()))
        assert got == set(map(tuple, ref[et].edge_index.t().tolist())), et
    np.testing.assert_array_equal(ds.read_type_features("author"), feats["author"])
    assert from_pyg(data, tmp_path / "out", undirected=True)["status"] == "already complete"
    train_a_little(tmp_path / "out", model="rgcn", topology="ssd")


def test_damaged_sources_are_refused_naming_the_file(tmp_path, capsys):
    src = tmp_path / "ogbn_mag"
    write_ogb_mag(src)
    bad = src / "raw" / "relations" / "author___writes___paper" / "edge.csv.gz"
    gz(bad, "1,2\n3,999\n")
    assert main(["gnn", "import", "--from", str(src), "--out", str(tmp_path / "o1"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "999" in err and "out of range" in err
    igbh = tmp_path / "igbh"
    write_igbh(igbh)
    edge = igbh / "processed" / "paper__written_by__author" / "edge_index.npy"
    np.save(edge, np.array([[0.5, 1.0]]))
    assert main(["gnn", "import", "--from", str(igbh), "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    assert str(edge) in capsys.readouterr().err


def test_interrupted_import_resumes(tmp_path, monkeypatch, reference_csc):
    from terastack.gnn.storage.build import CSCBuilder
    from terastack.gnn.formats.detect import import_directory

    src = tmp_path / "ogbn_mag"
    rel, *_ = write_ogb_mag(src)
    calls = {"n": 0}
    original = CSCBuilder.build

    def crash(self):
        calls["n"] += 1
        if calls["n"] == 3:  # two relations built, the third interrupted
            raise KeyboardInterrupt
        return original(self)
    monkeypatch.setattr(CSCBuilder, "build", crash)
    with pytest.raises(KeyboardInterrupt):
        import_directory(src, tmp_path / "out", progress=False)
    monkeypatch.setattr(CSCBuilder, "build", original)
    result = import_directory(src, tmp_path / "out", progress=False)
    assert result["status"] == "imported"
    ds = open_dataset(tmp_path / "out", verify="full")
    for et, (s, d) in rel.items():
        check_relation(ds, et, s, d, reference_csc)
