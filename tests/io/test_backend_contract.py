"""Every registered backend against the contract of terastack.io.backend.Backend, driven directly.

Parametrized over the registry, so a backend added with register_backend is checked here with no new test.
"""
import errno
import os
import threading

import numpy as np
import pytest

from terastack import io
from terastack.io import backend as backends
from terastack.io.requests import OP_READ, OP_WRITE, REQUEST_DTYPE

from tests.io.conftest import BACKENDS, available


@pytest.fixture(params=BACKENDS)
def started(request):
    why = available(request.param)
    if why is not None:
        pytest.skip(f"{request.param} unavailable here: {why}")
    b, reason = backends.start_backend(request.param, threads=4, queue_depth=16, rings=1)
    assert reason == "selected"
    yield b
    b.close()


def vector(*entries) -> np.ndarray:
    """A request vector from (op, fd, offset, length, addr) tuples."""
    out = np.empty(len(entries), dtype=REQUEST_DTYPE)
    for i, e in enumerate(entries):
        out[i] = e
    return out


def run(b, requests: np.ndarray, timeout: float = 30) -> tuple[np.ndarray, int]:
    """Submit, wait for on_done; returns the results and how often on_done ran."""
    results = np.full(len(requests), np.iinfo(np.int64).min, dtype=np.int64)
    calls = []
    done = threading.Event()

    def on_done():
        calls.append(threading.get_ident())
        done.set()

    b.submit(requests, results, on_done)
    assert done.wait(timeout), "on_done was never called"
    return results, len(calls)


def test_registry_knows_the_built_ins_in_auto_order():
    assert backends.backend_names()[:3] == ("io_uring", "threads", "python")
    with pytest.raises(ValueError, match="already registered"):
        backends.register_backend("python", lambda **_: None, order=99)
    with pytest.raises(ValueError, match="must be one of auto, io_uring, threads, python"):
        backends.backend_unavailable_reason("spdk")


def test_is_a_backend_named_as_registered(started):
    assert isinstance(started, backends.Backend)
    assert started.name in BACKENDS
    assert started.in_flight == 0


def test_per_request_results_and_errors(started, tmp_path):
    data = os.urandom(3 * 4096 + 100)
    path = tmp_path / "ref.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        buf = np.zeros(5 * 4096, np.uint8)
        base = buf.ctypes.data
        requests = vector((OP_READ, fd, 0, 4096, base),                   # whole
                          (OP_READ, fd, 4096, 5000, base + 4096),          # unaligned length
                          (OP_READ, fd, len(data) - 50, 4096, base + 3 * 4096),  # stops at end of file
                          (OP_READ, fd, -1, 10, base),                     # malformed: -EINVAL, others go on
                          (7, fd, 0, 10, base),                            # unknown op: -EINVAL
                          (OP_READ, fd, 0, 0, base),                       # empty
                          (OP_READ, 1 << 20, 0, 10, base + 4 * 4096))      # not a descriptor: -EBADF
        results, calls = run(started, requests)
        assert calls == 1
        assert results.tolist() == [4096, 5000, 50, -errno.EINVAL, -errno.EINVAL, 0, -errno.EBADF]
        assert buf[:4096 + 5000].tobytes() == data[:4096 + 5000]
        assert buf[3 * 4096:3 * 4096 + 50].tobytes() == data[-50:]

        out = np.frombuffer(os.urandom(8192), np.uint8).copy()
        results, _ = run(started, vector((OP_WRITE, fd, 100, 8192, out.ctypes.data)))
        assert results.tolist() == [8192]
        assert path.read_bytes()[100:100 + 8192] == out.tobytes()
    finally:
        os.close(fd)


def test_short_transfers_are_retried(started, tmp_path):
    data = os.urandom(100_000)
    path = tmp_path / "ref.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    previous = backends.set_syscall_limit(1000)
    try:
        buf = np.zeros(len(data), np.uint8)
        results, _ = run(started, vector((OP_READ, fd, 0, len(data), buf.ctypes.data)))
    finally:
        backends.set_syscall_limit(previous if previous < (1 << 30) else 0)
        os.close(fd)
    assert results.tolist() == [len(data)] and buf.tobytes() == data


def test_empty_vector_completes(started):
    results, calls = run(started, vector())
    assert calls == 1 and len(results) == 0


def test_concurrent_submits_each_complete_once(started, tmp_path):
    data = os.urandom(64 * 4096)
    path = tmp_path / "ref.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    bufs = [np.zeros(len(data), np.uint8) for _ in range(8)]
    outcomes = [None] * len(bufs)
    try:
        def one(k):
            offsets = np.random.default_rng(k).permutation(64) * 4096
            requests = vector(*[(OP_READ, fd, int(o), 4096, bufs[k].ctypes.data + int(o)) for o in offsets])
            outcomes[k] = run(started, requests)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(bufs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        os.close(fd)
    for (results, calls), buf in zip(outcomes, bufs):
        assert calls == 1 and (results == 4096).all() and buf.tobytes() == data
    assert started.in_flight == 0


def test_close_waits_for_in_flight_then_refuses(tmp_path):
    for name in BACKENDS:
        if available(name):
            continue
        b, _ = backends.start_backend(name, threads=2, queue_depth=4, rings=1)
        path = tmp_path / f"{name}.bin"
        path.write_bytes(os.urandom(1 << 20))
        fd = os.open(path, os.O_RDONLY)
        buf = np.zeros(1 << 20, np.uint8)
        results = np.zeros(256, np.int64)
        finished = []
        b.submit(vector(*[(OP_READ, fd, i * 4096, 4096, buf.ctypes.data + i * 4096) for i in range(256)]),
                 results, lambda: finished.append(True))
        b.close()
        os.close(fd)
        assert finished == [True] and (results == 4096).all(), name
        assert b.in_flight == 0
        b.close()  # a second close does nothing
        with pytest.raises(RuntimeError):
            b.submit(vector(), np.zeros(0, np.int64), lambda: None)


def test_auto_takes_the_first_that_starts_and_says_why():
    def refuse(**_):
        raise OSError(errno.ENODEV, "no such device here")

    backends.register_backend("missing", refuse, order=0, unavailable=lambda: "pretended missing")
    backends.register_backend("refusing", refuse, order=1)
    try:
        assert backends.backend_names()[:2] == ("missing", "refusing")
        with io.IOEngine() as eng:
            assert eng.backend in BACKENDS
            assert eng.backend_reason.startswith(f"auto chose {eng.backend} (missing unavailable: pretended "
                                                 "missing; refusing unavailable: [Errno 19] no such device here")
        with pytest.raises(RuntimeError, match="I/O backend 'missing' is not available here: pretended missing"):
            io.IOEngine(backend="missing")
    finally:
        backends.unregister_backend("missing")
        backends.unregister_backend("refusing")
    with pytest.raises(ValueError, match="backend: must be one of auto, io_uring, threads, python; got 'missing'"):
        io.IOEngine(backend="missing")


def test_auto_without_the_native_core_says_so_and_benchmarks_record_it(monkeypatch, capsys):
    """A checkout whose native core was never built (a fresh clone or worktree without ``pip install``) runs the
    Python backend: the engine says so once on stderr, and every benchmark's environment names the backend."""
    from terastack.io import _native

    missing = "the native core was not built with this install"
    monkeypatch.setattr(_native, "load_error", lambda: missing)
    monkeypatch.setattr(backends, "_said", set())
    assert backends.auto_choice() == ("python", f"auto chose python (io_uring unavailable: {missing}; threads "
                                                f"unavailable: {missing})")
    for _ in range(2):
        with io.IOEngine() as eng:
            assert eng.backend == "python"
    err = capsys.readouterr().err
    assert err.count("terastack I/O: auto chose python") == 1 and "slow path" in err
    assert backends.backend_record()["name"] == "python"  # what a benchmark records beside its environment()
    monkeypatch.undo()
    name, why = backends.auto_choice()
    with io.IOEngine() as eng:
        assert name == eng.backend and why.startswith(f"auto chose {name}")
