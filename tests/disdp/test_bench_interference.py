"""``terastack bench dist-interference``: settings are checked before any process starts."""
import argparse

import pytest

from terastack.disdp.bench import interference as bench_interference


@pytest.mark.parametrize("argv, message", [(["--ranks", "1"], "ranks"), (["--iters", "0"], "iters"),
                                           (["--elements", "0"], "elements"), (["--collectives", "0"], "collectives"),
                                           (["--storage-chunk", "1000"], "storage_chunk"),
                                           (["--storage-bytes", "3MiB", "--storage-chunk", "2MiB"], "storage_bytes")])
def test_bad_settings_are_refused_by_name(argv, message):
    p = argparse.ArgumentParser()
    bench_interference.add_arguments(p)
    with pytest.raises(ValueError, match=message):
        bench_interference.measure(p.parse_args(argv))


def test_presets_parse():
    p = argparse.ArgumentParser()
    bench_interference.add_arguments(p)
    for argv in bench_interference.PRESETS.values():
        args = p.parse_args(argv)
        assert args.ranks >= 2 and args.collectives >= 1 and args.storage_bytes != "0"
