"""Pinned staging of device transfers, driven here with plain host buffers and CPU copies standing in for the
side-stream copies: chunking through a cap smaller than the record, the cap and the host ledger, errors from a
copy's completion reaching the caller, reads not queued behind writes."""
import os
import threading
import time

import pytest
import torch

from terastack import io
from terastack.errors import BudgetError
from terastack.io.cuda import MIN_CHUNK, PinnedStaging, staging_chunk
from terastack.io.staged import chunked_read, chunked_write
from terastack.tiers.budget import BudgetLedger


def _file(tmp_path, size: int):
    data = os.urandom(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


def _cpu_copy_up(dst: torch.Tensor):
    def copy_up(buf, start, n):
        dst[start:start + n].copy_(buf[:n])
        return lambda: None
    return copy_up


def test_chunk_is_a_power_of_two_within_the_cap():
    assert staging_chunk(256 << 20) == 64 << 20
    assert staging_chunk(3 * MIN_CHUNK) == MIN_CHUNK
    assert staging_chunk(24 << 20) == 8 << 20  # two chunks at least, rounded down to a power of two
    with pytest.raises(ValueError, match="pinned_budget"):
        staging_chunk(MIN_CHUNK - 1)


def test_record_above_the_cap_is_read_in_chunks(tmp_path):
    size = 10 * MIN_CHUNK + 123  # 5x the cap, and a tail that is not a whole chunk
    path, data = _file(tmp_path, size)
    staging = PinnedStaging(2 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False)
    dst = torch.zeros(size, dtype=torch.uint8)
    with io.IOEngine(backend="python") as eng, eng.open(path) as f:
        got = chunked_read(lambda buf, s, n: f.pread(buf, s, n), _cpu_copy_up(dst), staging, size).result(10)
    assert got == size
    assert bytes(dst.numpy()) == data
    assert staging.peak <= staging.cap and staging.used == 0
    assert staging.allocated_bytes <= 2 * MIN_CHUNK  # buffers reused, not one per chunk


def test_record_above_the_cap_is_written_in_chunks(tmp_path):
    size = 7 * MIN_CHUNK + 5
    src = torch.randint(0, 256, (size,), dtype=torch.uint8)
    staging = PinnedStaging(2 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False)

    def copy_down(buf, s, n):
        buf[:n].copy_(src[s:s + n])
        return lambda: None
    path = tmp_path / "out.bin"
    with io.IOEngine(backend="python") as eng, eng.open(path, "w") as f:
        chunked_write(copy_down, lambda buf, s, n: f.pwrite(buf, s, n), staging, size).result(10)
    assert path.read_bytes()[:size] == bytes(src.numpy())
    assert staging.peak <= staging.cap and staging.used == 0


def test_staging_bytes_are_reserved_in_the_host_ledger():
    host = BudgetLedger("host", 3 * MIN_CHUNK)
    staging = PinnedStaging(4 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False, ledger=host)
    a, b = staging.acquire(), staging.acquire()
    assert host.used == 2 * MIN_CHUNK  # whole power-of-two chunks: what the pinned allocator really holds
    staging.release(a)
    staging.acquire()  # reuses a: nothing more reserved
    assert host.used == 2 * MIN_CHUNK
    host.reserve(MIN_CHUNK)  # the ledger is full now: the next acquire waits for a chunk of ours, no error
    threading.Timer(0.2, staging.release, args=(b,)).start()
    c = staging.acquire(timeout=5)
    host.release(MIN_CHUNK)
    staging.release(c)
    staging.close()  # the idle chunk's bytes go back; the one still in use stays reserved
    assert host.used == staging.allocated_bytes == MIN_CHUNK


def test_staging_without_room_for_one_chunk_names_the_budget():
    staging = PinnedStaging(2 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False, ledger=BudgetLedger("host", MIN_CHUNK - 1))
    with pytest.raises(BudgetError, match="host"):
        staging.acquire()


def test_error_from_a_copy_completion_fails_the_future(tmp_path):
    path, _ = _file(tmp_path, 3 * MIN_CHUNK)
    staging = PinnedStaging(2 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False)

    def copy_up(buf, s, n):
        def wait():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return wait
    with io.IOEngine(backend="python") as eng, eng.open(path) as f:
        fut = chunked_read(lambda buf, s, n: f.pread(buf, s, n), copy_up, staging, 3 * MIN_CHUNK)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            fut.result(60)  # raised, not a hang until the caller's timeout
    deadline = time.monotonic() + 60  # (a poll: waiting on the staging's condition could take the driver's wake-up)
    while staging.used and time.monotonic() < deadline:
        time.sleep(0.01)
    assert staging.used == 0  # every chunk came back


def test_reads_do_not_wait_behind_a_write_waiting_on_compute(tmp_path):
    path, data = _file(tmp_path, MIN_CHUNK)
    staging = PinnedStaging(4 * MIN_CHUNK, chunk=MIN_CHUNK, pin=False)
    compute_done = threading.Event()

    def copy_down(buf, s, n):
        return lambda: compute_done.wait(120)  # the write's copy waits on queued compute (until the test says)
    dst = torch.zeros(MIN_CHUNK, dtype=torch.uint8)
    with io.IOEngine(backend="python") as eng, eng.open(path, "r+") as f:
        write = chunked_write(copy_down, lambda buf, s, n: f.pwrite(buf, 8 * MIN_CHUNK + s, n), staging,
                              MIN_CHUNK)
        try:
            read = chunked_read(lambda buf, s, n: f.pread(buf, s, n), _cpu_copy_up(dst), staging, MIN_CHUNK)
            assert read.result(60) == MIN_CHUNK
            assert not write.done()
        finally:
            compute_done.set()
        write.result(60)
    assert bytes(dst.numpy()) == data


def test_empty_transfer_completes():
    staging = PinnedStaging(2 * MIN_CHUNK, pin=False)
    assert chunked_read(None, None, staging, 0).result(1) == 0
