"""OGB node-property-prediction datasets as the ``ogb`` package leaves them after download + extract.

Checked against ``ogb`` at commit 61e9784 (``ogb/io/read_graph_raw.py``, ``ogb/nodeproppred/dataset_pyg.py``,
``ogb/nodeproppred/master.csv``). A dataset directory ``<root>/ogbn_<name>`` (``-`` becomes ``_``; ``_pyg``
may be appended) holds:

CSV layout (ogbn-arxiv, ogbn-products; ``master.csv``'s ``binary`` is False)::

    raw/edge.csv.gz            E lines "src,dst", no header (read as edge_index = rows.T: 2 x E, src -> dst)
    raw/node-feat.csv.gz       N lines of F comma-separated floats (ogb casts them to float32)
    raw/node-label.csv.gz      N lines, one class id (NaN / empty: unlabelled)
    raw/num-node-list.csv.gz   one line: N     (ogb requires it; here optional: N = the label count)
    raw/num-edge-list.csv.gz   one line: E     (ogb requires it; here optional: the edges are counted)
    split/<split>/{train,valid,test}.csv.gz    one node id per line

npz layout (ogbn-papers100M; ``binary`` True)::

    raw/data.npz               edge_index (2 x E), node_feat (N x F), num_nodes_list, num_edges_list, ...
    raw/node-label.npz         node_label (N x 1, float, NaN for unlabelled)
    split/time/{train,valid,test}.csv.gz

Members are read as ``.npy`` streams inside the zip (never unpickled; members not needed, such as an
``edge_feat`` saved as an object array, are never parsed).

Inverse edges: ogb's loader duplicates every edge in reverse when ``master.csv`` says
``add_inverse_edge`` (True for ogbn-products and ogbn-proteins, False for arxiv, mag, papers100M; the
binary reader refuses it). The files do not say which dataset they are, so the default follows the
directory name (``ogbn_products`` or ``ogbn_proteins`` -> add them, anything else -> as stored) and
``undirected`` (``--undirected`` / ``--no-undirected``) overrides it. The split directory is the only
one under ``split/``, or the dataset's own (``master.csv``'s ``split``) when there are several, or the
one named by ``split``. Multi-task (ogbn-proteins' 112 binary targets) and heterogeneous (ogbn-mag)
datasets are refused: the dataset format holds one class id per node of one node type.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.formats.source import GraphSource, labels_from_values
from terastack.gnn.formats.streams import CsvGz, file_record, need_file, npz_member

#: From ogb's nodeproppred/master.csv: dataset dir name -> (add_inverse_edge, default split, classes)
KNOWN = {"ogbn_proteins": (True, "species", None), "ogbn_products": (True, "sales_ranking", 47),
         "ogbn_arxiv": (False, "time", 40), "ogbn_mag": (False, "time", 349),
         "ogbn_papers100m": (False, "time", 172)}
SPLIT_FILES = {"train_idx": "train.csv.gz", "val_idx": "valid.csv.gz", "test_idx": "test.csv.gz"}
_SPLIT_WORDS = {"train_idx": "training", "val_idx": "validation", "test_idx": "test"}


def dataset_name(root: Path) -> str:
    name = root.name.lower()
    return name[: -len("_pyg")] if name.endswith("_pyg") else name


def is_ogb_csv(root: Path) -> bool:
    return (root / "raw" / "edge.csv.gz").is_file()


def is_ogb_npz(root: Path) -> bool:
    return (root / "raw" / "data.npz").is_file()


def split_dir(root: Path, split: str | None) -> Path:
    """The ``split/<name>`` directory holding train/valid/test.csv.gz (see the module docstring)."""
    base = root / "split"
    if split:
        path = base / split
        if not path.is_dir():
            raise DatasetError(f"{path}: split directory does not exist")
        return path
    if (root / "raw" / "nodetype-has-split.csv.gz").exists() or (root / "raw" / "num-node-dict.csv.gz").exists():
        raise DatasetError(f"{root / 'raw'}: a heterogeneous OGB dataset (several node types); only homogeneous "
                           "graphs can be imported")
    names = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if not names:
        raise DatasetError(f"{base}: no split directory (expected split/<name>/train.csv.gz)")
    if len(names) == 1:
        return base / names[0]
    default = KNOWN.get(dataset_name(root), (None, None, None))[1]
    if default in names:
        return base / default
    raise DatasetError(f"{base}: several splits ({', '.join(names)}); choose one with --split")


def _splits(folder: Path, block_bytes: int):
    def read(_labels) -> dict:
        out = {}
        for key, name in SPLIT_FILES.items():
            path = folder / name
            if key == "train_idx" or path.exists():
                out[key] = (CsvGz(path, f"{key} node ids", dtype=np.int64, columns=1,
                                  block_bytes=block_bytes).read_all()[:, 0], path)
        return out
    return read


def _single_count(path: Path, what: str) -> int | None:
    if not path.exists():
        return None
    values = CsvGz(path, what, dtype=np.int64, columns=1).read_all()[:, 0]
    if len(values) != 1:
        raise DatasetError(f"{path}: {what} lists {len(values)} graphs; node property prediction has one graph")
    return int(values[0])


def _common(root: Path, split: str | None, block_bytes: int) -> dict:
    """What both OGB layouts share: name-derived defaults, the split files and their records."""
    name = dataset_name(root)
    if name == "ogbn_mag":
        raise DatasetError(f"{root}: ogbn-mag is heterogeneous; only homogeneous graphs can be imported")
    inverse, _, classes = KNOWN.get(name, (False, None, None))
    folder = split_dir(root, split)
    for key, file in SPLIT_FILES.items():
        # train.csv.gz is required (its absence is an error when it is read); the others may be left out, but
        # never without a word: a split that silently holds 0 nodes reads like a bug in the import
        if key != "train_idx" and not (folder / file).exists():
            print(f"warning: {folder / file} is missing: the import has no {_SPLIT_WORDS[key]} nodes", file=sys.stderr)
    files = {f"split/{folder.name}/{n}": file_record(folder / n) for n in SPLIT_FILES.values() if (folder / n).exists()}
    return {"undirected": inverse, "num_classes": classes, "splits": _splits(folder, block_bytes),
            "files": files, "notes": {"dataset": name, "split": folder.name}}


def ogb_csv_source(root: str | Path, *, split: str | None = None, memory_budget: int = 1 << 30) -> GraphSource:
    """The CSV layout (see the module docstring) as a :class:`GraphSource`."""
    root = Path(root)
    raw = root / "raw"
    block = int(max(1 << 20, min(32 << 20, memory_budget // 32)))
    edge_csv = CsvGz(raw / "edge.csv.gz", "edges", dtype=np.int64, columns=2, block_bytes=block)
    feat_path = raw / "node-feat.csv.gz"
    need_file(feat_path, "node features (this dataset has none; only datasets with node features can be imported)")
    label_csv = CsvGz(raw / "node-label.csv.gz", "node labels", dtype=np.float64, blank_as_nan=True, block_bytes=block)
    feat_dim = CsvGz(feat_path, "node features", dtype=np.float32, block_bytes=block).first_row().size
    memo: dict = {}

    def labels() -> np.ndarray:
        if "labels" not in memo:
            memo["labels"] = labels_from_values(label_csv.read_all(), label_csv.path)
        return memo["labels"]

    num_nodes = _single_count(raw / "num-node-list.csv.gz", "num-node-list")
    if num_nodes is None:
        num_nodes = len(labels())
    num_edges = _single_count(raw / "num-edge-list.csv.gz", "num-edge-list")

    def count_edges() -> int:
        return num_edges if num_edges is not None else edge_csv.count_rows()

    def edge_blocks(first: int, _max_chunk: int):
        seen = first
        for rows in edge_csv.blocks(first):
            seen += len(rows)
            yield rows[:, 0], rows[:, 1]
        if num_edges is not None and seen != num_edges:
            raise DatasetError(f"{edge_csv.path}: {seen} edges, but {raw / 'num-edge-list.csv.gz'} says {num_edges}")

    def feature_blocks(first: int, _max_rows: int):
        return CsvGz(feat_path, "node features", dtype=np.float32, columns=feat_dim, block_bytes=block).blocks(first)

    common = _common(root, split, block)
    files = {n: file_record(raw / n) for n in ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz",
                                               "num-node-list.csv.gz", "num-edge-list.csv.gz") if (raw / n).exists()}
    return GraphSource(layout="ogb-csv", num_nodes=num_nodes, feat_dim=feat_dim, feat_dtype=np.dtype(np.float32),
                       edge_blocks=edge_blocks, count_edges=count_edges, edges_where=str(edge_csv.path),
                       feature_blocks=feature_blocks, features_where=str(feat_path), labels=labels,
                       labels_where=str(label_csv.path), splits=common["splits"],
                       files={**{f"raw/{k}": v for k, v in files.items()}, **common["files"]},
                       undirected=common["undirected"], num_classes=common["num_classes"], notes=common["notes"])


def ogb_npz_source(root: str | Path, *, split: str | None = None, memory_budget: int = 1 << 30) -> GraphSource:
    """The npz layout of ogbn-papers100M (see the module docstring) as a :class:`GraphSource`."""
    root = Path(root)
    raw = root / "raw"
    data_path, label_path = raw / "data.npz", raw / "node-label.npz"
    edges = npz_member(data_path, "edge_index", "edges")
    feats = npz_member(data_path, "node_feat", "node features")
    label_member = npz_member(label_path, "node_label", "node labels")
    if not np.issubdtype(edges.dtype, np.integer):
        raise DatasetError(f"{edges.where}: edge_index must hold integers, holds {edges.dtype}")
    if len(edges.shape) != 2 or edges.shape[0] != 2:
        raise DatasetError(f"{edges.where}: edge_index must be 2 x E (sources, destinations), shape is {edges.shape}")
    if len(feats.shape) != 2 or feats.dtype.kind not in "fiu":
        raise DatasetError(f"{feats.where}: node_feat must be a numeric N x F matrix, is {feats.dtype} {feats.shape}")
    n = feats.shape[0]
    try:
        counts = npz_member(data_path, "num_nodes_list", "node counts").read_all().reshape(-1)
    except DatasetError:
        counts = None  # optional: the feature rows give N
    if counts is not None and (len(counts) != 1 or int(counts[0]) != n):
        raise DatasetError(f"{data_path}[num_nodes_list]: lists {counts.tolist()[:4]}, expected one graph of "
                           f"{n} nodes (node_feat's rows)")

    def labels() -> np.ndarray:
        if label_member.shape[:1] != (n,):
            raise DatasetError(f"{label_member.where}: node_label must have one row per node ({n}), "
                               f"shape is {label_member.shape}")
        out = np.empty(n, np.int64)
        start = 0
        for block in label_member.blocks(0, 1 << 20):
            out[start:start + len(block)] = labels_from_values(block, label_member.where, start)
            start += len(block)
        return out

    common = _common(root, split, int(max(1 << 20, min(32 << 20, memory_budget // 32))))
    return GraphSource(layout="ogb-npz", num_nodes=n, feat_dim=feats.shape[1], feat_dtype=feats.dtype,
                       edge_blocks=lambda first, step: edges.pairs(first, step), count_edges=lambda: edges.shape[1],
                       edges_where=edges.where,
                       feature_blocks=lambda first, rows: feats.blocks(first, rows),
                       features_where=feats.where, labels=labels, labels_where=label_member.where,
                       splits=common["splits"],
                       files={"raw/data.npz": file_record(data_path), "raw/node-label.npz": file_record(label_path),
                              **common["files"]},
                       undirected=common["undirected"], num_classes=common["num_classes"], notes=common["notes"])
