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

from terastack.gnn.build import BuildState, CSCBuilder, FeatureWriter, write_array
from terastack.gnn.dataset import FEATURE_DTYPES, write_manifest
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
        rmat: tuple[float, float, float] = (0.57, 0.19, 0.19)
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
