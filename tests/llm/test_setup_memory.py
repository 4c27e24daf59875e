"""Set-up holds itself to the budget as the step does: timing the units on this machine (calibration) and filling
the store hold no more than the memory budget gives the tiers, counted in bytes of tensors held
(tests/llm/held_bytes.py), not read from the process's resident memory."""
import pytest
import torch

from .held_bytes import HeldBytes
from terastack.llm import Trainer
from terastack.llm.engine import profile
from terastack.llm.trainer_config import LoraSpec
from terastack.plan.budget_search import tier_memory
from terastack.plan.llm_plan import PlanError
from terastack.units import parse_bytes

pytest.importorskip("bitsandbytes")


def wide_llama():
    """Two decoder layers of 0.59M parameters (2.4 MB in fp32): large beside the step's working set, so that timing
    a layer on copies of dense weights beside their NF4 records passes a budget its step fits."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=96, max_position_embeddings=64, bos_token_id=0,
                       eos_token_id=1)


def setup_config(trainer_config, budget: str):
    return trainer_config(memory_budget=budget, device_budget=None, host_budget=None, calibrate=True, batch_size=1,
                          lora=LoraSpec(r=4, alpha=8, base_format="nf4"))


@pytest.fixture
def quick_timing(monkeypatch):
    """Each unit timed in its warm-up runs and five more: only what timing holds is measured here."""
    monkeypatch.setattr(profile, "_MIN_TIMED_S", 0.0)
    monkeypatch.setattr(profile, "_CALIBRATED", {})


def test_setup_holds_within_the_memory_budget(tmp_path, trainer_config, quick_timing):
    """An NF4 LoRA base under an 8 MiB memory budget: the step fits, and set-up (the units timed, the store filled)
    holds at most what the tiers get of the budget. Timing the layer as it was (three copies of its weights dense
    and as NF4 records, and the copy dequantized from them) held 10.8 MB."""
    budget = "8MiB"
    with HeldBytes() as held:
        trainer = Trainer.from_config(wide_llama(), setup_config(trainer_config, budget), name="wide")
    with trainer as t:
        assert all(u.fwd_s is not None for u in t.profile.units)  # every unit was timed on this machine
        assert t.tensors["base_model.model.model.layers.0.mlp.up_proj.weight"].nf4
    assert 0 < held.peak <= tier_memory(parse_bytes(budget))


def test_a_unit_that_cannot_be_timed_within_the_budget_is_refused_before_anything_is_made(quick_timing):
    """Under 2 MiB one copy of the layer's weights and the copy it computes with do not fit: refused naming the
    budget and the unit, as its step would be, before any weight is drawn for it (a trainer's plan refuses such a
    budget before it times anything; ``plan llm`` times units without that plan)."""
    with HeldBytes() as held:
        with pytest.raises(PlanError, match=r"memory budget exceeded for timing unit .*layers\.0 .*short by"):
            profile.profile_config(wide_llama(), batch=1, seq_len=16, dtype=torch.float32, name="wide",
                                   lora=LoraSpec(r=4, alpha=8, base_format="nf4"), calibrate=True,
                                   budget=("memory", 2 << 20))
    assert held.peak < 2 << 20


class SlowDisk:
    """A store whose writes to the SSD finish only when waited for (the slowest disk): each one's data stays
    held until then."""

    def __init__(self, store):
        self.put = store.put
        store.put = self

    def __call__(self, name, tensor, **kw):
        return Unfinished(self.put(name, tensor, **kw), tensor)


class Unfinished:
    def __init__(self, fut, data):
        self.fut, self.data = fut, data

    def done(self) -> bool:
        return False

    def result(self, timeout=None):
        self.data = None
        return self.fut.result(timeout)


def test_the_fill_holds_its_writes_within_the_budget_on_a_slow_disk(tmp_path, trainer_config, monkeypatch):
    """A full fine-tune of eight 2.4 MB layers under a 16 MiB memory budget, its writes to the SSD finishing only
    when waited for: the fill keeps no more of them in flight than the budget's room beside the weights being
    made (all 20 MB of them were held before)."""
    from terastack.tiers import TieredStore

    opened = TieredStore.__init__

    def slow(store, *args, **kwargs):
        opened(store, *args, **kwargs)
        SlowDisk(store)

    monkeypatch.setattr(TieredStore, "__init__", slow)
    hf = wide_llama()
    hf.num_hidden_layers = 8
    budget = "16MiB"
    cfg = trainer_config(memory_budget=budget, device_budget=None, host_budget=None, batch_size=1,
                         state_placement="ssd")
    with HeldBytes() as held:
        trainer = Trainer.from_config(hf, cfg, name="wide")
    with trainer as t:
        weights = sum(4 * info.numel for info in t.tensors.values())
        assert weights > tier_memory(parse_bytes(budget))  # all of them in flight would not fit
    assert 0 < held.peak <= tier_memory(parse_bytes(budget))
