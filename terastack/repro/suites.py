"""The harness's suites: the project's benchmarks (from ``terastack.bench.BENCHMARKS``) and the DaCe suite.

A suite turns a preset into one result per benchmark it runs, each tagged
with a status ("ok", "missing", "dependency-missing", "no-preset", "error",
"timeout") and a reason, so that the report says why anything did not run.
A benchmark runs at its module's ``PRESETS[preset]``, or, for the scale suite,
at the harness's own arguments (:data:`HARNESS_ARGS`, [Note: the scale presets]).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from terastack.repro.logs import last_lines

#: suite -> the benchmarks it runs, in order: names in terastack.bench.BENCHMARKS, or in HARNESS_ARGS
BENCH_SUITES = {"io": ("io", "io-cpu"), "kernels": ("gemm", "sort"), "llm": ("llm",), "gnn": ("gnn",),
                "dist": ("dist", "dist-interference"),
                "scale": ("llm-scale", "gnn-scale")}
SUITE_NAMES = (*BENCH_SUITES, "dace")
#: what installs each suite's optional dependencies (for "dependency-missing" reports)
EXTRAS_HINT = {"llm": "pip install 'terastack[llm]' (and apt-get install libaio-dev for DeepSpeed)",
               "gnn": "pip install 'terastack[gnn]'", "dist": "pip install 'terastack[dist]'",
               "scale": "pip install 'terastack[llm,gnn]'"}
#: preset -> bound on one benchmark process
BENCH_TIMEOUT_S = {"smoke": 600, "small": 1800, "full": 3600}
#: benchmark -> preset -> a bound of its own, where the preset's is too short
BENCH_TIMEOUT_OVERRIDES = {"llm-scale": {"small": 3600, "full": 4 * 3600}, "gnn-scale": {"full": 3 * 3600}}

SCRATCH = "{scratch}"
#: benchmarks the harness runs at its own arguments rather than the module's PRESETS:
#: name -> (benchmark in terastack.bench.BENCHMARKS, {preset: arguments}). ``{scratch}`` stands for a directory
#: of this run for the benchmark's stores and datasets (SCRATCH_DIR/NAME, see Harness.Config.scratch_dir),
#: removed after it.
#: [Note: the scale presets]
#: smoke is seconds: the llm ladder's tiny rung (terastack's row alone) and a 20,000-node graph (one np.memmap
#: contender), to show both run end to end (the scale claims are not judged there; each baseline's worker has
#: tests of its own in tests/llm/test_bench_scale.py and tests/gnn/test_gnn_scale.py). small is tens of
#: minutes: the ladder to 1.1B under an 8 GiB RSS limit, where in-memory AdamW (9.5 GiB at 0.55B) and
#: ZeRO-Infinity already stop and terastack goes on in 4 GiB, and a 4M-node graph (2.3 GB). full is the
#: committed figures: the ladder to 3.4B (41 GB of state on the disk, 13-30 minutes on 2 cores) and a 48M-node
#: graph of 28 GB, larger than 23.5 GiB of RAM (6-30 minutes to generate, as the disk's rate goes). Each needs
#: at most about 50 GB free at once, both runs delete what they wrote, and each refuses up front, naming the
#: bytes, a run that would not fit the free disk.
HARNESS_ARGS: dict[str, tuple[str, dict[str, list[str]]]] = {
    "llm-scale": ("llm-scale", {
        "smoke": ["--sizes", "tiny", "--systems", "terastack", "--steps", "1", "--warmup", "1",
                  "--seq-len", "32", "--timeout", "300", "--dir", SCRATCH],
        "small": ["--sizes", "0.15b,0.55b,1.1b", "--rss-limit", "8GiB", "--steps", "1", "--warmup", "1",
                  "--timeout", "1800", "--dir", SCRATCH],
        "full": ["--dir", SCRATCH],
    }),
    "gnn-scale": ("gnn", {
        "smoke": ["--scale", "--nodes", "20000", "--avg-degree", "5", "--feat-dim", "16", "--classes", "4",
                  "--train-nodes", "512", "--batch-size", "128", "--fanouts", "5,5", "--hidden", "16",
                  "--budget", "512KiB", "--gen-memory", "256MiB", "--rss-limit", "4GiB", "--load-probe-seconds", "0.5",
                  "--disk-probe-seconds", "0.3", "--mmap-threads", "1", "--dir", SCRATCH, "--cleanup", "--quiet"],
        "small": ["--scale", "--nodes", "4000000", "--budget", "256MiB", "--dir", SCRATCH,
                  "--cleanup", "--quiet"],
        "full": ["--scale", "--dir", SCRATCH, "--cleanup", "--quiet"],
    }),
}


@dataclass(kw_only=True, slots=True)
class BenchOutcome:
    name: str
    module: str
    status: str
    reason: str = ""
    result: dict | None = None
    wall_s: float = 0.0
    log: str | None = None
    headline: list = field(default_factory=list)
    #: with ``--repeat N`` (N > 1): every run's {status, reason, result, wall_s, log}, in order; the outcome's own
    #: status and result are those of its first run that finished ("ok"), else of its first run
    runs: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {"name": self.name, "module": self.module, "status": self.status, "reason": self.reason,
               "wall_s": self.wall_s, "log": self.log, "headline": self.headline, "result": self.result}
        if self.runs:
            out["runs"] = self.runs
        return out

    @classmethod
    def of_runs(cls, runs: list["BenchOutcome"]) -> "BenchOutcome":
        """One benchmark's repeated runs as one outcome (see ``runs``)."""
        if len(runs) == 1:
            return runs[0]
        first = next((r for r in runs if r.status == "ok"), runs[0])
        return cls(name=first.name, module=first.module, status=first.status, reason=first.reason,
                   result=first.result, wall_s=sum(r.wall_s for r in runs), log=first.log, headline=first.headline,
                   runs=[{"status": r.status, "reason": r.reason, "result": r.result, "wall_s": r.wall_s,
                          "log": r.log} for r in runs])


def registry() -> dict[str, str]:
    """Benchmark name -> module, from the project's registry."""
    from terastack.bench import BENCHMARKS

    # entries are Command records (name, module, help, ...); older tables were plain tuples
    pairs = [(c.name, c.module) if hasattr(c, "module") else (c[0], c[1]) for c in BENCHMARKS]
    reg = dict(pairs)
    for name, (bench, _args) in HARNESS_ARGS.items():
        if bench in reg:
            reg[name] = reg[bench]
    return reg


class BenchSuite:
    """Runs each benchmark module of one suite in a child process at the preset's CLI arguments."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        name: str
        #: (benchmark name, module) pairs, or (name, module, {preset: arguments}) to run a benchmark at the
        #: harness's arguments instead of its module's PRESETS
        benchmarks: tuple[tuple, ...]
        preset: str = "smoke"
        out_dir: str = "."
        timeout_s: float | None = None
        #: extra entries for the child's PYTHONPATH (tests add a directory with fake modules)
        pythonpath: tuple[str, ...] = ()
        #: what ``{scratch}`` in a benchmark's arguments stands for (default: OUT_DIR/scratch)
        scratch_dir: str | None = None
        #: runs of each benchmark, one after the other (the verdicts take the median run's value, with the spread)
        repeat: int = 1

        def __post_init__(self) -> None:
            if self.preset not in BENCH_TIMEOUT_S:
                raise ValueError(f"preset: must be one of {list(BENCH_TIMEOUT_S)}, got {self.preset!r}")
            if self.repeat < 1:
                raise ValueError(f"repeat: must be >= 1, got {self.repeat}")
            if self.timeout_s is not None and self.timeout_s <= 0:
                raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
            if not self.benchmarks:
                raise ValueError(f"benchmarks: suite {self.name} has none")
            for entry in self.benchmarks:
                if len(entry) == 3 and self.preset not in entry[2]:
                    raise ValueError(f"benchmarks: {entry[0]} has no arguments for preset {self.preset!r}")

    def __init__(self, config: Config):
        self.config = config

    @classmethod
    def from_registry(cls, name: str, **kwargs) -> "BenchSuite":
        reg = registry()
        benches = tuple((b, reg.get(b, f"terastack.{b}.bench"), *((HARNESS_ARGS[b][1],) if b in HARNESS_ARGS else ()))
                        for b in BENCH_SUITES[name])
        return cls(cls.Config(name=name, benchmarks=benches, **kwargs))

    def run(self, log=lambda msg: None) -> list[BenchOutcome]:
        out = []
        for entry in self.config.benchmarks:
            args = entry[2][self.config.preset] if len(entry) == 3 else None
            runs = []
            for i in range(self.config.repeat):
                if self.config.repeat > 1:
                    log(f"{self.config.name}/{entry[0]}: run {i + 1} of {self.config.repeat}")
                runs.append(self._run_one(entry[0], entry[1], args, log, run=i))
            out.append(BenchOutcome.of_runs(runs))
        return out

    def _child_env(self) -> dict:
        import terastack

        env = dict(os.environ)
        paths = [*self.config.pythonpath, str(Path(terastack.__file__).resolve().parent.parent)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def _run_one(self, bench: str, module: str, args: list[str] | None, log, run: int = 0) -> BenchOutcome:
        cfg = self.config
        out_dir = Path(cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = bench if run == 0 else f"{bench}.run{run + 1}"
        out_json, log_path = out_dir / f"{stem}.child.json", out_dir / f"{stem}.log"
        timeout = cfg.timeout_s or BENCH_TIMEOUT_OVERRIDES.get(bench, {}).get(cfg.preset) or BENCH_TIMEOUT_S[cfg.preset]
        log(f"{cfg.name}/{bench}: {module} at preset {cfg.preset} (bound {timeout:.0f} s)")
        started = time.perf_counter()
        out_json.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "terastack.repro.bench_child", module, cfg.preset, str(out_json)]
        scratch = None
        if args is not None:
            if any(SCRATCH in a for a in args):
                scratch = Path(cfg.scratch_dir or out_dir.parent / "scratch") / bench
                # a directory that was there before this run is someone's data: never delete it afterwards
                scratch_is_ours = not scratch.exists()
                scratch.mkdir(parents=True, exist_ok=True)
                args = [a.replace(SCRATCH, str(scratch)) for a in args]
            cmd.append(json.dumps(args))
        try:
            outcome = self._wait(cmd, bench, module, timeout, log_path, started)
        finally:
            if scratch is not None and scratch_is_ours:
                shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(outcome, BenchOutcome):
            return outcome
        proc = outcome
        wall = time.perf_counter() - started
        try:
            outcome = json.loads(out_json.read_text())
        except (OSError, ValueError):
            tail = last_lines(log_path.read_text(errors="replace"), 10)
            return BenchOutcome(name=bench, module=module, status="error", log=str(log_path), wall_s=wall,
                                reason=f"the benchmark process died (exit {proc.returncode}) without a result; "
                                       f"last lines:\n{tail}")
        out_json.unlink(missing_ok=True)
        status = outcome.get("status", "error")
        reason = outcome.get("reason", "")
        if status == "dependency-missing" and cfg.name in EXTRAS_HINT:
            reason += f"; install with: {EXTRAS_HINT[cfg.name]}"
        if status == "missing":
            reason += " (its engine has not landed, or the package was installed without it)"
        if status == "error" and outcome.get("traceback"):
            reason += "\n" + outcome["traceback"]
        log(f"{cfg.name}/{bench}: {status} in {wall:.1f} s" + (f" ({reason.splitlines()[0]})" if reason else ""))
        return BenchOutcome(name=bench, module=module, status=status, reason=reason, result=outcome.get("result"),
                            wall_s=wall, log=str(log_path), headline=outcome.get("headline", []))

    def _wait(self, cmd: list[str], bench: str, module: str, timeout: float, log_path: Path, started: float):
        """The finished child process, or a "timeout" outcome when it ran past ``timeout``."""
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=self._child_env(),
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)      # the benchmark and anything it launched (torchrun, fio)
                proc.wait(timeout=30)
                return BenchOutcome(name=bench, module=module, status="timeout", log=str(log_path),
                                    reason=f"ran past its {timeout:.0f} s bound at preset {self.config.preset}; "
                                           f"log: {log_path}", wall_s=time.perf_counter() - started)
        return proc
