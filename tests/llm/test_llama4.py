"""Llama 4 (text) trains equal to plain PyTorch AdamW as the first model of a fresh process, its units timed.

The first model of a process is the one whose units the calibration times (later models with units of the same
shapes reuse those times): Llama 4's glue moves the batch to the embedding weight's device, which on the skeleton
is the meta device ([Note: the skeleton's meta device] in terastack.llm.engine.streamed_units). The run happens in
a fresh interpreter, with the unit calibration on and the state on the SSD (8 MiB of device tier, 4 MiB of host).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, sys
import torch
from terastack.llm import Trainer, TrainerConfig
from tests.llm.llm_helpers import BATCH, SEQ, batches, max_weight_diff, offloaded_train, reference_train
from tests.llm.test_families import save_family

out = sys.argv[1]
ref = save_family("llama4_text", out + "/model")
data = batches(3)
cfg = TrainerConfig(store_dir=out + "/store", device_budget="8MiB", host_budget="4MiB", state_placement="ssd",
                    lr=3e-3, weight_decay=0.01, batch_size=BATCH, seq_len=SEQ, calibrate=True,
                    hardware=sys.argv[2], optimizer_impl="single")
with Trainer.from_pretrained(out + "/model", cfg) as trainer:
    timed = all(u.fwd_s is not None for u in trainer.profile.units)
    losses = offloaded_train(trainer, data)
    ref_losses, _ = reference_train(ref, data, lr=3e-3)
    print(json.dumps({"losses": losses, "ref_losses": ref_losses, "diff": max_weight_diff(trainer, ref),
                      "timed": timed, "ssd_read": trainer.history[-1].ssd_read_bytes}))
"""


def test_llama4_first_model_of_a_process(tmp_path, hardware_file):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), hardware_file], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["timed"]  # the calibration ran (and did not meet a meta tensor)
    assert result["ssd_read"] > 0  # the state travelled through the SSD
    assert max(abs(a - b) for a, b in zip(result["losses"], result["ref_losses"])) <= 1e-6
    assert result["diff"] <= 1e-5


def test_llama4_every_activation_policy(tmp_path, trainer_config):
    """Saved on the SSD and recomputed (the no-RoPE layer's temperature and the router replayed), three steps."""
    from .llm_helpers import batches, max_weight_diff, offloaded_train, reference_train
    from .test_families import save_family
    from terastack.llm import Trainer

    ref = save_family("llama4_text", tmp_path / "model")
    data = batches(3)
    cfg = trainer_config(activation_policy="ssd,recompute", state_placement="ssd", lr=3e-3, max_grad_norm=0.5)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        losses = offloaded_train(trainer, data)
        ref_losses, _ = reference_train(ref, data, lr=3e-3, max_grad_norm=0.5)
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= 1e-6
        assert max_weight_diff(trainer, ref) <= 1e-5
