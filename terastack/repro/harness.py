"""The reproduction harness: run the requested suites, judge every claim, write the report.

Output directory layout::

    DIR/REPORT.md            the report (see report.py)
    DIR/report.json          environment, every suite outcome, every verdict
    DIR/raw/<bench>.json     each benchmark's own result, as measured
    DIR/plots/*.png          figures referenced by REPORT.md
    DIR/logs/                each benchmark's output; the DaCe runner's and mpirun's
    DIR/scratch/<bench>/     the scale benchmarks' stores and datasets while they run (--scratch moves it;
                             removed after each benchmark)
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from terastack.atomic import atomic_write_json, safe_relative
from terastack.repro import plots as plot_mod
from terastack.repro.claims import CLAIMS, Claim
from terastack.repro.report import write_report
from terastack.repro.suites import BENCH_SUITES, SUITE_NAMES, BenchOutcome, BenchSuite
from terastack.repro.verdicts import evaluate_runs


def log(msg: str) -> None:
    print(f"[repro] {msg}", file=sys.stderr, flush=True)


class Harness:
    @dataclass(kw_only=True, slots=True)
    class Config:
        suites: tuple[str, ...] = SUITE_NAMES
        preset: str = "smoke"
        out_dir: str = "runs/repro"
        claims: tuple[Claim, ...] = CLAIMS
        #: suite -> ((bench name, module), ...); default: terastack.bench.BENCHMARKS
        bench_suites: dict[str, tuple[tuple[str, str], ...]] | None = None
        #: bound on one benchmark process (default: by preset, see suites.BENCH_TIMEOUT_S)
        bench_timeout_s: float | None = None
        pythonpath: tuple[str, ...] = ()
        #: where benchmarks that write stores or datasets put them (default OUT_DIR/scratch); needs the free
        #: disk the preset's scale runs refuse to start without (tens of GB at full)
        scratch_dir: str | None = None
        #: DaCe suite settings (see terastack.repro.dace.suite.DaceSuite.Config)
        dace: dict = field(default_factory=dict)
        #: add the suites measured now to OUT_DIR's earlier run of the same preset, which keeps its other suites
        #: as they were measured ([Note: a report measured in several runs])
        add: bool = False
        #: runs of each benchmark of the benchmark suites, one after the other: every claim's verdict is its median
        #: run's, with each run's value and the spread beside it (the dace suite runs once: it repeats every
        #: kernel's timing itself)
        repeat: int = 1

        def __post_init__(self) -> None:
            if self.preset not in ("smoke", "small", "full"):
                raise ValueError(f"preset: must be smoke, small or full, got {self.preset!r}")
            known = set(self.bench_suites or BENCH_SUITES) | {"dace"}
            unknown = [s for s in self.suites if s not in known]
            if unknown:
                raise ValueError(f"suites: unknown {unknown}; choose from {', '.join(sorted(known))}")
            if not self.suites:
                raise ValueError("suites: name at least one")
            if self.repeat < 1:
                raise ValueError(f"repeat: must be >= 1, got {self.repeat}")

    def __init__(self, config: Config):
        self.config = config
        self.out = Path(config.out_dir)

    def run(self) -> dict:
        cfg = self.config
        earlier = self._earlier() if cfg.add and (self.out / "report.json").exists() else None
        if earlier is not None and earlier["preset"] != cfg.preset:
            raise ValueError(f"--add: {self.out} holds a run of preset {earlier['preset']!r}, not {cfg.preset!r}; "
                             "one report holds one preset")
        if earlier is not None:
            _refuse_another_machine(earlier, self.out)
        for sub in ("raw", "plots", "logs"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        from terastack.io.backend import backend_record
        from terastack.reporting import environment

        started, started_at = time.perf_counter(), _now()
        load_start = _loadavg()
        suites, dace_env = [], None
        for name in cfg.suites:
            t0, suite_load, measured_at = time.perf_counter(), _loadavg(), _now()
            outcomes = self._run_dace() if name == "dace" else self._run_bench_suite(name)
            if name == "dace" and outcomes[0].result:
                dace_env = outcomes[0].result.get("env")
            suites.append({"name": name, "wall_s": time.perf_counter() - t0, "measured_at": measured_at,
                           "load_average": {"start": suite_load, "end": _loadavg()},
                           "benchmarks": [o.as_dict() for o in outcomes]})
        if cfg.scratch_dir is None:
            try:
                (self.out / "scratch").rmdir()      # each benchmark removed its own; the folder if it is empty
            except OSError:
                pass
        raw_files = self._write_raw(suites)
        env = environment(io_backend=backend_record())
        load = {"start": load_start, "end": _loadavg()}
        wall_s = time.perf_counter() - started
        runs = [{"date": started_at, "command": env.get("command"), "suites": list(cfg.suites),
                 "load_average": load, "wall_s": wall_s, "machine": env.get("machine")}]
        data = {"preset": cfg.preset, "suites_requested": list(cfg.suites), "environment": env,
                "load_average": load, "dace_env": dace_env, "suites": suites, "raw_files": raw_files,
                "wall_s": wall_s, "runs": runs}
        if earlier is not None:
            data = _added(earlier, data)
        data["verdicts"] = self._judge(data["suites"], cfg.preset)
        return self._finish(data)

    def render(self) -> dict:
        """Rebuild REPORT.md, the verdicts and the plots of an earlier run from its report.json and raw/
        (after the claims table or the report's layout changed), without measuring anything again."""
        data = self._earlier()
        data["verdicts"] = self._judge(data["suites"], data["preset"])
        return self._finish(data)

    def _earlier(self) -> dict:
        """OUT_DIR's earlier run: its report.json with each benchmark's result read back from raw/."""
        try:
            data = json.loads((self.out / "report.json").read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.out / 'report.json'}: cannot read an earlier run's report ({exc})") from None
        for suite in data["suites"]:
            for b in suite["benchmarks"]:
                raw_path = safe_relative(self.out, f"raw/{b['name']}.json")
                raw = json.loads(raw_path.read_text()) if raw_path.exists() else {}
                b["result"] = raw.get("result")
                if raw.get("runs"):
                    b["runs"] = raw["runs"]
        return data

    def _finish(self, data: dict) -> dict:
        data["plots"], data["plots_missing"] = self._plots(data["suites"], data["verdicts"])
        # report.json keeps everything but the benchmarks' results, which are in raw/
        slim = {**data, "suites": [{**s, "benchmarks": [_without_results(b) for b in s["benchmarks"]]}
                                   for s in data["suites"]]}
        atomic_write_json(self.out / "report.json", slim)
        write_report(self.out / "REPORT.md", data, self.config.claims)
        log(f"report written to {self.out / 'REPORT.md'}")
        return data

    # ----------------------------------------------------------------- suites

    def _run_bench_suite(self, name: str) -> list[BenchOutcome]:
        cfg = self.config
        common = dict(preset=cfg.preset, out_dir=str(self.out / "logs"), timeout_s=cfg.bench_timeout_s,
                      pythonpath=cfg.pythonpath, scratch_dir=cfg.scratch_dir or str(self.out / "scratch"),
                      repeat=cfg.repeat)
        if cfg.bench_suites is not None:
            suite = BenchSuite(BenchSuite.Config(name=name, benchmarks=cfg.bench_suites[name], **common))
        else:
            suite = BenchSuite.from_registry(name, **common)
        return suite.run(log=log)

    def _run_dace(self) -> list[BenchOutcome]:
        from terastack.repro.dace.env import DaceEnvironment
        from terastack.repro.dace.suite import DaceSuite

        opts = dict(self.config.dace)
        env_cfg = DaceEnvironment.Config(**opts.pop("env", {}))
        t0 = time.perf_counter()
        try:
            suite = DaceSuite(DaceSuite.Config(preset=self.config.preset, out_dir=str(self.out / "logs"),
                                               env=env_cfg, **opts))
            result = suite.run()
        except (OSError, ValueError, RuntimeError) as exc:
            result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
        status = result.get("status", "error")
        return [BenchOutcome(name="dace", module="terastack.repro.dace", status=status,
                             reason=result.get("reason", ""), result=result, wall_s=time.perf_counter() - t0,
                             log=str(self.out / "logs"))]

    # ----------------------------------------------------------------- verdicts, files, plots

    def _judge(self, suites: list[dict], preset: str) -> list[dict]:
        out = []
        for suite in suites:
            by_bench = {b["name"]: b for b in suite["benchmarks"]}
            for claim in self.config.claims:
                if claim.suite != suite["name"]:
                    continue
                b = by_bench.get(claim.benchmark)
                if b is None:
                    runs = [("missing", f"no benchmark {claim.benchmark!r} in suite {suite['name']}", None)]
                else:
                    runs = [(r["status"], _first_line(r.get("reason")), r.get("result"))
                            for r in (b.get("runs") or [b])]
                v = evaluate_runs(claim, runs, preset)
                out.append({**v.as_dict(), "suite": claim.suite, "benchmark": claim.benchmark})
        return out

    def _write_raw(self, suites: list[dict]) -> list[str]:
        files = []
        for suite in suites:
            for b in suite["benchmarks"]:
                rel = f"raw/{b['name']}.json"
                raw = {k: b[k] for k in ("name", "module", "status", "reason", "result")}
                if b.get("runs"):
                    raw["runs"] = [{k: r.get(k) for k in ("status", "reason", "result", "wall_s")} for r in b["runs"]]
                atomic_write_json(self.out / rel, raw)
                files.append(rel)
        # the DaCe suite's own JSON (runner, scaling) sits in logs/; copy it beside the others
        for extra in sorted((self.out / "logs").glob("dace_*.json")):
            shutil.copyfile(extra, self.out / "raw" / extra.name)
            files.append(f"raw/{extra.name}")
        return files

    def _plots(self, suites: list[dict], verdicts: list[dict]) -> tuple[dict, str | None]:
        missing = plot_mod.matplotlib_missing()
        if missing:
            return {}, missing
        made: dict[str, str] = {}

        def keep(key: str, path):
            if path is not None:
                made[key] = os.path.relpath(path, self.out)

        plots = self.out / "plots"
        keep("claims_chart", plot_mod.claims_chart(verdicts, plots / "claims.png"))
        dace = next((b["result"] for s in suites if s["name"] == "dace" for b in s["benchmarks"]
                     if b.get("result") and b["result"].get("kernels")), None)
        if dace:
            keep("dace_heatmap", plot_mod.dace_heatmap(dace.get("speedups", {}), plots / "dace_speedup_heatmap.png"))
            keep("dace_bars", plot_mod.dace_bars(dace.get("speedups", {}), plots / "dace_speedups.png"))
            keep("dace_compile", plot_mod.dace_compile(dace["kernels"], plots / "dace_compile.png"))
            keep("dace_scaling", plot_mod.dace_scaling((dace.get("scaling") or {}).get("efficiency") or {},
                                                       plots / "dace_scaling.png"))
        return made, None


# [Note: a report measured in several runs]
# The full preset takes hours, longer than one sitting at a machine that must run nothing else. ``--add`` lets
# the suites be measured in separate runs into one directory: a suite measured now replaces that suite of the
# earlier run, the others stay as they were measured, and every suite keeps the date and load average of its
# own run, which REPORT.md prints beside it. Ratios are only ever taken within one benchmark, so a report whose
# suites come from different days compares nothing across them. What it does state is the machine ("measured
# on this machine", its reasons for each miss), so every run of one report is on one machine: ``--add`` on
# another (another CPU model, core count, memory or accelerator; a new kernel is the same machine) is refused
# before anything is measured. A run whose every suite a later run measured again has no figure left in the
# report and leaves its Runs table; a run keeps the suites whose figures are still its own.


def _machine_key(m: dict | None) -> tuple | None:
    """What makes two runs' machines the same one: CPU model, cores, memory (to the GiB) and accelerator."""
    if not m:
        return None
    return m.get("cpu"), m.get("cores"), round((m.get("memory_bytes") or 0) / 2**30), m.get("gpu")


def _describe(m: dict) -> str:
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{m.get('cpu')} ({m.get('cores')} cores, {(m.get('memory_bytes') or 0) / 2**30:.1f} GiB{gpu})"


def _refuse_another_machine(earlier: dict, out: Path) -> None:
    from terastack.reporting import machine

    before, now = earlier.get("environment", {}).get("machine"), machine()
    if _machine_key(before) is not None and _machine_key(before) != _machine_key(now):
        raise ValueError(f"--add: {out} was measured on {_describe(before)}, this machine is {_describe(now)}; "
                         "one report holds one machine's runs: give another --out")


def _live_runs(runs: list[dict]) -> list[dict]:
    """``runs`` (oldest first) with each run's suites cut to those no later run measured again; a run left with
    none is dropped."""
    remeasured: set[str] = set()
    live = []
    for run in reversed(runs):
        own = [s for s in run.get("suites", ()) if s not in remeasured]
        remeasured.update(run.get("suites", ()))
        if own:
            live.append({**run, "suites": own})
    return live[::-1]


def _added(earlier: dict, now: dict) -> dict:
    """``now``'s suites added to ``earlier``'s run (same preset): a suite measured now replaces the earlier one."""
    fresh = {s["name"] for s in now["suites"]}
    kept = []
    for suite in earlier["suites"]:
        if suite["name"] not in fresh:
            # a run from before suites carried their own date: the run's date and load average are theirs
            suite.setdefault("measured_at", earlier["environment"].get("date"))
            suite.setdefault("load_average", earlier.get("load_average"))
            kept.append(suite)
    order = {name: i for i, name in enumerate(SUITE_NAMES)}
    suites = sorted(kept + now["suites"], key=lambda s: order.get(s["name"], len(order)))
    runs = earlier.get("runs") or [{"date": earlier["environment"].get("date"),
                                    "command": earlier["environment"].get("command"),
                                    "suites": earlier["suites_requested"], "load_average": earlier.get("load_average"),
                                    "wall_s": earlier.get("wall_s")}]
    return {**now, "suites": suites, "suites_requested": [s["name"] for s in suites],
            "dace_env": now["dace_env"] if "dace" in fresh else earlier.get("dace_env"),
            "raw_files": sorted(set(earlier.get("raw_files", ())) | set(now["raw_files"])),
            "runs": _live_runs(runs + now["runs"])}


def _first_line(text: str | None) -> str:
    return text.splitlines()[0] if text else ""


def _without_results(bench: dict) -> dict:
    """A benchmark's entry in report.json: its results (and its runs' results) are in raw/."""
    out = {k: v for k, v in bench.items() if k != "result"}
    if out.get("runs"):
        out["runs"] = [{k: v for k, v in r.items() if k != "result"} for r in out["runs"]]
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
