"""Bad input gets a clear exception carrying errno, path, offset and length — never a hang or a crash."""
import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from terastack import io

from tests.io.conftest import BACKENDS, available


def test_missing_file(engine, tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(io.StorageError) as info:
        engine.open(missing, "r")
    assert info.value.errno == errno.ENOENT
    assert info.value.path == str(missing)
    assert "nope.bin" in str(info.value)


def test_permission_denied(tmp_path):
    """Run unprivileged: root bypasses file permissions."""
    target = tmp_path / "secret.bin"
    target.write_bytes(b"x" * 100)
    target.chmod(0o000)
    os.chmod(tmp_path, 0o755)
    code = textwrap.dedent(f"""
        import os, sys
        from terastack import io
        engine = io.get_engine()  # everything imported before privileges are dropped
        if os.getuid() == 0:
            os.setgid(65534); os.setuid(65534)
        try:
            io.open({str(target)!r}, "r", engine=engine)
        except io.StorageError as e:
            print(e.errno, e.path)
            sys.exit(0)
        sys.exit(1)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    err, path = out.stdout.split()
    assert int(err) == errno.EACCES and path == str(target)


def test_read_past_end_of_file(engine, random_file):
    path, data = random_file(10_000)
    buf = np.zeros(4096, np.uint8)
    with engine.open(path, "r") as f:
        with pytest.raises(io.EndOfFileError) as info:
            f.read(buf, 8000)
    e = info.value
    assert (e.path, e.offset, e.length, e.got) == (path, 8000, 4096, 2000)
    assert isinstance(e, EOFError) and e.errno == errno.ENODATA
    assert buf[:2000].tobytes() == data[8000:]


def test_full_disk_gives_enospc(engine):
    buf = np.ones(8192, np.uint8)
    with engine.open("/dev/full", "r+", direct=False) as f:
        with pytest.raises(io.StorageError) as info:
            f.write(buf, 0)
    assert info.value.errno == errno.ENOSPC
    assert (info.value.path, info.value.offset, info.value.length) == ("/dev/full", 0, 8192)


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_size_limit_gives_efbig(tmp_path, backend):
    """RLIMIT_FSIZE: the write fails with EFBIG and the process lives (SIGXFSZ must not kill it)."""
    if available(backend):
        pytest.skip(available(backend))
    code = textwrap.dedent(f"""
        import resource, sys, numpy as np
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from terastack import io
        eng = io.IOEngine(backend={backend!r})
        with eng.open({str(tmp_path / "big.bin")!r}, "w", direct=False) as f:
            try:
                f.write(np.ones(2 << 20, np.uint8), 0)
            except io.StorageError as e:
                print(e.errno, e.offset, e.length)
                sys.exit(0)
        sys.exit(3)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, (out.returncode, out.stderr)
    err, offset, length = map(int, out.stdout.split())
    assert err == errno.EFBIG and offset == 0 and length == 2 << 20


def test_use_after_close(engine, random_file):
    path, _ = random_file(100)
    f = engine.open(path, "r")
    f.close()
    with pytest.raises(io.ClosedFileError) as info:
        f.pread(bytearray(10), 0)
    assert info.value.errno == errno.EBADF and info.value.path == path
    with pytest.raises(io.ClosedFileError):
        f.pread_many(bytearray(10), [0], [10])
    f.close()  # closing twice is harmless


def test_buffer_too_small(engine, random_file):
    path, _ = random_file(100)
    with engine.open(path, "r") as f:
        with pytest.raises(io.InvalidRequestError) as info:
            f.pread(bytearray(10), 0, 50)
        assert info.value.errno == errno.EINVAL and info.value.length == 50 and "too small" in str(info.value)
        with pytest.raises(io.InvalidRequestError, match="request 1"):
            f.pread_many(bytearray(20), [0, 10], [10, 11])


def test_negative_offsets(engine, random_file):
    path, _ = random_file(100)
    with engine.open(path, "r+") as f:
        with pytest.raises(io.InvalidRequestError) as info:
            f.pread(bytearray(10), -1)
        assert info.value.offset == -1 and isinstance(info.value, ValueError)
        with pytest.raises(io.InvalidRequestError):
            f.pwrite(bytearray(10), -4096)
        with pytest.raises(io.InvalidRequestError, match="offset must be >= 0"):
            f.pread_many(bytearray(20), [0, -10], [10, 10])


def test_read_only_buffer_and_read_only_file(engine, random_file):
    path, _ = random_file(100)
    with engine.open(path, "r") as f:
        with pytest.raises(io.InvalidRequestError, match="read-only"):
            f.pread(b"immutable bytes", 0)
        with pytest.raises(io.StorageError, match="read-only") as info:
            f.pwrite(bytearray(10), 0)
        assert info.value.errno == errno.EBADF


def test_unsupported_buffer(engine, random_file):
    path, _ = random_file(100)
    with engine.open(path, "r") as f:
        with pytest.raises(io.InvalidRequestError, match="unsupported buffer"):
            f.pread([1, 2, 3], 0)
        with pytest.raises(io.InvalidRequestError, match="contiguous"):
            f.pread(np.zeros((10, 10), np.uint8)[:, ::2], 0)


def test_batch_reports_each_failed_request(engine, random_file):
    path, data = random_file(10_000)
    buf = np.zeros(3 * 4096, np.uint8)
    with engine.open(path, "r") as f:
        fut = f.pread_many(buf, [0, 9000, 20000], [4096, 4096, 4096], [0, 4096, 8192])
        with pytest.raises(io.BatchError) as info:
            fut.result(timeout=30)
    e = info.value
    assert e.results.tolist() == [4096, 1000, 0]
    assert [(x.offset, x.got) for x in e.errors] == [(9000, 1000), (20000, 0)]
    assert buf[:4096].tobytes() == data[:4096]


def test_o_direct_refused_is_explained(engine):
    """Files that refuse O_DIRECT (here /dev/zero): direct=True fails clearly, "auto" falls back and says why."""
    with pytest.raises(io.StorageError, match="O_DIRECT") as info:
        engine.open("/dev/zero", "r", direct=True)
    assert info.value.errno == errno.EINVAL and info.value.path == "/dev/zero"
    with engine.open("/dev/zero", "r", direct="auto") as f:
        assert not f.direct and "O_DIRECT" in f.direct_reason
        out = bytearray(b"x" * 3000)
        assert f.read(out, 0) == 3000
        assert out == bytes(3000)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="backend"):
        io.IOEngine(backend="spdk")
    with pytest.raises(ValueError, match="split_bytes"):
        io.IOEngine(split_bytes=1000)
    with pytest.raises(ValueError, match="mode"):
        io.open("/dev/null", "rw")
