"""Old spellings of job keys: what a job file written for ``terastack finetune`` before the sectioned job
used, and where each key lives now.

Such a file was flat job keys, the sections ``model``, ``data``, ``training``, ``validation``, ``output`` and
``checkpoint`` holding any job key (plus a few aliases: ``data.val``, ``checkpoint.path``...), and a
``trainer:`` table of the offloaded trainer's fields, which could also stand at the top level. Flat keys are
still flat names (:data:`terastack.training.job.sections.FLAT`); every other old spelling is read as its new
``section.field`` and named in one note line (see [Note: job config resolution]).
"""
from __future__ import annotations

from terastack.training.job.sections import FLAT

#: (section, key) of an old section -> the setting it names now
OLD_SECTION_KEYS = {("model", "name"): "model.path", ("data", "train"): "data.path",
                    ("data", "val"): "validation.data", ("output", "path"): "output.dir",
                    ("checkpoint", "path"): "checkpoint.dir", ("lora", "r"): "lora.rank"}
#: fields of the old ``trainer:`` table whose name is not a flat name now
OLD_TRAINER_KEYS = {"store_dir": "store.dirs", "packed": "data.pack"}
#: the old ``trainer.lora`` table (LoRA's settings) -> the lora section
OLD_LORA_KEYS = {"r": "lora.rank", "alpha": "lora.alpha", "dropout": "lora.dropout",
                 "target_modules": "lora.target_modules", "init_from": "lora.init_from"}


def old_section_key(section: str, key: str) -> str | None:
    """Where ``section.key`` of an old file lives now (None: nowhere). The old sections held any job key."""
    return OLD_SECTION_KEYS.get((section, key)) or FLAT.get(key)


def old_trainer_key(key: str) -> str | None:
    """Where a field of the old ``trainer:`` table lives now (None: nowhere; ``lora`` is a table of its own)."""
    return OLD_TRAINER_KEYS.get(key) or (FLAT.get(key) if key != "lora" else None)
