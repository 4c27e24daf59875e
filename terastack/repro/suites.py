"""The harness's suites: the project's benchmarks (from ``terastack.bench.BENCHMARKS``) and the DaCe suite.

A suite turns a preset into one result per benchmark it runs, each tagged
with a status ("ok", "missing", "dependency-missing", "no-preset", "error",
"timeout") and a reason, so that the report says why anything did not run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from terastack.repro.logs import last_lines

#: suite -> the benchmark names (keys of terastack.bench.BENCHMARKS) it runs, in order
BENCH_SUITES = {"io": ("io",), "kernels": ("gemm", "sort"), "llm": ("llm",), "gnn": ("gnn",), "dist": ("dist",)}
SUITE_NAMES = (*BENCH_SUITES, "dace")
#: what installs each suite's optional dependencies (for "dependency-missing" reports)
EXTRAS_HINT = {"llm": "pip install 'terastack[llm]' (and apt-get install libaio-dev for DeepSpeed)",
               "gnn": "pip install 'terastack[gnn]'", "dist": "pip install 'terastack[dist]'"}
#: preset -> bound on one benchmark process
BENCH_TIMEOUT_S = {"smoke": 600, "small": 1800, "full": 3600}


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

    def as_dict(self) -> dict:
        return {"name": self.name, "module": self.module, "status": self.status, "reason": self.reason,
                "wall_s": self.wall_s, "log": self.log, "headline": self.headline, "result": self.result}


def registry() -> dict[str, str]:
    """Benchmark name -> module, from the project's registry."""
    from terastack.bench import BENCHMARKS

    return {name: module for name, module, _help in BENCHMARKS}


class BenchSuite:
    """Runs each benchmark module of one suite in a child process at the preset's CLI arguments."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        name: str
        #: (benchmark name, module) pairs
        benchmarks: tuple[tuple[str, str], ...]
        preset: str = "smoke"
        out_dir: str = "."
        timeout_s: float | None = None
        #: extra entries for the child's PYTHONPATH (tests add a directory with fake modules)
        pythonpath: tuple[str, ...] = ()

        def __post_init__(self) -> None:
            if self.preset not in BENCH_TIMEOUT_S:
                raise ValueError(f"preset: must be one of {list(BENCH_TIMEOUT_S)}, got {self.preset!r}")
            if self.timeout_s is not None and self.timeout_s <= 0:
                raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
            if not self.benchmarks:
                raise ValueError(f"benchmarks: suite {self.name} has none")

    def __init__(self, config: Config):
        self.config = config

    @classmethod
    def from_registry(cls, name: str, **kwargs) -> "BenchSuite":
        reg = registry()
        benches = tuple((b, reg.get(b, f"terastack.{b}.bench")) for b in BENCH_SUITES[name])
        return cls(cls.Config(name=name, benchmarks=benches, **kwargs))

    def run(self, log=lambda msg: None) -> list[BenchOutcome]:
        return [self._run_one(bench, module, log) for bench, module in self.config.benchmarks]

    def _child_env(self) -> dict:
        import terastack

        env = dict(os.environ)
        paths = [*self.config.pythonpath, str(Path(terastack.__file__).resolve().parent.parent)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def _run_one(self, bench: str, module: str, log) -> BenchOutcome:
        cfg = self.config
        out_dir = Path(cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        out_json, log_path = out_dir / f"{bench}.child.json", out_dir / f"{bench}.log"
        timeout = cfg.timeout_s or BENCH_TIMEOUT_S[cfg.preset]
        log(f"{cfg.name}/{bench}: {module} at preset {cfg.preset} (bound {timeout:.0f} s)")
        started = time.perf_counter()
        out_json.unlink(missing_ok=True)
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "terastack.repro.bench_child", module, cfg.preset,
                                     str(out_json)], stdout=logf, stderr=subprocess.STDOUT, env=self._child_env(),
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)      # the benchmark and anything it launched (torchrun, fio)
                proc.wait(timeout=30)
                return BenchOutcome(name=bench, module=module, status="timeout", log=str(log_path),
                                    reason=f"ran past its {timeout:.0f} s bound at preset {cfg.preset}; "
                                           f"log: {log_path}", wall_s=time.perf_counter() - started)
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
