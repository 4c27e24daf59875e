"""REPORT.md: an SC-style reproducibility report from the harness's collected results.

Layout: machine and software; a summary of suites and verdicts; per suite,
the claims table (paper figure and its hardware, measured here, baseline,
target, verdict) with the reason for every verdict that differs; suites that
did not run and why; the DaCe evaluation (set-up, validation, speedups,
compile times, scaling, comparison with the paper); then where the plots and
raw JSON are.
"""
from __future__ import annotations

import math
from pathlib import Path

from terastack.repro.claims import CLAIMS, PAPERS, VERDICTS, Claim
from terastack.repro.verdicts import fmt

MARK = {"reproduced": "yes", "not reproduced": "**no**", "reported": "reported", "not measured": "not measured",
        "needs other hardware": "needs other hardware"}


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _bytes(n) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) and n else "?"


def machine_section(env: dict, load: dict, dace_env: dict | None) -> list[str]:
    m, v = env.get("machine", {}), env.get("versions", {})
    lines = ["## Machine and software", "",
             "| | |", "|---|---|",
             f"| CPU | {_cell(m.get('cpu'))} ({m.get('cores')} cores visible) |",
             f"| memory | {_bytes(m.get('memory_bytes'))} |",
             f"| accelerator | {m.get('gpu') or 'none'} |",
             f"| kernel | {m.get('kernel')} |",
             f"| load average at start / end | {load.get('start')} / {load.get('end')} "
             f"(above {m.get('cores')} means other work shared the cores) |"]
    for name in ("python", "terastack", "torch", "numpy", "fio", "transformers", "torch_geometric", "deepspeed"):
        if v.get(name):
            lines.append(f"| {name} | {_cell(v[name])} |")
    if dace_env:
        dv = dace_env.get("versions", {})
        lines.append(f"| DaCe environment | {dace_env.get('path')} "
                     f"({'created in this run' if dace_env.get('created_now') else 'reused'}, install took "
                     f"{dace_env.get('install_s')} s) |")
        for name in ("dace", "numpy", "numba", "llvmlite", "scipy", "networkx", "mpi4py"):
            if dv.get(name):
                lines.append(f"| {name} (DaCe env) | {dv[name]} |")
        sysinfo = dace_env.get("system", {})
        lines.append(f"| C++ compiler / CMake | {sysinfo.get('cxx')} / {sysinfo.get('cmake')} |")
        lines.append(f"| MPI | {_cell(sysinfo.get('mpi_version') or 'not installed')} |")
    lines += ["", f"Command: `{_cell(env.get('command'))}` — {env.get('date')}", ""]
    return lines


def _when(iso: str | None) -> str:
    return iso[:16].replace("T", " ") if iso else "—"


def runs_section(runs: list[dict]) -> list[str]:
    """The runs a report's suites were measured in, when there was more than one (``repro --add``)."""
    if len(runs) < 2:
        return []
    lines = ["## Runs", "", "The suites were measured in separate runs on this machine, each benchmark's ratios "
             "within its own run ([Note: a report measured in several runs] in terastack.repro.harness); a run "
             "lists the suites whose figures here are its own.", "",
             "| started | suites | load average at start / end | time |", "|---|---|---|---|"]
    for r in runs:
        load = r.get("load_average") or {}
        lines.append(f"| {_when(r.get('date'))} | {', '.join(r.get('suites', ()))} | {load.get('start')} / "
                     f"{load.get('end')} | {(r.get('wall_s') or 0) / 60:.0f} min |")
    return lines + [""]


def summary_section(suites: list[dict], verdicts: list[dict]) -> list[str]:
    lines = ["## Summary", "", "| suite | benchmark | measured | status | time | " + " | ".join(VERDICTS) + " |",
             "|---|---|---|---|---|" + "---|" * len(VERDICTS)]
    for s in suites:
        for b in s["benchmarks"]:
            counts = {k: 0 for k in VERDICTS}
            for v in verdicts:
                if v["suite"] == s["name"] and v["benchmark"] == b["name"]:
                    counts[v["status"]] += 1
            lines.append(f"| {s['name']} | {b['name']} | {_when(s.get('measured_at'))} | {b['status']} | "
                         f"{b.get('wall_s', 0):.0f} s | "
                         + " | ".join(str(counts[k]) for k in VERDICTS) + " |")
    return lines + [""]


def claims_section(suite: dict, verdicts: list[dict], claims: dict[str, Claim]) -> list[str]:
    rows = [v for v in verdicts if v["suite"] == suite["name"]]
    if not rows:
        return []
    lines = [f"### {suite['name']}", "",
             "| claim | source: the paper's figure, or terastack's target and why | paper's hardware | measured here | "
             "baseline | target | verdict |",
             "|---|---|---|---|---|---|---|"]
    reasons, seen = [], set()
    for v in rows:
        c = claims[v["claim"]]
        target = f"{c.comparison} {fmt(c.target, c.unit)}" if c.target is not None else "—"
        lines.append(f"| {_cell(c.title)} (`{c.id}`) | {_cell(c.source_text())} | {_cell(c.paper_hardware or '—')} | "
                     f"{_measured_cell(v, c)} | {_cell(c.baseline_text() or '—')} | {target} | {MARK[v['status']]} |")
        # every row but a plain reproduced one says why (a reported row too: its figure belongs to this machine);
        # claims of a benchmark that did not run share one reason: say it once
        if (v["status"] != "reproduced" or len(v.get("runs") or ())) and (v["status"], v["reason"]) not in seen:
            seen.add((v["status"], v["reason"]))
            same = [w["claim"] for w in rows if (w["status"], w["reason"]) == (v["status"], v["reason"])]
            reasons.append(f"- {', '.join(f'`{i}`' for i in same)} — {v['status']}: {_cell(v['reason'])}")
    lines.append("")
    if reasons:
        lines += ["Why each verdict is what it is, with this machine's reasons:", "", *reasons, ""]
    return lines


def _measured_cell(v: dict, claim: Claim) -> str:
    """The measured figure; over several runs, the median with the spread."""
    runs = [r for r in v.get("runs") or () if r is not None]
    if len(runs) < 2:
        return fmt(v["measured"], claim.unit)
    return (f"{fmt(v['measured'], claim.unit)} (median of {len(runs)} runs: {fmt(min(runs), claim.unit)} to "
            f"{fmt(max(runs), claim.unit)})")


def sources_section(verdicts: list[dict], claims: dict[str, Claim]) -> list[str]:
    """The papers the judged claims quote, in full, so that a reader can look each figure up."""
    judged = [claims[v["claim"]] for v in verdicts]
    cited = sorted({c.paper for c in judged if c.source == "paper"} | {k for c in judged for k in c.related})
    if not cited:
        return []
    lines = ["## Sources", "", "Rows marked \"terastack's target\" are targets terastack set itself, each with its "
             "reason in the row; the others quote these works' abstracts in short quotes (a figure an abstract does "
             "not state is marked in its row as derived by terastack, with the arithmetic, or named as another "
             "work's):", ""]
    lines += [f"- **{PAPERS[key].short}**{' (related work)' if PAPERS[key].role == 'related' else ''}: "
              f"{PAPERS[key].reference}. {_sentence(PAPERS[key].where_quoted())}" for key in cited]
    return lines + [""]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def not_run_section(suites: list[dict]) -> list[str]:
    rows = [(s["name"], b) for s in suites for b in s["benchmarks"] if b["status"] != "ok"]
    if not rows:
        return []
    lines = ["## Suites that did not run (or not completely)", ""]
    for suite, b in rows:
        reason = (b.get("reason") or "").strip().splitlines()
        lines.append(f"- **{suite}/{b['name']}** (`{b.get('module')}`): {b['status']} — {_cell(reason[0] if reason else '')}"
                     + (f" (log: `{b['log']}`)" if b.get("log") else ""))
        if len(reason) > 1:
            lines += ["", "  ```", *["  " + r for r in reason[1:15]], "  ```"]
    return lines + [""]


def _ms(x) -> str:
    return f"{x * 1e3:.2f}" if isinstance(x, (int, float)) else "—"


def dace_section(dace: dict, plots: dict[str, str]) -> list[str]:
    lines = ["## DaCe data-centric Python evaluation", ""]
    if dace.get("status") == "dependency-missing":
        return lines + [f"Not run: {dace.get('reason')}", ""]
    kern = dace.get("kernels", {})
    env = kern.get("environment", {})
    timing = kern.get("timing", {})
    lines += [
        f"Preset `{dace.get('preset')}`; {dace.get('threads')} thread(s) for every framework "
        f"(NumPy's BLAS, DaCe's OpenMP, Numba's pool). DaCe: each program parsed to an SDFG, auto-optimized for "
        f"the CPU and compiled; the compiled SDFG is what is timed, as NPBench does. BLAS library nodes expand to "
        f"**{(env.get('dace') or {}).get('blas_implementation', '?')}**. "
        f"Timing: first call measured on its own (it includes compilation), then up to {timing.get('repeats')} runs "
        f"(at least {timing.get('min_repeats')}, within {timing.get('budget_s')} s) with inputs copied before the "
        f"clock starts; median with a 95% percentile-bootstrap CI. Speedup = NumPy median / framework median; "
        f"its CI resamples both. Every output is checked against NumPy's with `np.allclose` at the kernel's "
        f"stated tolerances before any timing; a failure is listed and excluded.", ""]
    if kern.get("status") != "ok":
        lines += [f"**The kernel runner did not finish**: {_cell(kern.get('reason', ''))}", ""]
    crashes = kern.get("crashes") or []
    if crashes:
        lines += [f"Crashed measurements (the process died; excluded, the suite went on): **{len(crashes)}**", ""]
        lines += [f"- {c['kernel']} / {c['framework']}: {_cell(c['detail'][-400:])}" for c in crashes]
        lines.append("")
    # a run from before the count took in crashes and build failures listed only the outputs that did not match
    failures = dace.get("not_validated_list", dace.get("validation_failure_list")) or []
    lines += [f"Measurements not validated (an output unlike NumPy's, a build or run that failed, a runner that "
              f"died, or no record): **{len(failures)}**" + (":" if failures else "."), ""]
    lines += [f"- {f['kernel']} / {f['framework']}: {f.get('status', 'invalid')}: {_cell(f['detail'])}"
              for f in failures]
    if failures:
        lines.append("")
    sp = dace.get("speedups", {})
    frameworks = kern.get("frameworks") or []
    lines += _kernel_table(kern, sp, frameworks)
    lines += _first_calls_and_forms(kern, frameworks)
    for key, title in (("dace_heatmap", "Speedup heatmap"), ("dace_bars", "Speedups with confidence intervals"),
                       ("dace_compile", "Compile (first-call) times")):
        if key in plots:
            lines += [f"![{title}]({plots[key]})", ""]
    lines += scaling_lines(dace.get("scaling"), plots)
    lines += ["### Comparison with the paper", "",
              "The paper (Ziogas et al., SC'21) states its CPU and GPU results in the abstract as 2.47x and 3.75x "
              "speedups over the previous-best framework and its distributed result as up to 93.16% scaling "
              "efficiency on 512 nodes of Piz Daint; its per-kernel results are given only as plots and are not "
              "transcribed here, so the per-kernel rows above have no published counterpart. The aggregate figures "
              "are judged in the `dace` rows of the claims table. Where this machine differs: it has 2 CPU cores "
              "(the load average above says whether other work shared them), where the paper used "
              "a many-core node — DaCe's parallel maps and Numba's `prange` have little to divide and their thread "
              "barriers suffer most from preemption; the previous best here is the faster of NumPy and Numba only "
              "(no Pythran, CuPy or Legate); 15 kernels rather than NPBench's 52; and at most 2 MPI processes, "
              "with DaCe compiling each rank's local kernel while communication goes through mpi4py, not DaCe's "
              "own distributed code generation. terastack's seed for this part is a student reproduction of the "
              "paper (CPU and GPU, Azure CycleCloud, up to 32 nodes / 64 processes), whose abstract states no "
              "figure of its own, only that its results are \"in accordance with the SC paper\": its rows in the "
              "claims table (`dace.scc_*`) report what this machine reran beside what it says.", ""]
    return lines


def _kernel_table(kern: dict, sp: dict, frameworks: list) -> list[str]:
    """Per kernel: its definition, size, tolerance, each framework's median and speedup; the geometric means."""
    lines: list[str] = []
    lines += ["| kernel | definition | size | tolerance | " + " | ".join(f"{fw} ms [95% CI]" for fw in frameworks)
              + " | " + " | ".join(f"{fw} speedup [CI]" for fw in frameworks if fw != "numpy") + " | DaCe vs best |",
              "|---|---|---|---|" + "---|" * (2 * len(frameworks))]
    for name, entry in (kern.get("kernels") or {}).items():
        cells = []
        for fw in frameworks:
            rec = entry["frameworks"].get(fw, {})
            if rec.get("status") == "ok":
                cells.append(f"{_ms(rec['median'])} [{_ms(rec['ci_low'])}, {_ms(rec['ci_high'])}]")
            else:
                cells.append(f"{rec.get('status', '—')}")
        for fw in frameworks:
            if fw == "numpy":
                continue
            s = (sp.get("per_kernel", {}).get(name, {}) or {}).get(fw, {})
            cells.append(f"{s['ratio']:.3g}x [{s['ci_low']:.3g}, {s['ci_high']:.3g}]" if s.get("status") == "ok"
                         else s.get("status", "—"))
        vb = (sp.get("dace_vs_best_other") or {}).get(name)
        cells.append(f"{vb['ratio']:.3g}x vs {vb['best_other']}" if vb else "—")
        sizes = ", ".join(f"{k}={v}" for k, v in entry.get("sizes", {}).items())
        lines.append(f"| {name} | {_cell(entry.get('definition'))} | {sizes} | rtol={entry.get('rtol'):g}, "
                     f"atol={entry.get('atol'):g} | " + " | ".join(cells) + " |")
    geo = sp.get("geomean", {})
    lines += ["", "Geometric mean speedup over NumPy (validated kernels only): "
              + ", ".join(f"{fw} {v:.2f}x over {sp.get('counted', {}).get(fw)} kernels" for fw, v in geo.items()
                          if isinstance(v, float) and not math.isnan(v))
              + (f"; DaCe over the faster of NumPy and Numba: {sp['vs_best_other_geomean']:.2f}x"
                 if sp.get("vs_best_other_geomean") else "") + ".", ""]
    return lines


def _first_calls_and_forms(kern: dict, frameworks: list) -> list[str]:
    """First-call (compile) times, and where a kernel's DaCe form, size or optimization differs."""
    lines: list[str] = []
    lines += ["First call (compile + one run), seconds:", "", "| kernel | " + " | ".join(frameworks) + " |",
              "|---|" + "---|" * len(frameworks)]
    for name, entry in (kern.get("kernels") or {}).items():
        lines.append(f"| {name} | " + " | ".join(
            f"{entry['frameworks'].get(fw, {}).get('first_call_s', float('nan')):.2f}" for fw in frameworks) + " |")
    forms = [(n, e["dace_note"]) for n, e in (kern.get("kernels") or {}).items() if e.get("dace_note")]
    if forms:
        lines += ["", "Where the DaCe form differs from the NumPy function (every other kernel runs the NumPy "
                  "function itself, annotated with types):", ""]
        lines += [f"- {n}: {_cell(note)}" for n, note in forms]
    sizes = [(n, e["size_note"]) for n, e in (kern.get("kernels") or {}).items() if e.get("size_note")]
    if sizes:
        lines += ["", "Sizes below the ~10/100/1000 ms NumPy targets:", ""]
        lines += [f"- {n}: {_cell(note)}" for n, note in sizes]
    notes = [(n, e["frameworks"]["dace"].get("auto_optimize_error")) for n, e in (kern.get("kernels") or {}).items()
             if e.get("frameworks", {}).get("dace", {}).get("auto_optimize_error")]
    if notes:
        lines += ["", "DaCe's auto-optimizer failed on these kernels; they ran as the frontend produced them:", ""]
        lines += [f"- {n}: {_cell(err[:300])}" for n, err in notes]
    lines.append("")
    return lines


def scaling_lines(scaling: dict | None, plots: dict[str, str]) -> list[str]:
    lines = ["### Scaling (MPI)", ""]
    if not scaling:
        return lines + ["Not run (disabled).", ""]
    if scaling.get("status") == "dependency-missing":
        return lines + [f"Not run: {scaling.get('reason')}", ""]
    lines += [f"Process counts {scaling.get('process_counts')}; {scaling.get('note')}. Strong scaling keeps the "
              f"global size; weak scaling grows the split dimension with P. Efficiency: strong T(1)/(P T(P)), "
              f"weak T(1)/T(P). Every point is validated against serial NumPy before it is timed.", "",
              "| kernel | mode | P | sizes | median ms [95% CI] | efficiency | valid |", "|---|---|---|---|---|---|---|"]
    for kernel, modes in (scaling.get("efficiency") or {}).items():
        for mode, points in modes.items():
            for p in points:
                eff = f"{p['efficiency']:.1%}" if p.get("efficiency") is not None else "—"
                sizes = ", ".join(f"{k}={v}" for k, v in p["sizes"].items())
                lines.append(f"| {kernel} | {mode} | {p['procs']} | {sizes} | {_ms(p.get('median_s'))} "
                             f"[{_ms(p.get('ci_low'))}, {_ms(p.get('ci_high'))}] | {eff} | "
                             f"{'yes' if p['valid'] else '**no**'} |")
    for procs, run in (scaling.get("runs") or {}).items():
        if run.get("status") != "ok":
            lines.append(f"\nmpirun -n {procs} failed: {_cell(run.get('reason', ''))}")
    lines.append("")
    if "dace_scaling" in plots:
        lines += [f"![Scaling efficiency]({plots['dace_scaling']})", ""]
    return lines


def write_report(path: Path, data: dict, claims: tuple[Claim, ...] = CLAIMS) -> Path:
    by_id = {c.id: c for c in claims}
    verdicts = data["verdicts"]
    lines = ["# terastack reproduction report", "",
             f"Preset `{data['preset']}`, suites: {', '.join(data['suites_requested'])}. Every figure below was "
             f"measured {'in this run' if len(data.get('runs', ())) < 2 else 'in the runs listed below'} on this "
             f"machine, as a ratio against a baseline measured in the same run; the "
             f"paper's figures are quoted with the hardware they were measured on. Absolute times hold for this "
             f"machine only.", ""]
    repeated = max((len(b.get("runs") or ()) for s in data["suites"] for b in s["benchmarks"]), default=0)
    if repeated > 1:
        lines += [f"Benchmarks ran up to {repeated} times one after the other: each verdict is its median run's, "
                  f"with every run's value and the spread beside it.", ""]
    if data["preset"] == "smoke":
        lines += ["**Preset `smoke` runs every benchmark at a tiny size to show that it runs end to end; its ratios "
                  "are not measurements of the claims (compute and I/O are not balanced at that size). Use "
                  "`--preset full` for figures.**", ""]
    lines += machine_section(data["environment"], data["load_average"], data.get("dace_env"))
    lines += runs_section(data.get("runs", []))
    lines += summary_section(data["suites"], verdicts)
    lines += ["## Claims", ""]
    if "claims_chart" in data["plots"]:
        lines += [f"![Claims]({data['plots']['claims_chart']})", ""]
    for suite in data["suites"]:
        lines += claims_section(suite, verdicts, by_id)
    lines += sources_section(verdicts, by_id)
    lines += not_run_section(data["suites"])
    dace = next((b["result"] for s in data["suites"] if s["name"] == "dace" for b in s["benchmarks"]
                 if b.get("result")), None)
    if dace is not None:
        lines += dace_section(dace, data["plots"])
    lines += ["## Files", "", "- `report.json`: everything above, machine-readable (verdicts included)",
              *[f"- `{f}`" for f in data["raw_files"]]]
    if data.get("plots_missing"):
        lines.append(f"- plots not drawn: {data['plots_missing']}")
    else:
        lines += [f"- `{p}`" for p in data["plots"].values()]
    lines.append("")
    counts = {k: sum(1 for v in verdicts if v["status"] == k) for k in VERDICTS}
    lines.insert(3, "Verdicts: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".\n")
    path.write_text("\n".join(lines))
    return path

