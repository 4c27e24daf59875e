"""Heterogeneous datasets as their publishers' downloads leave them: ogbn-mag (OGB's raw CSV layout),
MAG240M (OGB-LSC) and IGBH (IGB's heterogeneous sets), each as a :class:`.hetero_importer.HeteroSource`.

ogbn-mag, as ``ogb`` (``io/read_graph_raw.py`` ``read_csv_heterograph_raw``, ``read_node_label_hetero``,
``read_nodesplitidx_split_hetero``) reads ``<root>/ogbn_mag``::

    raw/num-node-dict.csv.gz         a header of node types, then one line of their counts
    raw/triplet-type-list.csv.gz     one "src,rel,dst" line per relation (no header)
    raw/relations/<src>___<rel>___<dst>/edge.csv.gz        E lines "src,dst" (ids of each type)
    raw/relations/<src>___<rel>___<dst>/num-edge-list.csv.gz   one line: E
    raw/node-feat/<type>/node-feat.csv.gz                  N lines of F floats (types with features)
    raw/nodetype-has-label.csv.gz    a header of node types, then True/False
    raw/node-label/<type>/node-label.csv.gz               N lines, one class id
    split/<name>/nodetype-has-split.csv.gz                 a header of node types, then True/False
    split/<name>/<type>/{train,valid,test}.csv.gz          one id per line

MAG240M, as ``ogb.lsc.MAG240MDataset`` reads ``<root>/mag240m_kddcup2021``::

    meta.pt                          {"paper": N, "author": N, "institution": N, "num_classes": C}
    split_dict.pt                    {"train", "valid", "test"}: arrays of paper ids
    processed/paper/node_feat.npy    N x 768 float16;  processed/paper/node_label.npy  N float (NaN: none)
    processed/<src>___<rel>___<dst>/edge_index.npy        2 x E (row 0: src ids, row 1: dst ids)

The two ``.pt`` files are read with ``torch.load(weights_only=True)``, numpy arrays allowed (numpy's
array reconstructor, ``ndarray`` and dtypes, which build arrays and nothing else); anything else in them
is refused naming the file. The test papers' labels are withheld in the release (NaN): test ids without a
label are left out of the test split (reported). ``author`` and ``institution`` have no features.

IGBH, as IGB's ``IGBHeteroDGLDataset`` / ``IGBHeteroDGLDatasetMassive`` (``igb/dataloader.py`` at
fc36357) read ``<root>/<size>``::

    processed/<type>/node_feat.npy                         N x 1024 float32 (paper, author, institute, fos;
                                                           journal, conference in large/full)
    processed/paper/node_label_19.npy | node_label_2K.npy  N float class ids
    processed/<src>__<rel>__<dst>/edge_index.npy           E x 2 (src, dst) per row: paper__cites__paper,
                                                           paper__written_by__author,
                                                           author__affiliated_to__institute, paper__topic__fos,
                                                           paper__published__journal, paper__venue__conference

``large``/``full`` store paper and author features and labels header-less (read as IGB's ``np.memmap``
does, as in terastack.gnn.formats.igb). IGB's loaders give every relation's reverse (``rev_*``) for
training, so the import adds reverse edges by default (``--no-undirected`` keeps them as stored). The
split is IGB's: ``torch.randperm(N_paper)`` seeded ``split_seed`` (0), 60/20/20.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.formats.hetero_importer import HeteroSource, NodeTypeSource, RelationSource
from terastack.gnn.formats.igb import igb_splits, read_array, resolve_label_set
from terastack.gnn.formats.ogb import SPLIT_FILES, KNOWN
from terastack.gnn.formats.source import labels_from_values
from terastack.gnn.formats.streams import CsvGz, file_record, need_file
from terastack.gnn.importer import load_npy

_SMALL_TABLE_BYTES = 1 << 20


def is_ogb_mag(root: Path) -> bool:
    return (root / "raw" / "num-node-dict.csv.gz").is_file()


def is_mag240m(root: Path) -> bool:
    return (root / "processed" / "paper" / "node_feat.npy").is_file() and any(
        (p / "edge_index.npy").is_file() for p in (root / "processed").glob("*___*___*"))


def is_igbh(root: Path) -> bool:
    processed = root / "processed"
    return (processed / "paper__cites__paper" / "edge_index.npy").is_file() and (
        (processed / "author" / "node_feat.npy").is_file()
        or (processed / "paper__written_by__author" / "edge_index.npy").is_file())


# ------------------------------------------------------------------ helpers
def _table(path: Path, what: str, header: bool) -> tuple[list[str], list[list[str]]]:
    """A small gzipped CSV of words (OGB's type lists): (header, rows)."""
    need_file(path, what)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read(_SMALL_TABLE_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read {what}: damaged gzip ({exc})") from None
    if len(raw) > _SMALL_TABLE_BYTES:
        raise DatasetError(f"{path}: {what} is larger than {_SMALL_TABLE_BYTES} bytes; it should list a few types")
    lines = [[c.strip() for c in line.split(",")] for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
    if header:
        if not lines:
            raise DatasetError(f"{path}: {what} is empty")
        return lines[0], lines[1:]
    return [], lines


def _flags(path: Path, what: str) -> dict[str, bool]:
    """``nodetype-has-*.csv.gz``: a header of types, one row of True/False."""
    names, rows = _table(path, what, header=True)
    if len(rows) != 1 or len(rows[0]) != len(names):
        raise DatasetError(f"{path}: {what} must be a header of node types and one row of True/False")
    return {n: v.lower() in ("true", "1") for n, v in zip(names, rows[0])}


def _csv_labels(path: Path, n: int, block: int) -> np.ndarray:
    values = CsvGz(path, "node labels", dtype=np.float64, blank_as_nan=True, block_bytes=block).read_all()
    return labels_from_values(values, path)


def _csv_split(folder: Path, block: int) -> dict:
    out = {}
    for key, name in SPLIT_FILES.items():
        path = folder / name
        if key == "train_idx" or path.exists():
            out[key] = (CsvGz(path, f"{key} node ids", dtype=np.int64, columns=1, block_bytes=block).read_all()[:, 0],
                        path)
    return out


def _npy_pairs(edges: np.ndarray, rows: bool):
    """``edge_blocks`` over a memory-mapped 2 x E (``rows``) or E x 2 array."""
    def blocks(first: int, step: int):
        total = edges.shape[1] if rows else edges.shape[0]
        for s in range(first, total, step):
            part = np.asarray(edges[:, s:s + step] if rows else edges[s:s + step])
            yield (part[0], part[1]) if rows else (part[:, 0], part[:, 1])
    return blocks


def _npy_relation(path: Path, et: tuple, *, rows: bool) -> tuple[np.ndarray, RelationSource]:
    """The memory-mapped edge_index at ``path`` (2 x E with ``rows``, else E x 2) and its relation source;
    a DatasetError names the file when it is not an integer array of that shape (MAG240M and IGBH alike)."""
    edges = load_npy(path, f"edges of {et}")
    pair_axis = 0 if rows else 1
    if edges.ndim != 2 or edges.shape[pair_axis] != 2 or edges.dtype.kind not in "iu":
        want = "a 2 x E integer array" if rows else "an E x 2 integer array (one src, dst row per edge)"
        raise DatasetError(f"{path}: edge_index must be {want}, is {edges.dtype} {edges.shape}")
    return edges, RelationSource(edge_blocks=_npy_pairs(edges, rows=rows),
                                 count_edges=lambda e=edges: e.shape[1 - pair_axis], where=str(path))


def _feature_stream(feats: np.ndarray):
    def blocks(first: int, rows: int):
        for s in range(first, feats.shape[0], rows):
            yield np.asarray(feats[s:s + rows])
    return blocks


def load_pt(path: Path, what: str):
    """A ``.pt`` file read with ``torch.load(weights_only=True)``, numpy arrays allowed (see the module docstring)."""
    import torch

    need_file(path, what)
    from numpy._core.multiarray import _reconstruct

    dtypes = sorted({type(np.dtype(c)) for c in "?bhilqBHILQefdFD"}, key=lambda t: t.__name__)
    safe = [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype, *dtypes]
    try:
        with torch.serialization.safe_globals(safe):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal of the restricted unpickler
        first = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"{path}: {what} cannot be read without unpickling arbitrary objects, which terastack "
                           f"never does (torch.load(weights_only=True) refused it: {first})") from None


def _ids(value, where: str) -> np.ndarray:
    if hasattr(value, "numpy"):
        value = value.numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise DatasetError(f"{where}: must hold integer ids, holds {arr.dtype}")
    return arr.reshape(-1).astype(np.int64)


# ------------------------------------------------------------------ ogbn-mag
def _ogb_split_name(base: Path, split: str | None) -> str:
    """The split directory to train on: the one asked for, the only one, or ogbn-mag's own ``time``."""
    names = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if split:
        if split not in names:
            raise DatasetError(f"{base / split}: split directory does not exist")
        return split
    if len(names) == 1:
        return names[0]
    if "time" in names:  # ogbn-mag's own (master.csv)
        return "time"
    if not names:
        raise DatasetError(f"{base}: no split directory (expected split/<name>/<type>/train.csv.gz)")
    raise DatasetError(f"{base}: several splits ({', '.join(names)}); choose one with --split")


def ogb_mag_source(root: str | Path, *, split: str | None = None, memory_budget: int = 1 << 30) -> HeteroSource:
    """``<root>/ogbn_mag`` in OGB's raw heterogeneous layout (see the module docstring)."""
    root = Path(root)
    raw = root / "raw"
    block = int(max(1 << 20, min(32 << 20, memory_budget // 32)))
    names, rows = _table(raw / "num-node-dict.csv.gz", "node counts", header=True)
    if len(rows) != 1 or len(rows[0]) != len(names):
        raise DatasetError(f"{raw / 'num-node-dict.csv.gz'}: must be a header of node types and one row of counts "
                           "(node property prediction has one graph)")
    try:
        counts = {n: int(v) for n, v in zip(names, rows[0])}
    except ValueError:
        raise DatasetError(f"{raw / 'num-node-dict.csv.gz'}: node counts must be integers, got {rows[0]}") from None
    triplets_path = raw / "triplet-type-list.csv.gz"
    if triplets_path.exists():
        triplets = [tuple(r) for r in _table(triplets_path, "relation list", header=False)[1]]
    else:
        triplets = [tuple(p.name.split("___")) for p in sorted((raw / "relations").glob("*___*___*"))]
    files = {}
    relations = {}
    for et in triplets:
        if len(et) != 3:
            raise DatasetError(f"{triplets_path}: every line must be src,rel,dst; got {','.join(et)}")
        folder = raw / "relations" / "___".join(et)
        csv = CsvGz(folder / "edge.csv.gz", f"edges of {et}", dtype=np.int64, columns=2, block_bytes=block)
        count_path = folder / "num-edge-list.csv.gz"
        expected = int(CsvGz(count_path, "edge count", dtype=np.int64, columns=1).read_all()[0, 0]) \
            if count_path.exists() else None

        def edge_blocks(first, _step, csv=csv, expected=expected, count_path=count_path):
            seen = first
            for part in csv.blocks(first):
                seen += len(part)
                yield part[:, 0], part[:, 1]
            if expected is not None and seen != expected:
                raise DatasetError(f"{csv.path}: {seen} edges, but {count_path} says {expected}")
        relations[et] = RelationSource(edge_blocks=edge_blocks, where=str(csv.path),
                                       count_edges=(lambda e=expected, c=csv: e if e is not None else c.count_rows()))
        files[f"raw/relations/{'___'.join(et)}/edge.csv.gz"] = file_record(csv.path)
    label_flags = _flags(raw / "nodetype-has-label.csv.gz", "labelled node types") \
        if (raw / "nodetype-has-label.csv.gz").exists() else \
        {p.name: True for p in (raw / "node-label").glob("*") if (p / "node-label.csv.gz").is_file()}
    node_types = {}
    for t, n in counts.items():
        src = NodeTypeSource(num_nodes=n)
        feat = raw / "node-feat" / t / "node-feat.csv.gz"
        if feat.is_file():
            src.feat_dim = CsvGz(feat, "node features", dtype=np.float32, block_bytes=block).first_row().size
            src.feat_dtype = np.dtype(np.float32)
            src.feature_blocks = (lambda first, _rows, feat=feat, dim=src.feat_dim: CsvGz(
                feat, "node features", dtype=np.float32, columns=dim, block_bytes=block).blocks(first))
            src.features_where = str(feat)
            files[f"raw/node-feat/{t}/node-feat.csv.gz"] = file_record(feat)
        label = raw / "node-label" / t / "node-label.csv.gz"
        if label_flags.get(t):
            src.labels = lambda label=label, n=n: _csv_labels(label, n, block)
            src.labels_where = str(label)
            files[f"raw/node-label/{t}/node-label.csv.gz"] = file_record(need_file(label, "node labels"))
        node_types[t] = src
    split = _ogb_split_name(root / "split", split)
    folder = root / "split" / split
    has_split = _flags(folder / "nodetype-has-split.csv.gz", "node types with a split")
    targets = [t for t, v in has_split.items() if v]
    if len(targets) != 1:
        raise DatasetError(f"{folder / 'nodetype-has-split.csv.gz'}: exactly one node type must have a split to "
                           f"train on, found {targets}")
    target = targets[0]
    files.update({f"split/{split}/{target}/{n}": file_record(folder / target / n) for n in SPLIT_FILES.values()
                  if (folder / target / n).exists()})
    name = root.name.lower().removesuffix("_pyg")
    return HeteroSource(layout="ogb-mag", target=target, node_types=node_types, relations=relations,
                        splits=lambda _labels: _csv_split(folder / target, block), files=files,
                        undirected=False, num_classes=KNOWN.get(name, (None, None, None))[2],
                        notes={"dataset": name, "split": split})


# ------------------------------------------------------------------ MAG240M
def mag240m_source(root: str | Path) -> HeteroSource:
    """``<root>/mag240m_kddcup2021`` as OGB-LSC leaves it (see the module docstring)."""
    root = Path(root)
    processed = root / "processed"
    meta = load_pt(root / "meta.pt", "the dataset's node counts") if (root / "meta.pt").exists() else {}
    if not isinstance(meta, dict):
        raise DatasetError(f"{root / 'meta.pt'}: must hold a dict of node counts, holds {type(meta).__name__}")
    relations, files, max_ids = {}, {}, {}
    for folder in sorted(processed.glob("*___*___*")):
        et = tuple(folder.name.split("___"))
        path = folder / "edge_index.npy"
        if len(et) != 3 or not path.is_file():
            continue
        edges, relations[et] = _npy_relation(path, et, rows=True)
        files[f"processed/{folder.name}/edge_index.npy"] = file_record(path)
        if not meta:  # counts from the largest ids, streamed (only without meta.pt)
            for i, t in ((0, et[0]), (1, et[2])):
                for s in range(0, edges.shape[1], 1 << 24):
                    max_ids[t] = max(max_ids.get(t, -1), int(np.asarray(edges[i, s:s + (1 << 24)]).max(initial=-1)))
    node_types = {}
    for t in sorted({t for et in relations for t in (et[0], et[2])} | {"paper"}):
        feat_path = processed / t / "node_feat.npy"
        feats = load_npy(feat_path, f"{t} features") if feat_path.is_file() else None
        n = meta.get(t) if meta else None
        n = int(n) if n is not None else (feats.shape[0] if feats is not None else max_ids.get(t, -1) + 1)
        src = NodeTypeSource(num_nodes=n)
        if feats is not None:
            if feats.ndim != 2 or feats.shape[0] != n or feats.dtype.kind not in "fiu":
                raise DatasetError(f"{feat_path}: features must be a numeric {n} x F matrix, are {feats.dtype} "
                                   f"{feats.shape}")
            src.feat_dim, src.feat_dtype = feats.shape[1], feats.dtype
            src.feature_blocks, src.features_where = _feature_stream(feats), str(feat_path)
            files[f"processed/{t}/node_feat.npy"] = file_record(feat_path)
        label_path = processed / t / "node_label.npy"
        if label_path.is_file():
            raw_labels = load_npy(label_path, f"{t} labels")
            src.labels = lambda r=raw_labels, p=label_path: labels_from_values(np.asarray(r), p)
            src.labels_where = str(label_path)
            files[f"processed/{t}/node_label.npy"] = file_record(label_path)
        node_types[t] = src
    split_path = root / "split_dict.pt"
    given = load_pt(split_path, "the split")
    if not isinstance(given, dict) or "train" not in given:
        raise DatasetError(f"{split_path}: must hold a dict with 'train', 'valid' and 'test' paper ids")
    files["split_dict.pt"] = file_record(split_path)
    dropped = {}

    def splits(labels: np.ndarray) -> dict:
        out = {}
        for key, name in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")):
            if name in given:
                ids = _ids(given[name], f"{split_path}[{name!r}]")
                if key == "test_idx":  # withheld labels: see the module docstring
                    inside = (ids >= 0) & (ids < len(labels))
                    keep = ~inside | (labels[np.clip(ids, 0, len(labels) - 1)] >= 0)
                    dropped["test_unlabelled"] = int((~keep).sum())
                    ids = ids[keep]
                out[key] = (ids, f"{split_path}[{name!r}]")
        return out

    classes = int(meta["num_classes"]) if meta and "num_classes" in meta else None
    return HeteroSource(layout="mag240m", target="paper", node_types=node_types, relations=relations, splits=splits,
                        files=files, num_classes=classes, notes={"dataset": "mag240m", "split": "split_dict.pt"})


# ------------------------------------------------------------------ IGBH
def igbh_source(root: str | Path, *, label_set: str | None = None, split_seed: int = 0) -> HeteroSource:
    """``<root>/<size>`` of an IGBH dataset (see the module docstring)."""
    root = Path(root)
    processed = root / "processed"
    label_set, label_name, classes = resolve_label_set(root, label_set)
    files, node_types, relations = {}, {}, {}
    for folder in sorted(p for p in processed.iterdir() if p.is_dir() and "__" not in p.name):
        feat_path = folder / "node_feat.npy"
        if not feat_path.is_file():
            continue
        feats = read_array(feat_path, f"{folder.name} features", (1024,))
        if feats.ndim != 2 or feats.dtype.kind not in "fiu":
            raise DatasetError(f"{feat_path}: features must be a numeric N x F matrix, are {feats.dtype} "
                               f"{feats.shape}")
        node_types[folder.name] = NodeTypeSource(num_nodes=feats.shape[0], feat_dim=feats.shape[1],
                                                 feat_dtype=feats.dtype, feature_blocks=_feature_stream(feats),
                                                 features_where=str(feat_path))
        files[f"processed/{folder.name}/node_feat.npy"] = file_record(feat_path)
    if "paper" not in node_types:
        raise DatasetError(f"{processed / 'paper' / 'node_feat.npy'}: paper features file does not exist")
    paper = node_types["paper"]
    label_path = processed / "paper" / label_name
    raw_labels = read_array(label_path, "paper labels", ())
    if raw_labels.shape[:1] != (paper.num_nodes,):
        raise DatasetError(f"{label_path}: labels must have one entry per paper ({paper.num_nodes}), shape is "
                           f"{raw_labels.shape}")
    paper.labels = lambda: labels_from_values(np.asarray(raw_labels), label_path)
    paper.labels_where = str(label_path)
    files[f"processed/paper/{label_name}"] = file_record(label_path)
    for folder in sorted(processed.glob("*__*__*")):
        et = tuple(folder.name.split("__"))
        path = folder / "edge_index.npy"
        if len(et) != 3 or not path.is_file():
            continue
        _, relations[et] = _npy_relation(path, et, rows=False)
        files[f"processed/{folder.name}/edge_index.npy"] = file_record(path)

    def splits(labels: np.ndarray) -> dict:
        ids = igb_splits(labels, size="igbh", label_set=label_set, seed=split_seed)
        return {k: (v, f"{label_path} (IGB split)") for k, v in ids.items()}

    size = root.name
    return HeteroSource(layout="igbh", target="paper", node_types=node_types, relations=relations, splits=splits,
                        files=files, undirected=True, num_classes=classes,
                        notes={"dataset": f"igbh-{size}", "label_set": label_set,
                               "split": f"IGB: torch.randperm(N) seeded {split_seed}, 60/20/20"})
