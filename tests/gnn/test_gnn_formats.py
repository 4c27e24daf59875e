"""`terastack gnn import --from DIR` on tiny datasets in the exact on-disk layouts of OGB (csv.gz and npz) and
IGB, and `from_pyg`: topology, features, labels and splits equal the sources, training runs on each import, and
damaged files are refused with one line naming the file."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from terastack.cli import main
from terastack.gnn import from_pyg
from terastack.gnn.storage.dataset import DatasetError, open_dataset
from terastack.gnn.formats.streams import CsvGz, RowCursor, npz_member
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.train import GnnTrainer

N, E, F, C = 60, 240, 5, 3


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def graph(seed=0, n=N, e=E, f=F, dtype=np.float32):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    feats = rng.standard_normal((n, f)).astype(dtype)
    labels = rng.integers(0, C, n)
    perm = rng.permutation(n)
    return src, dst, feats, labels, perm


def write_csv_gz(path, rows, text=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        text = "".join(",".join(repr(v) if isinstance(v, float) else str(v) for v in row) + "\n" for row in rows)
    with gzip.open(path, "wt") as f:
        f.write(text)


def write_split(root, name, perm):
    for part, ids in (("train", perm[:30]), ("valid", perm[30:40]), ("test", perm[40:50])):
        write_csv_gz(root / "split" / name / f"{part}.csv.gz", [[int(i)] for i in ids])


def ogb_csv(root, seed=0, split="time", counts=True, unlabelled=0):
    """An OGB CSV layout as ogb's download leaves it (raw/*.csv.gz, split/<name>/*.csv.gz, no headers);
    the last ``unlabelled`` nodes of ``perm`` (in no split) get an empty or "nan" label."""
    src, dst, feats, labels, perm = graph(seed)
    unlabelled = set(perm[N - unlabelled:].tolist())
    raw = root / "raw"
    write_csv_gz(raw / "edge.csv.gz", zip(src.tolist(), dst.tolist()))
    write_csv_gz(raw / "node-feat.csv.gz", [[float(v) for v in row] for row in feats])
    lines = ["" if i in unlabelled and i % 2 else "nan" if i in unlabelled else str(int(v))
             for i, v in enumerate(labels)]
    write_csv_gz(raw / "node-label.csv.gz", None, "".join(s + "\n" for s in lines))
    if counts:
        write_csv_gz(raw / "num-node-list.csv.gz", [[N]])
        write_csv_gz(raw / "num-edge-list.csv.gz", [[E]])
    write_split(root, split, perm)
    return src, dst, feats, labels, perm


def ogb_npz(root, compressed=False, unlabelled=0):
    """ogbn-papers100M's layout: raw/data.npz, raw/node-label.npz (N x 1 float, NaN unlabelled), split/time."""
    src, dst, feats, labels, perm = graph(1, dtype=np.float16)
    (root / "raw").mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(root / "raw" / "data.npz", edge_index=np.stack([src, dst]), node_feat=feats,
         node_year=np.arange(N)[:, None], edge_feat=np.array(None, dtype=object),
         num_nodes_list=np.array([N]), num_edges_list=np.array([E]))
    y = labels.astype(np.float64)[:, None]
    y[perm[N - unlabelled:]] = np.nan
    save(root / "raw" / "node-label.npz", node_label=y)
    write_split(root, "time", perm)
    return src, dst, feats, labels, perm


def igb(size_dir, label_sets=("19", "2K"), headerless=False, unlabelled_from=None):
    src, dst, feats, labels, perm = graph(2, f=1024)
    paper = size_dir / "processed" / "paper"
    paper.mkdir(parents=True)
    (size_dir / "processed" / "paper__cites__paper").mkdir()
    labels = {"19": labels % 19, "2K": (labels * 7) % 2983}
    for name in label_sets:
        lab = labels[name].astype(np.float32)
        if unlabelled_from is not None:
            lab[unlabelled_from:] = np.nan
        if headerless:
            lab.tofile(paper / f"node_label_{name}.npy")
        else:
            np.save(paper / f"node_label_{name}.npy", lab)
    if headerless:
        feats.tofile(paper / "node_feat.npy")
    else:
        np.save(paper / "node_feat.npy", feats)
    np.save(size_dir / "processed" / "paper__cites__paper" / "edge_index.npy", np.stack([src, dst], axis=1))
    return src, dst, feats, labels


def check_dataset(ds, src, dst, feats, labels, reference_csc, undirected=False):
    s, d = (np.concatenate([src, dst]), np.concatenate([dst, src])) if undirected else (src, dst)
    ptr, idx = reference_csc(s, d, ds.num_nodes, drop_self_loops=False)
    np.testing.assert_array_equal(ds.indptr, ptr)
    np.testing.assert_array_equal(ds.indices, idx)
    np.testing.assert_array_equal(ds.read_features(), feats)
    np.testing.assert_array_equal(ds.labels, labels)


def train_a_little(data):
    result = GnnTrainer(gnn_job(data=str(data), fanouts="3,3", batch_size=8, epochs=1, hidden=8,
                                          host_cache="8KiB", eval_nodes=-1), progress=False).run()
    losses = result["loss_curve"]
    assert len(losses) >= 2 and np.isfinite(losses).all() and result["accuracy"] is not None


def test_ogb_csv_layout_arxiv(tmp_path, capsys, reference_csc):
    root = tmp_path / "dataset" / "ogbn_arxiv"
    src, dst, feats, labels, perm = ogb_csv(root, unlabelled=3)
    out = tmp_path / "out"
    # `--from` the ogb root (one dataset inside): detected one level down
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(tmp_path / "dataset"), "--out", str(out),
                                "--quiet", "--json", "--memory-budget", "32MiB")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["layout"] == "ogb-csv" and result["undirected"] is False  # arxiv: add_inverse_edge False
    assert result["unlabelled"] == 3 and result["classes"] == 40  # ogb's master.csv class count for arxiv
    ds = open_dataset(out)
    stored = labels.copy()
    stored[perm[-3:]] = 0  # unlabelled: placeholder class, never in a split
    check_dataset(ds, src, dst, feats, stored, reference_csc)
    np.testing.assert_array_equal(ds.splits["train"], np.sort(perm[:30]))
    np.testing.assert_array_equal(ds.splits["val"], np.sort(perm[30:40]))
    np.testing.assert_array_equal(ds.splits["test"], np.sort(perm[40:50]))
    assert ds.manifest.origin["split"] == "time" and ds.manifest.origin["dataset"] == "ogbn_arxiv"
    train_a_little(out)
    # the same command again: already complete
    code, stdout, _ = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(out), "--quiet", "--json",
                              "--memory-budget", "32MiB")
    assert code == 0 and json.loads(stdout)["status"] == "already complete"


def test_import_says_the_unlabelled_count_without_json(tmp_path, capsys):
    root = tmp_path / "ogbn_arxiv"
    ogb_csv(root, unlabelled=3)
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(tmp_path / "out"),
                                "--quiet")
    assert code == 0, err
    assert "3 unlabelled nodes" in stdout and "train 30" in stdout and "val 10" in stdout, stdout


def test_ogb_import_without_a_validation_file_says_so(tmp_path, capsys):
    root = tmp_path / "ogbn_arxiv"
    ogb_csv(root)
    missing = root / "split" / "time" / "valid.csv.gz"
    missing.unlink()
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(tmp_path / "out"),
                                "--quiet", "--json")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and str(missing) in warned[0] and "validation" in warned[0], err
    assert len(open_dataset(tmp_path / "out").splits.get("val", ())) == 0  # what the warning is about


def test_ogb_csv_layout_products_adds_inverse_edges(tmp_path, capsys, reference_csc):
    root = tmp_path / "ogbn_products"
    src, dst, feats, labels, perm = ogb_csv(root, split="sales_ranking", counts=False)
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(tmp_path / "u"), "--quiet",
                                "--json")
    assert code == 0, err
    assert json.loads(stdout)["undirected"] is True  # master.csv: add_inverse_edge True for ogbn-products
    check_dataset(open_dataset(tmp_path / "u"), src, dst, feats, labels, reference_csc, undirected=True)
    code, _, err = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(tmp_path / "d"), "--quiet",
                           "--no-add-inverse-edges")
    assert code == 0, err
    check_dataset(open_dataset(tmp_path / "d"), src, dst, feats, labels, reference_csc)
    train_a_little(tmp_path / "u")


@pytest.mark.parametrize("compressed", [False, True])
def test_ogb_npz_layout_papers100m(tmp_path, capsys, reference_csc, compressed):
    root = tmp_path / "ogbn_papers100M"
    src, dst, feats, labels, perm = ogb_npz(root, compressed, unlabelled=2)
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(root), "--out", str(out), "--quiet", "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["layout"] == "ogb-npz" and result["unlabelled"] == 2 and result["classes"] == 172
    ds = open_dataset(out)
    assert ds.feat_dtype == np.float16  # papers100M's float16 features stay float16
    stored = labels.copy()
    stored[perm[-2:]] = 0
    check_dataset(ds, src, dst, feats, stored, reference_csc)
    np.testing.assert_array_equal(ds.splits["train"], np.sort(perm[:30]))
    train_a_little(out)


def test_npz_members_stream_in_chunks(tmp_path):
    rng = np.random.default_rng(3)
    ei, x = rng.integers(0, 100, (2, 1000)), rng.standard_normal((97, 3))
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", edge_index=ei, node_feat=x, fortran=np.asfortranarray(ei))
        for key in ("edge_index", "fortran"):
            parts = list(npz_member(tmp_path / "a.npz", key, "edges").pairs(skip=10, block=7))
            assert max(len(s) for s, _ in parts) == 7
            np.testing.assert_array_equal(np.concatenate([s for s, _ in parts]), ei[0, 10:])
            np.testing.assert_array_equal(np.concatenate([d for _, d in parts]), ei[1, 10:])
        cursor = RowCursor(lambda k: npz_member(tmp_path / "a.npz", "node_feat", "x").blocks(k, 5), 97, "a.npz", "x")
        got = [cursor.rows(a, min(97, a + 11)) for a in range(22, 97, 11)]
        np.testing.assert_array_equal(np.concatenate(got), x[22:])


def test_csv_blocks_resume_at_any_row(tmp_path):
    rows = np.arange(300).reshape(100, 3)
    write_csv_gz(tmp_path / "t.csv.gz", rows.tolist())
    csv = CsvGz(tmp_path / "t.csv.gz", "table", dtype=np.int64, columns=3, block_bytes=64)
    assert len(list(csv.blocks())) > 5 and csv.count_rows() == 100
    for skip in (0, 1, 37, 99, 100):
        got = list(csv.blocks(skip))
        np.testing.assert_array_equal(np.concatenate(got) if got else np.zeros((0, 3)), rows[skip:])


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_igb_layout(tmp_path, capsys, reference_csc, size):
    full = size == "full"
    src, dst, feats, labels = igb(tmp_path / "igb" / size, headerless=full, unlabelled_from=45 if full else None)
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "gnn", "import", "--from", str(tmp_path / "igb"), "--out", str(out),
                                "--label-set", "2K", "--quiet", "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["layout"] == "igb" and result["classes"] == 2983
    ds = open_dataset(out)
    stored = labels["2K"].copy()
    if full:
        stored[45:] = 0
    check_dataset(ds, src, dst, feats, stored, reference_csc)
    if full:  # IGB-full: the labelled prefix, 60/20/20 in order
        expect = {"train": np.arange(27), "val": np.arange(27, 36), "test": np.arange(36, 45)}
    else:  # IGB260MDGLDataset: torch.manual_seed(0); torch.randperm(N); 60/20/20
        torch.manual_seed(0)
        perm = torch.randperm(N).numpy()
        expect = {"train": np.sort(perm[:36]), "val": np.sort(perm[36:48]), "test": np.sort(perm[48:])}
    for name, ids in expect.items():
        np.testing.assert_array_equal(ds.splits[name], ids)
    train_a_little(out)


def test_from_pyg(tmp_path, reference_csc):
    from torch_geometric.data import Data

    src, dst, feats, labels, perm = graph(4)
    train = np.zeros(N, bool)
    train[perm[:30]] = True
    y = torch.from_numpy(labels.astype(np.float32))
    y[perm[-1]] = float("nan")  # unlabelled, in no split
    data = Data(x=torch.from_numpy(feats), edge_index=torch.from_numpy(np.stack([src, dst])), y=y,
                train_mask=torch.from_numpy(train), valid_idx=torch.from_numpy(perm[30:40]),
                test_idx=torch.from_numpy(perm[40:50]))
    result = from_pyg(data, tmp_path / "pyg")
    assert result["status"] == "imported" and result["unlabelled"] == 1 and result["classes"] == C
    ds = open_dataset(tmp_path / "pyg")
    stored = labels.copy()
    stored[perm[-1]] = 0
    check_dataset(ds, src, dst, feats, stored, reference_csc)
    np.testing.assert_array_equal(ds.splits["train"], np.sort(perm[:30]))
    np.testing.assert_array_equal(ds.splits["val"], np.sort(perm[30:40]))
    assert from_pyg([data], tmp_path / "pyg")["status"] == "already complete"  # a dataset: its first graph
    data.x[0, 0] += 1
    with pytest.raises(DatasetError, match="other parameters"):
        from_pyg(data, tmp_path / "pyg")
    data.test_idx[0] = N
    with pytest.raises(DatasetError, match=f"Data.test_idx: node id {N} of entry 0 is out of range"):
        from_pyg(data, tmp_path / "bad")
    train_a_little(tmp_path / "pyg")


def _refused(capsys, tmp_path, source, *extra):
    code, _, err = run_cli(capsys, "gnn", "import", "--from", str(source), "--out", str(tmp_path / "x"), "--quiet",
                           "--force", *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_damaged_files_are_refused_naming_the_file(tmp_path, capsys):
    root = tmp_path / "ogbn_arxiv"
    ogb_csv(root)
    raw = root / "raw"
    edge = (raw / "edge.csv.gz").read_bytes()
    (raw / "edge.csv.gz").write_bytes(edge[: len(edge) // 2])  # truncated gzip
    assert "edge.csv.gz" in _refused(capsys, tmp_path, root) and "truncated" in _refused(capsys, tmp_path, root)
    (raw / "edge.csv.gz").write_bytes(edge)
    feat = gzip.decompress((raw / "node-feat.csv.gz").read_bytes()).decode().splitlines()
    for bad_line, expect in (("1.0,2.0", "line 7 of node features has 2 columns, expected 5"),
                             ("1,2,abc,4,5", "line 7 of node features: 'abc' is not a number"),
                             ("", "line 7 of node features is empty")):
        write_csv_gz(raw / "node-feat.csv.gz", None, "\n".join(feat[:6] + [bad_line] + feat[7:]) + "\n")
        msg = _refused(capsys, tmp_path, root)
        assert "node-feat.csv.gz: " + expect in msg, msg
    write_csv_gz(raw / "node-feat.csv.gz", None, "\n".join(feat) + "\n")
    write_csv_gz(raw / "edge.csv.gz", [[0, 1], [2, N]])
    write_csv_gz(raw / "num-edge-list.csv.gz", [[2]])
    assert "edge.csv.gz: node id 60 of edge 1 is out of range" in _refused(capsys, tmp_path, root)
    (raw / "edge.csv.gz").write_bytes(edge)
    write_csv_gz(raw / "num-edge-list.csv.gz", [[E]])
    write_csv_gz(root / "split" / "time" / "valid.csv.gz", [[3], [N + 5]])
    assert "valid.csv.gz: node id 65 of entry 1 is out of range" in _refused(capsys, tmp_path, root)

    papers = tmp_path / "ogbn_papers100M"
    ogb_npz(papers)
    src, dst, feats, labels, perm = graph(1, dtype=np.float16)
    np.savez(papers / "raw" / "data.npz", edge_index=np.stack([src, dst]), num_nodes_list=np.array([N]))
    msg = _refused(capsys, tmp_path, papers)
    assert "data.npz: member 'node_feat' (node features) is missing" in msg, msg
    np.savez(papers / "raw" / "data.npz", edge_index=np.stack([src, dst]),
             node_feat=np.array([{"evil": 1}] * N, dtype=object))
    msg = _refused(capsys, tmp_path, papers)
    assert "data.npz[node_feat]" in msg and "unpickling" in msg, msg
    np.savez(papers / "raw" / "data.npz", edge_index=np.stack([src, dst]), node_feat=feats)
    (papers / "raw" / "node-label.npz").write_bytes(b"PK\x03\x04garbage")
    assert "node-label.npz" in _refused(capsys, tmp_path, papers)

    size = tmp_path / "igb" / "small"
    igb(size, label_sets=("19",))
    ei = np.load(size / "processed" / "paper__cites__paper" / "edge_index.npy")
    ei[5, 1] = -1
    np.save(size / "processed" / "paper__cites__paper" / "edge_index.npy", ei)
    msg = _refused(capsys, tmp_path, size)
    assert "edge_index.npy: node id -1 of edge 5 is out of range" in msg, msg
    assert "no known dataset layout" in _refused(capsys, tmp_path, tmp_path / "ogbn_arxiv" / "split")


def test_interrupted_import_resumes(tmp_path, monkeypatch, reference_csc):
    from terastack.gnn.formats import source as source_mod
    from terastack.gnn.formats.detect import import_directory

    root = tmp_path / "ogbn_arxiv"
    src, dst, feats, labels, perm = ogb_csv(root)
    real = source_mod.write_features

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # after labels and topology are committed
    monkeypatch.setattr(source_mod, "write_features", crash)
    with pytest.raises(KeyboardInterrupt):
        import_directory(root, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / ".build-state.json").exists()
    monkeypatch.setattr(source_mod, "write_features", real)
    monkeypatch.setattr(source_mod.CSCBuilder, "add_chunk", lambda *a, **k: pytest.fail("edges were re-read"))
    assert import_directory(root, tmp_path / "out", progress=False)["status"] == "imported"
    check_dataset(open_dataset(tmp_path / "out"), src, dst, feats, labels, reference_csc)
