"""The DaCe suite: scaling bookkeeping (here), and three kernels through DaCe, Numba and MPI (in its environment).

The end-to-end test creates the suite's environment on first use (about a minute: pip
installs dace, numba, scipy, mpi4py) and reuses it afterwards; set TERASTACK_DACE_ENV
to choose where. TERASTACK_SKIP_DACE=1 skips it, and the skip says so.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from terastack.repro.dace import scaling
from terastack.repro.dace.suite import (DaceSuite, mpirun_flags, process_counts, scaling_efficiency,
                                        scaling_summary)


def test_global_rows_slices_equal_the_whole_matrix():
    whole = scaling.global_rows(3, (200, 7), 0, 200)
    for start, end in ((0, 1), (63, 65), (64, 128), (100, 200), (5, 5)):
        np.testing.assert_array_equal(scaling.global_rows(3, (200, 7), start, end), whole[start:end])


def test_blocks_cover_every_row_once():
    for n, p in ((10, 3), (7, 7), (1000, 4)):
        ranges = [scaling.block_range(n, p, r) for r in range(p)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_weak_scaling_grows_the_split_dimension():
    assert scaling.sizes_for("gemm", "smoke", "weak", 4)["NI"] == 4 * scaling.SIZES["gemm"]["smoke"]["NI"]
    assert scaling.sizes_for("gemm", "smoke", "strong", 4) == scaling.SIZES["gemm"]["smoke"]
    with pytest.raises(ValueError, match="mode"):
        scaling.sizes_for("gemm", "smoke", "sideways", 2)


def test_process_counts():
    assert process_counts(1) == [1]
    assert process_counts(2) == [1, 2]
    assert process_counts(6) == [1, 2, 4, 6]


def test_efficiency_formulas():
    def rec(kernel, mode, p, t):
        return {"kernel": kernel, "mode": mode, "procs": p, "sizes": {}, "validation": {"ok": True}, "median": t}

    runs = {1: {"status": "ok", "records": [rec("gemm", "strong", 1, 10.0), rec("gemm", "weak", 1, 10.0)]},
            4: {"status": "ok", "records": [rec("gemm", "strong", 4, 5.0), rec("gemm", "weak", 4, 12.5)]}}
    eff = scaling_efficiency(runs)
    strong4 = eff["gemm (numpy)"]["strong"][1]
    assert strong4["speedup"] == pytest.approx(2.0) and strong4["efficiency"] == pytest.approx(0.5)
    assert eff["gemm (numpy)"]["weak"][1]["efficiency"] == pytest.approx(0.8)
    s = scaling_summary({"efficiency": eff})
    assert s == {"max_procs": 4, "local": "numpy", "weak_efficiency_min": pytest.approx(0.8),
                 "strong_efficiency_min": pytest.approx(0.5)}
    # with DaCe-compiled rank-local runs present, the summary is theirs
    dace_runs = {p: {"status": "ok", "records": [{**r, "local": "dace", "median": r["median"] / 2}
                                                 for r in run["records"]] + run["records"]}
                 for p, run in runs.items()}
    assert scaling_summary({"efficiency": scaling_efficiency(dace_runs)})["local"] == "dace"


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(os.environ.get("TERASTACK_SKIP_DACE") == "1",
                    reason="TERASTACK_SKIP_DACE=1: the DaCe end-to-end run was switched off for this run")
@pytest.mark.parametrize("kernels,scaling", [(("gemm",), False), (("jacobi_2d",), False), (("crc16",), True)],
                         ids=["gemm", "jacobi_2d", "crc16-and-mpi"])
def test_three_kernels_through_dace_numba_and_mpi(tmp_path, kernels, scaling, monkeypatch):
    """Three kernels through NumPy, DaCe and Numba, and the MPI scaling runs: in three suite runs (three tests), so
    that they run side by side; the scaling runs measure their own kernels (gemm, atax, jacobi_2d) whichever are chosen.
    The output folder is given relative to the working directory, as `repro --out DIR` gives it."""
    # one thread per framework: the smoke sizes gain nothing from a second one, and an OpenMP or Numba team on a
    # busy machine waits for its descheduled member at every parallel loop (jacobi_2d: 100x slower with two)
    monkeypatch.chdir(tmp_path)
    suite = DaceSuite(DaceSuite.Config(preset="smoke", out_dir="out", kernels=kernels, max_procs=2,
                                       threads=1, scaling=scaling))
    result = suite.run()
    assert result["status"] == "ok", result.get("reason")
    assert result["env"]["versions"]["dace"] == "1.0.2"
    assert result["env"]["versions"]["numpy"].startswith("1.")
    runs = result["kernels"]["kernels"]
    assert sorted(runs) == sorted(kernels)
    for name in kernels:
        for fw in ("numpy", "dace", "numba"):
            rec = runs[name]["frameworks"][fw]
            assert rec["status"] == "ok", (name, fw, rec.get("error") or rec.get("validation"))
            assert rec["validation"]["ok"] and len(rec["times_s"]) >= 3
            assert rec["ci_low"] <= rec["median"] <= rec["ci_high"]
        # the first DaCe call parses, optimizes and compiles C++ into a shared library
        assert runs[name]["frameworks"]["dace"]["compiled_library"].endswith(".so")
    assert result["not_validated"] == 0 and result["not_validated_list"] == []
    assert result["speedups"]["counted"] == {"dace": len(kernels), "numba": len(kernels)}
    assert set(result["speedups"]["dace_vs_best_other"]) == set(kernels)
    if not scaling:
        assert "scaling" not in result
        return
    sc = result["scaling"]
    if shutil.which("mpirun") is None and shutil.which("mpiexec") is None:
        assert sc["status"] == "dependency-missing" and "openmpi" in sc["reason"]
        return
    assert sc["status"] == "ok", sc
    assert sc["process_counts"] == [1, 2]
    for kernel in ("gemm", "atax", "jacobi_2d"):
        for mode in ("strong", "weak"):
            points = sc["efficiency"][f"{kernel} (numpy)"][mode]
            assert [p["procs"] for p in points] == [1, 2]
            assert all(p["valid"] for p in points), (kernel, mode)
            assert points[0]["efficiency"] == pytest.approx(1.0)
            assert points[1]["efficiency"] > 0
    assert result["scaling_summary"]["max_procs"] == 2


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(os.environ.get("TERASTACK_SKIP_DACE") == "1",
                    reason="TERASTACK_SKIP_DACE=1: the DaCe end-to-end run was switched off for this run")
def test_rank_local_compute_compiled_by_dace_on_two_ranks(tmp_path):
    """The scaling runs' rank-local compute compiled by DaCe, each rank into its own build folder, validated on 2
    ranks (the smoke preset's scaling runs, in the test above, take NumPy's). A test of its own, so that it runs
    beside that one."""
    from terastack.repro.dace.env import DaceEnvironment

    env = DaceEnvironment(DaceEnvironment.Config())
    info = env.ensure()
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        pytest.skip("no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)")
    out = tmp_path / "dace_local.json"
    cmd = [mpirun, *mpirun_flags(info["system"]["mpi_version"] or "", 2), "-n", "2", str(env.python), "-m",
           "terastack.repro.dace.scaling", "--preset", "smoke", "--kernels", "jacobi_2d,atax", "--modes", "strong",
           "--locals", "dace", "--build-dir", str(tmp_path / "mpibuild"), "--out", str(out)]
    proc = subprocess.run(cmd, env=env.subprocess_env(threads=1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert [(r["kernel"], r["local"], r["validation"]["ok"]) for r in records] == [
        ("jacobi_2d", "dace", True), ("atax", "dace", True)]


def test_environment_refuses_a_foreign_directory(tmp_path):
    from terastack.repro.dace.env import DaceEnvironment, DaceUnavailable

    foreign = tmp_path / "someones-venv"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(DaceUnavailable, match="not a terastack DaCe environment"):
        DaceEnvironment(DaceEnvironment.Config(path=str(foreign))).ensure()
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_environment_with_other_requirements_is_not_reused(tmp_path):
    from terastack.repro.dace.env import STAMP, DaceEnvironment

    env = DaceEnvironment(DaceEnvironment.Config(path=str(tmp_path / "env")))
    (env.path / "bin").mkdir(parents=True)
    (env.path / "bin" / "python").write_text("")
    (env.path / STAMP).write_text(json.dumps({"requirements": ["dace==0.16"]}))
    assert env._usable() is None
    (env.path / STAMP).write_text(json.dumps({"requirements": list(env.config.requirements)}))
    assert env._usable() is not None


def test_failed_install_is_reported_with_pip_output(tmp_path):
    from terastack.repro.dace.env import DaceEnvironment, DaceUnavailable

    # --no-index: pip looks nowhere, so the install fails at once and offline
    env = DaceEnvironment(DaceEnvironment.Config(path=str(tmp_path / "env"), extra_pip_args=("--no-index",),
                                                 install_timeout_s=300))
    with pytest.raises(DaceUnavailable, match="failed with exit") as info:
        env.ensure()
    assert "dace" in str(info.value) and "install.log" in str(info.value)
    assert env._usable() is None      # an incomplete environment is never taken for a ready one


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="frameworks"):
        DaceSuite.Config(frameworks=("dace",))
    with pytest.raises(ValueError, match="threads"):
        DaceSuite.Config(threads=0)
    with pytest.raises(ValueError, match="preset"):
        DaceSuite.Config(preset="medium")


def _ok(fw):
    return {"framework": fw, "status": "ok", "times_s": [1.0, 1.0, 1.0], "median": 1.0, "ci_low": 1.0,
            "ci_high": 1.0, "first_call_s": 2.0, "validation": {"ok": True, "detail": ""}}


def test_a_crashing_measurement_is_recorded_and_the_suite_goes_on(tmp_path, monkeypatch):
    calls = []

    def fake_runner(self, kernel, frameworks, threads, build_dir, log_path, deadline):
        calls.append((kernel, list(frameworks)))
        base = {"preset": "smoke", "environment": {}, "timing": {}}
        if kernel == "gemm" and frameworks[0] == "numpy":
            # numpy measured, then the process died (SIGSEGV) inside DaCe's measurement
            part = {**base, "in_progress": "gemm/dace", "kernels": {"gemm": {"frameworks": {"numpy": _ok("numpy")}}}}
            return part, {"returncode": -11, "timed_out": False, "tail": "Segmentation fault"}
        part = {**base, "in_progress": None,
                "kernels": {kernel: {"frameworks": {fw: _ok(fw) for fw in frameworks}}}}
        return part, {"returncode": 0, "timed_out": False, "tail": ""}

    monkeypatch.setattr(DaceSuite, "_runner", fake_runner)
    suite = DaceSuite(DaceSuite.Config(preset="smoke", out_dir=str(tmp_path), kernels=("gemm", "atax")))
    merged = suite._run_kernels(threads=1)
    assert calls == [("gemm", ["numpy", "dace", "numba"]), ("gemm", ["numba"]), ("atax", ["numpy", "dace", "numba"])]
    assert merged["status"] == "ok"
    gemm = merged["kernels"]["gemm"]["frameworks"]
    assert gemm["dace"]["status"] == "crashed" and "exit -11" in gemm["dace"]["error"]
    assert gemm["numba"]["status"] == "ok" and gemm["numpy"]["status"] == "ok"
    assert merged["crashes"] == [{"kernel": "gemm", "framework": "dace", "detail": "Segmentation fault"}]
    from terastack.repro.dace.suite import summarize_speedups

    sp = summarize_speedups(merged)
    assert sp["per_kernel"]["gemm"]["dace"] == {"status": "crashed"} and sp["counted"]["numba"] == 2


def test_a_scaling_run_that_wrote_nothing_is_not_read_from_an_earlier_run(tmp_path, monkeypatch):
    """An earlier run's dace_scaling_P2.json left in the folder is not this run's result: an mpirun that exits 0
    without writing one has failed."""
    from terastack.repro.dace import suite as suite_mod

    monkeypatch.setattr(suite_mod, "_run_logged", lambda cmd, **kw: {"returncode": 0, "timed_out": False, "tail": ""})
    (tmp_path / "dace_scaling_P2.json").write_text(json.dumps({"records": [{"kernel": "gemm"}]}))
    suite = DaceSuite(DaceSuite.Config(preset="smoke", out_dir=str(tmp_path)))
    env_info = {"system": {"mpi_version": "mpirun (Open MPI) 4.1.4"}}
    out = suite._mpirun("mpirun", env_info, 2, ["numpy"], str(tmp_path))
    assert out["status"] == "failed" and "mpirun -n 2 exit 0" in out["reason"]


def test_children_run_with_the_stack_limit_raised(tmp_path):
    import resource
    import sys

    from terastack.repro.dace.suite import _run_logged

    log = tmp_path / "child.log"
    proc = _run_logged([sys.executable, "-c", "import resource; print('STACK', resource.getrlimit(resource.RLIMIT_STACK)[0])"],
                       env=dict(os.environ), cwd=str(tmp_path), timeout=60, log_path=log, what="stack probe")
    assert proc["returncode"] == 0
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    assert f"STACK {hard}" in log.read_text()


def test_a_runaway_child_is_killed_at_its_bound(tmp_path):
    import sys

    from terastack.repro.dace.suite import _run_logged

    proc = _run_logged([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ),
                       cwd=str(tmp_path), timeout=1, log_path=tmp_path / "slow.log", what="a sleeping child")
    assert proc["timed_out"] and proc["returncode"] == 124
    assert "a sleeping child ran past its 1 s bound" in (tmp_path / "slow.log").read_text()


def test_tail_shows_only_the_latest_process(tmp_path):
    import sys

    from terastack.repro.dace.suite import _run_logged

    log = tmp_path / "shared.log"
    for word in ("FIRST", "SECOND"):
        proc = _run_logged([sys.executable, "-c", f"print('{word}')"], env=dict(os.environ), cwd=str(tmp_path),
                           timeout=60, log_path=log, what=word)
    assert "SECOND" in proc["tail"] and "FIRST" not in proc["tail"]
    assert "FIRST" in log.read_text()               # the log itself keeps both


def test_runner_environment(tmp_path, monkeypatch):
    from terastack.repro.dace.env import DaceEnvironment

    monkeypatch.delenv("OMP_STACKSIZE", raising=False)
    env = DaceEnvironment(DaceEnvironment.Config(path=str(tmp_path))).subprocess_env(threads=3)
    assert env["OMP_NUM_THREADS"] == env["NUMBA_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    assert env["OMP_STACKSIZE"] == "512M"
    import terastack

    assert os.path.dirname(os.path.dirname(terastack.__file__)) in env["PYTHONPATH"].split(os.pathsep)
