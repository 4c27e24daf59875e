"""Fanouts: one strict parser for both graph kinds, ``-1`` (every neighbour) on both, and ``--fanouts -1,5``
through the real command-line parser."""
from __future__ import annotations

import json

import numpy as np
import pytest

from terastack.cli import build_parser, main
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.fanouts import parse_fanouts, parse_relation_fanouts
from terastack.gnn.sampling.sampler import NeighborSampler
from terastack.gnn.settings import gnn_job

ETS = [("paper", "cites", "paper"), ("paper", "written_by", "author")]


@pytest.mark.parametrize("bad", ["5,,5", "5,", ",5", "5;5", "5.0,2", "+5", "-2,3", "", "0", "0,5", "a,b"])
def test_bad_lists_are_refused_the_same_way_on_both_kinds(bad):
    with pytest.raises(ValueError, match="^fanouts: ") as homogeneous:
        parse_fanouts(bad)
    assert "fanouts: fanouts" not in str(homogeneous.value)
    with pytest.raises(ValueError, match="^fanouts: ") as one_relation:
        parse_relation_fanouts(bad, ETS[:1])
    assert str(one_relation.value) == str(homogeneous.value)  # a homogeneous graph is the one-relation case


def test_good_lists_parse_the_same_on_both_kinds():
    for text, want in [("15,10", (15, 10)), ("-1,5", (-1, 5)), (" 4 , 3 ", (4, 3)), ("-1", (-1,))]:
        assert parse_fanouts(text) == want
        assert parse_relation_fanouts(text, ETS) == {et: want for et in ETS}
    # 0 leaves one relation out of a hop; a hop that no relation samples is refused
    assert parse_relation_fanouts("cites=4,0;*=0,2", ETS) == {ETS[0]: (4, 0), ETS[1]: (0, 2)}
    with pytest.raises(ValueError, match="hop 2 samples no neighbours"):
        parse_relation_fanouts("cites=4,0;*=1,0", ETS)
    with pytest.raises(ValueError, match="^fanouts: cites: an empty hop"):
        parse_relation_fanouts("cites=4,,0;*=1,2", ETS)
    with pytest.raises(ValueError, match="heterogeneous"):
        parse_fanouts("cites=4,3")


def test_minus_one_takes_every_in_neighbour_on_a_homogeneous_graph(tiny):
    ds = open_dataset(tiny)
    s = NeighborSampler(ds.indptr, ds.indices, fanouts="-1", seed=0)
    seeds = np.array([0, 7, 123, 2999])
    b = s.sample(seeds, s.batch_rng(0, 0))
    for k, v in enumerate(seeds):
        got = sorted(b.n_id[b.row[b.col == k]].tolist())
        assert got == sorted(ds.indices[ds.indptr[v]:ds.indptr[v + 1]].tolist())


def test_cli_parses_negative_lists_and_refuses_empty_items(tmp_path, capsys):
    from terastack.training.job import job_flags

    parser = build_parser()
    args = parser.parse_args(["gnn", "train", "--data", "d", "--fanouts", "-1,5"])
    assert job_flags(args)["sampling.fanouts"] == "-1,5"
    args = parser.parse_args(["gnn", "advise", "--data", "d", "--fanouts", "-1"])
    assert job_flags(args)["sampling.fanouts"] == "-1"
    assert main(["gnn", "train", "--data", str(tmp_path), "--fanouts", "5,,5"]) == 2
    err = capsys.readouterr().err
    assert "--fanouts" in err and "empty hop" in err and "fanouts: fanouts" not in err


def test_cli_trains_both_kinds_with_minus_one(tiny, hetero, capsys):
    common = ["--batch-size", "500", "--epochs", "1", "--hidden", "8", "--eval-nodes", "0", "--json", "--quiet",
              "--threads", "0"]
    assert main(["gnn", "train", "--data", str(tiny), "--fanouts", "-1,3", *common]) == 0
    assert json.loads(capsys.readouterr().out)["fanouts"] == {"node___to___node": [-1, 3]}
    assert main(["gnn", "train", "--data", str(hetero), "--model", "rgcn", "--fanouts", "-1,3", *common]) == 0
    assert set(map(tuple, json.loads(capsys.readouterr().out)["fanouts"].values())) == {(-1, 3)}


def test_trainer_config_takes_minus_one_and_names_the_field_once(tiny):
    assert gnn_job(data=str(tiny), fanouts="-1,5").sampling.fanouts == "-1,5"
    assert gnn_job(data=str(tiny), fanouts=(-1, 5)).sampling.fanouts == "-1,5"
    with pytest.raises(ValueError) as err:
        gnn_job(data=str(tiny), fanouts="5,,5")
    assert str(err.value).startswith("sampling.fanouts: ") and str(err.value).count("fanouts:") == 1
