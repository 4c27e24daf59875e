"""``terastack gnn import --from DIR``: recognize a dataset directory's layout and import it.

Layouts, tried in this order on DIR, then (if none matches) on each subdirectory of DIR -- so both
``dataset/ogbn_arxiv`` and ``dataset`` (holding only ``ogbn_arxiv``) work, and an IGB root holding a
single size:

========== ======================================================= =====================================
layout     recognized by                                           reader
========== ======================================================= =====================================
ogb-npz    ``raw/data.npz`` (ogbn-papers100M)                      :func:`.ogb.ogb_npz_source`
ogb-csv    ``raw/edge.csv.gz`` (ogbn-arxiv, ogbn-products)          :func:`.ogb.ogb_csv_source`
ogb-mag    ``raw/num-node-dict.csv.gz`` (ogbn-mag, heterogeneous)   :func:`.hetero_layouts.ogb_mag_source`
mag240m    ``processed/paper/node_feat.npy`` + ``processed/*___*___*`` :func:`.hetero_layouts.mag240m_source`
igbh       ``processed/paper__cites__paper`` + ``processed/author``  :func:`.hetero_layouts.igbh_source`
igb        ``processed/paper__cites__paper/edge_index.npy``        :func:`.igb.igb_source`
npy        ``edge_index.npy`` (terastack's ``--ogb-dir`` arrays)    :class:`terastack.gnn.importer.GraphImporter`
========== ======================================================= =====================================

The heterogeneous layouts (ogb-mag, mag240m, igbh) become heterogeneous datasets
(terastack.gnn.storage.manifest); the others homogeneous ones.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.formats import hetero_layouts, igb, ogb
from terastack.gnn.formats.hetero_importer import HeteroImporter
from terastack.gnn.formats.source import BuildOptions, SourceImporter

LAYOUTS = (("ogb-npz", ogb.is_ogb_npz), ("ogb-csv", ogb.is_ogb_csv), ("ogb-mag", hetero_layouts.is_ogb_mag),
           ("mag240m", hetero_layouts.is_mag240m), ("igbh", hetero_layouts.is_igbh), ("igb", igb.is_igb),
           ("npy", lambda root: (root / "edge_index.npy").is_file()))


def _match(root: Path) -> str | None:
    return next((name for name, test in LAYOUTS if test(root)), None)


def detect_layout(path: str | os.PathLike) -> tuple[str, Path]:
    """(layout name, the directory it is rooted at); a DatasetError naming ``path`` when nothing matches."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    layout = _match(root)
    if layout:
        return layout, root
    found = [(m, p) for p in sorted(root.iterdir()) if p.is_dir() for m in [_match(p)] if m]
    if len(found) == 1:
        return found[0][0], found[0][1]
    if found:
        raise DatasetError(f"{root}: holds several datasets ({', '.join(p.name for _, p in found)}); "
                           "pass one of them")
    raise DatasetError(f"{root}: no known dataset layout (looked for raw/data.npz, raw/edge.csv.gz, "
                       "raw/num-node-dict.csv.gz, processed/paper/node_feat.npy with processed/<src>___<rel>___<dst>, "
                       "processed/paper__cites__paper/edge_index.npy, edge_index.npy, here and one level down)")


class DirectoryImporter:
    """Imports whatever dataset a directory holds (see the module docstring for the layouts)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BuildOptions):
        source: str
        out: str
        #: OGB: the split directory under split/ (None: the only one, or the dataset's own)
        split: str | None = None
        #: IGB: which label file, "19" or "2K" (None: the first present)
        label_set: str | None = None
        #: IGB: seed of the random split (0 is IGB's own)
        split_seed: int = 0
        #: add the reverse of every edge; None: what the layout's loader does (OGB's add_inverse_edge)
        undirected: bool | None = None

        def __post_init__(self) -> None:
            if not self.source:
                raise ValueError("source: a dataset directory is required")
            if self.label_set is not None and self.label_set not in igb.LABEL_SETS:
                raise ValueError(f"label_set: must be one of {', '.join(igb.LABEL_SETS)}, got {self.label_set!r}")
            if self.split_seed < 0:
                raise ValueError(f"split_seed: must be >= 0, got {self.split_seed}")
            BuildOptions.check(self)

    def __init__(self, config: "DirectoryImporter.Config", *, engine=None):
        self.config = config
        self.engine = engine

    def run(self) -> dict:
        cfg = self.config
        layout, root = detect_layout(cfg.source)
        common = {"out": cfg.out, **{f: getattr(cfg, f) for f in BuildOptions.__dataclass_fields__}}
        if layout == "npy":
            from terastack.gnn.importer import GraphImporter

            result = GraphImporter(GraphImporter.Config(ogb_dir=str(root), undirected=bool(cfg.undirected), **common),
                                   engine=self.engine).run()
            return {"layout": layout, **result}
        hetero = {"ogb-mag": lambda: hetero_layouts.ogb_mag_source(root, split=cfg.split,
                                                                   memory_budget=cfg.memory_budget),
                  "mag240m": lambda: hetero_layouts.mag240m_source(root),
                  "igbh": lambda: hetero_layouts.igbh_source(root, label_set=cfg.label_set, split_seed=cfg.split_seed)}
        if layout in hetero:
            result = HeteroImporter(hetero[layout](), HeteroImporter.Config(undirected=cfg.undirected, **common),
                                    engine=self.engine).run()
            return {"layout": layout, "source": str(root), **result}
        if layout == "igb":
            source = igb.igb_source(root, label_set=cfg.label_set, split_seed=cfg.split_seed)
        elif layout == "ogb-npz":
            source = ogb.ogb_npz_source(root, split=cfg.split, memory_budget=cfg.memory_budget)
        else:
            source = ogb.ogb_csv_source(root, split=cfg.split, memory_budget=cfg.memory_budget)
        result = SourceImporter(source, SourceImporter.Config(undirected=cfg.undirected, **common),
                                engine=self.engine).run()
        return {"layout": layout, "source": str(root), **result}


def import_directory(source: str | os.PathLike, out: str | os.PathLike, **kwargs) -> dict:
    """Import the dataset in ``source`` into ``out``; keyword arguments are :class:`DirectoryImporter.Config` fields."""
    return DirectoryImporter(DirectoryImporter.Config(source=os.fspath(source), out=os.fspath(out), **kwargs)).run()
