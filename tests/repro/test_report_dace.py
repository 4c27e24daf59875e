"""The DaCe section of the report and its plots, from measurements of a toy kernel (no DaCe needed)."""
import numpy as np
import pytest

from terastack.repro import plots
from terastack.repro.dace import runner
from terastack.repro.dace.kernel import Kernel, fresh_args, readonly_checksums
from terastack.repro.dace.suite import not_validated, scaling_efficiency, scaling_summary, summarize_speedups
from terastack.repro.report import dace_section


def _kernel(factor_numba: float) -> Kernel:
    def numpy_impl(x, y):
        y[:] = 2 * x

    def numba_factory():
        def impl(x, y):
            y[:] = factor_numba * x
        return impl

    return Kernel(name="double", domain="test", definition="y = 2 x", args=("x", "y"), outputs=("y",),
                  sizes={p: {"n": 64} for p in ("smoke", "small", "full")},
                  init=lambda n: {"x": np.arange(float(n)), "y": np.zeros(n)}, numpy=numpy_impl,
                  numba=numba_factory, extras={"dace_note": "toy note"})


def _entry(kernel: Kernel) -> dict:
    inputs = kernel.inputs("smoke")
    ref = kernel.call(kernel.numpy, fresh_args(kernel, inputs))
    sums = readonly_checksums(kernel, inputs)
    fws = {fw: runner.measure_framework(kernel, fw, inputs, ref, sums, repeats=5, min_repeats=3, budget_s=1.0,
                                        auto_optimize=True) for fw in ("numpy", "numba")}
    return {"domain": "test", "definition": kernel.definition, "sizes": {"n": 64}, "rtol": kernel.rtol,
            "atol": kernel.atol, "dace_note": kernel.extras.get("dace_note"), "frameworks": fws}


@pytest.fixture
def dace_result():
    kernels = {"status": "ok", "frameworks": ["numpy", "numba"], "timing": {"repeats": 5, "min_repeats": 3,
                                                                           "budget_s": 1.0},
               "environment": {"dace": {"blas_implementation": "OpenBLAS"}},
               "kernels": {"double": _entry(_kernel(2.0)), "broken": _entry(_kernel(3.0))}}

    def rec(kernel, local, mode, p, t):
        return {"kernel": kernel, "local": local, "mode": mode, "procs": p, "sizes": {"M": 8 * p},
                "validation": {"ok": True}, "median": t, "ci_low": t, "ci_high": t}

    runs = {1: {"status": "ok", "records": [rec("atax", "numpy", "strong", 1, 1.0), rec("atax", "numpy", "weak", 1, 1.0)]},
            2: {"status": "ok", "records": [rec("atax", "numpy", "strong", 2, 0.6), rec("atax", "numpy", "weak", 2, 1.25)]}}
    eff = scaling_efficiency(runs)
    failures = not_validated(kernels)
    return {"status": "ok", "preset": "smoke", "threads": 2, "kernels": kernels,
            "speedups": summarize_speedups(kernels), "not_validated": len(failures),
            "not_validated_list": failures,
            "scaling": {"status": "ok", "process_counts": [1, 2], "runs": runs, "efficiency": eff,
                        "note": "rank-local compute in numpy"},
            "scaling_summary": scaling_summary({"efficiency": eff})}


def test_dace_section_lists_speedups_failures_and_scaling(dace_result):
    text = "\n".join(dace_section(dace_result, {}))
    assert "not validated (an output unlike NumPy's, a build or run that failed" in text and "**1**" in text
    assert "broken / numba: invalid:" in text and "not allclose" in text
    row = next(l for l in text.splitlines() if l.startswith("| double |"))
    assert "y = 2 x" in row and "x [" in row          # a speedup with its confidence interval
    broken = next(l for l in text.splitlines() if l.startswith("| broken |"))
    assert "invalid" in broken                          # excluded, and says so
    assert "over 1 kernels" in text                     # the geometric mean counts only the valid one
    assert "toy note" in text
    assert "| atax (numpy) | strong | 2 |" in text and "83.3%" in text     # 1 / (2 * 0.6)
    assert "| atax (numpy) | weak | 2 |" in text and "80.0%" in text       # 1 / 1.25
    assert "Comparison with the paper" in text and "93.16%" in text


def test_dace_plots(dace_result, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the repro extra (matplotlib)")
    made = [plots.dace_heatmap(dace_result["speedups"], tmp_path / "h.png"),
            plots.dace_bars(dace_result["speedups"], tmp_path / "b.png"),
            plots.dace_compile(dace_result["kernels"], tmp_path / "c.png"),
            plots.dace_scaling(dace_result["scaling"]["efficiency"], tmp_path / "s.png")]
    for path in made:
        assert path is not None and path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 1000


def test_dace_section_when_not_installable():
    text = "\n".join(dace_section({"status": "dependency-missing", "reason": "no CMake"}, {}))
    assert "Not run: no CMake" in text
