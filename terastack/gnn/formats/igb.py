"""IGB (Illinois Graph Benchmark) homogeneous datasets as IGB's download leaves them.

Checked against IGB-Datasets at commit fc36357 (``igb/dataloader.py``: ``IGB260M`` and
``IGB260MDGLDataset``; ``igb/train_single_gpu.py``). ``<root>/<size>`` (size: tiny, small, medium,
large, full) holds::

    processed/paper/node_feat.npy                  N x 1024 float32
    processed/paper/node_label_19.npy              N float32 class ids (19 classes)
    processed/paper/node_label_2K.npy              N float32 class ids (IGB's 2K set: 2983 classes)
    processed/paper__cites__paper/edge_index.npy   E x 2 int: one row (src, dst) per edge

IGB's loader reads the ``large`` and ``full`` feature and label files with ``np.memmap`` and no header
(raw float32: N x 1024 and N), so a file without the ``.npy`` magic is read that way here too; every
other file is an ``.npy`` (never unpickled). The edges go src -> dst as in ``dgl.graph((e[:, 0], e[:, 1]))``;
IGB's loader then removes and re-adds self-loops for its models, a model-side step the import leaves out
(an imported graph keeps its edges as stored).

Splits follow ``IGB260MDGLDataset.process``, as IGB's training scripts run it (``torch.manual_seed(0)``):

* sizes other than ``full``: ``perm = torch.randperm(N)`` from seed ``split_seed`` (default 0, IGB's);
  train = ``perm[:int(0.6 N)]``, val = the next ``int(0.2 N)``, test = the rest. IGB labels every node of
  these sizes; should a node be unlabelled (NaN or negative) it is left out of its split (the import
  reports the unlabelled count). The permutation costs 8 bytes per node while importing.
* ``full``: the first L nodes are the labelled ones (L = 227,130,858 for the 19-class set and
  157,675,969 for 2K, IGB's constants; for a ``full`` directory of another size, the number of labelled
  nodes); train = ``[0, int(0.6 L))``, val = the next ``int(0.2 L)``, test = the rest up to L.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.formats.source import GraphSource, labels_from_values
from terastack.gnn.formats.streams import file_record, need_file
from terastack.gnn.importer import load_npy

LABEL_SETS = {"19": ("node_label_19.npy", 19), "2K": ("node_label_2K.npy", 2983)}
SIZES = ("tiny", "small", "medium", "large", "full")
#: IGB's feature width (hard-coded in its loader for the header-less large/full files)
FEAT_DIM = 1024
#: labelled papers of IGB-full (IGB260MDGLDataset.process)
FULL_NODES = 269346174
FULL_LABELLED = {"19": 227130858, "2K": 157675969}
FRACTIONS = (0.6, 0.2)


def is_igb(root: Path) -> bool:
    return (root / "processed" / "paper__cites__paper" / "edge_index.npy").is_file()


def read_array(path: Path, what: str, row_shape: tuple[int, ...]) -> np.ndarray:
    """An ``.npy`` (memory-mapped) or, without the magic, IGB's header-less float32 file."""
    need_file(path, what)
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        return load_npy(path, what)
    item = 4 * int(np.prod(row_shape, dtype=np.int64))
    size = path.stat().st_size
    if size % item:
        raise DatasetError(f"{path}: {what} is neither an .npy file nor a header-less float32 array of rows "
                           f"{row_shape} ({size} bytes)")
    return np.memmap(path, dtype=np.float32, mode="r", shape=(size // item,) + row_shape)


def default_label_set(root: Path) -> str:
    paper = root / "processed" / "paper"
    have = [k for k, (name, _) in LABEL_SETS.items() if (paper / name).is_file()]
    if not have:
        raise DatasetError(f"{paper}: no label file ({' or '.join(n for n, _ in LABEL_SETS.values())})")
    return have[0]


def igb_splits(labels: np.ndarray, *, size: str, label_set: str, seed: int) -> dict[str, np.ndarray]:
    """Split name -> node ids by IGB's rule (see the module docstring)."""
    n = len(labels)
    labelled = labels >= 0
    if size == "full":
        count = FULL_LABELLED[label_set] if n == FULL_NODES else int(labelled.sum())
        n_train, n_val = int(count * FRACTIONS[0]), int(count * FRACTIONS[1])
        return {"train_idx": np.arange(0, n_train), "val_idx": np.arange(n_train, n_train + n_val),
                "test_idx": np.arange(n_train + n_val, count)}
    import torch

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    n_train, n_val = int(n * FRACTIONS[0]), int(n * FRACTIONS[1])
    parts = {"train_idx": perm[:n_train], "val_idx": perm[n_train:n_train + n_val], "test_idx": perm[n_train + n_val:]}
    return {k: v[labelled[v]] for k, v in parts.items()}


def resolve_label_set(root: Path, label_set: str | None) -> tuple[str, str, int]:
    """``(label_set, label file name, classes)`` for ``label_set`` (None: the one ``root`` has); a ValueError
    names the field when it is not one of LABEL_SETS. Homogeneous IGB and IGBH label papers the same way."""
    label_set = label_set or default_label_set(root)
    if label_set not in LABEL_SETS:
        raise ValueError(f"label_set: must be one of {', '.join(LABEL_SETS)}, got {label_set!r}")
    label_name, classes = LABEL_SETS[label_set]
    return label_set, label_name, classes


def igb_source(root: str | Path, *, label_set: str | None = None, split_seed: int = 0) -> GraphSource:
    """``<root>/<size>`` of an IGB homogeneous dataset (see the module docstring) as a :class:`GraphSource`."""
    root = Path(root)
    processed = root / "processed"
    label_set, label_name, classes = resolve_label_set(root, label_set)
    feat_path = processed / "paper" / "node_feat.npy"
    label_path = processed / "paper" / label_name
    edge_path = processed / "paper__cites__paper" / "edge_index.npy"
    feats = read_array(feat_path, "node features", (FEAT_DIM,))
    if feats.ndim != 2 or feats.dtype.kind not in "fiu":
        raise DatasetError(f"{feat_path}: node features must be a numeric N x F matrix, "
                           f"are {feats.dtype} {feats.shape}")
    n = feats.shape[0]
    raw_labels = read_array(label_path, "node labels", ())
    edges = load_npy(edge_path, "edges")
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise DatasetError(f"{edge_path}: edge_index must be an E x 2 integer array (one src, dst row per edge), "
                           f"is {edges.dtype} {edges.shape}")
    size = root.name if root.name in SIZES else "unknown"
    rule = "first labelled 60/20/20 in order" if size == "full" else f"torch.randperm(N) seeded {split_seed}, 60/20/20"
    notes = {"dataset": f"igb-{size}", "label_set": label_set, "split": f"IGB: {rule}"}

    def labels() -> np.ndarray:
        if raw_labels.shape[:1] != (n,):
            raise DatasetError(f"{label_path}: labels must have one entry per node ({n}), shape is {raw_labels.shape}")
        out = np.empty(n, np.int64)
        for s in range(0, n, 1 << 22):
            out[s:s + (1 << 22)] = labels_from_values(np.asarray(raw_labels[s:s + (1 << 22)]), label_path, s)
        return out

    def splits(lab: np.ndarray) -> dict:
        ids = igb_splits(lab, size=size, label_set=label_set, seed=split_seed)
        return {k: (v, f"{label_path} (IGB split)") for k, v in ids.items()}

    def edge_blocks(first: int, step: int):
        for s in range(first, edges.shape[0], step):
            part = np.asarray(edges[s:s + step])
            yield part[:, 0], part[:, 1]

    def feature_blocks(first: int, rows: int):
        for s in range(first, n, rows):
            yield np.asarray(feats[s:s + rows])

    files = {str(p.relative_to(root)): file_record(p) for p in (feat_path, label_path, edge_path)}
    return GraphSource(layout="igb", num_nodes=n, feat_dim=feats.shape[1], feat_dtype=feats.dtype,
                       edge_blocks=edge_blocks, count_edges=lambda: edges.shape[0], edges_where=str(edge_path),
                       feature_blocks=feature_blocks, features_where=str(feat_path), labels=labels,
                       labels_where=str(label_path), splits=splits, files=files, num_classes=classes, notes=notes)
