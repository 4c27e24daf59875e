"""The SSD probe of a dataset's feature file: medians over windows, so one slow second does not set the rate."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from terastack.constants import BLOCK
from terastack.gnn.advise import probe_feature_file
from terastack.io.file import File


@pytest.fixture
def feature_file(tmp_path):
    path = tmp_path / "features.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 512 * BLOCK, dtype=np.uint8).tobytes())
    return SimpleNamespace(features_path=str(path), feature_bytes=512 * BLOCK)


def test_one_slow_window_does_not_set_the_rate(feature_file, monkeypatch):
    calls = []
    real = File.pread_many

    def pread_many(self, *args, **kwargs):
        calls.append(time.perf_counter())
        if len(calls) == 1:  # the first window's first request stalls, as a disk busy elsewhere would
            time.sleep(0.3)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(File, "pread_many", pread_many)
    out = probe_feature_file(feature_file, seconds=0.3, windows=3, batch_blocks=64, seq_bytes=64 * BLOCK)
    rates = out["windows"]["ssd_rand4k_iops"]
    assert len(rates) == 3 and len(out["windows"]["ssd_read_bytes_per_s"]) == 3
    assert rates[0] < 64 / 0.3  # the stalled window: at most one batch of 64 blocks in its 0.3 s
    assert out["ssd_rand4k_iops"] == pytest.approx(float(np.median(rates)))
    assert out["ssd_rand4k_iops"] > 10 * rates[0]
    assert out["io_cpu_seconds_per_block"] == pytest.approx(float(np.median(out["windows"]["io_cpu_seconds_per_block"])))


def test_sequential_reads_are_spread_over_the_file(feature_file, monkeypatch):
    offsets = []
    real = File.read

    def read(self, buf, offset, length=None, **kwargs):
        offsets.append((offset, length))
        return real(self, buf, offset, length, **kwargs)

    monkeypatch.setattr(File, "read", read)
    probe_feature_file(feature_file, seconds=0.05, windows=1, batch_blocks=16, seq_bytes=128 * BLOCK, seq_reads=3)
    assert offsets == [(0, 128 * BLOCK), (192 * BLOCK, 128 * BLOCK), (384 * BLOCK, 128 * BLOCK)]


def test_bad_window_counts_are_refused(feature_file):
    with pytest.raises(ValueError, match="windows and seq_reads"):
        probe_feature_file(feature_file, windows=0)
