"""Resumable, bounded-memory construction of a dataset directory (used by ``gen`` and ``import``).

[Note: resumable builds]
A build runs named stages in order; each stage commits its progress to
``.build-state.json`` (atomic write) after every unit of work it has made
durable (fdatasync). Rerunning the same command resumes at the first
unfinished unit: a stage's partial output is truncated back to the size
recorded at its last commit, so nothing is appended twice. Every unit is
deterministic (random streams are seeded per unit, never carried across
units), so a resumed build writes the same bytes as an uninterrupted one.
The state records the build's parameters; resuming with different parameters
is refused. The manifest is written last (atomically) and is the commit point
of the whole dataset; the state file and scratch files are removed after it.

[Note: CSC in bounded memory]
Edges arrive in chunks of (src, dst) pairs in any order. Phase 1 appends each
chunk's pairs to one of B bucket files by destination range (B chosen so one
bucket fits the memory budget). Phase 2 loads one bucket at a time, sorts it by
(dst, src), drops duplicates (and self-loops), and appends its sources to
``indices.bin`` and its column pointers to ``indptr.bin``. Peak memory is one
edge chunk or one bucket, plus O(N) per-node arrays; a bucket that outgrows the
budget (skewed ids) is split by destination into sub-ranges that fit.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from terastack.atomic import atomic_write_json
from terastack.gnn.storage.manifest import FILES, MANIFEST, DatasetError
from terastack.gnn.storage.rows import block_period_rows
from terastack.progress import Progress

STATE = ".build-state.json"
SCRATCH = ".build-scratch"
#: bytes of memory per edge while a bucket is sorted: the pair, its int64 key, dst/src and masks
_SORT_BYTES_PER_EDGE = 48


class BuildState:
    """Stage progress of one build, committed atomically. See [Note: resumable builds]."""

    def __init__(self, root: str | os.PathLike, params: dict, *, force: bool = False):
        self.root = Path(root)
        self.path = self.root / STATE
        self.params = json.loads(json.dumps(params))  # normalized as it will read back
        self.complete = False
        self.root.mkdir(parents=True, exist_ok=True)
        manifest = self.root / MANIFEST
        if manifest.exists() and not force:
            try:
                origin = json.loads(manifest.read_text()).get("origin", {})
            except (OSError, ValueError):
                origin = None
            if origin == self.params:
                self.complete = True
                self.stages: dict = {}
                return
            raise DatasetError(f"{self.root}: already holds a dataset built with other parameters; "
                               "choose another output directory or pass --force to overwrite it")
        if force:
            for name in list(FILES.values()) + [MANIFEST, STATE, ".verified.json"]:
                (self.root / name).unlink(missing_ok=True)
            shutil.rmtree(self.root / SCRATCH, ignore_errors=True)
        self.stages = {}
        if self.path.exists():
            try:
                saved = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{self.path}: unreadable build state ({exc}); pass --force to start over") from None
            if saved.get("params") != self.params:
                raise DatasetError(f"{self.path}: an interrupted build with different parameters is here "
                                   f"({saved.get('params')}); rerun it with those, or pass --force to start over")
            self.stages = saved.get("stages", {})
        self.resumed = bool(self.stages)

    @property
    def scratch(self) -> Path:
        path = self.root / SCRATCH
        path.mkdir(exist_ok=True)
        return path

    def done(self, stage: str) -> bool:
        return self.stages.get(stage, {}).get("done", False)

    def progress(self, stage: str) -> dict:
        return dict(self.stages.get(stage, {}))

    def commit(self, stage: str, **progress) -> None:
        self.stages[stage] = progress
        atomic_write_json(self.path, {"params": self.params, "stages": self.stages})

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
        shutil.rmtree(self.root / SCRATCH, ignore_errors=True)


def _durable_append(path: Path, data: np.ndarray) -> None:
    with open(path, "ab") as f:
        data.tofile(f)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _truncate(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size > size:
        os.truncate(path, size)
    elif not path.exists() and size == 0:
        path.touch()
    elif path.stat().st_size < size:
        raise DatasetError(f"{path}: shorter ({path.stat().st_size} bytes) than its committed size {size}; "
                           "the build state is inconsistent, pass --force to start over")


def write_array(state: BuildState, stage: str, array: np.ndarray) -> None:
    """Write one small array file (labels, a split) as a whole stage."""
    if state.done(stage):
        return
    path = state.root / FILES[stage]
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.ascontiguousarray(array).tofile(f)
        f.flush()
        os.fdatasync(f.fileno())
    os.replace(tmp, path)
    state.commit(stage, done=True)


class CSCBuilder:
    """Builds ``indptr.bin``/``indices.bin`` from edge chunks. See [Note: CSC in bounded memory]."""

    def __init__(self, state: BuildState, *, num_nodes: int, expected_edges: int, memory_budget: int,
                 drop_self_loops: bool = True, progress: bool = True, num_src: int | None = None):
        """``num_nodes`` destination nodes (indptr has ``num_nodes + 1`` entries); sources are ids below
        ``num_src`` (default ``num_nodes``; another count for a relation between two node types)."""
        self.state = state
        self.num_nodes = num_nodes
        self.num_src = num_nodes if num_src is None else num_src
        self.memory_budget = memory_budget
        self.drop_self_loops = drop_self_loops
        self.show_progress = progress
        self.index_dtype = np.dtype(np.int32 if max(num_nodes, self.num_src) < 2**31 else np.int64)
        self.pair_dtype = self.index_dtype
        saved = state.progress("edges")
        if "buckets" in saved:
            self.buckets = saved["buckets"]
        else:
            per_bucket = max(1, memory_budget // _SORT_BYTES_PER_EDGE)
            self.buckets = int(max(1, min(num_nodes, -(-expected_edges // per_bucket))))
        self.nodes_per_bucket = max(1, -(-num_nodes // self.buckets))  # a node type may have no nodes
        self.sizes = saved.get("sizes", [0] * self.buckets)
        self.chunks_done = saved.get("chunks", 0)
        self.extra = saved.get("extra", {})
        if not state.done("edges"):
            for b in range(self.buckets):
                _truncate(self._bucket(b), self.sizes[b])

    def _bucket(self, b: int) -> Path:
        return self.state.scratch / f"edges-{b:05d}.bin"

    # ---------------------------------------------------------- phase 1
    def add_chunk(self, src: np.ndarray, dst: np.ndarray, **extra) -> None:
        """Append one chunk of edges src -> dst and commit it (``extra`` is saved with the progress)."""
        pairs = np.empty((len(src), 2), self.pair_dtype)
        pairs[:, 0] = dst
        pairs[:, 1] = src
        bucket = dst // self.nodes_per_bucket
        order = np.argsort(bucket, kind="stable")
        pairs, bucket = pairs[order], bucket[order]
        bounds = np.searchsorted(bucket, np.arange(self.buckets + 1))
        touched = []
        for b in range(self.buckets):
            lo, hi = bounds[b], bounds[b + 1]
            if hi > lo:
                _durable_append(self._bucket(b), pairs[lo:hi])
                self.sizes[b] += int(hi - lo) * pairs.itemsize * 2
                touched.append(b)
        for b in touched:
            _fsync(self._bucket(b))
        self.chunks_done += 1
        self.extra = extra
        self.state.commit("edges", buckets=self.buckets, sizes=self.sizes, chunks=self.chunks_done, extra=extra)

    def close_edges(self) -> None:
        self.state.commit("edges", done=True, buckets=self.buckets, sizes=self.sizes, chunks=self.chunks_done,
                          extra=self.extra)

    # ---------------------------------------------------------- phase 2
    def build(self) -> int:
        """Sort the buckets into CSC files; returns the number of edges."""
        state = self.state
        root = state.root
        saved = state.progress("topology")
        if saved.get("done"):
            return saved["edges"]
        done_buckets, edges = saved.get("buckets_done", 0), saved.get("edges", 0)
        indptr_path, indices_path = root / FILES["indptr"], root / FILES["indices"]
        if done_buckets == 0:
            with open(indptr_path, "wb") as f:
                f.truncate((self.num_nodes + 1) * 8)
        _truncate(indices_path, edges * self.index_dtype.itemsize)
        progress = Progress(self.buckets, label="topology (CSC)", unit="buckets", enabled=self.show_progress)
        progress.update(done_buckets)
        for b in range(done_buckets, self.buckets):
            lo = b * self.nodes_per_bucket
            hi = min(self.num_nodes, lo + self.nodes_per_bucket)
            for sub_lo, sub_hi in self._subranges(b, lo, hi):
                pairs = self._load_range(b, sub_lo, sub_hi)
                # one int64 key per edge, (dst - sub_lo) * S + src: sorting it sorts by (dst, src)
                key = (pairs[:, 0].astype(np.int64) - sub_lo) * self.num_src + pairs[:, 1]
                del pairs
                key.sort()
                keep = np.ones(len(key), bool)
                keep[1:] = key[1:] != key[:-1]
                key = key[keep]
                dst, src = key // self.num_src + sub_lo, key % self.num_src
                del key
                if self.drop_self_loops:
                    keep = src != dst
                    dst, src = dst[keep], src[keep]
                counts = np.bincount(dst - sub_lo, minlength=sub_hi - sub_lo)
                with open(indices_path, "ab") as f:
                    src.astype(self.index_dtype).tofile(f)
                ptr = edges + np.cumsum(counts, dtype=np.int64)
                with open(indptr_path, "r+b") as f:
                    f.seek((sub_lo + 1) * 8)
                    ptr.tofile(f)
                edges += len(src)
            _fsync(indices_path)
            _fsync(indptr_path)
            state.commit("topology", buckets_done=b + 1, edges=edges)
            progress.update(1)
        progress.close()
        state.commit("topology", done=True, buckets_done=self.buckets, edges=edges)
        return edges

    def _subranges(self, b: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """Destination sub-ranges of bucket ``b`` whose edges each fit the memory budget."""
        limit = max(1, self.memory_budget // _SORT_BYTES_PER_EDGE)
        total = self.sizes[b] // (2 * self.pair_dtype.itemsize)
        if total <= limit:
            return [(lo, hi)]
        counts = np.zeros(hi - lo, np.int64)
        for part in self._read_parts(b):
            counts += np.bincount(part[:, 0].astype(np.int64) - lo, minlength=hi - lo)
        if counts.max() > limit:
            v = lo + int(np.argmax(counts))
            raise DatasetError(f"node {v} has {int(counts.max())} in-edges, more than fit the memory budget "
                               f"of {self.memory_budget} bytes ({limit} edges); raise --memory-budget")
        ranges, start, acc = [], lo, 0
        for v, c in enumerate(counts.tolist()):
            if acc + c > limit:
                ranges.append((start, lo + v))
                start, acc = lo + v, 0
            acc += c
        ranges.append((start, hi))
        return ranges

    def _read_parts(self, b: int):
        step = max(1, self.memory_budget // (4 * 2 * self.pair_dtype.itemsize))
        mm = np.memmap(self._bucket(b), dtype=self.pair_dtype, mode="r") if self.sizes[b] else np.zeros(0, self.pair_dtype)
        mm = mm.reshape(-1, 2)
        for start in range(0, len(mm), step):
            yield np.asarray(mm[start:start + step])

    def _load_range(self, b: int, lo: int, hi: int) -> np.ndarray:
        parts = []
        for part in self._read_parts(b):
            sel = (part[:, 0] >= lo) & (part[:, 0] < hi)
            parts.append(part[sel] if not sel.all() else part)
        return np.concatenate(parts) if parts else np.zeros((0, 2), self.pair_dtype)


class FeatureWriter:
    """Writes the feature matrix in row chunks through the storage engine, resumably.

    ``make_rows(start, stop) -> ndarray[stop-start, F]`` must be deterministic
    per chunk (see [Note: resumable builds]). Chunks are sized to whole 4 KiB
    blocks so every write but the last is O_DIRECT from an aligned buffer.
    """

    def __init__(self, state: BuildState, *, num_nodes: int, feat_dim: int, dtype: str, chunk_bytes: int,
                 align_rows: int = 1, progress: bool = True, engine=None):
        self.state = state
        self.num_nodes, self.feat_dim, self.dtype = num_nodes, feat_dim, np.dtype(dtype)
        self.row_bytes = feat_dim * self.dtype.itemsize
        # Chunks hold whole 4 KiB blocks and whole units of the caller's row alignment.
        period = int(np.lcm(block_period_rows(self.row_bytes), align_rows))
        self.rows_per_chunk = int(max(period, chunk_bytes // self.row_bytes // period * period))
        self.show_progress = progress
        self.engine = engine

    def write(self, make_rows) -> None:
        from terastack import io

        state = self.state
        if state.done("features"):
            return
        rows_done = state.progress("features").get("rows", 0)
        path = state.root / FILES["features"]
        total_bytes = self.num_nodes * self.row_bytes
        progress = Progress(self.num_nodes, label="features", unit="rows", enabled=self.show_progress)
        progress.update(rows_done)
        bufs = [io.aligned_empty((self.rows_per_chunk, self.feat_dim), self.dtype) for _ in range(2)]
        with io.open(path, "a", direct="auto", engine=self.engine) as f:
            if f.size != total_bytes:
                f.truncate(total_bytes)  # sized up front: resumed writes land at their offsets
            pending = None
            for i, start in enumerate(range(rows_done, self.num_nodes, self.rows_per_chunk)):
                stop = min(self.num_nodes, start + self.rows_per_chunk)
                buf = bufs[i % 2]
                buf[: stop - start] = make_rows(start, stop)  # computed while the previous chunk is written
                if pending is not None:
                    rows_done = self._commit(f, pending, rows_done, progress)
                pending = (f.pwrite(buf, start * self.row_bytes, (stop - start) * self.row_bytes), stop)
            if pending is not None:
                self._commit(f, pending, rows_done, progress)
        progress.close()
        state.commit("features", done=True, rows=self.num_nodes)

    def _commit(self, f, pending, rows_done: int, progress: Progress) -> int:
        future, stop = pending
        future.result(timeout=600)
        f.sync()
        self.state.commit("features", rows=stop)
        progress.update(stop - rows_done)
        return stop
