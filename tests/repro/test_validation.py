"""Validation catches wrong results, and a framework that fails it is reported and left out of every speedup."""
import dataclasses

import numpy as np
import pytest

from terastack.repro.dace import runner
from terastack.repro.dace.kernel import Kernel, validate
from terastack.repro.dace.stats import geomean, median_ci, ratio_ci
from terastack.repro.dace.suite import not_validated, summarize_speedups


def test_validate_accepts_within_tolerance():
    ref = [np.linspace(1, 2, 50)]
    assert validate(ref, [ref[0] * (1 + 1e-12)], rtol=1e-10, atol=0).ok


@pytest.mark.parametrize("got, why", [
    ([np.linspace(1, 2, 50) * (1 + 1e-6)], "not allclose"),
    ([np.linspace(1, 2, 49)], "shape"),
    ([np.where(np.arange(50) == 7, np.nan, np.linspace(1, 2, 50))], "NaN"),
    ([], "outputs"),
])
def test_validate_rejects_wrong_results(got, why):
    v = validate([np.linspace(1, 2, 50)], got, rtol=1e-10, atol=0)
    assert not v.ok and why in v.detail


def test_validate_integers_must_be_exact():
    assert not validate([np.array(0x906E, np.uint16)], [np.array(0x906F, np.uint16)], rtol=0, atol=0).ok
    assert validate([np.array(0x906E, np.uint16)], [np.array(0x906E, np.uint16)], rtol=0, atol=0).ok


def test_validate_names_the_worst_element():
    ref = np.zeros((3, 4))
    bad = ref.copy()
    bad[2, 1] = 1.0
    v = validate([ref], [bad], rtol=1e-10, atol=1e-12)
    assert "(2, 1)" in v.detail and v.max_abs_err == 1.0


def _toy_kernel(wrong_numba: bool) -> Kernel:
    def numpy_impl(x, y):
        y[:] = 2 * x

    def numba_factory():
        # a "framework" computing the wrong thing (3x instead of 2x), or the right one
        def impl(x, y):
            y[:] = (3 if wrong_numba else 2) * x
        return impl

    return Kernel(name="double", domain="test", definition="y = 2 x", args=("x", "y"), outputs=("y",),
                  sizes={p: {"n": 8} for p in ("smoke", "small", "full")},
                  init=lambda n: {"x": np.arange(float(n)), "y": np.zeros(n)}, numpy=numpy_impl,
                  numba=numba_factory)


def _measure(kernel, framework):
    inputs = kernel.inputs("smoke")
    from terastack.repro.dace.kernel import fresh_args, readonly_checksums

    reference = kernel.call(kernel.numpy, fresh_args(kernel, inputs))
    return runner.measure_framework(kernel, framework, inputs, reference, readonly_checksums(kernel, inputs),
                                    repeats=4, min_repeats=3, budget_s=1.0, auto_optimize=True)


def test_wrong_framework_is_invalid_untimed_and_excluded():
    k = _toy_kernel(wrong_numba=True)
    bad = _measure(k, "numba")
    assert bad["status"] == "invalid" and "not allclose" in bad["validation"]["detail"]
    assert "times_s" not in bad
    base = _measure(k, "numpy")
    assert base["status"] == "ok" and len(base["times_s"]) == 4
    result = {"kernels": {"double": {"frameworks": {"numpy": base, "numba": bad}}}}
    sp = summarize_speedups(result)
    assert sp["per_kernel"]["double"]["numba"] == {"status": "invalid"}
    assert sp["counted"] == {}
    assert not_validated(result) == [{"kernel": "double", "framework": "numba", "status": "invalid",
                                      "detail": bad["validation"]["detail"]}]


def test_correct_framework_is_timed_and_counted():
    k = _toy_kernel(wrong_numba=False)
    good, base = _measure(k, "numba"), _measure(k, "numpy")
    assert good["status"] == "ok" and good["ci_low"] <= good["median"] <= good["ci_high"]
    sp = summarize_speedups({"kernels": {"double": {"frameworks": {"numpy": base, "numba": good}}}})
    assert sp["counted"] == {"numba": 1} and sp["per_kernel"]["double"]["numba"]["status"] == "ok"


def test_writing_into_a_read_only_input_fails_validation():
    k = _toy_kernel(wrong_numba=False)

    def sneaky():
        def impl(x, y):
            y[:] = 2 * x
            x[0] = 99.0      # corrupts the shared input
        return impl

    k2 = dataclasses.replace(k, numba=sneaky)
    rec = _measure(k2, "numba")
    assert rec["status"] == "invalid" and "read-only input" in rec["validation"]["detail"]


def test_a_framework_that_raises_is_reported_failed():
    def broken():
        raise ImportError("no numba here")

    k = _toy_kernel(wrong_numba=False)
    k2 = dataclasses.replace(k, numba=broken)
    rec = _measure(k2, "numba")
    assert rec["status"] == "failed" and "no numba here" in rec["error"]


def test_median_and_ratio_confidence_intervals():
    r = np.random.default_rng(0)
    a, b = 1.0 + 0.01 * r.random(30), 0.5 + 0.005 * r.random(30)
    m = median_ci(a)
    assert m["ci_low"] <= m["median"] <= m["ci_high"] and m["n"] == 30
    s = ratio_ci(a, b)
    assert 1.9 < s["ci_low"] <= s["ratio"] <= s["ci_high"] < 2.1
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="samples"):
        median_ci([])
