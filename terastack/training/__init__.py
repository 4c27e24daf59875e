"""terastack.training: what every language-model job shares, whichever engine runs it.

The job's settings (:mod:`terastack.training.job`), its data (:mod:`terastack.training.data`: the built-in
standard-library corpus, record files of instruction and chat data, epochs), the loop that drives a job
(:mod:`terastack.training.loop`: schedule, accumulation, evaluation, metrics, checkpoints), the learning-rate
schedules, and Hugging Face formats (:mod:`terastack.training.hf`: checkpoint keys, the model files, the sharded
export, LoRA merge). The engines -- :mod:`terastack.llm` (offloaded, one process) and :mod:`terastack.disdp`
(disaggregated, many) -- import this package; it imports neither.
"""
