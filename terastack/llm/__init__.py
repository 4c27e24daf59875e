"""terastack.llm: fine-tune Hugging Face causal LMs whose training state is larger than memory.

    from terastack.llm import Trainer, TrainerConfig

Weights stream to the device per decoder layer, fp32 masters and AdamW moments
rest on SSD or host memory, each layer's optimizer step runs on CPU threads
while backward continues, and activations are kept, swapped or recomputed per
layer as the planner (``terastack.plan.llm_planner``) decides.
"""
__all__ = ["LoraSpec", "Trainer", "TrainerConfig"]


def __getattr__(name: str):
    # imported on first use: `terastack plan llm` (in this package) plans without the trainer's imports
    if name == "Trainer":
        from terastack.llm.trainer import Trainer

        return Trainer
    if name in ("LoraSpec", "TrainerConfig"):
        from terastack.llm import trainer_config

        return getattr(trainer_config, name)
    raise AttributeError(f"module 'terastack.llm' has no attribute {name!r}")
