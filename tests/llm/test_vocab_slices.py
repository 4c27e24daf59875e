"""A vocabulary-sized embedding and output head streamed in row slices, each its own unit ([Note: vocabulary slices]
in terastack.llm.vocab_slices), train as the whole modules do: equal to the reference optimizers, exported and
resumed under the model's own names."""
import pytest
import torch

from .llm_helpers import BATCH, SEQ, offloaded_train, reference_train
from terastack.llm import Trainer

VOCAB = 1000          # 1000 rows: three parts of 256 and one of 232
HIDDEN = 64
PART = 256 * HIDDEN * 4  # --vocab-slice: 256 fp32 rows of the head
STEPS = 3
LR, WD = 1e-3, 0.01
PARTS = ["model.embed_tokens.parts.0", "model.embed_tokens.parts.1", "model.embed_tokens.parts.2",
         "model.embed_tokens.parts.3", "lm_head.parts.0", "lm_head.parts.1", "lm_head.parts.2", "lm_head.parts.3"]


def make_model(path, *, tied=False, seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=1, pad_token_id=700, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(path))
    model.train()
    return model


def data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def config(trainer_config, fmt="adamw", **kw):
    kw.setdefault("vocab_slice", PART)
    # state and weights through the SSD, budgets that hold a part but not the whole head
    return trainer_config(optimizer=fmt, lr=LR, weight_decay=WD, state_placement="ssd", optimizer_chunk=4096,
                          device_budget="4MiB", host_budget="4MiB", **kw)


def reference_optimizer(fmt, params):
    if fmt == "adamw8bit":
        bnb = pytest.importorskip("bitsandbytes")
        return bnb.optim.AdamW8bit(params, lr=LR, weight_decay=WD)
    return torch.optim.AdamW(params, lr=LR, weight_decay=WD)


@pytest.mark.parametrize("fmt", ["adamw", "adamw8bit"])
def test_sliced_embedding_and_head_train_as_the_whole_modules(fmt, tmp_path, trainer_config):
    ref = make_model(tmp_path / "model")
    steps = data(STEPS)
    with Trainer.from_pretrained(tmp_path / "model", config(trainer_config, fmt)) as t:
        assert t.slicing.decision == {"model.embed_tokens": 256, "lm_head": 256}
        assert [u.path for u in t.units if ".parts." in u.path] == PARTS
        assert t.tensors["lm_head.parts.3.weight"].shape == (VOCAB - 3 * 256, HIDDEN)
        losses = offloaded_train(t, steps)
        ref_losses, opt = reference_train(ref, steps, opt=reference_optimizer(fmt, list(ref.parameters())))
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        assert [n for n, _ in t.named_parameters()] == [n for n, _ in ref.named_parameters()]
        # the head's input gradient is summed over the parts: float sums in another order (AdamW: 2.4e-6 here); an
        # 8-bit moment whose value sits on a rounding edge may then take the next code, an update a percent of the
        # rate away (1.4e-5 here)
        tol = 1e-5 if fmt == "adamw" else 5e-2 * LR
        for name, p in ref.named_parameters():
            assert torch.allclose(t.parameter(name), p.detach(), rtol=0, atol=tol), name
        # the padding row of the embedding (in part 2) takes no gradient, as nn.Embedding's padding_idx says: with
        # AdamW it stays as it was, bit for bit. (8-bit AdamW moves it too, in the library as here: its update reads
        # the block's quantized moments, whose absmax is a float sum in another order; the row is within ``tol``
        # above, 7e-13 apart on one machine, equal on another.)
        if fmt == "adamw":
            assert torch.equal(t.parameter("model.embed_tokens.weight")[700], ref.model.embed_tokens.weight[700])
        if fmt == "adamw8bit":
            # the parts' blocks are the whole tensor's blocks: the joined state is the library's (absmax per block
            # equal to float rounding; an 8-bit code may differ by one where a value sits on a rounding edge)
            mine, theirs = t.optimizer_state("lm_head.weight"), opt.state[ref.lm_head.weight]
            assert mine["step"] == STEPS
            for key in ("absmax1", "absmax2"):
                assert torch.allclose(mine[key], theirs[key], rtol=1e-4, atol=0), key
            for key in ("state1", "state2"):
                assert mine[key].shape == theirs[key].shape and mine[key].dtype == torch.uint8
                assert (mine[key].int() - theirs[key].int()).abs().max() <= 1, key


def test_nothing_is_sliced_for_adafactor_tied_weights_or_a_small_head(tmp_path, trainer_config):
    """Adafactor's statistics span a matrix's rows; a tied weight serves two units already; a head under the bound
    stays whole."""
    make_model(tmp_path / "model")
    make_model(tmp_path / "tied", tied=True)
    cases = [("model", config(trainer_config, "adafactor")), ("tied", config(trainer_config)),
             ("model", config(trainer_config, vocab_slice=VOCAB * HIDDEN * 4))]
    for model, cfg in cases:
        with Trainer.from_pretrained(tmp_path / model, cfg) as t:
            assert t.slicing.decision == {} and not any(".parts." in u.path for u in t.units), (model, cfg)


def test_sliced_run_exports_and_resumes_under_the_models_names(tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    make_model(tmp_path / "model")
    steps = data(4)
    with Trainer.from_pretrained(tmp_path / "model", config(trainer_config)) as full:
        offloaded_train(full, steps[:2])
        full.save_checkpoint(tmp_path / "ckpt")
        for ids in steps[2:]:
            full.step(ids)
        expected = full.state_dict()
        full.save_pretrained(tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert {n: tuple(p.shape) for n, p in loaded.named_parameters()} == {n: tuple(t.shape) for n, t in
                                                                         expected.items()}
    assert all(torch.equal(p.detach(), expected[n]) for n, p in loaded.named_parameters())
    # the checkpoint slices as its run did, whatever the resuming job's setting says
    with Trainer.load_checkpoint(tmp_path / "ckpt", config(trainer_config, vocab_slice=0)) as resumed:
        assert resumed.slicing.decision == {"model.embed_tokens": 256, "lm_head": 256}
        for ids in steps[2:]:
            resumed.step(ids)
        got = resumed.state_dict()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_planner_streams_an_8b_head_in_parts():
    """Llama 3 8B's 128256 x 4096 embedding and head (2 GiB of fp32 each) as parts of at most 256 MiB; with slicing
    off, one unit of 2 GiB."""
    from terastack.llm.engine.profile import profile_config
    from terastack.training.model_registry import resolve_model

    hf_config, _ = resolve_model("llama-3-8b")

    def largest_unit(vocab_slice, optimizer="adamw8bit"):
        profile = profile_config(hf_config, batch=1, seq_len=64, dtype=torch.float32, name="llama-3-8b",
                                 vocab_slice=vocab_slice, optimizer=optimizer)
        return max(u.weight_bytes for u in profile.units), sum(".parts." in u.name for u in profile.units)

    layer = 4 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)  # attention, MLP, two norms
    assert largest_unit(256 << 20) == (layer, 16)   # a decoder layer is now the largest unit
    assert largest_unit(0) == (128256 * 4096 * 4, 0)
    assert largest_unit(256 << 20, "adafactor") == (128256 * 4096 * 4, 0)


def test_the_logits_of_a_sliced_head_are_its_parts_together():
    """The planner's logits are the whole vocabulary's, whether the head is one unit or eight parts; joining the
    parts' outputs holds them twice ([Note: the loss in place] in terastack.llm.engine.causal_loss)."""
    from terastack.llm.engine.profile import profile_config
    from terastack.plan.llm_profile import LOSS_CHUNK_BYTES
    from terastack.training.model_registry import resolve_model

    hf_config, _ = resolve_model("llama-3-8b")
    logits = 64 * 128256 * 4
    for vocab_slice, parts in ((256 << 20, 8), (0, 1)):
        profile = profile_config(hf_config, batch=1, seq_len=64, dtype=torch.float32, name="llama-3-8b",
                                 vocab_slice=vocab_slice, optimizer="adamw8bit")
        assert (profile.logits_bytes, profile.head_parts, profile.loss_in_place) == (logits, parts, True)
        assert profile.loss_bytes == logits * (2 if parts > 1 else 1) + 4 * min(logits, LOSS_CHUNK_BYTES)


def test_a_lora_run_streams_its_frozen_head_in_parts_never_as_nf4(tmp_path, trainer_config):
    """With --lora and an NF4 base the head stays in the compute dtype (QLoRA does not quantize it), also in parts;
    the adapters train over the parts as over the whole head."""
    pytest.importorskip("bitsandbytes")
    make_model(tmp_path / "model")
    steps = data(2)
    losses = {}
    for vocab_slice in (PART, 0):
        cfg = config(trainer_config, vocab_slice=vocab_slice, lora={"r": 4, "alpha": 8, "base_format": "nf4"})
        with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
            parts = [n for n in t.tensors if ".parts." in n]
            assert len(parts) == (8 if vocab_slice else 0)
            assert not any(t.tensors[n].nf4 or t.tensors[n].trainable for n in parts)
            assert any(t.tensors[n].nf4 for n in t.tensors if n.endswith("q_proj.base_layer.weight"))
            losses[vocab_slice] = offloaded_train(t, steps)
    assert losses[PART] == pytest.approx(losses[0], abs=1e-5)


def test_a_sliced_run_killed_inside_a_step_resumes_bit_equal(tmp_path, trainer_config):
    """The head's parts side by side are one level of the unit chain: points inside the step follow the norm and
    the layers, never a part, so a checkpoint that follows the step still holds a few units' old versions; a
    process killed after a point inside step 3 resumes to the uninterrupted run's losses and weights."""
    from .llm_helpers import batches
    from .test_checkpoint_follow import STEPS, run_killed_inside

    make_model(tmp_path / "model")
    cfg = config(trainer_config, store_dir=str(tmp_path / "store"))
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        torch.manual_seed(5)
        losses = [t.step(ids) for ids in batches(STEPS)]
        expected = t.state_dict()
    run_killed_inside(tmp_path, cfg, tmp_path / "model", kill_at="after-point")
    with Trainer.load_checkpoint(tmp_path / "ckpt", cfg) as resumed:
        point = resumed.resumed_point
        assert resumed.step_count == 2 and point is not None and point.unit is not None
        assert ".parts." not in resumed.units[point.unit].path
        got_losses = [resumed.step(ids) for ids in batches(STEPS)[2:]]
        chain = resumed.following.taker.chain
        got = resumed.state_dict()
    assert got_losses == losses[2:]
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert chain is None or not any(".parts." in resumed.units[i].path for i in chain)
