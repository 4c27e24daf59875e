"""A trainer's export checked without the model in memory: keys and shapes through transformers' conversions
on meta tensors, a few tensors compared; then loaded by transformers itself as the reference."""
import pytest
import torch

from terastack.llm import Trainer
from terastack.training.hf.export_check import check_export

from .llm_helpers import batches, tiny_config


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_export_checks_against_the_trainer_and_transformers(family, tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    with Trainer.from_config(tiny_config(family, layers=2), trainer_config()) as trainer:
        for ids in batches(2):
            trainer.step(ids)
        out = trainer.save_pretrained(tmp_path / "export")
        compared = check_export(out, trainer.parameter)
        assert len(compared) >= 3
        reference = AutoModelForCausalLM.from_pretrained(out)  # tiny: the reference may hold it whole
        ref = dict(reference.named_parameters())
        for name in compared:
            assert torch.equal(ref[name], trainer.parameter(name))
        # a trainer whose weights moved on no longer matches the export
        trainer.step(batches(1, seed=9)[0])
        with pytest.raises(ValueError, match="differs from the trainer's"):
            check_export(out, trainer.parameter)
