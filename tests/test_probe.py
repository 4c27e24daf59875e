import json

import pytest

from terastack import probe
from terastack.cli import main
from terastack.plan import PRESETS, Hardware, load_probe, save_probe


def test_ssd_measurement_on_a_real_file(tmp_path):
    r = probe.measure_ssd(str(tmp_path), 16 << 20, rand_seconds=0.2)
    assert r["ssd_read_bytes_per_s"] > 1e6 and r["ssd_write_bytes_per_s"] > 1e6 and r["ssd_rand4k_iops"] > 100
    # a reader and a writer at once ([Note: reads and writes at once] in terastack.plan.hardware)
    assert r["ssd_mixed_read_bytes_per_s"] > 0 and r["ssd_mixed_write_bytes_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # the probe file is removed


def test_io_slowdown_measurement_on_a_real_file(tmp_path):
    k = probe.measure_io_slowdown(str(tmp_path), seconds=0.1, file_bytes=16 << 20)
    assert 0 <= k < 5  # a fraction of the compute rate per GB/s: a machine losing all of it at 0.2 GB/s is broken
    assert list(tmp_path.iterdir()) == []


def test_compute_measurements_are_plausible():
    assert 1e8 < probe.measure_cpu_flops(0.1, n=256) < 1e15
    assert 1e8 < probe.measure_memcpy(0.05, nbytes=8 << 20) < 1e12
    assert 1e5 < probe.measure_cpu_adam(0.1, params=1 << 16) < 1e12
    rates = probe.measure_cpu_updates(0.05, params=1 << 16)
    assert 1e3 < rates["adafactor"] < 1e12
    assert "adamw8bit" not in rates or 1e3 < rates["adamw8bit"] < 1e12


@pytest.mark.parametrize("name", ["adafactor", "adamw8bit"])
def test_a_formats_rate_is_its_update_as_the_step_calls_it(monkeypatch, name):
    """[Note: a format's rate as the step updates] The probe times the format's own ``update`` (the call the step's
    optimizer makes) over optimizer chunks as the optimizer hands them over: several chunks a call, the master and
    gradient views of one tensor each, each chunk's state parts tensors of their own, the step count moving each
    call. The rate is the elements updated per second of the clock: here a fake one, 1 s per update."""
    from terastack.plan import optimizer_formats as formats

    fmt = formats.optimizer_format(name)
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    seen, clock = [], [0.0]
    original = type(fmt).update

    def counted(self, chunks, steps, **kw):
        seen.append((chunks, list(steps)))
        clock[0] += 1.0
        return original(self, chunks, steps, **kw)

    monkeypatch.setattr(type(fmt), "update", counted)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clock[0])
    rates = probe.measure_cpu_updates(2.5, params=1 << 16, chunk=1 << 14, names=(name,))
    # one call before the clock starts, then calls until 2.5 s have passed: 3 calls in 3 s
    assert rates[name] == pytest.approx(3 * (1 << 16) / 3.0)
    assert [steps for _, steps in seen] == [[k] * 4 for k in range(4)]
    for chunks, _ in seen:
        assert [(c.lo, c.hi) for c in chunks] == [(k << 14, (k + 1) << 14) for k in range(4)]
        masters = {c.param.untyped_storage().data_ptr() for c in chunks}
        states = [t.untyped_storage().data_ptr() for c in chunks for t in c.state.values()]
        assert len(masters) == 1 and len(set(states)) == len(states)


def test_cache_roundtrip_and_hypothetical_overrides(tmp_path):
    hw = PRESETS["rtx4090-workstation"]
    path = save_probe(hw, tmp_path / "p.json")
    back = load_probe(path)
    assert back == hw
    bigger = hw.with_overrides(host_memory_bytes="512GiB", ssds=4)
    assert bigger.host_memory_bytes == 512 * 2**30 and not bigger.measured and bigger.ssd_read_total == 4 * 6.8e9
    (tmp_path / "bad.json").write_text(json.dumps({"cores": 2, "warp_drive": 1}))
    with pytest.raises(ValueError, match="warp_drive"):
        load_probe(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cores"):
        Hardware(cores=0)


def test_probe_command_caches(tmp_path, capsys, monkeypatch):
    fake = PRESETS["a100-server"].with_overrides(name="probed", probe_dir=str(tmp_path))
    calls = []
    monkeypatch.setattr(probe, "measure", lambda d, quick=False: calls.append(d) or fake)
    cache = tmp_path / "probe.json"
    assert main(["probe", "--dir", str(tmp_path), "--json", "--cache", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "probed"
    assert main(["probe", "--dir", str(tmp_path), "--cache", str(cache)]) == 0  # served from the cache
    assert len(calls) == 1 and "A100" in capsys.readouterr().out


def test_load_or_measure_measures_once_then_takes_the_cache(tmp_path, monkeypatch):
    """What the benchmarks call (their smoke tests start from a cached probe: tests/conftest.py's cached_probe)."""
    fake = PRESETS["a100-server"].with_overrides(name="probed", probe_dir=str(tmp_path))
    calls = []
    monkeypatch.setattr(probe, "measure", lambda d, quick=False: calls.append((d, quick)) or fake)
    monkeypatch.setenv("TERASTACK_CACHE", str(tmp_path / "cache"))
    assert probe.load_or_measure(str(tmp_path)) == fake and calls == [(str(tmp_path), True)]
    assert load_probe(tmp_path / "cache" / "probe.json") == fake
    assert probe.load_or_measure(str(tmp_path / "elsewhere")) == fake and len(calls) == 1


def test_probe_over_two_directories_measures_each(tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    real = probe.measure_ssd
    # quick mode with a tiny file: the same measurement on 16 MiB
    monkeypatch.setattr(probe, "measure_ssd", lambda d, file_bytes, rand_seconds=2.0: real(d, 16 << 20,
                                                                                            rand_seconds=0.1))
    # and the rest of the probe the same measurements at the sizes of the tests above
    slowdown, flops, memcpy = probe.measure_io_slowdown, probe.measure_cpu_flops, probe.measure_memcpy
    adam, updates = probe.measure_cpu_adam, probe.measure_cpu_updates
    monkeypatch.setattr(probe, "measure_io_slowdown", lambda d, seconds=1.0: slowdown(d, 0.1, file_bytes=16 << 20))
    monkeypatch.setattr(probe, "measure_cpu_flops", lambda seconds=1.0: flops(0.05, n=256))
    monkeypatch.setattr(probe, "measure_memcpy", lambda seconds=0.5: memcpy(0.05, nbytes=8 << 20))
    monkeypatch.setattr(probe, "measure_cpu_adam", lambda seconds=1.0: adam(0.05, params=1 << 16))
    monkeypatch.setattr(probe, "measure_cpu_updates", lambda seconds=1.0: updates(0.05, params=1 << 16))
    cache = tmp_path / "probe.json"
    assert main(["probe", "--dir", f"{a},{b}", "--quick", "--json", "--cache", str(cache)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["dir"] for e in out["ssd_dirs"]] == [str(a), str(b)]
    assert out["probe_dir"] == f"{a},{b}"
    for e in out["ssd_dirs"]:
        assert e["ssd_read_bytes_per_s"] > 1e6 and e["ssd_write_bytes_per_s"] > 1e6 and e["ssd_rand4k_iops"] > 100
    # both directories are on one file system here: one device, the mean of their two measurements
    assert out["ssds"] == 1
    mean = sum(e["ssd_read_bytes_per_s"] for e in out["ssd_dirs"]) / 2
    assert out["ssd_read_bytes_per_s"] == pytest.approx(mean)
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []  # probe files removed
    assert main(["probe", "--dir", f"{a},{b}", "--cache", str(cache)]) == 0  # served from the cache
    assert str(a) in capsys.readouterr().out
