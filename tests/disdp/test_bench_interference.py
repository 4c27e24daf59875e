"""``terastack bench dist-interference``: settings are checked before any process starts."""
import argparse

import pytest

from terastack.disdp.bench import interference as bench_interference


@pytest.mark.parametrize("argv, message", [(["--ranks", "1"], "ranks"), (["--iters", "0"], "iters"),
                                           (["--elements", "0"], "elements")])
def test_bad_settings_are_refused_by_name(argv, message):
    p = argparse.ArgumentParser()
    bench_interference.add_arguments(p)
    with pytest.raises(ValueError, match=message):
        bench_interference.measure(p.parse_args(argv))


def test_presets_parse():
    p = argparse.ArgumentParser()
    bench_interference.add_arguments(p)
    for argv in bench_interference.PRESETS.values():
        assert p.parse_args(argv).ranks >= 2
