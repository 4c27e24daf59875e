"""Bytes read and written through every backend equal an os.urandom reference."""
import os
import sys

import numpy as np
import pytest
import torch

from terastack import io
from terastack.io import backend

SIZES = [1, 511, 4096, 4097, 65536 + 3, (1 << 20) + 7]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("offset", [0, 1, 4095, 3 * 4096 + 7])
@pytest.mark.parametrize("direct", [True, False])
def test_read_matches_reference(engine, random_file, size, offset, direct):
    path, data = random_file(offset + size + 4096)
    out = np.zeros(size, np.uint8)
    with engine.open(path, "r", direct=direct) as f:
        f.drop_cache()
        assert f.read(out, offset) == size
    assert out.tobytes() == data[offset:offset + size]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("buffer_misalignment", [0, 1, 64])
def test_write_then_read_back_direct(engine, tmp_path, size, buffer_misalignment):
    data = os.urandom(size)
    raw = io.aligned_empty(size + 4096)
    src = raw[buffer_misalignment:buffer_misalignment + size]
    src[:] = np.frombuffer(data, np.uint8)
    path = tmp_path / "w.bin"
    with engine.open(path, "w", direct=True) as f:
        assert f.write(src, 4096 + 5) == size
        f.sync()
    assert path.read_bytes()[4096 + 5:] == data
    assert path.read_bytes()[:4096 + 5] == bytes(4096 + 5)  # the hole before the write reads as zeros


def test_64mib_roundtrip(engine, tmp_path):
    size = 64 << 20
    data = np.frombuffer(os.urandom(size), np.uint8)
    path = tmp_path / "big.bin"
    with engine.open(path, "w", direct=True) as f:
        f.allocate(size)
        assert f.write(data, 0) == size
        f.sync()
        f.drop_cache()
        back = io.aligned_empty(size)
        assert f.read(back, 0) == size
    assert np.array_equal(back, data)


@pytest.mark.parametrize("threads", [1, 4, 32])
def test_thread_counts(random_file, threads):
    if backend.backend_unavailable_reason("threads"):
        pytest.skip(backend.backend_unavailable_reason("threads"))
    path, data = random_file(3 << 20)
    with io.IOEngine(backend="threads", threads=threads) as eng, eng.open(path, "r") as f:
        n = 500
        offsets = np.random.default_rng(threads).integers(0, len(data) - 8192, n)
        lengths = np.random.default_rng(threads + 1).integers(1, 8192, n)
        buf = np.zeros(int(lengths.sum()), np.uint8)
        got = f.pread_many(buf, offsets, lengths).result()
    assert (got == lengths).all()
    expect = b"".join(data[o:o + n] for o, n in zip(offsets.tolist(), lengths.tolist()))
    assert buf.tobytes() == expect


def test_many_extents_scattered_into_buffer(engine, random_file):
    path, data = random_file(1 << 20)
    rng = np.random.default_rng(7)
    n = 2000
    offsets = rng.integers(0, (1 << 20) - 4096, n)
    buf_offsets = rng.permutation(n) * 4096
    buf = np.zeros(n * 4096, np.uint8)
    with engine.open(path, "r", direct=True) as f:
        res = f.pread_many(buf, offsets, 4096, buf_offsets).result()
    assert res.dtype == np.int64 and (res == 4096).all()
    for i in range(0, n, 97):
        o, b = int(offsets[i]), int(buf_offsets[i])
        assert buf[b:b + 4096].tobytes() == data[o:o + 4096]


def test_pwrite_many_scatter(engine, tmp_path):
    n, rec = 300, 100
    src = np.frombuffer(os.urandom(n * rec), np.uint8).copy()
    offsets = np.random.default_rng(1).permutation(n) * rec
    path = tmp_path / "scatter.bin"
    with engine.open(path, "w", direct=True) as f:
        assert (f.pwrite_many(src, offsets, rec).result() == rec).all()
    on_disk = np.frombuffer(path.read_bytes(), np.uint8).reshape(n, rec)
    assert np.array_equal(on_disk[offsets // rec], src.reshape(n, rec))


@pytest.mark.parametrize("kind", ["numpy", "torch", "bytearray", "memoryview"])
def test_buffer_types(engine, random_file, kind):
    path, data = random_file(10000)
    if kind == "numpy":
        buf = np.zeros(2500, np.float32)
    elif kind == "torch":
        buf = torch.zeros(2500, dtype=torch.float32)
    elif kind == "bytearray":
        buf = bytearray(10000)
    else:
        buf = memoryview(bytearray(10000))
    with engine.open(path, "r") as f:
        assert f.read(buf, 0) == 10000
    raw = buf.numpy().tobytes() if kind == "torch" else bytes(buf) if kind != "numpy" else buf.tobytes()
    assert raw == data
    with engine.open(path, "r+") as f:
        assert f.write(buf, 10000) == 10000
    assert open(path, "rb").read() == data + data


def test_forced_short_transfers_are_retried(engine, random_file, tmp_path):
    """Every syscall is capped at 1000 bytes: each transfer must be completed by the retry path."""
    path, data = random_file(300_000)
    previous = backend.set_syscall_limit(1000)
    try:
        out = np.zeros(300_000 - 3, np.uint8)
        with engine.open(path, "r", direct=False) as f:
            assert f.read(out, 3) == len(out)
        assert out.tobytes() == data[3:]
        with engine.open(tmp_path / "copy.bin", "w", direct=False) as f:
            assert f.write(out, 0) == len(out)
        assert (tmp_path / "copy.bin").read_bytes() == data[3:]
    finally:
        backend.set_syscall_limit(previous if previous < (1 << 30) else 0)


def test_kernel_short_reads_are_retried(engine):
    """/proc/PID/smaps returns short reads (about a page per call); the engine must fill the request."""
    import subprocess

    # a child that stops itself: once waitpid reports it stopped, its mappings cannot change (no polling)
    sleeper = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
    try:
        _, status = os.waitpid(sleeper.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        path = f"/proc/{sleeper.pid}/smaps"
        with open(path, "rb") as fh:
            reference = fh.read()
        want = min(len(reference), 12000)
        assert want > 4096 * 2, "smaps too small to produce short reads"
        fd = os.open(path, os.O_RDONLY)
        try:
            assert len(os.pread(fd, want, 0)) < want, "this kernel served smaps in one read: no short read to test"
        finally:
            os.close(fd)
        out = bytearray(want)
        with engine.open(path, "r", direct=False) as f:
            assert f.read(out, 0) == want
        # The mappings of a stopped process stay, but the sizes of shared pages move while other processes map
        # and unmap the same libraries (Pss is a share of each page among its mappers): every line is read in
        # full and in order, the " kB" figures compared by name only
        got = bytes(out).split(b"\n")[:-1]  # the last line may be cut at ``want``
        ref = reference.split(b"\n")[:len(got)]
        assert len(got) > 20 and len(ref) == len(got)
        for g, r in zip(got, ref):
            if r.endswith(b" kB"):
                assert g.split(b":")[0] == r.split(b":")[0] and g.endswith(b" kB"), (g, r)
            else:
                assert g == r
    finally:
        sleeper.kill()
        sleeper.wait()
