"""The DaCe suite, driven from the harness: environment, kernel runner, MPI scaling, summaries.

Everything that needs DaCe, Numba or mpi4py runs in subprocesses inside the
DaCe environment (see [Note: why a separate environment] in env.py); this
module only starts them, bounds them with timeouts, and summarizes their JSON
(speedups with bootstrap CIs, scaling efficiencies).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from terastack.repro.dace import scaling as scaling_mod
from terastack.atomic import atomic_write_json
from terastack.repro.dace.env import DaceEnvironment, DaceUnavailable
from terastack.repro.dace.kernels import select as select_kernels
from terastack.repro.dace.runner import FRAMEWORKS
from terastack.repro.dace.stats import geomean, ratio_ci
from terastack.repro.logs import last_lines

# [Note: one process per kernel]
# Each kernel runs in its own runner process: generated code that crashes
# (a segfault in a compiled kernel) takes down one measurement, not the
# suite. When a process dies, the framework it was measuring is recorded as
# "crashed" with the log's last lines, and the kernel's remaining frameworks
# run in a fresh process. Separate processes also return each kernel's
# memory (full-size inputs reach 1.3 GB) before the next one starts.
#
# [Note: stack size]
# DaCe 1.0.2 places some transients on the stack: azimint's per-bin mask at
# N = 10^6 overflows the default 8 MiB stack and segfaults (seen at the
# `full` preset with one thread), and at N = 2*10^5 it overflows an OpenMP
# worker's 2 MiB stack (seen at `small` with two threads). The runner and MPI
# ranks are started with their stack limit raised to the hard limit (as
# `ulimit -s` would) and with OMP_STACKSIZE=512M unless the user set it.

#: preset -> bound on the kernel runner (all kernels, all frameworks, compile included)
RUNNER_TIMEOUT_S = {"smoke": 900, "small": 2400, "full": 5400}
#: preset -> bound on one mpirun (all three kernels, both modes, one P)
MPIRUN_TIMEOUT_S = {"smoke": 300, "small": 1200, "full": 2400}
#: preset -> rank-local compute of the scaling runs (smoke skips DaCe's per-rank compiles to stay short)
SCALING_LOCALS = {"smoke": ("numpy",), "small": ("numpy", "dace"), "full": ("numpy", "dace")}


def log(msg: str) -> None:
    print(f"[dace-suite] {msg}", file=sys.stderr, flush=True)


def process_counts(max_procs: int) -> list[int]:
    """1, 2, 4, ... up to ``max_procs``, and ``max_procs`` itself."""
    counts, p = [], 1
    while p < max_procs:
        counts.append(p)
        p *= 2
    return counts + [max_procs]


class DaceSuite:
    @dataclass(kw_only=True, slots=True)
    class Config:
        preset: str = "smoke"
        out_dir: str = "."
        #: kernel names (empty: all)
        kernels: tuple[str, ...] = ()
        frameworks: tuple[str, ...] = FRAMEWORKS
        #: threads for every framework (NumPy BLAS, DaCe OpenMP, Numba); default: all cores
        threads: int | None = None
        scaling: bool = True
        #: largest MPI process count; default: the cores available here
        max_procs: int | None = None
        env: DaceEnvironment.Config = field(default_factory=DaceEnvironment.Config)

        def __post_init__(self) -> None:
            if self.preset not in RUNNER_TIMEOUT_S:
                raise ValueError(f"preset: must be one of {list(RUNNER_TIMEOUT_S)}, got {self.preset!r}")
            if "numpy" not in self.frameworks:
                raise ValueError("frameworks: must include numpy (the reference and the baseline)")
            for f in self.frameworks:
                if f not in FRAMEWORKS:
                    raise ValueError(f"frameworks: unknown {f!r}; choose from {FRAMEWORKS}")
            if self.threads is not None and self.threads < 1:
                raise ValueError(f"threads: must be >= 1, got {self.threads}")
            if self.max_procs is not None and self.max_procs < 1:
                raise ValueError(f"max_procs: must be >= 1, got {self.max_procs}")

    def __init__(self, config: Config):
        self.config = config
        self.env = DaceEnvironment(config.env)
        # absolute: the kernel runner and mpirun run in build folders of their own and write their results here
        self.out = Path(config.out_dir).resolve()

    def run(self) -> dict:
        """The suite's result; ``status`` is "ok", or "dependency-missing" with the reason."""
        cfg = self.config
        started = time.perf_counter()
        try:
            env_info = self.env.ensure(log=log)
        except DaceUnavailable as exc:
            return {"status": "dependency-missing", "reason": str(exc), "env_path": str(self.env.path)}
        threads = cfg.threads or os.cpu_count() or 1
        self.out.mkdir(parents=True, exist_ok=True)
        result = {"status": "ok", "preset": cfg.preset, "env": env_info, "threads": threads}
        result["kernels"] = self._run_kernels(threads)
        result["speedups"] = summarize_speedups(result["kernels"])
        failures = not_validated(result["kernels"], names=[k.name for k in select_kernels(list(cfg.kernels))],
                                 frameworks=list(cfg.frameworks))
        result["not_validated"], result["not_validated_list"] = len(failures), failures
        if result["kernels"].get("status") != "ok":
            result["status"], result["reason"] = "error", result["kernels"].get("reason", "kernel runner failed")
        if cfg.scaling:
            result["scaling"] = self._run_scaling(env_info)
            result["scaling_summary"] = scaling_summary(result["scaling"])
        result["wall_s"] = time.perf_counter() - started
        return result

    # ----------------------------------------------------------------- kernels

    def _run_kernels(self, threads: int) -> dict:
        """Every kernel in its own runner process; see [Note: one process per kernel]."""
        cfg = self.config
        names = [k.name for k in select_kernels(list(cfg.kernels))]
        build_dir = tempfile.mkdtemp(prefix="terastack-dacecache-")
        log_path = self.out / "dace_kernels.log"
        log_path.write_text("")
        merged: dict = {"kernels": {}, "crashes": []}
        deadline = time.monotonic() + RUNNER_TIMEOUT_S[cfg.preset]
        try:
            for i, name in enumerate(names, 1):
                log(f"kernel {i}/{len(names)}: {name}")
                todo = list(cfg.frameworks)
                while todo:
                    part, proc = self._runner(name, todo, threads, build_dir, log_path, deadline)
                    if part is None:
                        merged["crashes"].append({"kernel": name, "framework": todo[0], "detail": proc["tail"]})
                        break
                    for key in ("preset", "frameworks", "environment", "timing"):
                        merged.setdefault(key, part.get(key))
                    entry = merged["kernels"].setdefault(name, part["kernels"][name])
                    entry["frameworks"].update(part["kernels"][name]["frameworks"])
                    done = [fw for fw in todo if fw in entry["frameworks"]]
                    if proc["returncode"] == 0 and not part.get("in_progress"):
                        break
                    # the process died inside one framework: record it, carry on with the ones after it
                    current = part["in_progress"].split("/")[1] if part.get("in_progress") else todo[len(done)]
                    how = "timed out" if proc["timed_out"] else f"died (exit {proc['returncode']})"
                    entry["frameworks"][current] = {"framework": current, "status": "crashed",
                                                    "error": f"the runner process {how} during this measurement"}
                    merged["crashes"].append({"kernel": name, "framework": current, "detail": proc["tail"]})
                    log(f"{name}/{current}: the runner {how}; continuing with the next measurement")
                    if current == "numpy" or proc["timed_out"]:
                        break       # no reference (or no time left): nothing else to measure for this kernel
                    todo = todo[todo.index(current) + 1:]
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
        merged["frameworks"] = list(cfg.frameworks)
        # a crashed framework is a finding (listed, excluded from speedups), not a failure of the suite;
        # a kernel that produced nothing at all is
        missing = [n for n in names if n not in merged["kernels"]]
        merged["status"] = "ok" if not missing else "failed"
        if missing:
            merged["reason"] = f"no result for {', '.join(missing)}; log: {log_path}"
        atomic_write_json(self.out / "dace_kernels.json", merged)
        return merged

    def _runner(self, kernel: str, frameworks: list[str], threads: int, build_dir: str, log_path: Path,
                deadline: float) -> tuple[dict | None, dict]:
        cfg = self.config
        out_json = self.out / f"dace_kernel_{kernel}.json"
        out_json.unlink(missing_ok=True)
        cmd = [str(self.env.python), "-m", "terastack.repro.dace.runner", "--preset", cfg.preset, "--kernels", kernel,
               "--frameworks", ",".join(frameworks), "--build-dir", build_dir, "--out", str(out_json)]
        proc = _run_logged(cmd, env=self.env.subprocess_env(threads=threads), cwd=build_dir,
                           timeout=max(deadline - time.monotonic(), 1.0), log_path=log_path,
                           what=f"the DaCe kernel runner ({kernel}, {cfg.preset})")
        part = _load_json(out_json)
        out_json.unlink(missing_ok=True)
        return (part if part and kernel in part.get("kernels", {}) else None), proc

    # ----------------------------------------------------------------- scaling

    def _mpirun(self, mpirun: str, env_info: dict, procs: int, locals_: list[str], build_dir: str) -> dict:
        cfg = self.config
        out_json = self.out / f"dace_scaling_P{procs}.json"
        out_json.unlink(missing_ok=True)        # an earlier run's figures must never pass for this run's
        (self.out / f"dace_scaling_P{procs}.log").write_text("")
        cmd = [mpirun, *mpirun_flags(env_info["system"].get("mpi_version") or "", procs), "-n", str(procs),
               str(self.env.python), "-m", "terastack.repro.dace.scaling", "--preset", cfg.preset,
               "--locals", ",".join(locals_), "--build-dir", build_dir, "--out", str(out_json)]
        log(f"scaling: mpirun -n {procs} (rank-local compute: {', '.join(locals_)})")
        proc = _run_logged(cmd, env=self.env.subprocess_env(threads=1), cwd=str(self.out),
                           timeout=MPIRUN_TIMEOUT_S[cfg.preset], log_path=self.out / f"dace_scaling_P{procs}.log",
                           what=f"mpirun -n {procs} (scaling, {cfg.preset})")
        data = _load_json(out_json)
        if proc["returncode"] != 0 or data is None:
            return {"status": "failed", "reason": f"mpirun -n {procs} exit {proc['returncode']}"
                    + (" (timed out)" if proc["timed_out"] else "") + f"\n{proc['tail']}"}
        return {"status": "ok", **data}

    def _run_scaling(self, env_info: dict) -> dict:
        cfg = self.config
        mpirun = env_info["system"].get("mpirun")
        if not mpirun:
            return {"status": "dependency-missing",
                    "reason": "no mpirun on PATH: install an MPI implementation (apt-get install openmpi-bin "
                              "libopenmpi-dev, or mpich) to run the scaling experiments"}
        max_procs = cfg.max_procs or os.cpu_count() or 1
        counts = process_counts(max_procs)
        locals_ = [f for f in SCALING_LOCALS[cfg.preset] if f == "numpy" or f in cfg.frameworks]
        build_dir = tempfile.mkdtemp(prefix="terastack-dacecache-mpi-")
        runs = {}
        try:
            for procs in counts:
                runs[procs] = self._mpirun(mpirun, env_info, procs, locals_, build_dir)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
        return {"status": "ok" if all(r["status"] == "ok" for r in runs.values()) else "partial",
                "process_counts": counts, "runs": {str(k): v for k, v in runs.items()},
                "efficiency": scaling_efficiency(runs), "sizes": scaling_mod.SIZES, "locals": locals_,
                "note": f"rank-local compute in {' and in '.join(locals_)} (DaCe: the same kernel compiled per "
                        f"rank), one thread per rank; communication with mpi4py"}


def mpirun_flags(mpi_version: str, procs: int) -> list[str]:
    """Launch flags: shared memory only (no network), yield when idle (the cores may be shared)."""
    if "Open MPI" in mpi_version or "OpenRTE" in mpi_version:
        flags = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
                 "--mca", "mpi_yield_when_idle", "1"]
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        return flags
    return ["-launcher", "fork"]    # MPICH (hydra): start ranks as local processes


def _run_logged(cmd: list[str], *, env: dict, cwd: str, timeout: float, log_path: Path, what: str) -> dict:
    """Run ``cmd`` with its output in ``log_path``, echoing its progress lines; bounded by ``timeout``."""
    timed_out = False
    with open(log_path, "ab") as logf, open(log_path, "rb") as follow:
        start = follow.seek(0, os.SEEK_END)
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_raise_stack_limit)
        deadline = time.monotonic() + timeout
        pending = b""
        while True:
            finished = proc.poll() is not None
            pending += follow.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"[dace-suite]"):
                    print(line.decode(errors="replace"), file=sys.stderr, flush=True)
            if finished:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.killpg(proc.pid, 9)      # the whole session: mpirun and its ranks too
                proc.wait(timeout=30)
                logf.write(f"\n[terastack] killed: {what} ran past its {timeout:.0f} s bound\n".encode())
                break
            time.sleep(0.1)
    with open(log_path, "rb") as f:     # this process's output only (the log may hold earlier runs')
        f.seek(start)
        mine = f.read().decode(errors="replace")
    tail = last_lines(mine, 12, skip="Warning")
    return {"returncode": 124 if timed_out else proc.returncode, "timed_out": timed_out, "tail": tail}


def _raise_stack_limit() -> None:
    """In the child, before exec: stack limit up to the hard limit; see [Note: stack size]."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize_speedups(kernels_result: dict) -> dict:
    """Speedups of validated runs only: over NumPy per kernel and framework (median ratio, bootstrap CI),
    and DaCe over the faster of NumPy and Numba (the paper's "previous best" among what runs here)."""
    rows, per_fw, vs_best = {}, {}, {}
    for name, entry in (kernels_result.get("kernels") or {}).items():
        fws = entry.get("frameworks", {})
        base = fws.get("numpy", {})
        row = {}
        for fw, rec in fws.items():
            if fw == "numpy":
                continue
            if rec.get("status") != "ok" or base.get("status") != "ok":
                row[fw] = {"status": rec.get("status", "missing") if rec.get("status") != "ok" else "no-baseline"}
                continue
            row[fw] = {"status": "ok", **ratio_ci(base["times_s"], rec["times_s"])}
            per_fw.setdefault(fw, []).append(row[fw]["ratio"])
        rows[name] = row
        others = [r for f, r in fws.items() if f != "dace" and r.get("status") == "ok"]
        dace = fws.get("dace", {})
        if others and dace.get("status") == "ok":
            best = min(others, key=lambda r: r["median"])
            vs_best[name] = {"best_other": best["framework"], **ratio_ci(best["times_s"], dace["times_s"])}
    return {"per_kernel": rows, "geomean": {fw: geomean(v) for fw, v in per_fw.items()},
            "counted": {fw: len(v) for fw, v in per_fw.items()}, "dace_vs_best_other": vs_best,
            "vs_best_other_geomean": geomean([v["ratio"] for v in vs_best.values()]) if vs_best else None}


def not_validated(kernels_result: dict, names: list[str] | None = None,
                  frameworks: list[str] | None = None) -> list[dict]:
    """Every (kernel, framework) whose output was not shown equal to NumPy's, with its status and the detail: an
    output that did not match ("invalid"), a build or run that raised ("failed": a kernel that does not compile
    is one), a runner process that died or ran out of time ("crashed"), and a measurement asked for that left no
    record at all ("missing": the runner died before it, or the kernel produced nothing). ``names`` and
    ``frameworks``: what was asked for (default: what the result lists)."""
    kernels = kernels_result.get("kernels") or {}
    frameworks = frameworks or kernels_result.get("frameworks") or []
    out = []
    for name in names or list(kernels):
        recorded = (kernels.get(name) or {}).get("frameworks", {})
        for fw in dict.fromkeys([*frameworks, *recorded]):
            rec = recorded.get(fw)
            if rec is None:
                out.append({"kernel": name, "framework": fw, "status": "missing",
                            "detail": "no record: the runner stopped before this measurement"})
            elif rec.get("status") != "ok":
                detail = ((rec.get("validation") or {}).get("detail") or rec.get("error") or "no detail")
                out.append({"kernel": name, "framework": fw, "status": rec.get("status", "missing"),
                            "detail": detail})
    return out


def scaling_summary(scaling: dict) -> dict | None:
    """Worst weak and strong efficiency at the largest process count that ran, over the kernels.

    Taken over the DaCe-compiled rank-local runs when there are any (the paper's subject), else NumPy's.
    """
    eff = scaling.get("efficiency") or {}
    local = "dace" if any(name.endswith("(dace)") for name in eff) else "numpy"
    weak, strong, top = [], [], 0
    for name, modes in eff.items():
        if not name.endswith(f"({local})"):
            continue
        for mode, points in modes.items():
            valid = [p for p in points if p.get("efficiency") is not None]
            if not valid:
                continue
            last = max(valid, key=lambda p: p["procs"])
            top = max(top, last["procs"])
            (weak if mode == "weak" else strong).append(last["efficiency"])
    if not weak and not strong:
        return None
    return {"max_procs": top, "local": local, "weak_efficiency_min": min(weak) if weak else None,
            "strong_efficiency_min": min(strong) if strong else None}


def scaling_efficiency(runs: dict) -> dict:
    """"kernel (local)" -> mode -> [{procs, median, efficiency}], from the P = 1 run of the same kernel,
    rank-local framework and mode.

    Strong: E(P) = T(1) / (P T(P)); weak: E(P) = T(1) / T(P).
    """
    table: dict = {}
    by_key: dict = {}
    for procs, run in runs.items():
        if run.get("status") != "ok":
            continue
        for rec in run["records"]:
            name = f"{rec['kernel']} ({rec.get('local', 'numpy')})"
            by_key.setdefault((name, rec["mode"]), {})[int(procs)] = rec
    for (kernel, mode), recs in sorted(by_key.items()):
        base = recs.get(1)
        points = []
        for procs in sorted(recs):
            rec = recs[procs]
            point = {"procs": procs, "valid": rec["validation"]["ok"], "median_s": rec.get("median"),
                     "ci_low": rec.get("ci_low"), "ci_high": rec.get("ci_high"), "sizes": rec["sizes"]}
            if base and base.get("median") and rec.get("median"):
                t1, tp = base["median"], rec["median"]
                point["speedup"] = t1 / tp if mode == "strong" else None
                point["efficiency"] = t1 / (procs * tp) if mode == "strong" else t1 / tp
            points.append(point)
        table.setdefault(kernel, {})[mode] = points
    return table
