"""The share of the smaller side an overlapped run hides: in [0, 1] by construction, and the synchronous run's own
overhead no longer counted as hidden."""
import random

import pytest

from terastack.kernels.overlap import hidden_share, overlap_figures

#: the medians of the committed sort run of 2026-12-05 (benchmarks/repro-full_2core-epyc_2026-12-05/raw/sort.json):
#: the old formula, (sync - pipelined) / min(compute, io), gave 1.108 there
SORT = {"compute_only": [6.948069772999588], "io_only": [1.94908106100047], "sync": [10.564387929000077],
        "pipelined": [8.405174090999935]}


def test_the_committed_sort_run_hid_a_quarter_of_its_io():
    figures = overlap_figures(SORT)
    assert figures["smaller_side_hidden"] == pytest.approx(0.2524, abs=1e-4)
    assert figures["smaller_side_hidden_unclamped"] == pytest.approx(0.2524, abs=1e-4)
    assert "hidden_fraction" not in figures          # the old figure's name is not reused for the new one


@pytest.mark.parametrize("compute, io, pipelined, expected", [
    (2.0, 1.0, 2.0, 1.0),       # the smaller side entirely hidden
    (2.0, 1.0, 3.0, 0.0),       # nothing hidden: the serial sum
    (2.0, 1.0, 2.5, 0.5),
    (2.0, 1.0, 1.8, 1.0),       # faster than the larger side alone (noise): clamped
    (2.0, 1.0, 3.4, 0.0),       # slower than the serial sum: clamped
])
def test_hidden_share_cases(compute, io, pipelined, expected):
    assert hidden_share(compute, io, pipelined)[0] == pytest.approx(expected)


def test_hidden_share_lies_in_zero_one_whatever_the_timings():
    rng = random.Random(7)
    for _ in range(2000):
        c, i, p = (rng.uniform(1e-3, 10.0) for _ in range(3))
        share, raw = hidden_share(c, i, p)
        assert 0.0 <= share <= 1.0
        assert share == min(1.0, max(0.0, raw))


def test_a_zero_side_is_refused():
    with pytest.raises(ValueError, match="compute_s, io_s"):
        hidden_share(0.0, 1.0, 1.0)
