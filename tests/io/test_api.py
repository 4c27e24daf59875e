"""Futures, backend selection, file maintenance calls and engine statistics."""
import asyncio
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from terastack import io, trace


def test_futures_are_awaitable_and_have_result_timeout(engine, random_file):
    path, data = random_file(1 << 16)
    buf = np.zeros(1 << 16, np.uint8)
    with engine.open(path, "r") as f:
        fut = f.pread(buf, 0)
        assert fut.result(timeout=30) == 1 << 16
        assert fut.done()

        async def read_two():
            a, b = np.zeros(100, np.uint8), np.zeros(100, np.uint8)
            n1, n2 = await asyncio.gather(f.pread(a, 0), f.pread(b, 100))
            return n1, n2, a.tobytes() + b.tobytes()

        n1, n2, both = asyncio.run(read_two())
    assert (n1, n2) == (100, 100) and both == data[:200]


def test_auto_backend_says_which():
    eng = io.IOEngine()
    try:
        assert eng.backend in ("io_uring", "threads", "python")
        assert eng.backend_reason.startswith("auto chose " + eng.backend)
    finally:
        eng.close()


def test_without_native_core_auto_runs_on_python_and_says_so(tmp_path):
    code = textwrap.dedent(f"""
        import numpy as np
        from terastack.io import _native
        _native._find_library = lambda: None   # as if the install had no compiler
        from terastack import io
        eng = io.IOEngine()
        print(eng.backend)
        print(eng.backend_reason)
        with eng.open({str(tmp_path / "f.bin")!r}, "w") as f:
            f.write(np.arange(100, dtype=np.uint8), 0)
            out = np.zeros(100, np.uint8); f.read(out, 0)
            assert (out == np.arange(100)).all()
        try:
            io.IOEngine(backend="threads")
        except RuntimeError as e:
            print("explicit:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "python"
    assert "native core was not built" in lines[1] and "io_uring unavailable" in lines[1]
    assert lines[2].startswith("explicit:") and "not available" in lines[2]


def test_padded_write_is_truncated_to_true_size(engine, tmp_path):
    arena = io.AlignedArena(1 << 20)
    buf = arena.alloc(10_000)
    data = np.frombuffer(os.urandom(10_000), np.uint8)
    buf.numpy()[:] = data
    path = tmp_path / "padded.bin"
    with engine.open(path, "w", direct=True) as f:
        assert f.write(buf, 8192, pad=True) == 10_000
        assert f.size == 8192 + 10_000
    assert path.read_bytes()[8192:] == data.tobytes()


def test_allocate_sync_truncate(engine, tmp_path):
    path = tmp_path / "alloc.bin"
    with engine.open(path, "w") as f:
        f.allocate(1 << 20)
        assert f.size == 1 << 20
        assert os.stat(path).st_blocks * 512 >= 1 << 20  # really reserved, not sparse
        f.write(np.ones(10, np.uint8), 5)
        f.sync()
        f.truncate(100)
        assert f.size == 100
    assert path.read_bytes() == bytes(5) + b"\x01" * 10 + bytes(85)


def test_open_modes(engine, tmp_path):
    path = tmp_path / "m.bin"
    with pytest.raises(io.StorageError) as info:
        engine.open(path, "r+")
    assert info.value.errno == 2
    with engine.open(path, "x") as f:
        f.write(b"abc", 0)
    with pytest.raises(io.StorageError) as info:
        engine.open(path, "x")
    assert info.value.errno == 17  # EEXIST
    with engine.open(path, "a") as f:
        f.write(b"de", 3)
    assert path.read_bytes() == b"abcde"
    with engine.open(path, "w") as f:
        assert f.size == 0


def test_close_waits_for_in_flight_requests(engine, random_file):
    path, data = random_file(8 << 20)
    buf = np.zeros(8 << 20, np.uint8)
    f = engine.open(path, "r")
    fut = f.pread(buf, 0)
    f.close()  # must not close the descriptor under the in-flight read
    assert fut.result(timeout=30) == 8 << 20
    assert buf.tobytes() == data


def test_stats_and_trace(engine, random_file, tmp_path):
    path, _ = random_file(1 << 20)
    trace.tracer.start()
    try:
        with engine.open(path, "r") as f:
            f.pread_many(np.zeros(1 << 20, np.uint8), np.arange(256) * 4096, 4096).result()
    finally:
        trace.tracer.stop()
    assert engine.stats.snapshot()["bytes_read"] == 1 << 20
    assert engine.stats.snapshot()["requests"] == 256
    out = trace.tracer.save(tmp_path / "t.json")
    events = json.loads(out.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and spans[0]["name"] == "read x256" and spans[0]["args"]["bytes"] == 1 << 20


def test_split_large_request_and_zero_length(engine, random_file):
    path, data = random_file(5 << 20)
    out = np.zeros(5 << 20, np.uint8)
    with engine.open(path, "r", direct=True) as f:
        res = f.pread_many(out, [0, 100], [5 << 20, 0], [0, 0]).result()
    assert res.tolist() == [5 << 20, 0]
    assert out.tobytes() == data


@pytest.mark.gpu
def test_cuda_tensor_staged_roundtrip(engine, tmp_path):
    data = torch.randn(1 << 20, device="cuda")
    path = tmp_path / "gpu.bin"
    with engine.open(path, "w", direct=True) as f:
        assert f.write(data, 0) == data.numel() * 4
        back = torch.empty_like(data)
        assert f.read(back, 0) == data.numel() * 4
    assert torch.equal(back, data)


def test_one_buffer_per_extent(engine, random_file):
    """pread_buffers / pwrite_buffers: extent i moves to or from buffer i, all in one call; O_DIRECT-aligned and
    unaligned extents mixed; bad vectors are refused before anything is queued."""
    path, data = random_file(1 << 20)
    bufs = [io.aligned_empty(8192), np.zeros(100, np.uint8), io.aligned_empty(4096)]
    offsets = [4096, 333, 65536]
    with engine.open(path, "r+") as f:
        got = f.pread_buffers(bufs, offsets).result(timeout=30)  # lengths default to each buffer's size
        assert got.tolist() == [8192, 100, 4096]
        for buf, off in zip(bufs, offsets):
            assert buf.tobytes() == data[off:off + len(buf)]
        patterns = [np.full(len(b), k + 1, np.uint8) for k, b in enumerate(bufs)]
        for buf, pat in zip(bufs, patterns):
            buf[:] = pat
        assert f.pwrite_buffers(bufs, [0, 5000, 20480], [4096, 100, 4096]).result(timeout=30).tolist() == \
            [4096, 100, 4096]
        with pytest.raises(io.InvalidRequestError, match="2 buffers but 3 offsets"):
            f.pread_buffers(bufs[:2], offsets)
        with pytest.raises(io.InvalidRequestError, match="buffer 1 too small"):
            f.pread_buffers(bufs, offsets, [4096, 101, 4096])
    back = open(path, "rb").read()
    assert back[0:4096] == bytes([1]) * 4096 and back[5000:5100] == bytes([2]) * 100
    assert back[20480:24576] == bytes([3]) * 4096 and back[4096:5000] == data[4096:5000]


def test_a_finished_future_reads_like_a_concurrent_future():
    """``completed`` (what a request already satisfied returns) behaves as a finished
    ``concurrent.futures.Future`` for everything the engine's callers use."""
    import asyncio
    import concurrent.futures

    from terastack.io import completed, gather

    ref = concurrent.futures.Future()
    ref.set_result(7)
    done = completed(7)
    for fut in (ref, done):
        assert fut.done() and not fut.running() and not fut.cancelled() and not fut.cancel()
        assert fut.result() == 7 and fut.result(timeout=0) == 7 and fut.exception() is None
        seen = []
        fut.add_done_callback(lambda f: seen.append(f.result()))
        assert seen == [7]  # at once, on this thread
    assert done.then(lambda v: v + 1).result() == 8
    failed = done.then(lambda v: 1 / 0)
    assert isinstance(failed.exception(), ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        failed.result()
    assert gather([done, completed("x")]).result(timeout=1) == [7, "x"]

    async def read():
        return await completed(5)
    assert asyncio.run(read()) == 5
