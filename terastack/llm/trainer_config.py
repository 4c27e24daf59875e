"""TrainerConfig: the offloaded engine's settings, a view of a job's sections.

[Note: the trainer's settings are the job's]
A TrainerConfig holds one :class:`~terastack.training.job.JobConfig` and nothing else: every setting has one
name, one default and one check, its section's (:mod:`terastack.training.job.sections`). ``TrainerConfig(job)``
views a job as the command built it; ``TrainerConfig(lr=1e-5, store_dir="/nvme/run")`` builds the default job
with those settings, named by their flat names (the flags' names: ``lr``, ``host_budget``, ``optimizer_chunk``;
``store_dir`` and ``packed`` as the trainer's table once spelled them, ``lora`` as a :class:`LoraSpec`). Reading
a setting reads the job; a setting the job leaves unset (None) reads as what the engine chooses: "auto" for the
budgets, the device and the dtype, a scratch directory for the store; the learning rate stays None and the
trainer takes the default for its model ([Note: default learning rates] in terastack.training.job_runner). The
optimizer's and the planner's settings are built from it (:meth:`TrainerConfig.optimizer_config`,
:meth:`TrainerConfig.planner_config`).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from terastack.memory import MMAP_THRESHOLD
from terastack.configfile import read_toml_table
from terastack.training.job import FLAT, SECTIONS, JobConfig, LoraSection, SettingError, resolve_job, with_settings
from terastack.training.job.legacy import OLD_TRAINER_KEYS, old_trainer_key

__all__ = ["MEMORY_BUDGET_ENV", "LoraSpec", "TrainerConfig", "builtin_model_budget"]
#: glibc settings for a memory budget, best in the environment at process start (the bench's small-budget run
#: starts its process with them); see [Note: a memory budget bounds resident memory] (terastack.memory)
MEMORY_BUDGET_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
#: the store's directory when the job gives none: a fresh subdirectory per run is made there, removed on close
DEFAULT_STORE_DIR = os.path.join(tempfile.gettempdir(), "terastack-llm")
#: settings the job leaves to the engine (None), as the engine reads them
_ENGINE_CHOOSES = {"store.device_budget": "auto", "store.host_budget": "auto", "store.dtype": "auto"}


@dataclass(kw_only=True, slots=True)
class LoraSpec:
    """LoRA through ``peft``: only adapter weights (and their optimizer state) train; the base is read-only."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    #: module names to adapt (peft's ``target_modules``); "auto": peft's default for the family
    target_modules: tuple[str, ...] | str = "auto"
    #: a peft adapter directory to start from (adapter_model.safetensors); None: peft's initialization
    init_from: str | None = None
    #: how the frozen base rests and streams: "nf4", "native", or "auto" (nf4 for a bitsandbytes-quantized model)
    base_format: str = "auto"

    def __post_init__(self) -> None:
        try:  # the job's lora section checks the values ([Note: the trainer's settings are the job's])
            section = LoraSection(rank=self.r, alpha=self.alpha, dropout=self.dropout,
                                  target_modules=self.target_modules, init_from=self.init_from,
                                  base_format=self.base_format)
        except SettingError as exc:
            raise ValueError(f"{'lora.r' if exc.path == 'lora.rank' else exc.path}: {exc.reason}") from None
        self.target_modules = section.target_modules

    @classmethod
    def from_section(cls, section: LoraSection) -> "LoraSpec | None":
        """The adapter of a job's lora section (None without a rank); alpha defaults to twice the rank."""
        if section.rank is None:
            return None
        return cls(r=section.rank, alpha=section.alpha or 2 * section.rank, dropout=section.dropout,
                   target_modules=section.target_modules, init_from=section.init_from,
                   base_format=section.base_format)

    def section_values(self) -> dict:
        return {"lora.rank": self.r, "lora.alpha": self.alpha, "lora.dropout": self.dropout,
                "lora.target_modules": self.target_modules, "lora.init_from": self.init_from,
                "lora.base_format": self.base_format}


def builtin_model_budget(job: JobConfig, hf_config) -> dict:
    """What the offloaded engine decides where ``job`` leaves it unset, beyond the machine's "auto" budgets: the
    built-in model (no ``model.path``; ``hf_config``, its config, or a function giving it: read only here) gets a
    host budget of a quarter of its training state (16 bytes a parameter), so that most of it lives on the SSD, as
    it will for a model the memory cannot hold. ``{"host_budget": bytes}``, or {} where the job gives a budget or
    a model. ``terastack finetune`` and ``terastack plan llm`` both take it from here."""
    if job.model.path is None and job.store.host_budget is None and job.store.memory_budget is None:
        from terastack.training.hf.model_files import build_skeleton

        skeleton = build_skeleton(hf_config() if callable(hf_config) else hf_config)
        return {"host_budget": max(4 << 20, sum(p.numel() for p in skeleton.parameters()) * 16 // 4)}
    return {}


#: ``section.field`` -> its flat name
FLAT_OF = {path: flat for flat, path in FLAT.items()}


def _setting_path(name: str) -> str:
    path = OLD_TRAINER_KEYS.get(name) or FLAT.get(name)
    if path is None:
        raise TypeError(f"TrainerConfig: unknown setting {name!r} (the job's settings by their flat names: "
                        f"{', '.join(FLAT)}; or lora)")
    return path


class TrainerConfig:
    """The offloaded engine's settings: a view of ``job`` ([Note: the trainer's settings are the job's]).
    ``settings``: job settings by their flat names, applied over ``job`` (default: the default job)."""

    __slots__ = ("job",)

    def __init__(self, job: JobConfig | None = None, /, **settings):
        changes = {}
        for name, value in settings.items():
            if name == "lora" and (value is None or isinstance(value, (dict, LoraSpec))):   # else the flat rank
                spec = LoraSpec(**value) if isinstance(value, dict) else value
                changes.update(spec.section_values() if spec is not None else {"lora.rank": None})
            else:
                changes[_setting_path(name)] = value
        try:
            self.job = with_settings(job or JobConfig(), changes)
        except SettingError as exc:  # named as the caller named it
            given = {_setting_path(n): n for n in settings if n != "lora"}
            raise ValueError(f"{given.get(exc.path, exc.path)}: {exc.reason}") from None

    def __getattr__(self, name: str):
        path = old_trainer_key(name)
        if path is None:
            raise AttributeError(f"TrainerConfig has no setting {name!r}")
        value = self.job.get(path)
        return _ENGINE_CHOOSES.get(path, value) if value is None else value

    def __eq__(self, other) -> bool:
        return isinstance(other, TrainerConfig) and other.job == self.job

    def __repr__(self) -> str:
        return f"TrainerConfig({self.job.to_dict()!r})"

    @property
    def store_dir(self) -> str:
        return self.job.store.dirs or DEFAULT_STORE_DIR

    @property
    def lora(self) -> LoraSpec | None:
        return LoraSpec.from_section(self.job.lora)

    @property
    def optimizer_schedule(self) -> str:
        """When the per-layer updates run: the job's schedule by name, else eager, deferred with clipping, or
        after the whole backward without active offloading."""
        chosen = self.job.schedule.optimizer
        if chosen != "auto":
            return chosen
        if not self.job.schedule.active_offload:
            return "after_backward"
        return "deferred" if self.job.training.max_grad_norm is not None else "eager"

    def replace(self, **settings) -> "TrainerConfig":
        """This config with ``settings`` (flat names) changed."""
        return TrainerConfig(self.job, **settings)

    @classmethod
    def from_job(cls, job: JobConfig, **given) -> "TrainerConfig":
        """The trainer's settings of ``job``, ``given`` (flat names: what the command decides, such as a scratch
        store) applied over it."""
        return cls(job, **given)

    def optimizer_config(self, *, lr: float, no_decay: frozenset[str] = frozenset()):
        """The optimizer's settings at peak learning rate ``lr`` (the job's, or the default for the model);
        ``no_decay``: parameters the caller exempts from weight decay (a Hugging Face Trainer's no-decay group)."""
        from terastack.llm.engine.optimizer import OffloadedAdamW

        return OffloadedAdamW.Config(lr=lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                     max_grad_norm=self.max_grad_norm, optimizer_schedule=self.optimizer_schedule,
                                     impl=self.optimizer_impl, timeout=self.timeout, format=self.optimizer,
                                     no_decay=no_decay)

    def planner_config(self, *, device_budget: int, host_budget: int, inline_updates: bool,
                       accumulation: str | None = None):
        """The planner's settings for these budgets (bytes) and this machine's choice of inline updates
        (``accumulation``: an order chosen already, in place of the configured one)."""
        from terastack.plan.llm_planner import LLMPlanner

        return LLMPlanner.Config(device_budget=device_budget, host_budget=host_budget,
                                 policy=self.activation_policy, optimizer_schedule=self.optimizer_schedule,
                                 prefetch_depth=self.prefetch_depth, state_placement=self.state_placement,
                                 optimizer_chunk=self.optimizer_chunk, optimizer=self.optimizer,
                                 retain_weights=self.retain_weights,
                                 inline_updates=inline_updates, grad_accum=self.grad_accum,
                                 accumulation=accumulation or self.accumulation)

    def to_dict(self) -> dict:
        """The job's settings that differ from their defaults, by their flat names (what a checkpoint records;
        ``TrainerConfig(**config.to_dict())`` is the same config). Tuples become lists, as in job files."""
        return {FLAT_OF[f"{section}.{name}"]: value for section, fields in self.job.to_dict().items()
                for name, value in fields.items()}

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> "TrainerConfig":
        """A job file in sections (the shipped configs), or an old TOML file of trainer fields (a ``[trainer]``
        table, or bare): the trainer's settings of that job."""
        data = read_toml_table(path, "trainer")
        if set(data) & set(SECTIONS):
            return cls(resolve_job(file=path, flags={}, overrides=[]))
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None

