"""Every optimizer state format moves the bytes its spec says: a real tiny run with its state on the SSD, the
byte ledger's bytes per kind against the planner's prediction for the same shape and budget, and no bytes read
twice when micro-batches accumulate ([Note: the byte ledger] in terastack.llm.engine.byte_ledger)."""
import pytest
import torch

from .llm_helpers import SEQ, VOCAB
from terastack.llm import Trainer
from terastack.plan.optimizer_formats import FORMATS

pytest.importorskip("bitsandbytes")


def make_wide_model(path, seed=0, layers=3):
    """A tiny llama whose matrices reach bitsandbytes' min_8bit_size (4096 elements), so adamw8bit keeps 8-bit
    moments with block scales, and whose norms do not."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=1)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))


def last_step(path, trainer_config, fmt, *, accum=1, rows=8, steps=3, **kw):
    """The last step's ledger and the plan's prediction of a run with every state tensor on the SSD: steps of
    ``rows`` rows, in ``accum`` micro-batches."""
    cfg = trainer_config(optimizer=fmt, state_placement="ssd", device_budget="8MiB", host_budget="64MiB",
                         grad_accum=accum, batch_size=rows // accum, seq_len=SEQ, activation_policy="keep",
                         retain_weights=False, store_dir=str(path / f"store-{fmt}-{accum}"), **kw)
    g = torch.Generator().manual_seed(1)
    with Trainer.from_pretrained(path / "model", cfg) as t:
        for ids in [torch.randint(0, VOCAB, (rows, SEQ), generator=g) for _ in range(steps)]:
            if accum == 1:
                t.step(ids)
            else:
                t.step_accumulated([{"input_ids": part} for part in ids.chunk(accum)])
        t.synchronize()
        return t.history[-1], t.plan.prediction


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("format-bytes")
    make_wide_model(path / "model")
    return path


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_ledger_counts_the_bytes_the_planner_predicts_per_kind(fmt, model_dir, tmp_path, trainer_config):
    """Each kind the byte ledger counts is the planner's prediction within 5%: the masters, the format's own
    state (8-bit moments with their block scales, Adafactor's factored statistics) and the weights both ways."""
    (tmp_path / "model").symlink_to(model_dir / "model")
    stats, pred = last_step(tmp_path, trainer_config, fmt)
    got, planned = stats.bytes_by_kind, pred.bytes_by_kind
    assert planned["moments_read"] > 0 and planned["masters_written"] > 0
    # fp32: backward hands each master to the optimizer, so neither the plan nor the step reads one, at any pace of
    # the disk ([Note: the hand-over does not depend on the disk's pace])
    assert got["masters_read"] == planned["masters_read"] == 0
    for kind in set(got) | set(planned):
        assert got.get(kind, 0) == pytest.approx(planned.get(kind, 0), rel=0.05), kind
    assert sum(v for k, v in got.items() if k.endswith("_read")) == stats.ssd_read_bytes


def test_a_smaller_state_moves_fewer_bytes(model_dir, tmp_path, trainer_config):
    """The formats' state bytes per step against AdamW's: one byte per moment and a scale per 256 elements; a
    row and a column statistic per matrix."""
    (tmp_path / "model").symlink_to(model_dir / "model")
    moments = {fmt: last_step(tmp_path, trainer_config, fmt, steps=1)[0].bytes_by_kind["moments_read"]
               for fmt in FORMATS}
    assert moments["adamw8bit"] < 0.35 * moments["adamw"]
    assert moments["adafactor"] < 0.1 * moments["adamw"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_accumulating_eight_micro_batches_reads_at_most_half_again(fmt, model_dir, tmp_path, trainer_config):
    """grad_accum 8 against 1, the same rows per step, the order the planner chooses: the store reads per step
    are at most 1.5x, by the ledger (the weights come in once each way, the state once)."""
    (tmp_path / "model").symlink_to(model_dir / "model")
    one, _ = last_step(tmp_path, trainer_config, fmt, steps=2)
    eight, pred = last_step(tmp_path, trainer_config, fmt, accum=8, steps=2)
    assert eight.ssd_read_bytes <= 1.5 * one.ssd_read_bytes
    for kind in ("moments_read", "weights_backward_read"):
        assert eight.bytes_by_kind[kind] == pytest.approx(pred.bytes_by_kind[kind], rel=0.05), kind


def test_at_one_host_budget_a_smaller_state_keeps_more_of_it_in_host_memory(model_dir, tmp_path, trainer_config):
    """The planner places the format's state, not AdamW's 12 bytes a parameter: at a host budget that holds about a
    third of AdamW's state, 8-bit moments keep more tensors' state in host memory, and a step reads fewer state
    bytes from the SSD (the ledger's)."""
    (tmp_path / "model").symlink_to(model_dir / "model")
    on_host, moments = {}, {}
    for fmt in ("adamw", "adamw8bit"):
        cfg = trainer_config(optimizer=fmt, device_budget="8MiB", host_budget="4MiB", batch_size=8, seq_len=SEQ,
                             activation_policy="keep", retain_weights=False, store_dir=str(tmp_path / fmt))
        with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
            on_host[fmt] = sum(1 for h in t.plan.state_home.values() if h.value == "host")
            t.step(torch.randint(0, VOCAB, (8, SEQ), generator=torch.Generator().manual_seed(1)))
            t.synchronize()
            moments[fmt] = t.history[-1].bytes_by_kind["moments_read"]
            assert moments[fmt] == pytest.approx(t.plan.prediction.bytes_by_kind["moments_read"], rel=0.05)
    assert on_host["adamw"] < on_host["adamw8bit"]
    assert moments["adamw8bit"] < moments["adamw"]
