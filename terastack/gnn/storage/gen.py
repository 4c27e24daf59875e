"""``terastack gnn gen``: a power-law (R-MAT) graph with learnable features, written in bounded memory.

[Note: what the generator makes]
Topology: R-MAT (Chakrabarti et al.) on 2^L >= N ids with quadrant
probabilities (a, b, c, d); pairs with an id >= N are rejected, self-loops and
duplicates dropped, every pair stored in both directions (an undirected
graph), and node ids randomly permuted (as Graph500 does) so that hot nodes are
spread over the feature file instead of packed at its start. Degrees follow a
power law, which is what makes a hotness-ordered cache pay off.

Labels: node v's class is its pre-permutation R-MAT id scaled to C classes,
``floor(id * C / N)``. R-MAT's recursive quadrants make nodes with nearby ids
link to each other more often than chance, so labels are mildly homophilous.

Features: ``x_v = centroid[y_v] + noise * N(0, I)`` with class centroids of norm
``signal``; a model has to average out the noise to recover the class, so
accuracy reflects training, not a lookup.

Every random stream is seeded by (seed, purpose, unit index), so a resumed
build writes exactly the bytes an uninterrupted one does.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from terastack.gnn.storage.build import BuildState, CSCBuilder, FeatureWriter, write_array
from terastack.gnn.storage.manifest import FEATURE_DTYPES, write_manifest
from terastack.progress import Progress
from terastack.units import parse_bytes

#: bumped whenever the same parameters would produce different bytes
GENERATOR_VERSION = 2
#: rows per deterministic feature block (the unit of the feature random streams)
_FEATURE_BLOCK_ROWS = 16384
#: memory per R-MAT pair while a chunk is generated, symmetrized and bucketed
_BYTES_PER_PAIR = 160
#: R-MAT pairs per deterministic unit (the unit of the edge random streams)
_RMAT_UNIT = 1 << 16
#: R-MAT quadrant probabilities (a, b, c), Graph500's
RMAT_DEFAULT = (0.57, 0.19, 0.19)


def rmat_pairs(rng: np.random.Generator, count: int, scale: int, a: float, b: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """``count`` R-MAT (src, dst) pairs on 2^scale ids, one quadrant choice per level, vectorized."""
    src = np.zeros(count, np.int64)
    dst = np.zeros(count, np.int64)
    ab, abc = a + b, a + b + c
    for level in range(scale):
        u = rng.random(count, dtype=np.float32)
        bit = np.int64(1) << (scale - 1 - level)
        src |= (u >= ab) * bit                        # quadrants c and d: lower half of the rows
        dst |= (((u >= a) & (u < ab)) | (u >= abc)) * bit  # quadrants b and d: right half of the columns
    return src, dst


class GraphGenerator:
    """Generates a dataset directory; see [Note: what the generator makes] and [Note: resumable builds]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        out: str
        nodes: int
        avg_degree: float = 10.0
        feat_dim: int = 128
        classes: int = 16
        dtype: str = "float32"
        seed: int = 0
        rmat: tuple[float, float, float] = RMAT_DEFAULT
        #: norm of the class centroids; per-dimension noise has standard deviation ``noise``
        signal: float = 2.0
        noise: float = 1.0
        train_fraction: float = 0.1
        val_fraction: float = 0.05
        test_fraction: float = 0.05
        #: host memory the build may use (edge chunks, one CSC bucket, per-node arrays)
        memory_budget: int | str = "1GiB"
        force: bool = False
        progress: bool = True
        extra_origin: dict = field(default_factory=dict)

        def __post_init__(self) -> None:
            if not self.out:
                raise ValueError("out: an output directory is required")
            if not isinstance(self.nodes, int) or self.nodes < 2:
                raise ValueError(f"nodes: must be an integer >= 2, got {self.nodes!r}")
            if not self.avg_degree > 0:
                raise ValueError(f"avg_degree: must be > 0, got {self.avg_degree}")
            if self.feat_dim < 1:
                raise ValueError(f"feat_dim: must be >= 1, got {self.feat_dim}")
            if not 2 <= self.classes <= self.nodes:
                raise ValueError(f"classes: must be in 2..nodes ({self.nodes}), got {self.classes}")
            if self.dtype not in FEATURE_DTYPES:
                raise ValueError(f"dtype: must be one of {', '.join(FEATURE_DTYPES)}, got {self.dtype!r}")
            a, b, c = self.rmat
            if min(a, b, c) < 0 or a + b + c >= 1:
                raise ValueError(f"rmat: probabilities a, b, c must be >= 0 with a + b + c < 1, got {self.rmat}")
            for name in ("train_fraction", "val_fraction", "test_fraction"):
                if not 0 <= getattr(self, name) <= 1:
                    raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
            if self.train_fraction + self.val_fraction + self.test_fraction > 1:
                raise ValueError("train_fraction + val_fraction + test_fraction: must be <= 1")
            if int(self.nodes * self.train_fraction) < 1:
                raise ValueError(f"train_fraction: {self.train_fraction} of {self.nodes} nodes leaves no training node")
            if self.signal < 0 or self.noise < 0:
                raise ValueError("signal, noise: must be >= 0")
            self.memory_budget = parse_bytes(self.memory_budget, field="memory_budget")
            per_node = 32 * self.nodes  # permutation, labels, split permutation, CSC counts
            if self.memory_budget < per_node + (16 << 20):
                raise ValueError(f"memory_budget: {self.memory_budget} bytes cannot hold the per-node arrays of "
                                 f"{self.nodes} nodes ({per_node} bytes) plus 16 MiB of edge chunks")

    def __init__(self, config: "GraphGenerator.Config", *, engine=None):
        self.config = config
        self.engine = engine

    def params(self) -> dict:
        """What identifies this dataset (progress display and output dir excluded)."""
        p = asdict(self.config)
        for key in ("out", "force", "progress", "memory_budget", "extra_origin"):
            p.pop(key)
        p["rmat"] = list(p["rmat"])
        return {"generator": "rmat", "generator_version": GENERATOR_VERSION, **p, **self.config.extra_origin}

    def run(self) -> dict:
        """Build (or resume, or find complete) the dataset. Returns a summary with timings."""
        cfg = self.config
        started = time.perf_counter()
        state = BuildState(cfg.out, self.params(), force=cfg.force)
        if state.complete:
            return {"out": cfg.out, "status": "already complete", "seconds": 0.0}
        resumed = state.resumed
        n, c = cfg.nodes, cfg.classes
        perm = np.random.default_rng([cfg.seed, 1]).permutation(n)
        labels = np.empty(n, np.int32)
        labels[perm] = (np.arange(n, dtype=np.int64) * c // n).astype(np.int32)
        write_array(state, "labels", labels)
        edges = self._edges(state, perm)
        del perm
        self._features(state, labels)
        self._splits(state)
        write_manifest(cfg.out, num_nodes=n, num_edges=edges, feat_dim=cfg.feat_dim, feat_dtype=cfg.dtype,
                       num_classes=c, index_dtype="int32" if n < 2**31 else "int64", origin=state.params,
                       engine=self.engine)
        state.finish()
        return {"out": cfg.out, "status": "resumed and completed" if resumed else "generated",
                "nodes": n, "edges": edges, "seconds": time.perf_counter() - started}

    # ------------------------------------------------------------------ stages
    def _edges(self, state: BuildState, perm: np.ndarray) -> int:
        cfg = self.config
        n = cfg.nodes
        pairs_target = max(1, int(round(n * cfg.avg_degree / 2)))
        builder = CSCBuilder(state, num_nodes=n, expected_edges=2 * pairs_target,
                             memory_budget=cfg.memory_budget - 32 * n, progress=cfg.progress)
        if not state.done("edges"):
            # Pairs come from fixed units of _RMAT_UNIT draws, each with its own random stream, so the graph is
            # the same whatever memory budget sets how many units go into one chunk.
            units_per_chunk = int(max(1, (cfg.memory_budget - 32 * n) // (_BYTES_PER_PAIR * _RMAT_UNIT)))
            scale = max(1, math.ceil(math.log2(n)))
            a, b, c = cfg.rmat
            kept = builder.extra.get("pairs", 0)
            unit = builder.extra.get("units", 0)
            progress = Progress(pairs_target, label="edges (R-MAT)", unit="pairs", enabled=cfg.progress)
            progress.update(kept)
            while kept < pairs_target:
                srcs, dsts = [], []
                for _ in range(units_per_chunk):
                    if kept >= pairs_target:
                        break
                    src, dst = rmat_pairs(np.random.default_rng([cfg.seed, 2, unit]), _RMAT_UNIT, scale, a, b, c)
                    ok = (src < n) & (dst < n)
                    src, dst = src[ok][: pairs_target - kept], dst[ok][: pairs_target - kept]
                    srcs.append(perm[src])
                    dsts.append(perm[dst])
                    kept += len(src)
                    unit += 1
                src, dst = np.concatenate(srcs), np.concatenate(dsts)
                builder.add_chunk(np.concatenate([src, dst]), np.concatenate([dst, src]), pairs=kept, units=unit)
                progress.update(len(src))
            progress.close()
            builder.close_edges()
        return builder.build()

    def _features(self, state: BuildState, labels: np.ndarray) -> None:
        cfg = self.config
        centroids = np.random.default_rng([cfg.seed, 3]).standard_normal((cfg.classes, cfg.feat_dim))
        centroids *= cfg.signal / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        centroids = centroids.astype(np.float32)
        dtype = np.dtype(cfg.dtype)

        def make_rows(start: int, stop: int) -> np.ndarray:
            out = np.empty((stop - start, cfg.feat_dim), dtype)
            for block_start in range(start, stop, _FEATURE_BLOCK_ROWS):
                block_stop = min(stop, block_start + _FEATURE_BLOCK_ROWS)
                rng = np.random.default_rng([cfg.seed, 4, block_start // _FEATURE_BLOCK_ROWS])
                x = rng.standard_normal((block_stop - block_start, cfg.feat_dim), dtype=np.float32)
                x *= cfg.noise
                x += centroids[labels[block_start:block_stop]]
                out[block_start - start:block_stop - start] = x
            return out

        chunk_bytes = max(4 << 20, min(64 << 20, cfg.memory_budget // 8))
        FeatureWriter(state, num_nodes=cfg.nodes, feat_dim=cfg.feat_dim, dtype=cfg.dtype, chunk_bytes=chunk_bytes,
                      align_rows=_FEATURE_BLOCK_ROWS, progress=cfg.progress, engine=self.engine).write(make_rows)

    def _splits(self, state: BuildState) -> None:
        cfg = self.config
        n = cfg.nodes
        order = np.random.default_rng([cfg.seed, 5]).permutation(n)
        n_train, n_val = int(n * cfg.train_fraction), int(n * cfg.val_fraction)
        n_test = int(n * cfg.test_fraction)
        parts = {"train_idx": order[:n_train], "val_idx": order[n_train:n_train + n_val],
                 "test_idx": order[n_train + n_val:n_train + n_val + n_test]}
        for key, ids in parts.items():
            write_array(state, key, np.sort(ids).astype(np.int64))


def generate(out: str | os.PathLike, nodes: int, **kwargs) -> dict:
    """Generate a dataset in ``out``; keyword arguments are :class:`GraphGenerator.Config` fields."""
    return GraphGenerator(GraphGenerator.Config(out=os.fspath(out), nodes=nodes, **kwargs)).run()


# ------------------------------------------------------------------ heterogeneous
#: IGBH's node types and relations (IGB's ``IGBHeteroDGLDataset``): per relation, the edges per source-side
#: node and the skew of each end (the chance an id bit is set; below 0.5 makes low ids, after hashing
#: scattered ones, hot)
IGBH_NODE_SHARES = {"paper": 1.0, "author": 1.9, "institute": 0.015, "fos": 0.19}
IGBH_RELATIONS = {("paper", "cites", "paper"): 12.0, ("paper", "written_by", "author"): 4.5,
                  ("author", "affiliated_to", "institute"): 1.0, ("paper", "topic", "fos"): 6.0}


def _skewed_ids(rng: np.random.Generator, count: int, n: int, skew: float) -> np.ndarray:
    """``count`` ids below ``n`` drawn bit by bit with P(bit) = ``skew`` (power-law-like popularity)."""
    bits = max(1, math.ceil(math.log2(n)))
    out = np.zeros(0, np.int64)
    while len(out) < count:
        ids = np.zeros(2 * (count - len(out)) + 16, np.int64)
        for level in range(bits):
            ids |= (rng.random(len(ids), dtype=np.float32) < skew).astype(np.int64) << (bits - 1 - level)
        out = np.concatenate([out, ids[ids < n]])
    return out[:count]


def _scatter(ids: np.ndarray, n: int) -> np.ndarray:
    """A bijection of 0..n-1 (``(id * a + b) mod n``, ``a`` coprime to ``n``) that spreads hot low ids over
    the whole id range, like the homogeneous generator's permutation but in no memory."""
    a = 2654435761 % n or 1
    while math.gcd(a, n) != 1:
        a += 1
    return (ids * a + 7919) % n


class HeteroGraphGenerator:
    """An IGBH-shaped heterogeneous dataset (paper, author, institute, fos and their relations, reverse edges
    added as IGB's loaders do), written by the heterogeneous importer in bounded memory and resumably.

    Paper labels and the citations follow the homogeneous generator ([Note: what the generator makes]):
    R-MAT citations over pre-scatter ids, class ``floor(id * C / N)``, features ``centroid[y] + noise``;
    other types get noise features around one centroid per type. Bipartite relations draw both ends with
    a power-law-like skew. Every random stream is seeded by (seed, purpose, unit).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        out: str
        papers: int
        feat_dim: int = 128
        classes: int = 16
        dtype: str = "float32"
        seed: int = 0
        #: multiplies every relation's edges per node (IGBH_RELATIONS)
        degree_scale: float = 1.0
        train_nodes: int = 0
        test_nodes: int = 0
        memory_budget: int | str = "1GiB"
        force: bool = False
        progress: bool = True

        def __post_init__(self) -> None:
            if not self.out:
                raise ValueError("out: an output directory is required")
            if not isinstance(self.papers, int) or self.papers < 64:
                raise ValueError(f"papers: must be an integer >= 64, got {self.papers!r}")
            if self.feat_dim < 1:
                raise ValueError(f"feat_dim: must be >= 1, got {self.feat_dim}")
            if not 2 <= self.classes <= self.papers:
                raise ValueError(f"classes: must be in 2..papers ({self.papers}), got {self.classes}")
            if self.dtype not in FEATURE_DTYPES:
                raise ValueError(f"dtype: must be one of {', '.join(FEATURE_DTYPES)}, got {self.dtype!r}")
            if not self.degree_scale > 0:
                raise ValueError(f"degree_scale: must be > 0, got {self.degree_scale}")
            if not 1 <= self.train_nodes or self.train_nodes + self.test_nodes > self.papers or self.test_nodes < 0:
                raise ValueError(f"train_nodes, test_nodes: need train_nodes >= 1, test_nodes >= 0 and their sum "
                                 f"<= papers ({self.papers}); got {self.train_nodes}, {self.test_nodes}")

    def __init__(self, config: "HeteroGraphGenerator.Config", *, engine=None):
        self.config, self.engine = config, engine

    def node_counts(self) -> dict[str, int]:
        return {t: max(2, int(round(self.config.papers * share))) for t, share in IGBH_NODE_SHARES.items()}

    def edge_counts(self) -> dict[tuple, int]:
        """Pairs drawn per relation (duplicates are merged when the topology is built)."""
        n = self.node_counts()
        return {et: max(1, int(round(n[et[0]] * per * self.config.degree_scale))) for et, per in IGBH_RELATIONS.items()}

    def source(self):
        from terastack.gnn.formats.hetero_importer import HeteroSource, NodeTypeSource, RelationSource

        cfg = self.config
        counts, dtype = self.node_counts(), np.dtype(cfg.dtype)
        npap = counts["paper"]
        labels = np.empty(npap, np.int64)  # class of a paper from its pre-scatter id (R-MAT locality)
        labels[_scatter(np.arange(npap, dtype=np.int64), npap)] = np.arange(npap, dtype=np.int64) * cfg.classes // npap
        rng = np.random.default_rng([cfg.seed, 3])
        centroids = rng.standard_normal((cfg.classes + len(counts), cfg.feat_dim)).astype(np.float32)
        centroids *= 2.0 / np.linalg.norm(centroids, axis=1, keepdims=True)

        def features(t: str, k: int):
            def blocks(first: int, rows: int):
                for start in range(first - first % _FEATURE_BLOCK_ROWS, counts[t], _FEATURE_BLOCK_ROWS):
                    stop = min(counts[t], start + _FEATURE_BLOCK_ROWS)
                    x = np.random.default_rng([cfg.seed, 4, k, start // _FEATURE_BLOCK_ROWS]).standard_normal(
                        (stop - start, cfg.feat_dim), dtype=np.float32)
                    x += centroids[labels[start:stop]] if t == "paper" else centroids[cfg.classes + k]
                    yield x.astype(dtype, copy=False)[max(0, first - start):]
            return blocks

        nodes = {t: NodeTypeSource(num_nodes=n, feat_dim=cfg.feat_dim, feat_dtype=dtype,
                                   feature_blocks=features(t, k), features_where=f"generated {t} features")
                 for k, (t, n) in enumerate(counts.items())}
        nodes["paper"].labels, nodes["paper"].labels_where = (lambda: labels), "generated paper labels"
        relations = {et: RelationSource(edge_blocks=self._edges(et, r, counts), count_edges=lambda c=c: c,
                                        where=f"generated {'__'.join(et)}")
                     for r, (et, c) in enumerate(self.edge_counts().items())}

        def splits(_labels):
            order = np.random.default_rng([cfg.seed, 5]).permutation(npap)
            parts = {"train_idx": order[:cfg.train_nodes], "val_idx": np.zeros(0, np.int64),
                     "test_idx": order[cfg.train_nodes:cfg.train_nodes + cfg.test_nodes]}
            return {k: (v, "generated split") for k, v in parts.items()}

        return HeteroSource(layout="generated-igbh", target="paper", node_types=nodes, relations=relations,
                            splits=splits, files={}, undirected=True, num_classes=cfg.classes,
                            notes={"generator": "igbh-shaped", "generator_version": GENERATOR_VERSION,
                                   "papers": npap, "feat_dim": cfg.feat_dim, "seed": cfg.seed,
                                   "degree_scale": cfg.degree_scale, "train_nodes": cfg.train_nodes,
                                   "test_nodes": cfg.test_nodes, "feat_dtype": cfg.dtype, "classes": cfg.classes})

    def _edges(self, et: tuple, r: int, counts: dict):
        cfg = self.config
        total = self.edge_counts()[et]
        n_src, n_dst = counts[et[0]], counts[et[2]]

        def unit(u: int) -> tuple[np.ndarray, np.ndarray]:
            rng = np.random.default_rng([cfg.seed, 2, r, u])
            size = min(_RMAT_UNIT, total - u * _RMAT_UNIT)
            if et[0] == et[2]:  # citations: R-MAT over pre-scatter ids (nearby ids cite each other)
                src, dst = np.zeros(0, np.int64), np.zeros(0, np.int64)
                while len(src) < size:
                    s, d = rmat_pairs(rng, size, max(1, math.ceil(math.log2(n_src))), *RMAT_DEFAULT)
                    ok = (s < n_src) & (d < n_src)
                    src, dst = np.concatenate([src, s[ok]]), np.concatenate([dst, d[ok]])
                src, dst = src[:size], dst[:size]
            else:
                src, dst = _skewed_ids(rng, size, n_src, 0.4), _skewed_ids(rng, size, n_dst, 0.3)
            return _scatter(src, n_src), _scatter(dst, n_dst)

        def blocks(first: int, step: int):
            u, skip = divmod(first, _RMAT_UNIT)
            while u * _RMAT_UNIT < total:
                src, dst = unit(u)
                yield src[skip:], dst[skip:]
                u, skip = u + 1, 0
        return blocks

    def run(self) -> dict:
        from terastack.gnn.formats.hetero_importer import HeteroImporter

        cfg = self.config
        return HeteroImporter(self.source(), HeteroImporter.Config(
            out=cfg.out, classes=cfg.classes, dtype=cfg.dtype, memory_budget=cfg.memory_budget, force=cfg.force,
            progress=cfg.progress), engine=self.engine).run()
