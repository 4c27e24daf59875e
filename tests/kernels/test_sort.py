import numpy as np
import pytest

from terastack import io
from terastack.kernels.sort import KEY, Checksum, ExternalSort
from terastack.memory import PeakRSS


def write_keys(path, keys):
    with io.open(path, "w") as f:
        f.write(keys, 0)


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("n", [1, 4095, 300_007])
def test_external_sort_matches_numpy(tmp_path, pipelined, n):
    rng = np.random.default_rng(n)
    keys = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    keys[: n // 10] = keys[n // 2]  # duplicates
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    write_keys(src, keys)
    sorter = ExternalSort(ExternalSort.Config(host_budget=256 << 10, threads=2, pipelined=pipelined))
    stats = sorter.sort_file(str(src), str(dst), str(tmp_path))
    sorter.close()
    assert np.array_equal(np.fromfile(dst, KEY), np.sort(keys))
    if n > 100_000:
        assert stats.runs > 8  # really external: many runs merged
    assert stats.peak_buffer_bytes <= 256 << 10


def test_in_memory_variant_matches(tmp_path):
    keys = np.random.default_rng(3).integers(-1000, 1000, 200_000, dtype=np.int64)
    sorter = ExternalSort(ExternalSort.Config(host_budget=1 << 20))
    out, stats = sorter.sort_in_memory(keys)
    sorter.close()
    assert np.array_equal(out, np.sort(keys)) and stats.runs >= 2


def test_io_only_moves_the_same_bytes(tmp_path):
    keys = np.arange(100_000, dtype=np.int64)[::-1].copy()
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    write_keys(src, keys)
    real = ExternalSort(ExternalSort.Config(host_budget=256 << 10)).sort_file(str(src), str(dst), str(tmp_path))
    fake = ExternalSort(ExternalSort.Config(host_budget=256 << 10, io_only=True)).sort_file(
        str(src), str(dst), str(tmp_path))
    assert (fake.bytes_read, fake.bytes_written) == (real.bytes_read, real.bytes_written)


def test_peak_rss_stays_within_budget(tmp_path):
    budget = 16 << 20
    keys = np.random.default_rng(0).integers(-2**62, 2**62, 8 * budget // 8, dtype=np.int64)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    write_keys(src, keys)
    del keys
    sorter = ExternalSort(ExternalSort.Config(host_budget=budget, threads=2))
    sorter.sort_file(str(src), str(dst), str(tmp_path))  # warm-up
    with PeakRSS() as rss:
        sorter.sort_file(str(src), str(dst), str(tmp_path))
    sorter.close()
    assert rss.peak_bytes < budget, f"peak RSS {rss.peak_bytes} above budget {budget}"


def test_checksum_is_order_independent_and_detects_changes():
    keys = np.random.default_rng(1).integers(-2**63, 2**63 - 1, 1000, dtype=np.int64)
    a, b, c = Checksum(), Checksum(), Checksum()
    a.add(keys)
    b.add(keys[::-1].copy())
    changed = keys.copy()
    changed[5] += 1
    c.add(changed)
    assert a == b and a != c


def test_bad_input_size(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"x" * 13)
    with pytest.raises(ValueError, match="multiple of 8"):
        ExternalSort(ExternalSort.Config(host_budget=1 << 20)).sort_file(
            str(tmp_path / "odd.bin"), str(tmp_path / "o.bin"), str(tmp_path))
    with pytest.raises(ValueError, match="host_budget"):
        ExternalSort.Config(host_budget=1000)
