"""The engine's loss in place ([Note: the loss in place] in terastack.llm.engine.causal_loss) against transformers'
own causal-LM loss: the same value (to the bit in one chunk) and the same gradient to the bit, written into the
logits' own storage."""
import pytest
import torch
from transformers.loss.loss_utils import ForCausalLMLoss

from terastack.llm.engine import causal_loss

from .llm_helpers import batches, make_model, max_weight_diff, offloaded_train, reference_train

VOCAB = 50


def _case(dtype, *, seed=0, rows=(3, 7)):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*rows, 8, generator=g)
    head = torch.randn(VOCAB, 8, generator=g)
    labels = torch.randint(0, VOCAB, rows, generator=g)
    labels[0, :3] = -100  # prompt tokens outside the loss
    labels[2, 5] = -100
    return hidden, head.to(dtype), labels


def _run(loss_fn, dtype, **kwargs):
    hidden, head, labels = _case(dtype)
    hidden = hidden.to(dtype).requires_grad_()
    logits = hidden @ head.T  # a computed tensor, as the head's output is
    seen = []
    logits.register_hook(lambda grad: seen.append((grad.clone(), grad.data_ptr())))
    loss = loss_fn(logits, labels, VOCAB, **kwargs)
    loss.backward()
    return loss.detach(), seen[0][0], hidden.grad, (seen[0][1], logits.data_ptr())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", [{}, {"num_items_in_batch": 11}, {"num_items_in_batch": torch.tensor(9)}],
                         ids=["mean", "int-items", "tensor-items"])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_equals_transformers_loss_and_gradient(dtype, kwargs, chunk_rows, monkeypatch):
    monkeypatch.setattr(causal_loss, "chunk_rows", lambda vocab: chunk_rows)
    ref_loss, ref_grad, ref_hidden, _ = _run(ForCausalLMLoss, dtype, **kwargs)
    loss, grad, hidden_grad, (grad_ptr, logits_ptr) = _run(causal_loss.causal_lm_loss, dtype, **kwargs)
    assert loss.dtype == ref_loss.dtype == torch.float32
    if chunk_rows >= 21:  # one chunk: the same sum
        assert torch.equal(loss, ref_loss)
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=0)  # chunks reassociate the sum over rows
    assert grad.dtype == ref_grad.dtype == dtype
    assert torch.equal(grad, ref_grad) and torch.equal(hidden_grad, ref_hidden)  # to the bit, in either dtype
    assert grad_ptr == logits_ptr  # the gradient is the logits' own storage: no second copy of them


def test_shift_labels_given():
    hidden, head, labels = _case(torch.float32)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    out = []
    for fn in (ForCausalLMLoss, causal_loss.causal_lm_loss):
        h = hidden.clone().requires_grad_()
        loss = fn(h @ head.T, None, VOCAB, shift_labels=shifted)
        loss.backward()
        out.append((loss.detach(), h.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_without_a_gradient_it_is_transformers_loss_and_leaves_the_logits():
    hidden, head, labels = _case(torch.float32)
    logits = hidden @ head.T
    before = logits.clone()
    with torch.no_grad():
        loss = causal_loss.causal_lm_loss(logits, labels, VOCAB)
    assert torch.equal(logits, before)
    assert torch.equal(loss, ForCausalLMLoss(before, labels, VOCAB))


def test_installed_for_a_call_and_removed_after(tmp_path):
    model = make_model("llama", tmp_path / "m")
    assert causal_loss.applies(model)
    assert model.loss_function is ForCausalLMLoss
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    ref = model(input_ids=ids, labels=ids).loss
    with causal_loss.installed(model):
        assert model.loss_function is causal_loss.causal_lm_loss
        out = model(input_ids=ids, labels=ids)
    assert model.loss_function is ForCausalLMLoss and "_loss_function" not in model.__dict__
    assert torch.equal(out.loss, ref)


def test_a_model_with_a_loss_of_its_own_keeps_it(tmp_path):
    model = make_model("llama", tmp_path / "m")
    own = lambda logits, labels, vocab_size, **kw: logits.sum() * 0  # noqa: E731
    model.loss_function = own
    assert not causal_loss.applies(model)
    with causal_loss.installed(model):
        assert model.loss_function is own


def test_the_planner_prices_the_loss_it_runs():
    from terastack.plan.llm_profile import LOSS_CHUNK_BYTES, ModelProfile

    def profile(**kw):
        return ModelProfile(model="m", batch=1, seq_len=8, units=[], tensor_numel={}, tensor_trainable={},
                            logits_bytes=400 << 20, **kw)

    assert profile(compute_bytes=4).loss_bytes == 3 * (400 << 20)  # the model's own: logits, log-softmax, gradient
    assert profile(compute_bytes=4, loss_in_place=True).loss_bytes == (400 << 20) + 4 * LOSS_CHUNK_BYTES
    assert profile(compute_bytes=2, loss_in_place=True).loss_bytes == (200 << 20) + 4 * LOSS_CHUNK_BYTES
    assert profile(compute_bytes=4, loss_in_place=True, head_parts=3).loss_bytes == (800 << 20) + 4 * LOSS_CHUNK_BYTES


def test_the_engine_step_runs_it_and_trains_as_plain_pytorch(tmp_path, trainer_config, monkeypatch):
    from terastack.llm import Trainer

    ref = make_model("llama", tmp_path / "model")
    data = batches(2)
    calls = []
    real = causal_loss.causal_lm_loss

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    with Trainer.from_pretrained(tmp_path / "model", trainer_config(state_placement="ssd")) as trainer:
        assert trainer.profile.loss_in_place and trainer.profile.head_parts == 1
        monkeypatch.setattr(causal_loss, "causal_lm_loss", counted)
        losses = offloaded_train(trainer, data)
        assert len(calls) == len(data)
        assert "_loss_function" not in trainer.model.__dict__
        ref_losses, _ = reference_train(ref, data)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        assert max_weight_diff(trainer, ref) <= 1e-5


def test_the_loss_counts_beside_the_head_alone():
    """A unit's working memory and the loss never overlap but at the head: the loss lives from the head's forward
    to the end of its backward."""
    from terastack.plan.llm_profile import LOSS_CHUNK_BYTES, ModelProfile, UnitProfile

    def unit(name, act, trainable):
        return UnitProfile(name=name, kind="layer", tensors=(name,), params=trainable, trainable=trainable,
                           weight_bytes=4 * trainable, fwd_flops=0, bwd_flops=0, act_bytes=act, boundary_bytes=0)

    layers = [unit(f"l{i}", 300 << 20, 50 << 20) for i in range(3)]  # 500 MiB of working memory each
    head = [unit(f"head.parts.{k}", 10 << 20, 10 << 20) for k in range(2)]  # 50 MiB each
    prof = ModelProfile(model="m", batch=1, seq_len=8, compute_bytes=4, units=layers + head, tensor_numel={},
                        tensor_trainable={}, logits_bytes=100 << 20, loss_in_place=True, head_parts=2)
    assert prof.loss_bytes == (200 << 20) + 4 * LOSS_CHUNK_BYTES
    assert prof.working_bytes == 500 << 20                                  # a layer's: more than head + loss
    prof.logits_bytes = 400 << 20
    assert prof.working_bytes == (50 << 20) + (800 << 20) + 4 * LOSS_CHUNK_BYTES   # the head's with the loss
