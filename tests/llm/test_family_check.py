"""The check before training a family the tests do not verify ([Note: the family check]).

Both ways: a correct family no test names (Granite, whose glue scales embeddings, residuals and logits) passes the
check and trains equal to plain AdamW; a family made wrong on purpose (a decoder layer whose forward depends on
the grad mode, which the engine's recomputed units run with it off the first time) is stopped before its first
step, naming the tensor; so is a unit boundary that drops an output's gradient (a stack passing complex hidden
states, which terastack now carries through its units). A family terastack cannot stream is refused by name before
any state is written.
"""
import pytest
import torch

from terastack.llm import Trainer, TrainerConfig
from terastack.llm.engine.family_check import FamilyCheckError, needs_check
from terastack.llm.model import TESTED_FAMILIES

from .llm_helpers import batches, max_weight_diff, offloaded_train, reference_train
from .test_families import _ATTN, save_family

TOL = 1e-5


def _save(cfg, path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(path))
    model.train()
    return model


def test_unverified_family_is_checked_and_trains(tmp_path, trainer_config):
    from transformers import GraniteConfig

    assert "granite" not in TESTED_FAMILIES
    ref = _save(GraniteConfig(**_ATTN, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
                              attention_multiplier=0.3), tmp_path / "model")
    data = batches(2)
    cfg = trainer_config(state_placement="ssd", activation_policy="keep,recompute")
    with pytest.warns(UserWarning, match="granite"), Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        report = trainer.family_check
        assert report is not None and report.family == "granite"
        # every unit (embedding, two layers, norm, head) compared: outputs, input and weight gradients
        assert report.unit_calls == 5 and report.tensors >= 5 + 4 + sum(1 for _ in ref.parameters())
        assert report.worst <= TOL
        losses = offloaded_train(trainer, data)
        ref_losses, _ = reference_train(ref, data)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        assert max_weight_diff(trainer, ref) <= TOL


def test_verified_family_skips_the_check_unless_forced(tmp_path, trainer_config):
    save_family("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as trainer:
        assert trainer.family_check is None
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(check_family="always")) as trainer:
        assert trainer.family_check is not None and trainer.family_check.worst <= TOL
    assert not needs_check("granite", "never", TESTED_FAMILIES)
    with pytest.raises(ValueError, match="check_family"):
        TrainerConfig(check_family="sometimes")


def test_family_made_wrong_is_stopped_naming_the_tensor(tmp_path, trainer_config, monkeypatch):
    from transformers.models.llama import modeling_llama

    save_family("llama", tmp_path / "model")
    original = modeling_llama.LlamaDecoderLayer.forward

    def grad_mode_dependent(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        return out if torch.is_grad_enabled() else out * 1.01

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", grad_mode_dependent)
    cfg = trainer_config(check_family="always", activation_policy="recompute")
    with pytest.raises(FamilyCheckError) as info:
        Trainer.from_pretrained(tmp_path / "model", cfg)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("check_family: llama: model.layers.0 output 0 differs")
    assert "relative 0.0099" in message or "relative 0.01" in message


def test_family_that_cannot_stream_is_refused_before_any_state(tmp_path, trainer_config):
    from transformers import JambaConfig

    cfg = JambaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                      expert_layer_offset=1, num_experts=2, mamba_d_state=4, mamba_dt_rank=4)
    with pytest.raises(ValueError, match=r"^jamba \(JambaForCausalLM\): .*not supported"):
        Trainer.from_config(cfg, trainer_config(store_dir=str(tmp_path / "store")))
    assert not (tmp_path / "store").exists()


def _complex_stack(monkeypatch):
    """Llama whose decoder layers pass their hidden states on as complex numbers (pairs of features), which the
    next layer and the final norm take back: a stack whose units' outputs are not real tensors."""
    from transformers.models.llama import modeling_llama

    layer_forward = modeling_llama.LlamaDecoderLayer.forward
    norm_forward = modeling_llama.LlamaRMSNorm.forward

    def as_real(x):
        return torch.view_as_real(x).flatten(-2) if x.is_complex() else x

    def layer(self, hidden_states, *args, **kwargs):
        out = layer_forward(self, as_real(hidden_states), *args, **kwargs)
        return torch.view_as_complex(out.unflatten(-1, (-1, 2)).contiguous())

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", layer)
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", lambda self, x: norm_forward(self, as_real(x)))


def test_complex_outputs_stream_with_their_gradients(tmp_path, trainer_config, monkeypatch):
    _complex_stack(monkeypatch)
    ref = save_family("llama", tmp_path / "model")
    data = batches(2)
    cfg = trainer_config(check_family="always", activation_policy="keep,recompute")
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        assert trainer.family_check.worst <= TOL
        losses = offloaded_train(trainer, data)
        ref_losses, _ = reference_train(ref, data)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        assert max_weight_diff(trainer, ref) <= TOL


def test_unit_losing_a_gradient_is_stopped(tmp_path, trainer_config, monkeypatch):
    """A unit boundary that passes a complex output on without its gradient (as terastack's did before complex
    outputs were carried): the forward is right, the training would not be; the check names the output."""
    from torch.utils import _pytree as pytree

    from terastack.llm.engine.streamed_units import UnitCall

    carried = UnitCall.split_output

    def real_outputs_only(self, out):
        flat, spec = pytree.tree_flatten(out)
        if any(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in flat):
            return carried(self, out)  # the planner's profile pass as it is
        self.out_spec = spec
        self.out_idx = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        self.out_flat = [None if i in self.out_idx else o for i, o in enumerate(flat)]
        return [flat[i] for i in self.out_idx]

    _complex_stack(monkeypatch)
    monkeypatch.setattr(UnitCall, "split_output", real_outputs_only)
    save_family("llama", tmp_path / "model")
    cfg = trainer_config(check_family="always", activation_policy="keep,recompute")
    with pytest.raises(FamilyCheckError, match=r"^check_family: llama: model\.layers\.1 output 0 carries no gradient"):
        Trainer.from_pretrained(tmp_path / "model", cfg)


def test_finetune_says_whether_the_family_check_ran_and_passed(tmp_path, hardware_file, capsys):
    """On the command line: an unverified family gets one note line (no warning's source line) and a line that
    the check ran and passed; a verified one a line that the check was not needed."""
    from transformers import GraniteConfig

    from terastack.cli import main

    from .test_finetune_frictions import _byte_model, _text

    _save(GraniteConfig(**{**_ATTN, "vocab_size": 259}, embedding_multiplier=2.0), tmp_path / "granite")
    _text(tmp_path / "train.txt", 200)
    base = ["--data", str(tmp_path / "train.txt"), "--steps", "1", "--seq-len", "16", "--batch-size", "2",
            "--hardware", hardware_file, "--no-calibrate", "--store", str(tmp_path / "store")]
    capsys.readouterr()
    assert main(["finetune", "--model", str(tmp_path / "granite"), *base]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "granite models are not among" in line]
    assert len(notes) == 1 and notes[0].startswith("terastack finetune: note: granite models"), err
    assert not any("Warning" in line or "warnings.warn" in line for line in err), err
    passed = [line for line in err if line.startswith("family check: passed: granite's streamed units")]
    assert len(passed) == 1 and "5 unit calls" in passed[0], err
    assert main(["finetune", "--model", str(tmp_path / "granite"), *base, "--check-family", "never"]) == 0
    assert "family check: not run (--check-family never)" in capsys.readouterr().err
    assert main(["finetune", "--model", _byte_model(tmp_path / "llama"), *base]) == 0
    assert "family check: not needed: the tests verify llama models" in capsys.readouterr().err
