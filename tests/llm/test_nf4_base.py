"""A LoRA base resting and streaming as NF4 (lora.base_format): equal to peft LoRA over bitsandbytes' own
dequantization of the same NF4 weights; a bitsandbytes-quantized model directory found by auto; merged into the
dequantized base as peft merges; quantized one tensor at a time; refused without --lora."""
import json
import shutil

import pytest
import torch

from .llm_helpers import AliveTensors, batches, make_model, offloaded_train, reference_train
from terastack.llm import LoraSpec, Trainer
from terastack.llm.engine.store_layout import records_for
from terastack.tiers import Tier

F = pytest.importorskip("bitsandbytes.functional")
peft = pytest.importorskip("peft")

#: adapter and loss tolerance (fp32; float reassociation only)
RTOL = 1e-5
#: budgets that put the frozen base on the SSD (the store streams it every forward and backward)
# the state and the frozen base on the SSD, so that the base streams from it as it rests
BUDGETS = dict(device_budget="1MiB", host_budget="128KiB", state_placement="ssd")


def _projections(model) -> list[str]:
    """The linear weights of the decoder layers (QLoRA's quantized set: not embeddings, norms or lm_head)."""
    return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]


def _nf4_roundtrip(w: torch.Tensor) -> torch.Tensor:
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    return F.dequantize_4bit(packed, state)


def _base(path, weights: dict | None = None, *, quantize: bool):
    """The fp32 model in ``path`` with ``weights`` put in (or, ``quantize``: every projection NF4-rounded)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        for name in _projections(model):
            p = model.get_parameter(name)
            if weights is not None:
                p.copy_(weights[name])
            elif quantize:
                p.copy_(_nf4_roundtrip(p))
    return model


def _peft(model, adapter0=None):
    """peft LoRA (r 4) over ``model``: a fresh adapter with non-zero B, or the one saved in ``adapter0``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter0 is not None:
        ref = PeftModel.from_pretrained(model, str(adapter0), is_trainable=True)
    else:
        torch.manual_seed(3)
        ref = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    ref.train()
    return ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _check_equal(t, ref, losses, ref_losses) -> None:
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)) <= RTOL
    for n, p in ref.named_parameters():
        got = t.parameter(n)
        if p.requires_grad:
            assert _rel(got, p.detach()) <= RTOL, n
        else:  # the base as streamed: bitsandbytes' dequantization, bit for bit
            assert torch.equal(got, p.detach()), n


def _train_nf4(tmp_path, base_dir, trainer_config, data, adapter0, *, base_format="nf4", count=28):
    cfg = trainer_config(lora=LoraSpec(init_from=str(adapter0), base_format=base_format), **BUDGETS)
    t = Trainer.from_pretrained(base_dir, cfg)
    nf4 = [n for n, i in t.tensors.items() if i.nf4]
    assert len(nf4) == count  # q, k, v, o, gate, up, down of four layers; embeddings, norms and lm_head native
    assert not any(("embed" in n or "norm" in n or "lm_head" in n) for n in nf4)
    for name in nf4:  # resting on the SSD as NF4 bytes, streamed in by every forward and backward
        (spec,) = records_for(t.runtime, name)
        assert spec.dtype == torch.uint8 and spec.home is Tier.SSD
        assert spec.shape[0] < t.tensors[name].numel  # about 0.56 bytes a parameter
    return t, offloaded_train(t, data)


def test_nf4_base_trains_like_peft_over_the_dequantized_base(tmp_path, trainer_config):
    make_model("llama", tmp_path / "base")
    data = batches(3)
    ref = _peft(_base(tmp_path / "base", quantize=True))
    ref.save_pretrained(str(tmp_path / "adapter0"))
    plain = _peft(_base(tmp_path / "base", quantize=False), tmp_path / "adapter0")
    ref_losses, _ = reference_train(ref, data)
    plain_losses, _ = reference_train(plain, data)
    t, losses = _train_nf4(tmp_path, tmp_path / "base", trainer_config, data, tmp_path / "adapter0")
    with t:
        _check_equal(t, ref, losses, ref_losses)
        t.synchronize()
        got, planned = t.history[-1].bytes_by_kind, t.plan.prediction.bytes_by_kind
        # the base's reads, as its NF4 bytes, at any pace of the disk: an adapter record written back is read
        # again from the SSD, never served from a copy its write-back has not yet freed ([Note: a write-back
        # drops its copy as it lands])
        for key in ("weights_forward_read", "weights_backward_read"):
            assert got[key] == pytest.approx(planned[key], rel=0.06), key
    # the check can fail: training on the unquantized base ends far outside the tolerance
    assert max(abs(a - b) / abs(b) for a, b in zip(plain_losses, ref_losses)) > 100 * RTOL
    adapters = [(p, q) for (n, p), (_, q) in zip(ref.named_parameters(), plain.named_parameters()) if "lora_" in n]
    assert max(_rel(q.detach(), p.detach()) for p, q in adapters) > 100 * RTOL


#: a projection the quantized directory keeps unquantized (as ``llm_int8_skip_modules`` would)
SKIPPED = "model.layers.0.mlp.down_proj.weight"


def _write_quantized(src, dst) -> dict[str, torch.Tensor]:
    """``src`` saved as transformers saves a bitsandbytes 4-bit model (double quantization): ``weight`` packed,
    its QuantState beside it (``as_dict(packed=True)``), ``quantization_config`` in config.json. Returns the
    dequantized projections (:data:`SKIPPED` as it is)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    out, dequantized = {}, {}
    for key, w in tensors.items():
        if key == SKIPPED:
            out[key] = dequantized[key] = w
        elif key.startswith("model.layers.") and key.endswith("_proj.weight"):
            packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
            out[key] = packed
            out.update({f"{key}.{k}": v for k, v in state.as_dict(packed=True).items()})
            dequantized[key] = F.dequantize_4bit(packed, state)
        else:
            out[key] = w
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                                  "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                  "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8"}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dequantized


def test_quantized_model_directory_is_streamed_as_nf4_by_auto(tmp_path, trainer_config):
    make_model("llama", tmp_path / "base")
    dequantized = _write_quantized(tmp_path / "base", tmp_path / "base4")
    data = batches(3)
    ref = _peft(_base(tmp_path / "base", dequantized, quantize=False))
    ref.save_pretrained(str(tmp_path / "adapter0"))
    ref_losses, _ = reference_train(ref, data)
    t, losses = _train_nf4(tmp_path, tmp_path / "base4", trainer_config, data[:2], tmp_path / "adapter0",
                           base_format="auto", count=27)
    skipped = f"base_model.model.{SKIPPED}"  # not adapted: peft's default targets are q_proj and v_proj
    with t:
        assert t.lora.base_format == "nf4" and not t.tensors[skipped].nf4
        assert "quantization_config" not in t.hf_config.to_dict()  # what it builds and exports is unquantized
        t.save_checkpoint(tmp_path / "ckpt")
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(**BUDGETS)) as r:
        assert sum(i.nf4 for i in r.tensors.values()) == 27 and not r.tensors[skipped].nf4
        losses.append(r.step(data[2]))
        _check_equal(r, ref, losses, ref_losses)
        r.save_pretrained(tmp_path / "adapter")
    # merged into the 4-bit directory's dequantized weights, written unquantized
    _check_merge(tmp_path / "base4", tmp_path / "adapter", _base(tmp_path / "base", dequantized, quantize=False),
                 tmp_path / "merged")
    assert "quantization_config" not in json.loads((tmp_path / "merged" / "config.json").read_text())


def _check_merge(base, adapter, reference, output) -> dict:
    """``terastack merge`` of ``adapter`` into ``base`` equals peft's merge_and_unload over ``reference``."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from terastack.cli import main

    assert main(["merge", "--base", str(base), "--adapter", str(adapter), "--output", str(output)]) == 0
    expected = PeftModel.from_pretrained(reference, str(adapter)).merge_and_unload().state_dict()
    merged = load_file(str(output / "model.safetensors"))
    assert set(merged) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(merged[key], value, rtol=1e-6, atol=1e-7, msg=key)
    return merged


def test_merge_of_an_nf4_adapter_is_peft_merge_over_the_dequantized_base(tmp_path, trainer_config):
    from safetensors.torch import load_file


    make_model("llama", tmp_path / "base")
    data = batches(2)
    _peft(_base(tmp_path / "base", quantize=True)).save_pretrained(str(tmp_path / "adapter0"))
    t, _ = _train_nf4(tmp_path, tmp_path / "base", trainer_config, data, tmp_path / "adapter0")
    with t:
        t.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "base_format.json").read_text())["base_format"] == "nf4"
    merged = _check_merge(tmp_path / "base", tmp_path / "adapter", _base(tmp_path / "base", quantize=True),
                          tmp_path / "merged")
    native = load_file(str(tmp_path / "base" / "model.safetensors"))
    assert not torch.equal(merged["model.layers.0.mlp.up_proj.weight"], native["model.layers.0.mlp.up_proj.weight"])


def test_nf4_base_checkpoint_resumes_bit_equal(tmp_path, trainer_config):
    make_model("llama", tmp_path / "base")
    data = batches(3)
    cfg = trainer_config(lora=LoraSpec(r=2, alpha=4, base_format="nf4"), **BUDGETS)
    with Trainer.from_pretrained(tmp_path / "base", cfg) as t:
        names = list(t.tensors)
        t.step(data[0])
        t.save_checkpoint(tmp_path / "ckpt")
        for ids in data[1:]:
            t.step(ids)
        expected = {n: t.parameter(n) for n in names}
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(**BUDGETS)) as r:
        assert r.lora.base_format == "nf4" and sum(i.nf4 for i in r.tensors.values()) == 28
        for ids in data[1:]:
            r.step(ids)
        assert all(torch.equal(r.parameter(n), expected[n]) for n in names)


def test_quantization_at_import_holds_one_tensor_at_a_time(tmp_path, trainer_config, monkeypatch):
    from terastack.training.hf import nf4

    make_model("llama", tmp_path / "base")
    alive, encode, sizes = AliveTensors(), nf4.encode, []

    def tracked(tensor):
        sizes.append(tensor.numel())
        return encode(alive.track(tensor))

    monkeypatch.setattr(nf4, "encode", tracked)
    cfg = trainer_config(lora=LoraSpec(r=4, alpha=8, base_format="nf4"), **BUDGETS)
    with Trainer.from_pretrained(tmp_path / "base", cfg) as t:
        quantized = [i for i in t.tensors.values() if i.nf4]
    assert alive.calls == len(quantized) == 28
    assert alive.peak <= 2  # the tensor being quantized (and the one before, until it is collected): never all
    assert max(sizes) == max(i.numel for i in quantized)


def test_nf4_base_without_lora_is_refused_naming_the_setting(tmp_path, capsys):
    from terastack.cli import main

    make_model("llama", tmp_path / "base")
    capsys.readouterr()
    assert main(["finetune", "--model", str(tmp_path / "base"), "--base-format", "nf4", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--base-format" in err and "--lora R" in err and "Traceback" not in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="lora.base_format"):
        LoraSpec(r=4, base_format="int4")


def test_plan_counts_an_nf4_base_at_its_nf4_bytes(tmp_path, capsys):
    from terastack.cli import main
    from terastack.training.hf.nf4 import nf4_bytes

    model = make_model("llama", tmp_path / "base")
    states = {}
    for fmt in ("native", "nf4"):
        capsys.readouterr()
        assert main(["plan", "llm", "--model", str(tmp_path / "base"), "--lora", "4", "--base-format", fmt,
                     "--dtype", "bfloat16", "--seq-len", "16", "--batch-size", "2", "--hardware", "rtx4090-workstation",
                     "--json"]) == 0
        states[fmt] = json.loads(capsys.readouterr().out)["training_state_bytes"]
    saved = sum(2 * p.numel() - nf4_bytes(p.numel()) for n, p in model.named_parameters() if n in _projections(model))
    assert states["native"] - states["nf4"] == saved > 0
    assert main(["plan", "llm", "--model", str(tmp_path / "base"), "--base-format", "nf4", "--hardware", "h200"]) == 2
    assert "--base-format" in capsys.readouterr().err


def test_full_fine_tune_of_a_quantized_directory_starts_from_its_dequantized_weights(tmp_path, trainer_config):
    make_model("llama", tmp_path / "base")
    dequantized = _write_quantized(tmp_path / "base", tmp_path / "base4")
    with Trainer.from_pretrained(tmp_path / "base4", trainer_config(**BUDGETS)) as t:
        assert not any(i.nf4 for i in t.tensors.values()) and all(i.trainable for i in t.tensors.values())
        for key, w in dequantized.items():
            assert torch.equal(t.parameter(key), w), key


@pytest.mark.parametrize("numel", [64 * 40, 64 * 40 + 37, 64 * 39 + 1])
def test_a_tensor_quantized_in_pieces_is_the_whole_calls_bytes(numel, monkeypatch):
    from terastack.plan.base_formats import nf4_bytes
    from terastack.training.hf import nf4

    monkeypatch.setattr(nf4, "ENCODE_PIECE", 64 * 6)  # seven pieces, the last one short
    w = torch.randn(numel, generator=torch.Generator().manual_seed(numel)) * 0.02
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    whole = torch.cat([state.absmax.view(torch.uint8), packed.reshape(-1)])
    got = nf4.encode(w)
    assert got.numel() == nf4_bytes(numel) and torch.equal(got, whole)
    assert torch.equal(nf4.decode(got, (numel,), torch.float32), F.dequantize_4bit(packed, state))


def test_calibration_dequantizes_as_the_step_does(monkeypatch):
    """The units' calibrated times include the dequantization: every timed forward and backward of a layer decodes
    each of its NF4 weights once, as the step's acquire does; a native base decodes nothing."""
    from terastack.llm.engine import profile as prof
    from terastack.training.hf import nf4

    from .llm_helpers import tiny_config

    shapes, decode = [], nf4.decode

    def counted(record, shape, dtype):
        shapes.append(tuple(shape))
        return decode(record, shape, dtype)

    monkeypatch.setattr(nf4, "decode", counted)
    for base_format, expect_decodes in (("native", False), ("nf4", True)):
        monkeypatch.setattr(prof, "_CALIBRATED", {})  # nothing timed before in this process
        shapes.clear()
        profile = prof.profile_config(tiny_config("llama", layers=2), batch=1, seq_len=8, dtype=torch.float32,
                                      name="tiny", lora=LoraSpec(r=4, alpha=8, base_format=base_format),
                                      calibrate=True)
        assert all(u.fwd_s is not None for u in profile.units)
        assert bool(shapes) == expect_decodes
    projections = {(32, 32), (16, 32), (64, 32), (32, 64)}  # q/o, k/v, gate/up, down (hidden 32, kv 16, mlp 64)
    assert set(shapes) <= projections
    # one layer timed (both are alike): seven NF4 weights, each decoded once per forward and once per backward
    assert len(shapes) % 14 == 0 and len(shapes) >= 14 * 3
