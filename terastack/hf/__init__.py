"""The way in from Hugging Face ``Trainer`` and TRL ``SFTTrainer`` scripts: one added line,

    terastack.hf.offload(trainer, store="/nvme/run", memory_budget="24GiB")

trains the trainer's model through terastack's offloaded engine (terastack.llm), its state on the SSD, with the
Trainer's own loop, arguments, callbacks, checkpoints and evaluation; ``terastack.hf.empty_model(path)`` gives a
model a Trainer is built around without its weights in memory. See docs/hf.md.
"""
from terastack.hf.adapter import offload
from terastack.hf.meta_model import empty_model

__all__ = ["empty_model", "offload"]
