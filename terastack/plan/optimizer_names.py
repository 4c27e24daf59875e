"""The optimizer state formats by name, without their specs: what a job's ``training.optimizer`` may say (the job's
sections import no torch). :mod:`terastack.plan.optimizer_formats` registers one spec per name, and refuses to
load if the two ever differ."""

#: the default first: exact AdamW with fp32 moments
OPTIMIZER_NAMES = ("adamw", "adamw8bit", "adafactor")
