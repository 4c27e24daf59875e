"""The cluster step-time model: its arithmetic, its calibration and the paper-scale prediction's shape."""
from __future__ import annotations

import argparse
import json

import pytest

from terastack.plan import cluster
from terastack.plan.cluster import Calibration, Cluster, ModelShape, predict

pytestmark = pytest.mark.timeout(60)


def test_175b_on_8_gpus_with_slow_nics_favours_disaggregation():
    out = predict(ModelShape.resolve("175b"), Cluster(gpus=8, nic_gbps=25, servers=2), Calibration())
    assert out["prediction"] is True
    assert out["disaggregated"]["step_s"] < out["msdp"]["step_s"]
    assert out["speedup"] > 1.5
    text = " ".join(out["assumptions"])
    assert "PREDICTION" in text and "multicast" in text and "mfu" in text and "assumed" in text


def test_formulas_by_hand():
    model = ModelShape(name="m", params=1e9, layers=10, hidden=1024, seq_len=1000)
    cal = Calibration(mfu=0.5, interference=0.0, link_efficiency=1.0, adam_params_per_s_per_core=1e9,
                      reduce_bytes_per_s_per_core=1e12)
    cl = Cluster(gpus=2, gpu_tflops=100, nic_gbps=80, gpus_per_node=2, servers=1, node_ssd_gbs=1000,
                 server_ssd_gbs=1000, node_cpu_cores=2, server_cpu_cores=1, micro_batch=1, recompute=False)
    out = predict(model, cl, cal)
    t_comp = 6 * 1e9 * 1000 / (100e12 * 0.5)                  # 0.12 s
    assert out["msdp"]["compute_s"] == pytest.approx(t_comp)
    nic = 10e9                                                # 80 Gbit/s
    assert out["msdp"]["collectives_s"] == pytest.approx(3 * 2e9 * 0.5 / nic)
    assert out["disaggregated"]["worker_nic_s"] == pytest.approx(4e9 / nic)
    assert out["disaggregated"]["server_adam_s"] == pytest.approx(1.0)   # 1e9 params at 1e9/s on one core


def test_faster_nics_shrink_msdp_collectives_and_more_servers_help_the_servers():
    model = ModelShape.resolve("13b")
    cal = Calibration()
    slow = predict(model, Cluster(nic_gbps=10), cal)
    fast = predict(model, Cluster(nic_gbps=400), cal)
    assert fast["msdp"]["collectives_s"] < slow["msdp"]["collectives_s"]
    one = predict(model, Cluster(servers=1), cal)["disaggregated"]
    four = predict(model, Cluster(servers=4), cal)["disaggregated"]
    assert four["server_ssd_s"] == pytest.approx(one["server_ssd_s"] / 4)


def test_calibration_measures_here():
    cal = cluster.calibrate(seconds=0.05)
    assert cal.adam_params_per_s_per_core > 1e6
    assert cal.reduce_bytes_per_s_per_core > 1e8
    assert cal.interference >= 0
    assert "measured" in cal.sources["adam_params_per_s_per_core"]
    assert "assumed" in cal.sources["mfu"]


def test_model_from_config_and_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
                                                      "intermediate_size": 128}))
    shape = ModelShape.resolve(str(tmp_path))
    assert shape.params == 2 * (4 * 64 * 64 + 3 * 64 * 128) + 2 * 100 * 64
    with pytest.raises(ValueError, match="model"):
        ModelShape.resolve("nonexistent-size")
    with pytest.raises(ValueError, match="nic_gbps"):
        Cluster(nic_gbps=0)
    with pytest.raises(ValueError, match="mfu"):
        Calibration(mfu=2)


def test_simulate_cli_json(capsys):
    parser = argparse.ArgumentParser()
    cluster.add_arguments(parser)
    args = parser.parse_args(["--model", "175b", "--gpus", "8", "--nic-gbps", "25", "--servers", "2", "--json",
                              "--no-calibrate"])
    assert cluster.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prediction"] and out["speedup"] > 1
