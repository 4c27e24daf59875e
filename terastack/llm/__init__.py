"""terastack.llm: fine-tune Hugging Face causal LMs whose training state is larger than memory.

    from terastack.llm import Trainer, TrainerConfig

Weights stream to the device per decoder layer, fp32 masters and AdamW moments
rest on SSD or host memory, each layer's optimizer step runs on CPU threads
while backward continues, and activations are kept, swapped or recomputed per
layer as the planner (``terastack.plan.llm_planner``) decides.
"""
from terastack.llm.trainer_config import LoraSpec, TrainerConfig
from terastack.llm.trainer import Trainer

__all__ = ["LoraSpec", "Trainer", "TrainerConfig"]
