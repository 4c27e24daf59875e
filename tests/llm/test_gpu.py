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


@pytest.mark.gpu
def test_bf16_step_matches_a_bf16_reference_step(tmp_path, trainer_config):
    """One bf16 step against plain PyTorch doing the same: bf16 forward/backward on the GPU, fp32 AdamW on the
    fp32 masters. Adam's first step moves each weight by about lr times the sign of its gradient, so weights
    whose bf16 gradients differ in sign by kernel order may differ by 2 lr; nearly all must agree closely."""
    import copy

    lr = 1e-3
    ref = make_model("llama", tmp_path / "model")
    data = batches(1)
    cfg = trainer_config(device="cuda", dtype="bfloat16", lr=lr)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        offloaded_train(t, [b.cuda() for b in data])
        low = copy.deepcopy(ref).to("cuda", torch.bfloat16)
        torch.manual_seed(5)
        low(input_ids=data[0].cuda(), labels=data[0].cuda(), use_cache=False).loss.backward()
        grads = dict(low.named_parameters())
        for name, p in ref.named_parameters():
            p.grad = grads[name].grad.float().cpu()
        torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.01).step()
        diffs = torch.cat([(t.parameter(n) - p.detach()).abs().flatten() for n, p in ref.named_parameters()])
        assert diffs.max().item() <= 2.5 * lr
        assert (diffs > lr / 2).float().mean().item() < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_trainer_on_the_second_gpu(tmp_path, trainer_config):
    ref = make_model("llama", tmp_path / "model")
    data = batches(2)
    on_first = torch.cuda.memory_allocated(0)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(device="cuda:1", dtype="float32")) as t:
        assert t.device == torch.device("cuda", 1) and t.store.device == torch.device("cuda", 1)
        offloaded_train(t, [b.to("cuda:1") for b in data])
        reference_train(ref, data)
        assert max_weight_diff(t, ref) <= 1e-4
        assert torch.cuda.memory_allocated(0) <= on_first  # nothing landed on device 0
