"""The trainer's split of one memory budget: its planners share what they remember, and choose what planners
made afresh for every split choose."""
import warnings

from terastack.llm import Trainer
from terastack.plan.budget_search import plan_memory_budget

from .llm_helpers import tiny_config


def test_the_memory_budget_split_equals_a_search_with_fresh_planners(tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny_config("llama", 3)).save_pretrained(str(tmp_path / "model"))
    cfg = trainer_config(memory_budget="48MiB", device_budget="auto", host_budget="auto", grad_accum=2,
                         device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the memory budget's advice on the allocator's environment
        trainer = Trainer.from_pretrained(tmp_path / "model", cfg)
    with trainer:
        config = cfg.planner_config(device_budget=0, host_budget=0, inline_updates=trainer.inline_updates)
        _, expected = plan_memory_budget(config, cfg.memory_budget, trainer.profile, trainer.hardware,
                                         what="model", share=False)
        assert trainer.plan == expected and trainer.plan.prediction == expected.prediction
        assert trainer.plan.state_home == expected.state_home
