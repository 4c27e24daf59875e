"""The settings of a language-model job, whichever engine runs it: one sectioned :class:`JobConfig` from which
the command-line flags, the YAML/TOML file keys and the ``key=value`` overrides are derived.

    setting.py    one setting = one dataclass field ([Note: a job setting is one field]); SettingError
    sections.py   the sections (model, data, validation, training, schedule, store, checkpoint, output, lora)
                  and JobConfig
    engine_sections.py   one section per engine (offload, disdp) and the choices those engines import
    layers.py     file < flags < overrides ([Note: job config resolution]); finetune.yaml
    legacy.py     old spellings of keys, read as the settings they name now
    flags.py      the flags, derived from the fields
"""
from terastack.training.job.flags import add_job_arguments, job_flags
from terastack.training.job.layers import (build_job, merge_layers, other_engine_note, parse_overrides,
                                           read_job_file, resolve_job, with_settings, write_job_file)
from terastack.training.job.sections import (ALTERNATIVES, DEFAULT_STEPS, FLAT, SECTIONS,
                                             CheckpointSection, DataSection, DisdpSection, JobConfig, LoraSection,
                                             ModelSection, OffloadSection, OutputSection, ScheduleSection,
                                             StoreSection, TrainingSection, ValidationSection)
from terastack.training.job.setting import SettingError, setting

__all__ = ["ALTERNATIVES", "DEFAULT_STEPS", "FLAT", "SECTIONS", "CheckpointSection",
           "DataSection", "DisdpSection", "JobConfig", "LoraSection", "ModelSection", "OffloadSection",
           "OutputSection", "ScheduleSection", "SettingError", "StoreSection", "TrainingSection",
           "ValidationSection", "add_job_arguments", "build_job", "job_flags", "merge_layers", "other_engine_note",
           "parse_overrides", "read_job_file", "resolve_job", "setting", "with_settings", "write_job_file"]
