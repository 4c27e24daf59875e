"""The accelerator path: device tier in CUDA memory, reads staged through pinned memory (skipped without CUDA)."""
import pytest
import torch

from .llm_helpers import batches, make_model, max_weight_diff, offloaded_train, reference_train
from terastack.llm import Trainer


@pytest.mark.gpu
def test_fp32_on_gpu_matches_cpu_reference(tmp_path, trainer_config):
    ref = make_model("llama", tmp_path / "model")
    data = batches(3)
    cfg = trainer_config(device="cuda", dtype="float32", activation_policy="keep,host,ssd,recompute",
                         max_grad_norm=1.0)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        assert t.store.device.type == "cuda"
        offloaded_train(t, [b.cuda() for b in data])
        reference_train(ref, data, max_grad_norm=1.0)
        assert max_weight_diff(t, ref) <= 1e-4  # GPU kernels sum in another order than the CPU reference


@pytest.mark.gpu
def test_bf16_mixed_precision_trains(tmp_path, trainer_config):
    make_model("qwen2", tmp_path / "model")
    data = batches(1) * 8
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(device="cuda", dtype="bfloat16",
                                                                    lr=3e-3)) as t:
        assert t.compute_dtype == torch.bfloat16 and t.profile.compute_bytes == 2
        losses = offloaded_train(t, data)
        assert losses[-1] < losses[0] - 0.5
        assert t.parameter("model.layers.0.mlp.up_proj.weight").dtype == torch.float32  # fp32 master
        assert any(r.startswith("w:") for r in t.store.names())  # bf16 compute copies
