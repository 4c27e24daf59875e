"""The SSD probe of a dataset's feature file: medians over windows, so one slow second does not set the rate."""
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from terastack.constants import BLOCK
from terastack.gnn.advise import probe_feature_file, probe_while_training, training_steps
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.hotness import presample
from terastack.gnn.sampling.sampler import NeighborSampler
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
    # the median, not the stalled window, is the rate (however slowly a loaded machine serves the other windows,
    # none waits 0.3 s before its first request)
    assert out["ssd_rand4k_iops"] == pytest.approx(float(np.median(rates)))
    assert out["ssd_rand4k_iops"] > rates[0] == min(rates)
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


class ReadLog(list):
    """When each read request began (in order: one reader thread), and a condition to wait for the next."""

    def __init__(self):
        super().__init__()
        self.began = threading.Condition()

    def add(self, t: float) -> None:
        with self.began:
            self.append(t)
            self.began.notify_all()

    def wait_for_one_after(self, t0: float, timeout: float = 60.0) -> None:
        with self.began:
            assert self.began.wait_for(lambda: self and self[-1] >= t0, timeout), "no read began"


def counting_reads(monkeypatch) -> ReadLog:
    """Patches File.pread_many to log each request's time; returns the log."""
    log, real = ReadLog(), File.pread_many

    def pread_many(self, *args, **kwargs):
        log.add(time.perf_counter())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(File, "pread_many", pread_many)
    return log


# ----------------------------------------------------------------- the SSD and the step under each other's load
@pytest.fixture
def tiny_hot(tiny):
    ds = open_dataset(tiny)
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 5), seed=0)
    yield ds, presample(sampler, ds.splits["train"], 64, epochs=1, seed=0)["node"]
    ds.close()


def test_reads_run_while_the_steps_run(tiny_hot, monkeypatch):
    import terastack.gnn.advise as advise

    ds, hot = tiny_hot
    reads, steps = counting_reads(monkeypatch), []
    real_step = advise.train_step

    def train_step(*args, **kwargs):
        t0 = time.perf_counter()
        time.sleep(0.02)
        if steps:  # a timed step (the warm-up runs before the reads start) ends only once a read began inside it:
            # by an event, however slowly a loaded machine serves the reader; reads run after the steps would hang
            reads.wait_for_one_after(t0)
        out = real_step(*args, **kwargs)
        steps.append((t0, time.perf_counter()))
        return out

    monkeypatch.setattr(advise, "train_step", train_step)
    out = probe_while_training(ds, training_steps("sage", hot.examples, ds, hidden=8, layers=2), seconds=0.3,
                               window_seconds=0.05, min_steps=4, batch_blocks=8)
    warm_up, timed = steps[0], steps[1:]
    assert out["steps"] == len(timed) >= 4 and out["seconds"] >= 0.3
    # the reads span the timed steps: one began inside the first and one inside the last
    assert any(timed[0][0] <= t <= timed[0][1] for t in reads)
    assert any(timed[-1][0] <= t <= timed[-1][1] for t in reads)
    assert warm_up[1] <= reads[0]  # the warm-up ran before the first read
    assert out["ssd_rand4k_iops"] == pytest.approx(float(np.median(out["windows"]["ssd_rand4k_iops"])))
    assert out["compute_seconds_per_node"] == pytest.approx(
        float(np.median(out["windows"]["compute_seconds_per_node"])))
    assert out["compute_seconds_per_node"] > 0.02 / max(b.num_nodes for b in hot.examples)


def test_a_failed_read_stops_the_training_and_is_raised(tiny_hot, monkeypatch):
    ds, hot = tiny_hot

    def pread_many(self, *args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(File, "pread_many", pread_many)
    step, calls = training_steps("sage", hot.examples, ds, hidden=8, layers=2), []

    def counted(k):
        calls.append(k)
        return step(k)
    with pytest.raises(OSError, match="Input/output error"):
        probe_while_training(ds, counted, seconds=30.0, min_steps=1000)
    assert len(calls) < 1000  # the steps stopped at the failure, not after 1000 steps (counted, not timed)


def test_loaded_probe_refuses_bad_durations(tiny_hot):
    ds, hot = tiny_hot
    with pytest.raises(ValueError, match="min_steps"):
        probe_while_training(ds, training_steps("sage", hot.examples, ds, hidden=8, layers=2), min_steps=0)


# ----------------------------------------------------------------- the step beside the epoch's own read rate
def load_sensitive_step(reads: ReadLog, full_rate, *, base: float = 0.01, per_read: float = 0.002):
    """A step that takes ``base`` s plus ``per_read`` for every read request that began during its first ``base``
    seconds: slower the harder the disk is driven, as the CPU's matmuls are beside SSD traffic. While the reads
    run at the disk's full rate (``full_rate()``), the disk is never idle: a timed step that saw no request begin
    (a loaded machine's reader thread is slow) waits for the next, which it then counts -- an event, not a
    race against the reader's pace."""
    def train_once(k: int) -> int:
        t0 = time.perf_counter()
        time.sleep(base)
        if k > 0 and full_rate() and not (reads and reads[-1] >= t0):  # k 0: the warm-up, before the reads
            reads.wait_for_one_after(t0)
        time.sleep(per_read * sum(1 for t in reads if t >= t0))
        return 10
    return train_once


def test_paced_reads_keep_to_the_rate(feature_file, monkeypatch):
    reads = counting_reads(monkeypatch)
    out = probe_while_training(feature_file, lambda k: time.sleep(0.01) or 10, seconds=0.6, window_seconds=0.1,
                               min_steps=1, batch_blocks=8, rate=200.0)  # one request of 8 blocks every 0.04 s
    span = reads[-1] - reads[0]
    assert out["rate_limit"] == 200.0 and out["request_blocks"] == 8
    assert len(reads) >= 2 and span >= (len(reads) - 1) * 0.04 * 0.95  # never ahead of the pace
    # the rate the disk kept, never above the pace (each request counts its whole slot): how close to it a loaded
    # machine's reader thread comes is its pace, not the probe's
    assert 0 < out["ssd_rand4k_iops"] <= 200.0 * (1 + 1e-9)
    assert out["ssd_rand4k_iops"] == pytest.approx(float(np.median(out["windows"]["ssd_rand4k_iops"])))
    unpaced = probe_while_training(feature_file, lambda k: time.sleep(0.01) or 10, seconds=0.3, window_seconds=0.1,
                                   min_steps=1, batch_blocks=8)
    assert unpaced["ssd_rand4k_iops"] > 200.0  # not held to a pace


class FakeClock:
    """``time`` for the probe: the clock moves only when a step sleeps (at any pace of the machine)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_zero_rate_reads_nothing(feature_file, monkeypatch):
    import terastack.gnn.advise as advise

    reads, clock = counting_reads(monkeypatch), FakeClock()
    monkeypatch.setattr(advise, "time", clock)  # without reads, only the steps' time is measured
    out = probe_while_training(feature_file, lambda k: clock.sleep(0.0625) or 10, seconds=0.5, min_steps=3, rate=0.0)
    assert reads == [] and out["steps"] == 8 and out["ssd_rand4k_iops"] == 0.0
    assert out["compute_seconds_per_node"] == 0.00625  # 0.0625 s a step of 10 nodes


def test_the_step_is_timed_beside_the_predicted_epochs_reads(feature_file, monkeypatch):
    import terastack.gnn.advise as advise

    reads = counting_reads(monkeypatch)
    calls, probes, real_probe = [], [], advise.probe_while_training

    def probe(*args, **kwargs):
        probes.append(kwargs)
        return real_probe(*args, **kwargs)

    monkeypatch.setattr(advise, "probe_while_training", probe)

    def predict(iops, seconds_per_node):  # 10 batches of ten steps' time (compute-bound), 16 blocks read a batch
        calls.append((iops, seconds_per_node))
        batch = seconds_per_node * 100
        return SimpleNamespace(epoch_seconds=10 * batch, batch_seconds=batch, ssd_bytes_per_epoch=10 * 16 * BLOCK)

    # a read costs the step twice its own base time: the one read at the full rate inside every step tells the two
    # rates apart, however few reads a loaded machine's reader thread manages
    step = load_sensitive_step(reads, lambda: "rate" not in probes[-1], per_read=0.02)
    out = advise.measure_under_epoch_load(feature_file, step, predict, seconds=0.4, rounds=2,
                                          window_seconds=0.1, min_steps=3, batch_blocks=8)
    full, paced = out["full_rate"], out["at_epoch_rate"]
    assert len(paced) == 2 and "rate" not in probes[0]
    for k, (before, probed) in enumerate(zip(calls, paced)):  # each round reads at the rate the last step predicts
        batch = before[1] * 100
        assert probes[k + 1]["rate"] == pytest.approx(16 / batch)
        assert probes[k + 1]["batch_blocks"] == 16 and probed["request_blocks"] == 16
    # the reads at the epoch's rate slow the step far less than the full rate did, and the model takes that step
    assert paced[-1]["compute_seconds_per_node"] < 0.6 * full["compute_seconds_per_node"]
    assert out["compute_seconds_per_node"] == paced[-1]["compute_seconds_per_node"] == calls[-1][1]
    assert out["ssd_rand4k_iops"] == full["ssd_rand4k_iops"] == calls[-1][0]


def test_an_epoch_that_keeps_the_disk_busy_is_timed_at_the_full_rate(feature_file):
    def predict(iops, seconds_per_node):  # reads at the disk's whole rate
        return SimpleNamespace(epoch_seconds=1.0, batch_seconds=0.1, ssd_bytes_per_epoch=iops * BLOCK)

    from terastack.gnn.advise import measure_under_epoch_load

    out = measure_under_epoch_load(feature_file, lambda k: time.sleep(0.01) or 10, predict, seconds=0.2,
                                   window_seconds=0.05, min_steps=2, batch_blocks=8)
    assert out["at_epoch_rate"] == [] and out["compute_seconds_per_node"] == out["full_rate"]["compute_seconds_per_node"]
    assert out["prediction"].ssd_bytes_per_epoch == out["ssd_rand4k_iops"] * BLOCK


def test_wide_rows_are_read_as_extents_of_their_blocks(feature_file, monkeypatch):
    from terastack.gnn.advise import feature_file_hardware

    expected = np.fromfile(feature_file.features_path, np.uint8)
    calls = []
    real_read = File.pread_many

    def pread_many(self, buf, offsets, lengths, buffer_offsets=None):
        fut = real_read(self, buf, offsets, lengths, buffer_offsets)
        fut.result()
        for off, at in zip(offsets, buffer_offsets):  # each extent landed where the request said, intact
            assert np.array_equal(buf[at:at + lengths], expected[off:off + lengths])
        calls.append((np.asarray(offsets), lengths, np.asarray(buffer_offsets)))
        return fut

    monkeypatch.setattr(File, "pread_many", pread_many)
    out = probe_while_training(feature_file, lambda k: 1, seconds=0.05, window_seconds=0.02, min_steps=2,
                               batch_blocks=16, extent_blocks=4)
    assert calls and out["ssd_rand4k_iops"] > 0
    for offsets, lengths, at in calls:
        # 16 blocks a request as 4 extents of 4 blocks, block-aligned, distinct, packed in the buffer
        assert lengths == 4 * BLOCK and len(offsets) == 4 and len(set(offsets.tolist())) == 4
        assert (offsets % BLOCK == 0).all() and (offsets + lengths <= feature_file.feature_bytes).all()
        assert at.tolist() == [0, 4 * BLOCK, 8 * BLOCK, 12 * BLOCK]
    # the model's figure: reads of 16 KiB at a quarter of the blocks' rate
    hw = feature_file_hardware({"ssd_read_bytes_per_s": 1e9, "ssd_rand4k_iops": 1000.0}, iops=4000.0,
                               extent_blocks=4)
    assert [(e["request_bytes"], e["reads_per_s"]) for e in hw.ssd_random_reads] == [(4 * BLOCK, 1000.0)]
    with pytest.raises(ValueError, match="extent_blocks"):
        probe_while_training(feature_file, lambda k: 1, seconds=0.05, extent_blocks=0)
