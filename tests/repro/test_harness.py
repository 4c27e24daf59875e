"""The harness on fake suites: report structure, verdicts, and every way a suite can fail to run being reported."""
import dataclasses
import json
import textwrap

import pytest

from terastack.repro.claims import Claim
from terastack.repro.harness import Harness
from terastack.repro.verdicts import evaluate, lookup

FAKE_MODULES = {
    # a benchmark that works: its ratio scales with --scale so the test can tell the preset's args were used
    "fakebench_ok": """
        PRESETS = {"smoke": ["--scale", "2"], "small": ["--scale", "3"], "full": []}
        HEADLINE = ["speedup_vs_sync"]
        def add_arguments(p):
            p.add_argument("--scale", type=float, default=1.0)
        def measure(args):
            return {"speedup_vs_sync": 0.9 * args.scale, "hidden_fraction": 0.5, "errors": [0.05, 0.3],
                    "nested": {"ours": 2.0, "theirs": 8.0}}
    """,
    # a benchmark whose optional dependency is not installed
    "fakebench_dep": """
        PRESETS = {"smoke": [], "small": [], "full": []}
        def add_arguments(p):
            pass
        def measure(args):
            import terastack_fake_missing_dependency  # noqa: F401
    """,
    "fakebench_err": """
        PRESETS = {"smoke": [], "small": [], "full": []}
        def add_arguments(p):
            pass
        def measure(args):
            raise RuntimeError("disk on fire at offset 4096")
    """,
    "fakebench_nopreset": """
        PRESETS = {"full": []}
        def add_arguments(p):
            pass
        def measure(args):
            return {}
    """,
    # a benchmark whose figure moves from run to run (its runs count themselves in a file beside it)
    "fakebench_moving": """
        import os
        PRESETS = {"smoke": []}
        def add_arguments(p):
            pass
        def measure(args):
            path = os.path.join(os.path.dirname(__file__), "moving.count")
            n = int(open(path).read()) if os.path.exists(path) else 0
            open(path, "w").write(str(n + 1))
            return {"speedup": (2.82, 1.87, 2.0)[n % 3]}
    """,
    "fakebench_slow": """
        import time
        PRESETS = {"smoke": [], "small": [], "full": []}
        def add_arguments(p):
            pass
        def measure(args):
            time.sleep(60)
    """,
}

SUITES = {
    "alpha": (("ok", "fakebench_ok"), ("dep", "fakebench_dep")),
    "beta": (("absent", "fakebench_absent_module"), ("err", "fakebench_err"), ("nopreset", "fakebench_nopreset")),
}

CLAIMS = (
    Claim(id="a.speedup", suite="alpha", benchmark="ok", title="speedup", source="paper", paper="CAM", where="abstract",
          paper_figure="P: 1.8x", paper_value=1.8, paper_hardware="a big GPU", field="speedup_vs_sync", baseline="sync", target=1.5,
          target_reason="terastack's floor below the paper's figure", differs_because="2 cores, not a big GPU"),
    Claim(id="a.hidden", suite="alpha", benchmark="ok", title="hidden", source="project", paper_figure=">= 0.8", rationale="hide most of it",
          field="hidden_fraction", baseline="alone", target=0.8, unit="fraction",
          differs_because="the cores are shared"),
    Claim(id="a.errors", suite="alpha", benchmark="ok", title="worst error", source="project", rationale="why", paper_figure="<= 0.2",
          field="errors", aggregate="max", comparison="<=", target=0.2, differs_because="noise"),
    Claim(id="a.ratio", suite="alpha", benchmark="ok", title="ratio", source="project", rationale="why", paper_figure="<= 0.5",
          field="nested.ours", ratio_to="nested.theirs", comparison="<=", target=0.5, differs_because="-"),
    Claim(id="a.reported", suite="alpha", benchmark="ok", title="reported", source="project", rationale="why", paper_figure="-",
          field="nested.ours", differs_because="-"),
    Claim(id="a.typo", suite="alpha", benchmark="ok", title="renamed field", source="project", rationale="why", paper_figure="-",
          field="speedup_vs_synch", target=1.0, differs_because="-"),
    Claim(id="a.dep", suite="alpha", benchmark="dep", title="needs a dep", source="project", rationale="why", paper_figure="-",
          field="x", target=1.0, differs_because="-"),
    Claim(id="a.cluster", suite="alpha", benchmark="ok", title="175B on 8 GPUs", source="paper", paper="DisDP",
          where="abstract", paper_figure="P: 3.98x", paper_value=3.98, differs_because="needs 8 GPUs",
          prediction_command="terastack dist simulate"),
    Claim(id="b.absent", suite="beta", benchmark="absent", title="absent", source="project", rationale="why", paper_figure="-",
          field="x", target=1.0, differs_because="-"),
    Claim(id="b.err", suite="beta", benchmark="err", title="errs", source="project", rationale="why", paper_figure="-",
          field="x", target=1.0, differs_because="-"),
)


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("fakebenches")
    for name, src in FAKE_MODULES.items():
        (d / f"{name}.py").write_text(textwrap.dedent(src))
    return d


@pytest.fixture(scope="module")
def report(fake_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    data = Harness(Harness.Config(suites=("alpha", "beta"), preset="smoke", out_dir=str(out), claims=CLAIMS,
                                  bench_suites=SUITES, pythonpath=(str(fake_path),))).run()
    return out, data


def _verdict(data, cid):
    return next(v for v in data["verdicts"] if v["claim"] == cid)


def test_statuses_of_every_kind_of_suite(report):
    _, data = report
    status = {b["name"]: b for s in data["suites"] for b in s["benchmarks"]}
    assert status["ok"]["status"] == "ok"
    assert status["ok"]["result"]["speedup_vs_sync"] == pytest.approx(1.8)     # PRESETS["smoke"] was used
    assert status["dep"]["status"] == "dependency-missing"
    assert "terastack_fake_missing_dependency" in status["dep"]["reason"]
    assert status["absent"]["status"] == "missing"
    assert "fakebench_absent_module" in status["absent"]["reason"]
    assert status["err"]["status"] == "error" and "disk on fire at offset 4096" in status["err"]["reason"]
    assert status["nopreset"]["status"] == "no-preset" and "'smoke'" in status["nopreset"]["reason"]


def test_verdicts(report):
    _, data = report
    assert _verdict(data, "a.speedup")["status"] == "reproduced"
    hidden = _verdict(data, "a.hidden")
    assert hidden["status"] == "not reproduced" and "the cores are shared" in hidden["reason"]
    assert _verdict(data, "a.errors")["status"] == "not reproduced"          # max(0.05, 0.3) > 0.2
    assert _verdict(data, "a.errors")["measured"] == pytest.approx(0.3)
    assert _verdict(data, "a.ratio")["measured"] == pytest.approx(0.25)
    assert _verdict(data, "a.ratio")["status"] == "reproduced"
    assert _verdict(data, "a.reported")["status"] == "reported"
    typo = _verdict(data, "a.typo")
    assert typo["status"] == "not measured" and "speedup_vs_synch" in typo["reason"] and "speedup_vs_sync" in typo["reason"]
    assert _verdict(data, "a.dep")["status"] == "not measured"
    cluster = _verdict(data, "a.cluster")
    assert cluster["status"] == "needs other hardware" and "terastack dist simulate" in cluster["reason"]
    assert _verdict(data, "b.absent")["status"] == "not measured"
    assert "not part of this installation" in _verdict(data, "b.absent")["reason"]


def test_report_structure(report):
    out, data = report
    text = (out / "REPORT.md").read_text()
    for heading in ("# terastack reproduction report", "## Machine and software", "## Summary", "## Claims",
                    "### alpha", "### beta", "## Suites that did not run", "## Files"):
        assert heading in text, heading
    # per claim: the paper's figure and hardware, the measurement, the baseline, the verdict
    row = next(line for line in text.splitlines() if "`a.speedup`" in line and line.startswith("|"))
    assert "P: 1.8x" in row and "a big GPU" in row and "1.80x" in row and "sync" in row and "yes" in row
    assert "with this machine's reasons" in text and "the cores are shared" in text
    # a reported row says why too
    assert "`a.reported` — reported: no target" in text
    # every suite that did not run is named with its reason, none silently dropped
    not_run = text.split("## Suites that did not run")[1]
    for name, why in (("dep", "dependency-missing"), ("absent", "missing"), ("err", "error"),
                      ("nopreset", "no-preset")):
        assert f"/{name}**" in not_run and why in not_run
    assert "disk on fire" in not_run
    assert "| CPU |" in text and "| python |" in text


def test_raw_json_and_report_json(report):
    out, data = report
    raw = json.loads((out / "raw" / "ok.json").read_text())
    assert raw["status"] == "ok" and raw["result"]["hidden_fraction"] == 0.5
    assert raw["result"]["environment"]["machine"]["cores"] >= 1
    rep = json.loads((out / "report.json").read_text())
    assert {v["claim"] for v in rep["verdicts"]} == {c.id for c in CLAIMS}
    assert (out / "logs" / "err.log").exists()


def test_plots_drawn_or_their_absence_explained(report):
    out, data = report
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plots not drawn" in (out / "REPORT.md").read_text()
        return
    png = out / data["plots"]["claims_chart"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert f"]({data['plots']['claims_chart']})" in (out / "REPORT.md").read_text()


def test_a_hanging_benchmark_is_bounded(fake_path, tmp_path):
    data = Harness(Harness.Config(suites=("slow",), preset="smoke", out_dir=str(tmp_path), claims=(),
                                  bench_suites={"slow": (("slow", "fakebench_slow"),)}, bench_timeout_s=3,
                                  pythonpath=(str(fake_path),))).run()
    b = data["suites"][0]["benchmarks"][0]
    assert b["status"] == "timeout" and "3 s" in b["reason"] and b["wall_s"] < 30


def test_dace_suite_without_a_compiler_is_reported(tmp_path, monkeypatch):
    from terastack.repro.dace import env as dace_env

    real_which = dace_env.shutil.which
    monkeypatch.setattr(dace_env.shutil, "which", lambda name: None if name == "cmake" else real_which(name))
    data = Harness(Harness.Config(suites=("dace",), preset="smoke", out_dir=str(tmp_path),
                                  dace={"env": {"path": str(tmp_path / "never-created")}})).run()
    b = data["suites"][0]["benchmarks"][0]
    assert b["status"] == "dependency-missing" and "CMake" in b["reason"]
    assert not (tmp_path / "never-created").exists()
    dace_verdicts = [v for v in data["verdicts"] if v["suite"] == "dace"]
    assert dace_verdicts and all(v["status"] in ("not measured", "needs other hardware") for v in dace_verdicts)
    text = (tmp_path / "REPORT.md").read_text()
    assert "dace/dace" in text and "CMake" in text


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="suites: unknown"):
        Harness.Config(suites=("nope",))
    with pytest.raises(ValueError, match="preset"):
        Harness.Config(preset="huge")


def test_lookup_and_evaluate_edge_cases():
    assert lookup({"a": {"b": [1, 2]}}, "a.b.1") == 2
    c = Claim(id="x", suite="s", benchmark="b", title="t", source="project", rationale="why", paper_figure="-", field="v",
              comparison="==", target=0, differs_because="-")
    assert evaluate(c, "ok", "", {"v": 0}).status == "reproduced"
    assert evaluate(c, "ok", "", {"v": 3}).status == "not reproduced"
    assert evaluate(c, "ok", "", {"v": "fast"}).status == "not measured"
    yes = Claim(id="b", suite="s", benchmark="b", title="t", source="project", rationale="why", paper_figure="-", field="flat",
                comparison="==", target=1, unit="bool", differs_because="-")
    assert evaluate(yes, "ok", "", {"flat": True}).status == "reproduced"
    assert evaluate(yes, "ok", "", {"flat": False}).status == "not reproduced"
    assert evaluate(c, "timeout", "ran past 600 s", None).reason.endswith("ran past 600 s")
    with pytest.raises(ValueError, match="differs_because"):
        Claim(id="y", suite="s", benchmark="b", title="t", source="paper", paper="DaCe", where="abstract",
              paper_figure="-")


def test_shipped_claims_are_consistent():
    from terastack.repro.claims import CLAIMS as shipped
    from terastack.repro.suites import BENCH_SUITES

    ids = [c.id for c in shipped]
    assert len(ids) == len(set(ids))
    for c in shipped:
        assert c.suite in (*BENCH_SUITES, "dace"), c.id
        assert c.benchmark in (*BENCH_SUITES.get(c.suite, ()), "dace"), c.id


def test_cli_lists_repro_and_rejects_bad_input(capsys):
    from terastack.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["repro", "io", "dace", "--preset", "smoke", "--out", "/tmp/x"])
    assert args.suites == ["io", "dace"] and args.preset == "smoke"
    with pytest.raises(SystemExit):
        parser.parse_args(["repro", "--preset", "enormous"])


@pytest.mark.parametrize("argv, message", [
    (["repro", "dace", "--threads", "0"], "threads: must be >= 1"),
    (["repro", "dace", "--kernels", "gemm,nope"], "unknown kernel"),
    (["repro", "warp-drive"], "suites: unknown"),
])
def test_cli_bad_input_fails_before_running_anything(argv, message, tmp_path, capsys):
    from terastack.cli import main

    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["io", "kernels"])
def test_smoke_preset_on_the_projects_storage_benchmarks(tmp_path, suite):
    """The real registry at `--preset smoke` for the io and kernels suites (the engines CI always has), one suite
    per test so that they run side by side."""
    from terastack.repro.bench_child import module_present
    from terastack.repro.suites import registry

    data = Harness(Harness.Config(suites=(suite,), preset="smoke", out_dir=str(tmp_path))).run()
    assert [s["name"] for s in data["suites"]] == [suite]
    reg = registry()
    for suite in data["suites"]:
        for b in suite["benchmarks"]:
            present = module_present(reg[b["name"]])
            assert b["status"] == ("ok" if present else "missing"), (b["name"], b["reason"])
            mine = [v for v in data["verdicts"] if v["benchmark"] == b["name"]]
            assert mine and all((v["status"] != "not measured") == present for v in mine), mine
    assert "Preset `smoke`" in (tmp_path / "REPORT.md").read_text()


def test_render_rejudges_an_earlier_run_without_measuring(report, tmp_path):
    import dataclasses
    import shutil

    out, _ = report
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "logs").rename(copy / "logs-moved")        # nothing is re-run: logs are not needed
    stricter = tuple(dataclasses.replace(c, target=2.0) if c.id == "a.speedup" else c for c in CLAIMS)
    data = Harness(Harness.Config(out_dir=str(copy), claims=stricter)).render()
    assert _verdict(data, "a.speedup")["status"] == "not reproduced"       # 1.8 < 2.0 now
    assert _verdict(data, "a.speedup")["measured"] == pytest.approx(1.8)
    assert "| >= 2.00x | **no** |" in (copy / "REPORT.md").read_text()
    with pytest.raises(ValueError, match="report.json"):
        Harness(Harness.Config(out_dir=str(tmp_path / "nothing-here"))).render()


def test_a_benchmark_whose_package_fails_to_import_is_an_error_not_missing(tmp_path, monkeypatch):
    """Finding ``pkg.bench`` imports ``pkg``; a broken ``pkg`` is reported with its error, not as an absent module."""
    from terastack.repro.bench_child import run_module

    pkg = tmp_path / "fakebrokenpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from os import no_such_name\n")
    (pkg / "bench.py").write_text("PRESETS = {'smoke': []}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = run_module("fakebrokenpkg.bench", "smoke")
    assert out["status"] == "error" and "no_such_name" in out["reason"] and "traceback" in out
    assert run_module("fakebrokenpkg_absent.bench", "smoke")["status"] == "missing"


def test_repeated_runs_are_judged_at_their_median_with_the_spread(fake_path, tmp_path):
    """``--repeat 3``: each benchmark runs three times; a verdict is its median run's, the report gives every run's
    value and the spread, and a re-render keeps them."""
    claims = (Claim(id="m.speedup", suite="moving", benchmark="moving", title="moving speedup", source="project",
                    rationale="why", paper_figure=">= 1.8", field="speedup", target=1.8, differs_because="a busy VM"),
              Claim(id="m.strict", suite="moving", benchmark="moving", title="stricter", source="project",
                    rationale="why", paper_figure=">= 2.5", field="speedup", target=2.5, differs_because="a busy VM"))
    (fake_path / "moving.count").unlink(missing_ok=True)
    config = Harness.Config(suites=("moving",), preset="smoke", out_dir=str(tmp_path), claims=claims, repeat=3,
                            bench_suites={"moving": (("moving", "fakebench_moving"),)}, pythonpath=(str(fake_path),))
    data = Harness(config).run()
    bench = data["suites"][0]["benchmarks"][0]
    assert [r["result"]["speedup"] for r in bench["runs"]] == [2.82, 1.87, 2.0]
    ok, strict = _verdict(data, "m.speedup"), _verdict(data, "m.strict")
    assert ok["status"] == "reproduced" and ok["measured"] == pytest.approx(2.0) and ok["runs"] == [2.82, 1.87, 2.0]
    assert strict["status"] == "not reproduced" and "spread 1.87x to 2.82x" in strict["reason"]
    text = (tmp_path / "REPORT.md").read_text()
    assert "2.00x (median of 3 runs: 1.87x to 2.82x)" in text and "ran up to 3 times" in text
    assert (tmp_path / "logs" / "moving.run3.log").exists()
    again = Harness(dataclasses.replace(config, repeat=1)).render()
    assert _verdict(again, "m.speedup")["runs"] == [2.82, 1.87, 2.0]


def test_suites_measured_in_separate_runs_make_one_report(fake_path, tmp_path):
    """``--add``: a second run's suite joins the first run's report; a suite measured again replaces its earlier
    figures; each suite keeps its own run's date; a run of another preset is refused before it measures."""
    def run(suites, preset="smoke", add=True):
        return Harness(Harness.Config(suites=suites, preset=preset, out_dir=str(tmp_path), claims=CLAIMS,
                                      bench_suites=SUITES, pythonpath=(str(fake_path),), add=add)).run()

    first = run(("alpha",), add=False)
    alpha_at = first["suites"][0]["measured_at"]
    second = run(("beta",))
    assert [s["name"] for s in second["suites"]] == ["alpha", "beta"]
    assert second["suites"][0]["measured_at"] == alpha_at
    assert _verdict(second, "a.speedup")["measured"] == pytest.approx(1.8)    # judged from the first run's raw/
    assert _verdict(second, "b.err")["status"] == "not measured"
    assert [r["suites"] for r in second["runs"]] == [["alpha"], ["beta"]]
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert [s["name"] for s in on_disk["suites"]] == ["alpha", "beta"]
    text = (tmp_path / "REPORT.md").read_text()
    assert "## Runs" in text and "in the runs listed below" in text
    assert {"raw/ok.json", "raw/err.json"} <= set(second["raw_files"])

    third = run(("alpha",))
    assert [s["name"] for s in third["suites"]] == ["beta", "alpha"]   # unknown suite names keep the run order
    # the first run's only suite was measured again: it has no figure left in the report
    assert [r["suites"] for r in third["runs"]] == [["beta"], ["alpha"]]
    assert len([v for v in third["verdicts"] if v["claim"] == "a.speedup"]) == 1

    with pytest.raises(ValueError, match="preset 'smoke', not 'small'"):
        run(("beta",), preset="small")
    assert json.loads((tmp_path / "report.json").read_text())["runs"] == json.loads(json.dumps(third["runs"]))


def test_a_report_holds_one_machines_runs(fake_path, tmp_path, monkeypatch):
    """``--add`` from another machine is refused before it measures, naming both machines; a new kernel is the
    same machine. A run keeps only the suites whose figures are still its own."""
    import terastack.reporting
    from terastack.repro.harness import _live_runs

    def run(suites):
        return Harness(Harness.Config(suites=suites, preset="smoke", out_dir=str(tmp_path), claims=CLAIMS,
                                      bench_suites=SUITES, pythonpath=(str(fake_path),), add=True)).run()

    first = run(("alpha",))
    here = first["runs"][0]["machine"]
    assert here == terastack.reporting.machine()
    before = (tmp_path / "report.json").read_text()
    monkeypatch.setattr(terastack.reporting, "machine", lambda: {**here, "cpu": "Another CPU", "cores": 64})
    with pytest.raises(ValueError, match=r"Another CPU \(64 cores.*one report holds one machine's runs"):
        run(("beta",))
    assert (tmp_path / "report.json").read_text() == before
    assert not (tmp_path / "raw" / "err.json").exists()                 # nothing was measured
    monkeypatch.setattr(terastack.reporting, "machine", lambda: {**here, "kernel": "a newer kernel"})
    assert [r["suites"] for r in run(("beta",))["runs"]] == [["alpha"], ["beta"]]

    runs = [{"date": "1", "suites": ["io", "llm", "gnn"]}, {"date": "2", "suites": ["llm"]},
            {"date": "3", "suites": ["llm", "io"]}, {"date": "4", "suites": ["gnn"]}]
    assert [(r["date"], r["suites"]) for r in _live_runs(runs)] == [("3", ["llm", "io"]), ("4", ["gnn"])]
    runs[3]["suites"] = ["dace"]
    assert [(r["date"], r["suites"]) for r in _live_runs(runs)] == [
        ("1", ["gnn"]), ("3", ["llm", "io"]), ("4", ["dace"])]
