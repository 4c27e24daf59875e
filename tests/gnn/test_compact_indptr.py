"""The compact in-memory indptr: every read equals the int64 array it encodes (hubs, group boundaries, partial
groups, corrupt files), it streams from the SSD, and a topology holding it samples the in-memory batches."""
from __future__ import annotations

import numpy as np
import pytest

from terastack.gnn.storage.compact_indptr import GROUP, CompactIndptr, compact_indptr_bytes
from terastack.gnn.storage.dataset import DatasetError, open_dataset
from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches
from terastack.gnn.storage.topology import ArrayTopology, DiskArray, SsdTopology, stream_chunks


def _indptr(degrees) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(degrees, np.int64))])


def _hub_degrees(n: int, seed: int = 0) -> np.ndarray:
    """Small random in-degrees, with one group spanning exactly 65535 entries (still narrow), one spanning
    65536 (the first wide span), and a hub of 200000 in-edges."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 12, n)
    deg[64:192] = 0  # indptr[i + 1] - indptr[i] = deg[i]: group g holds indptr[64 g .. 64 g + 63]
    deg[64 + 5] = 65535  # group 1 spans exactly 65535 (the largest uint16 offset)
    deg[128 + 62] = 65536  # only the last entry of group 2 sees it: span 65536
    deg[n // 2] = 200_000
    return deg


def _assert_reads_equal(c: CompactIndptr, ref: np.ndarray, rng) -> None:
    n = len(ref)
    assert len(c) == n and c.shape == (n,) and c.dtype == np.int64
    assert np.array_equal(np.asarray(c), ref) and np.asarray(c).dtype == np.int64
    assert np.array_equal(np.asarray(c, dtype=np.float64), ref.astype(np.float64))
    for i in {0, n - 1, -1, -n, n // 2, min(n - 1, 63), min(n - 1, 64)}:
        assert c[i] == ref[i] and isinstance(c[i], np.int64), i
    idx = rng.integers(-n, n, 4000)
    got = c[idx]
    assert got.dtype == np.int64 and np.array_equal(got, ref[idx])
    assert np.array_equal(c[idx.reshape(40, 100)], ref[idx.reshape(40, 100)])
    assert np.array_equal(c[list(idx[:7])], ref[idx[:7]])
    assert np.array_equal(c[np.zeros(0, np.int64)], ref[np.zeros(0, np.int64)])
    for lo, hi in [(0, n), (1, n - 1), (n // 3, n // 3 + 130), (63, 65), (5, 5), (n - 1, n + 10), (-3, None)]:
        assert np.array_equal(c[lo:hi], ref[lo:hi]), (lo, hi)
    chunks = [part for _, part in stream_chunks(c, chunk=100)]
    assert np.array_equal(np.concatenate(chunks), ref)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 300, 5000, 5001])
@pytest.mark.parametrize("group", [1, 4, GROUP])
def test_every_read_equals_the_int64_array(n, group):
    degrees = _hub_degrees(n - 1, seed=n) if n > 400 else np.random.default_rng(n).integers(0, 40, n - 1)
    ref = _indptr(degrees)
    assert len(ref) == n
    c = CompactIndptr(ref, group=group, chunk=3 * group)  # chunks that split the array many times
    _assert_reads_equal(c, ref, np.random.default_rng(n + group))


def test_the_span_boundary_and_hubs_are_wide_only_past_65535():
    ref = _indptr(_hub_degrees(5000))
    c = CompactIndptr(ref)
    spans = [int(ref[min(len(ref), (g + 1) * GROUP) - 1] - ref[g * GROUP]) for g in range(-(-len(ref) // GROUP))]
    assert spans[1] == 65535 and spans[2] == 65536
    assert c.base[1] >= 0 and c.base[2] < 0  # group 1 fits uint16 offsets exactly, group 2 is one past
    assert c.wide_groups == sum(s > 65535 for s in spans) == 2 and c.wide_off.dtype == np.uint32
    _assert_reads_equal(c, ref, np.random.default_rng(1))


def test_nbytes_is_a_fraction_of_int64_and_the_estimate_bounds_it():
    for degrees in (np.random.default_rng(0).integers(0, 30, 10_000), _hub_degrees(10_000)):
        ref = _indptr(degrees)
        c = CompactIndptr(ref)
        assert c.nbytes == c.base.nbytes + c.local.nbytes + c.wide_base.nbytes + c.wide_off.nbytes
        assert c.nbytes < 2.2 * len(ref) + 1200 < 8 * len(ref) / 3
        assert c.nbytes <= compact_indptr_bytes(len(ref) - 1, int(ref[-1]))
    assert compact_indptr_bytes(0, 0) == CompactIndptr(np.zeros(1, np.int64)).nbytes == 2 + 8


def test_any_int64_sequence_is_kept_exactly():
    """Not an indptr (decreasing, negative, spans past 2**32): kept faithfully, so the dataset's checks still
    see and name the defect."""
    rng = np.random.default_rng(3)
    ref = rng.integers(-(1 << 62), 1 << 62, 1000)
    ref[:200] = np.arange(200)[::-1]
    c = CompactIndptr(ref)
    assert c.wide_off.dtype == np.int64
    _assert_reads_equal(c, ref, rng)
    big = _indptr(np.full(300, 1 << 27))  # valid, but one group spans 2**33: int64 wide rows
    _assert_reads_equal(CompactIndptr(big), big, rng)


def test_built_from_the_ssd_equals_built_from_memory(tmp_path):
    ref = _indptr(_hub_degrees(7001))
    path = tmp_path / "indptr.bin"
    ref.tofile(path)
    disk = DiskArray(path, np.int64, len(ref))
    try:
        from_disk = CompactIndptr(disk, chunk=1024)
    finally:
        disk.close()
    from_memory = CompactIndptr(ref)
    for name in ("base", "local", "wide_base", "wide_off"):
        assert np.array_equal(getattr(from_disk, name), getattr(from_memory, name)), name
    assert from_disk.nbytes == from_memory.nbytes
    mapped = CompactIndptr(np.memmap(path, dtype=np.int64, mode="r"))
    assert np.array_equal(mapped.local, from_memory.local) and np.array_equal(mapped.base, from_memory.base)
    _assert_reads_equal(from_disk, ref, np.random.default_rng(2))


def test_bad_arguments_are_refused():
    c = CompactIndptr(np.arange(10))
    with pytest.raises(IndexError):
        c[10]
    with pytest.raises(IndexError):
        c[-11]
    with pytest.raises(IndexError):
        c[np.array([0, 10])]
    with pytest.raises(IndexError):
        c[np.array([0, -11])]
    with pytest.raises(IndexError, match="step"):
        c[::2]
    with pytest.raises(ValueError, match="group"):
        CompactIndptr(np.arange(10), group=48)


@pytest.fixture(scope="module")
def hub_graph(tmp_path_factory):
    """CSC files of 3000 nodes with hubs (wide groups) and the int64 arrays they hold."""
    root = tmp_path_factory.mktemp("hubs")
    n = 3000
    deg = _hub_degrees(n, seed=7)
    deg[n // 2] = 70_000
    indptr = _indptr(deg)
    indices = np.random.default_rng(8).integers(0, n, int(indptr[-1])).astype(np.int32)
    indptr.tofile(root / "indptr.bin")
    indices.tofile(root / "indices.bin")
    return root, indptr, indices


def _open(hub_graph, **config) -> SsdTopology:
    root, indptr, indices = hub_graph
    return SsdTopology(root / "indptr.bin", root / "indices.bin", num_nodes=len(indptr) - 1,
                       num_edges=len(indices), index_dtype=np.int32, **config)


@pytest.mark.parametrize("indptr", ["memory", "ssd"])
@pytest.mark.parametrize("cached", [0, 300])
def test_ssd_topology_samples_the_in_memory_batches(hub_graph, indptr, cached):
    _, ref_indptr, ref_indices = hub_graph
    n = len(ref_indptr) - 1
    topo = _open(hub_graph, indptr=indptr)
    try:
        assert topo.indptr_in_memory == (indptr == "memory")
        if topo.indptr_in_memory:
            assert isinstance(topo.indptr, CompactIndptr) and topo.indptr.wide_groups == 2
            assert topo.memory_bytes == topo.indptr.nbytes + topo.hot.nbytes
            assert topo.indptr.nbytes < 8 * (n + 1) / 3
        if cached:
            topo.fill(np.random.default_rng(1).choice(n, cached, replace=False))
        ref = ArrayTopology(ref_indptr, ref_indices)
        frontier = np.random.default_rng(2).integers(0, n, 2000)
        frontier[:4] = [n // 2, 69, 190, n - 1]  # the hubs and the last node
        a, b = ref.lookup(frontier), topo.lookup(frontier)
        assert np.array_equal(a.start, b.start) and np.array_equal(a.deg, b.deg)
        assert np.array_equal(ref.degrees(frontier), topo.degrees(frontier))
        seeds = np.arange(0, n, 3)
        s_ref = NeighborSampler(topology=ref, fanouts=(5, 3), seed=4)
        s_got = NeighborSampler(topology=topo, fanouts=(5, 3), seed=4)
        for k, batch in enumerate(epoch_batches(seeds, 100, seed=0, epoch=0)):
            x, y = s_ref.sample(batch, s_ref.batch_rng(0, k)), s_got.sample(batch, s_got.batch_rng(0, k))
            assert np.array_equal(x.n_id, y.n_id) and np.array_equal(x.row, y.row) and np.array_equal(x.col, y.col)
    finally:
        topo.close()


def test_auto_holds_indptr_when_four_times_the_compact_estimate_fits(hub_graph):
    _, indptr, indices = hub_graph
    estimate = compact_indptr_bytes(len(indptr) - 1, len(indices))
    fits, short = _open(hub_graph, budget=4 * estimate), _open(hub_graph, budget=4 * estimate - 1)
    try:
        assert fits.indptr_in_memory and not short.indptr_in_memory
        assert fits.indptr.nbytes <= estimate and isinstance(short.indptr, DiskArray)
        assert fits.describe()["indptr"] == "memory" and short.describe()["indptr"] == "ssd"
    finally:
        fits.close()
        short.close()


def test_hetero_auto_weighs_every_relation_s_compact_indptr(hetero):
    mem = open_dataset(hetero)
    estimate = sum(compact_indptr_bytes(mem.node_counts[et[2]], mem.manifest.edge_types[et].num_edges)
                   for et in mem.edge_types)
    fits = open_dataset(hetero, topology="ssd", topology_budget=4 * estimate)
    short = open_dataset(hetero, topology="ssd", topology_budget=4 * estimate - 1)
    try:
        assert all(t.indptr_in_memory and isinstance(t.indptr, CompactIndptr) for t in fits.topologies.values())
        assert not any(t.indptr_in_memory for t in short.topologies.values())
        for et in mem.edge_types:
            assert np.array_equal(np.asarray(fits.topologies[et].indptr), mem.topologies[et].indptr), et
    finally:
        fits.close()
        short.close()


def test_a_decreasing_indptr_is_still_refused_by_name(tiny, tmp_path):
    import shutil

    root = tmp_path / "bad"
    shutil.copytree(tiny, root)
    ip = np.fromfile(root / "indptr.bin", dtype=np.int64)
    ip[701] = ip[700] - 5  # node 700's in-degree is negative
    ip.tofile(root / "indptr.bin")
    for topology, indptr in [("memory", "auto"), ("ssd", "memory"), ("ssd", "ssd")]:
        with pytest.raises(DatasetError, match="indptr decreases at node 700$"):
            open_dataset(root, topology=topology, indptr=indptr, verify="size")
