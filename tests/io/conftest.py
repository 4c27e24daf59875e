import pytest

from terastack import io
from terastack.io import _native

BACKENDS = ["io_uring", "threads", "python"]


def available(backend: str) -> str | None:
    """None if the backend can run here, else why not."""
    if backend == "python":
        return None
    reason = _native.load_error()
    if reason is None and backend == "io_uring":
        reason = _native.uring_unavailable_reason()
    return reason


@pytest.fixture(params=BACKENDS)
def engine(request):
    why = available(request.param)
    if why is not None:
        # The backend cannot exist on this machine; the auto-selection test covers the fallback.
        pytest.skip(f"{request.param} unavailable here: {why}")
    eng = io.IOEngine(backend=request.param, threads=8, queue_depth=32)
    assert eng.backend == request.param
    yield eng
    eng.close()


@pytest.fixture
def random_file(tmp_path):
    import os

    def make(size: int, name: str = "ref.bin") -> tuple[str, bytes]:
        data = os.urandom(size)
        path = tmp_path / name
        path.write_bytes(data)
        return str(path), data
    return make
