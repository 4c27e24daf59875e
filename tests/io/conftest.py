import pytest

from terastack import io
from terastack.io.backend import backend_names, backend_unavailable_reason

#: Every registered backend, in the order auto tries them (io_uring, threads, python, then any added).
BACKENDS = list(backend_names())


def available(backend: str) -> str | None:
    """None if the backend can run here, else why not."""
    return backend_unavailable_reason(backend)


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
