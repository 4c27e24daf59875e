"""TrainerConfig: every knob of the offloading trainer, loadable from TOML, and built from a job.

[Note: the trainer's settings are the job's]
Each TrainerConfig field is a setting of the job (:mod:`terastack.training.job`): the one whose flat name is
the field's name, or the one :func:`~terastack.training.job.legacy.old_trainer_key` names (``store_dir`` is
``store.dirs``, ``packed`` is ``data.pack``); ``lora`` is the lora section. So the values are checked in one
place, the job's sections: a TrainerConfig checks its fields by building them (an error names the TrainerConfig
field), and :meth:`TrainerConfig.from_job` copies a job's settings by that same correspondence. The optimizer's
and the planner's settings are built from a TrainerConfig (:meth:`TrainerConfig.optimizer_config`,
:meth:`TrainerConfig.planner_config`).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass

from terastack.memory import MMAP_THRESHOLD
from terastack.configfile import config_from_dict, read_toml_table
from terastack.training.job import (SECTIONS, JobConfig, LoraSection, SettingError, build_job,
                                    resolve_job)
from terastack.training.job.legacy import old_trainer_key

__all__ = ["MEMORY_BUDGET_ENV", "LoraSpec", "TrainerConfig"]
#: glibc settings for a memory budget, best in the environment at process start (the bench's small-budget run
#: starts its process with them); see [Note: a memory budget bounds resident memory] (terastack.memory)
MEMORY_BUDGET_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}


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

    def __post_init__(self) -> None:
        try:  # the job's lora section checks the values ([Note: the trainer's settings are the job's])
            section = LoraSection(rank=self.r, alpha=self.alpha, dropout=self.dropout,
                                  target_modules=self.target_modules, init_from=self.init_from)
        except SettingError as exc:
            raise ValueError(f"{'lora.r' if exc.path == 'lora.rank' else exc.path}: {exc.reason}") from None
        self.target_modules = section.target_modules

    @classmethod
    def from_section(cls, section: LoraSection) -> "LoraSpec | None":
        """The adapter of a job's lora section (None without a rank); alpha defaults to twice the rank."""
        if section.rank is None:
            return None
        return cls(r=section.rank, alpha=section.alpha or 2 * section.rank, dropout=section.dropout,
                   target_modules=section.target_modules, init_from=section.init_from)

    def section_values(self) -> dict:
        return {"lora.rank": self.r, "lora.alpha": self.alpha, "lora.dropout": self.dropout,
                "lora.target_modules": self.target_modules, "lora.init_from": self.init_from}


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    #: where the training state lives (an SSD); a fresh subdirectory is made per run and removed on close.
    #: Several directories (one per SSD): a list, or one string with commas between them; kept as that string
    store_dir: str | list[str] = dataclasses.field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "terastack-llm"))
    #: accelerator memory terastack may use ("auto": 90% of the GPU, or 1 GiB of host memory without one)
    device_budget: int | str = "auto"
    #: host memory terastack may use for training state and working sets ("auto": a quarter of RAM)
    host_budget: int | str = "auto"
    #: without an accelerator, one budget for both tiers (both are host memory); the planner splits it
    memory_budget: int | str | None = None
    lr: float = 1e-4
    #: the optimizer state format: "adamw", "adamw8bit" or "adafactor" ([Note: optimizer state formats] in
    #: terastack.plan.optimizer_formats)
    optimizer: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    #: global-norm gradient clipping (None: off); see the optimizer's [Note: clipping with eager updates]
    max_grad_norm: float | None = None
    #: compute dtype: "auto" (bfloat16 on a GPU, float32 on CPU), "float32" or "bfloat16"
    dtype: str = "auto"
    seed: int = 0
    #: the batch shape the plan is made for (a step with another shape is planned again)
    batch_size: int = 1
    seq_len: int = 256
    #: micro-batches per optimizer step (``Trainer.step_accumulated``); the plan holds their gradient sums within
    #: the budgets (see terastack.llm.engine.accumulate's [Note: gradient accumulation])
    grad_accum: int = 1
    #: the order of the micro-batches: "vertical" (each unit runs all of them at once: weights read once per
    #: step), "horizontal" (one after another), or "auto" (vertical when it fits the budgets); see
    #: terastack.plan.accumulation_specs' [Note: vertical and horizontal accumulation]
    accumulation: str = "auto"
    #: batches pack several examples per row (``position_ids`` restarting at each example): the plan counts the
    #: block-diagonal attention mask such rows bring, and packed rows are refused without it
    packed: bool = False
    #: "auto" (the planner chooses per layer), one policy for every decoder layer ("keep", "host", "ssd",
    #: "recompute"), a comma-separated cycle of them over the decoder layers, or one policy per unit (a list)
    activation_policy: str | tuple = "auto"
    #: when the per-layer updates run: a schedule's name (terastack.plan.schedule_specs), or "auto" (eager, or
    #: deferred with max_grad_norm; after_backward without active_offload)
    optimizer_schedule: str = "auto"
    #: False runs the optimizer after the whole backward (the ablation of active gradient offloading)
    active_offload: bool = True
    #: eager updates on the training thread, right after each unit's backward (None: when computing on the CPU);
    #: see the optimizer's [Note: inline updates without an accelerator]
    inline_updates: bool | None = None
    prefetch_depth: int = 1
    #: "auto": state rests in host memory while the budget allows; "ssd": all of it on the SSD
    state_placement: str = "auto"
    optimizer_impl: str = "auto"
    #: elements per optimizer chunk: the optimizer reads and writes moments in pieces of this size
    optimizer_chunk: int = 1 << 20
    #: keep the updated weights of the first units in the device tier for the next forward, where they fit
    retain_weights: bool = True
    #: "auto", "cpu" or "cuda[:N]"
    device: str = "auto"
    #: time each distinct unit once on this machine so the plan predicts from measured times
    calibrate: bool = True
    #: a probe JSON (terastack probe --json) to plan with; None: the cached probe, else quick measurements
    hardware: str | None = None
    lora: LoraSpec | None = None
    #: every wait (a transfer, an update) gives up after this many seconds, naming what it waited for
    timeout: float = 600.0

    def __post_init__(self) -> None:
        from terastack.plan.optimizer_formats import optimizer_format

        if isinstance(self.lora, dict):
            self.lora = LoraSpec(**self.lora)
        optimizer_format(self.optimizer)  # ValueError naming the field
        try:  # [Note: the trainer's settings are the job's]
            job = build_job(self._job_settings())
        except SettingError as exc:
            raise ValueError(f"{_FIELD_OF.get(exc.path, exc.path)}: {exc.reason}") from None
        for name, path in _SETTING_OF.items():  # the values as the sections read them (sizes in bytes...)
            setattr(self, name, job.get(path))

    def _job_settings(self) -> dict:
        out = {path: getattr(self, name) for name, path in _SETTING_OF.items()}
        if self.lora is not None:
            out.update(self.lora.section_values())
        return out

    @classmethod
    def from_job(cls, job: JobConfig, **given) -> "TrainerConfig":
        """The trainer's settings of ``job``: every field the job gives ([Note: the trainer's settings are the
        job's]); a setting the job leaves unset (None) keeps the field's default; ``given`` (what the command
        decides: the learning rate for a pretrained model, a scratch store) wins."""
        fields = {name: job.get(path) for name, path in _SETTING_OF.items() if job.get(path) is not None}
        fields["lora"] = LoraSpec.from_section(job.lora)
        fields.update(given)
        return cls(**fields)

    def optimizer_config(self):
        """The optimizer's settings."""
        from terastack.llm.engine.optimizer import OffloadedAdamW

        return OffloadedAdamW.Config(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                     max_grad_norm=self.max_grad_norm, mode=self.optimizer_mode,
                                     impl=self.optimizer_impl, timeout=self.timeout, format=self.optimizer)

    def planner_config(self, *, device_budget: int, host_budget: int, inline_updates: bool,
                       accumulation: str | None = None):
        """The planner's settings for these budgets (bytes) and this machine's choice of inline updates
        (``accumulation``: an order chosen already, in place of the configured one)."""
        from terastack.plan.llm_planner import LLMPlanner

        return LLMPlanner.Config(device_budget=device_budget, host_budget=host_budget,
                                 policy=self.activation_policy, mode=self.optimizer_mode,
                                 prefetch_depth=self.prefetch_depth, state_placement=self.state_placement,
                                 optimizer_chunk=self.optimizer_chunk, optimizer=self.optimizer,
                                 retain_weights=self.retain_weights,
                                 inline_updates=inline_updates, grad_accum=self.grad_accum,
                                 accumulation=accumulation or self.accumulation)

    @property
    def optimizer_mode(self) -> str:
        if self.optimizer_schedule != "auto":
            return self.optimizer_schedule
        if not self.active_offload:
            return "after_backward"
        return "deferred" if self.max_grad_norm is not None else "eager"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        if isinstance(self.activation_policy, tuple):
            out["activation_policy"] = list(self.activation_policy)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "TrainerConfig":
        return config_from_dict(cls, data, what="trainer config")

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> "TrainerConfig":
        """A TOML file of TrainerConfig fields (a ``[trainer]`` table, or bare), or a job file in sections (the
        shipped configs): the trainer's settings of that job."""
        data = read_toml_table(path, "trainer")
        if set(data) & set(SECTIONS):
            return cls.from_job(resolve_job(file=path, flags={}, overrides=[]))
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None


#: fields that are no job setting: lora (the lora section), and the optimizer until the job has its setting
_NOT_SETTINGS = {"lora"} | ({"optimizer"} if old_trainer_key("optimizer") is None else set())
#: TrainerConfig field -> the job setting it is (every field but those)
_SETTING_OF = {f.name: old_trainer_key(f.name) for f in dataclasses.fields(TrainerConfig)
               if f.name not in _NOT_SETTINGS}
if not all(_SETTING_OF.values()):  # a new field is a new job setting first
    raise TypeError(f"TrainerConfig fields without a job setting: {[n for n, p in _SETTING_OF.items() if not p]}")
_FIELD_OF = {path: name for name, path in _SETTING_OF.items()}
