"""The sections of a job and :class:`JobConfig`, the job they make: every setting of a language-model job, each
one field (see [Note: a job setting is one field] in :mod:`terastack.training.job.setting`).

Engine-independent sections come first (model, data, validation, training, schedule, store, checkpoint, output,
lora); then one section per engine for the knobs only it has: ``offload`` (the offloaded engine,
:mod:`terastack.llm`) and ``disdp`` (the disaggregated engine, :mod:`terastack.disdp`). A None default means
"not given": the engine chooses (the learning rate depends on whether the model is pretrained; budgets are
measured on the machine).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field

from terastack.plan.accumulation_specs import accumulation_spec
from terastack.plan.activation_specs import ACTIVATIONS, AUTO
from terastack.plan import schedule_specs
from terastack.plan.optimizer_names import OPTIMIZER_NAMES
from terastack.training.job.engine_sections import DisdpSection, OffloadSection
from terastack.training.job.setting import SettingError, at_least, flat_name, one_of, read_fields, setting
from terastack.training.lr_schedule import SCHEDULES
from terastack.units import parse_bytes

DTYPES = ("auto", "float32", "bfloat16")
#: the kinds of RoPE scaling (terastack.training.hf.model_files.ROPE_SCALINGS, which applies them; a test keeps
#: the two equal: this module imports no torch)
ROPE_SCALINGS = ("linear", "dynamic", "yarn")
#: lora.base_format: how a LoRA run's frozen base rests and streams
BASE_FORMATS = ("auto", "nf4", "native")
#: a job's length when it gives neither steps nor epochs
DEFAULT_STEPS = 20
#: the export's largest safetensors file before it is sharded (transformers' default)
OUTPUT_SHARD_SIZE = "5GB"


def _check_size(section, name: str, *, keep: bool = False) -> None:
    """A byte size ("64MiB", 4096; "auto" and None pass) read as bytes, or kept as given with ``keep``."""
    value = getattr(section, name)
    if value is None or value == "auto":
        return
    path = f"{section.SECTION}.{name}"
    try:
        size = parse_bytes(value, field=path)
    except ValueError as exc:
        raise SettingError(path, str(exc).split(": ", 1)[1]) from None
    if not keep:
        setattr(section, name, size)


@dataclass(kw_only=True, slots=True)
class ModelSection:
    """the model"""
    SECTION = "model"

    path: str | None = setting(None, flat="model", path="path_or_name", help="a Hugging Face model directory "
                               "(safetensors), a config.json, or a built-in name (default: tiny-llama, random "
                               "init)")
    rope_scaling: tuple[str | float, ...] | None = setting(
        None, metavar=("KIND", "FACTOR"), help=f"extend a rotary-position model's context: scale its positions by "
        f"FACTOR ({'|'.join(ROPE_SCALINGS)}), as transformers' rope_scaling does; the exported config carries it")

    def __post_init__(self) -> None:
        read_fields(self)
        if self.rope_scaling is not None:
            value = self.rope_scaling
            if len(value) != 2 or str(value[0]) not in ROPE_SCALINGS:
                raise SettingError("model.rope_scaling", f"must be KIND FACTOR with KIND one of "
                                   f"{', '.join(ROPE_SCALINGS)}; got {' '.join(map(str, value))!r}")
            try:
                factor = float(value[1])
            except ValueError:
                factor = math.nan
            if not factor > 1 or not math.isfinite(factor):
                raise SettingError("model.rope_scaling", f"the factor must be a number > 1; got {value[1]!r}")
            self.rope_scaling = (str(value[0]), factor)


@dataclass(kw_only=True, slots=True)
class DataSection:
    """the training data"""
    SECTION = "data"

    path: str | None = setting(None, flat="data", help="a text file; a .jsonl/.json/.parquet file of text, "
                               "prompt/completion, OpenAI messages, ShareGPT conversations or Alpaca records; or "
                               "builtin:docstrings (signature -> docstring pairs from this Python's standard "
                               "library). Default: this Python's standard-library sources", path="path_or_name")
    train_on_prompt: bool = setting(False, help="with records: put prompts and user turns in the loss too "
                                    "(default: completions and assistant turns only)")
    pack: bool = setting(False, help="with records: pack several short examples into one row")

    def __post_init__(self) -> None:
        read_fields(self)


@dataclass(kw_only=True, slots=True)
class ValidationSection:
    """held-out data and how often it is evaluated"""
    SECTION = "validation"

    data: str | None = setting(None, flat="val_data", metavar="FILE", help="validation data, in the formats of "
                               "--data (at most 64 rows are evaluated)", path="path_or_name")
    fraction: float | None = setting(None, flat="val_fraction", help="the share of --data held out for "
                                     "validation (records: by a hash of the example, default 0.05; text: the end "
                                     "of the text, default 0)")
    every: int = setting(0, flat="eval_every", metavar="N", help="validation loss and perplexity every N steps "
                         "(default: before training and at the end)")

    def __post_init__(self) -> None:
        read_fields(self)
        at_least(self, "every", 0)
        if self.fraction is not None and not 0 <= self.fraction < 1:
            raise SettingError("validation.fraction", f"must be in [0, 1), got {self.fraction}")
        if self.data is not None and self.fraction:
            raise SettingError("validation.data/validation.fraction",
                               "give validation data or a share to hold out, not both")


@dataclass(kw_only=True, slots=True)
class TrainingSection:
    """the optimizer, the learning-rate schedule and the job's length"""
    SECTION = "training"

    steps: int | None = setting(None, help="optimizer steps (default 20)")
    epochs: float | None = setting(None, help="passes over the training rows instead of --steps (each epoch in "
                                   "its own seeded order)")
    seq_len: int = setting(128, help="tokens per row of a micro-batch: with --batch-size, what activations and the "
                           "plan are sized for")
    batch_size: int = setting(4, help="rows per micro-batch, each of --seq-len tokens")
    grad_accum: int = setting(1, metavar="N", help="micro-batches per optimizer step; the loss is the mean over "
                              "their target tokens")
    lr: float | None = setting(None, help="peak learning rate (default 3e-4; 1e-5 for a pretrained model; 1e-4 "
                               "with --lora)")
    optimizer: str = setting("adamw", choices=OPTIMIZER_NAMES, help="the optimizer and its state format: adamw "
                             "(exact, fp32 moments: 8 bytes a parameter beside the fp32 master), adamw8bit "
                             "(bitsandbytes' blockwise 8-bit moments: 2 bytes), adafactor (torch's, a factored "
                             "second moment: kilobytes a matrix)")
    betas: tuple[float, float] = setting((0.9, 0.999), metavar=("BETA1", "BETA2"), help="AdamW's beta1 and beta2")
    eps: float = setting(1e-8, help="AdamW's epsilon")
    weight_decay: float = setting(0.0, help="AdamW's decoupled weight decay")
    max_grad_norm: float | None = setting(None, help="global-norm gradient clipping (the metrics then carry "
                                          "grad_norm)")
    lr_schedule: str = setting("constant", choices=SCHEDULES, help="after the warmup: constant, or a linear or "
                               "cosine decay to --min-lr (the formulas of transformers' get_*_schedule_with_warmup)")
    warmup_steps: int | None = setting(None, metavar="N", help="steps of linear warmup from 0 (default 0)")
    warmup_ratio: float | None = setting(None, metavar="F", help="warmup over this share of the steps "
                                         "(rounded up)")
    min_lr: float = setting(0.0, help="the floor of the linear/cosine decay")
    seed: int = setting(0, help="initialization and data order")

    #: pairs of settings of which a job gives at most one; a later layer giving one drops the other
    ALTERNATIVES = (("steps", "epochs"), ("warmup_steps", "warmup_ratio"))

    def __post_init__(self) -> None:
        read_fields(self)
        for a, b in self.ALTERNATIVES:
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise SettingError(f"training.{a}/training.{b}", "give one of them, not both")
        for name in ("steps", "seq_len", "batch_size", "grad_accum"):
            at_least(self, name, 1)
        for name in ("warmup_steps", "lr", "weight_decay", "min_lr"):
            at_least(self, name, 0)
        if self.epochs is not None and not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise SettingError("training.epochs", f"must be > 0, got {self.epochs}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise SettingError("training.betas", f"must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise SettingError("training.eps", f"must be > 0, got {self.eps}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise SettingError("training.max_grad_norm", f"must be > 0 or null, got {self.max_grad_norm}")
        one_of(self, "lr_schedule", SCHEDULES)
        one_of(self, "optimizer", OPTIMIZER_NAMES)
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio <= 1:
            raise SettingError("training.warmup_ratio", f"must be in [0, 1], got {self.warmup_ratio}")
        if self.min_lr and self.lr_schedule == "constant":
            raise SettingError("training.min_lr", "the floor of a linear or cosine decay; give --lr-schedule "
                               "linear or cosine (the schedule is constant)")

    @property
    def step_count(self) -> int | None:
        """``steps``, the default when neither length is given, or None when the length is in epochs."""
        return None if self.epochs is not None else (self.steps or DEFAULT_STEPS)



@dataclass(kw_only=True, slots=True)
class ScheduleSection:
    """when the optimizer runs and what happens to activations"""
    SECTION = "schedule"

    optimizer: str = setting(
        AUTO, flat="optimizer_schedule", choices=(AUTO, *schedule_specs.SCHEDULES),
        help="when each layer's AdamW update runs, a schedule by name (terastack.plan.schedule_specs); auto: while "
             "backward continues (eager; deferred until the clip coefficient is known with --max-grad-norm)")
    active_offload: bool = setting(True, help="--no-active-offload runs the optimizer after the whole backward "
                                   "(the ablation of active gradient offloading; the after_backward schedule)")
    activation_policy: str | tuple[str, ...] = setting(
        AUTO, help="auto (the planner chooses per layer), one of keep, host, ssd, recompute for every decoder "
        "layer, or a comma-separated cycle of them over the decoder layers")
    accumulation: str = setting(
        AUTO, flat="accumulation", metavar="{auto,vertical,horizontal,grouped-G}",
        help="the order of a step's --grad-accum micro-batches (terastack.plan.accumulation_specs): vertical runs "
             "each layer for all of them at once (its weights read once per step), horizontal one micro-batch "
             "after another, grouped-G passes of G stacked; auto: the fewest passes whose plan fits the budgets")

    def __post_init__(self) -> None:
        read_fields(self)
        one_of(self, "optimizer", (AUTO, *schedule_specs.SCHEDULES))
        if self.accumulation != AUTO:
            try:
                accumulation_spec(self.accumulation)
            except ValueError as exc:
                raise SettingError(f"{self.SECTION}.accumulation", str(exc).split(": ", 1)[1]) from None
        after = schedule_specs.AFTER_BACKWARD.name
        if not self.active_offload and self.optimizer not in (AUTO, after):
            raise SettingError("schedule.optimizer", f"{self.optimizer} contradicts active_offload=false (the "
                               f"{after} schedule)")
        # the names are those of the planner's registry of activation policies (terastack.plan.activation_specs)
        names = (self.activation_policy if isinstance(self.activation_policy, tuple)
                 else [] if self.activation_policy == AUTO else self.activation_policy.split(","))
        bad = [p for p in names if p not in ACTIVATIONS]
        if bad:
            raise SettingError("schedule.activation_policy", f"{bad[0]!r} is not one of {', '.join(ACTIVATIONS)} "
                               f"(or {AUTO})")


@dataclass(kw_only=True, slots=True)
class StoreSection:
    """memory budgets and where the training state lives"""
    SECTION = "store"

    dirs: str | tuple[str, ...] | None = setting(
        None, flat="store", metavar="DIR", help="directory on the SSD for the training state; several (one per "
        "SSD) with commas between them (default: a temporary directory)", path="paths", writes=True)
    device_budget: str | int | None = setting(None, help="accelerator memory to use, e.g. 20GiB (default: auto)")
    host_budget: str | int | None = setting(None, help="host memory for training state and working sets, e.g. "
                                            "64GiB (default: auto; the built-in model gets a quarter of its "
                                            "training state)")
    memory_budget: str | int | None = setting(None, help="without a GPU: one budget for both tiers, split by the "
                                              "planner (instead of the two above)")
    dtype: str | None = setting(None, choices=DTYPES, help="compute dtype (default auto: bfloat16 on a GPU, "
                                "float32 on a CPU)")

    def __post_init__(self) -> None:
        read_fields(self)
        if isinstance(self.dirs, tuple):
            self.dirs = ",".join(self.dirs)
        if self.dirs is not None and not all(d.strip() for d in self.dirs.split(",")):
            raise SettingError("store.dirs", f"{self.dirs!r} names an empty directory")
        for name in ("device_budget", "host_budget", "memory_budget"):
            _check_size(self, name)
        if self.memory_budget is not None and (self.device_budget not in (None, "auto")
                                               or self.host_budget not in (None, "auto")):
            raise SettingError("store.memory_budget", "give either memory_budget or device_budget/host_budget, "
                               "not both")
        if self.dtype is not None:
            one_of(self, "dtype", DTYPES)


@dataclass(kw_only=True, slots=True)
class CheckpointSection:
    """checkpoints and resuming"""
    SECTION = "checkpoint"

    dir: str | None = setting(None, flat="checkpoint", metavar="DIR", path="path", writes=True,
                              help="write checkpoints to DIR")
    every: int = setting(0, flat="checkpoint_every", metavar="N", help="checkpoint every N steps (default: only "
                         "at the end when --checkpoint is given)")
    resume: str | None = setting(None, metavar="DIR", help="continue from the checkpoint in DIR: the schedule and "
                                 "the data order go on exactly", path="path")

    def __post_init__(self) -> None:
        read_fields(self)
        at_least(self, "every", 0)
        if self.every and self.dir is None:
            raise SettingError("checkpoint.every", "needs --checkpoint DIR, where the checkpoints go")


@dataclass(kw_only=True, slots=True)
class OutputSection:
    """the result"""
    SECTION = "output"

    dir: str | None = setting(None, flat="output", aliases=("save",), metavar="DIR", help="the result: the "
                              "trained model (save_pretrained format, a peft adapter with --lora) and its "
                              "tokenizer, metrics.jsonl and finetune.yaml (the resolved job: repeat it with "
                              "--config). Written under DIR.partial while training and renamed to DIR when "
                              "complete", path="path", writes=True)
    metrics: str | None = setting(None, metavar="FILE", path="path", writes=True, help="per-step metrics as JSON "
                                  "lines (default: DIR/metrics.jsonl with --output); also TensorBoard events beside it "
                                  "when the tensorboard package is installed")
    max_shard_size: str | int = setting(OUTPUT_SHARD_SIZE, metavar="SIZE", help="split the exported weights into safetensors "
                                        "shards of at most SIZE with an index file, as transformers does")

    def __post_init__(self) -> None:
        read_fields(self)
        _check_size(self, "max_shard_size", keep=True)
        if self.dir is None and self.max_shard_size != OUTPUT_SHARD_SIZE:
            raise SettingError("output.max_shard_size", "shards the export: needs --output DIR")


@dataclass(kw_only=True, slots=True)
class LoraSection:
    """a LoRA adapter (peft) instead of full fine-tuning"""
    SECTION = "lora"

    rank: int | None = setting(None, flat="lora", metavar="R", help="train a LoRA adapter of rank R (peft)")
    alpha: int | None = setting(None, flat="lora_alpha", help="the adapter's scale numerator (default: 2 x R)")
    dropout: float = setting(0.0, flat="lora_dropout", help="dropout on the adapter's input")
    target_modules: str | tuple[str, ...] = setting(
        "auto", flat="lora_target_modules", metavar="NAMES", help="module names to adapt, with commas between "
        "them (default auto: peft's choice for the model family)")
    init_from: str | None = setting(None, flat="lora_init_from", metavar="DIR", help="a peft adapter directory "
                                    "to start from (default: peft's initialization)", path="path")
    base_format: str = setting("auto", choices=BASE_FORMATS, help="how the frozen base rests on the store and "
                               "streams: nf4 (bitsandbytes' 4-bit NormalFloat, quantized once at import, "
                               "dequantized per unit), native (its own dtype), auto (nf4 when the model directory "
                               "is bitsandbytes-quantized, else native)")

    def __post_init__(self) -> None:
        read_fields(self)
        at_least(self, "rank", 1)
        one_of(self, "base_format", BASE_FORMATS)
        if self.base_format == "nf4" and self.rank is None:
            raise SettingError("lora.base_format", "nf4 streams a frozen LoRA base; give --lora R (a full "
                               "fine-tune trains every weight, which stays in its own dtype)")
        if self.alpha is not None and not self.alpha > 0:
            raise SettingError("lora.alpha", f"must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise SettingError("lora.dropout", f"must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, str) and self.target_modules != "auto":
            self.target_modules = tuple(m.strip() for m in self.target_modules.split(",") if m.strip())
        if self.rank is None:  # an adapter's settings without an adapter would change nothing
            given = [f.name for f in dataclasses.fields(self) if f.name != "rank" and getattr(self, f.name) != f.default]
            if given:
                raise SettingError(f"lora.{given[0]}", "a setting of a LoRA adapter: give --lora R too")


class SectionedJob:
    """What every sectioned job does, whatever its sections: a job class is a dataclass whose fields are its
    sections (:class:`JobConfig` for language models; another engine defines its own of the same shape, and the
    flags, file keys and overrides follow from it as from this one). Sections given as mappings are built and
    checked; ``get``, ``with_absolute_paths`` and ``to_dict`` read every section."""

    __slots__ = ()

    def __post_init__(self) -> None:
        for name, cls in sections_of(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, build_section(cls, value))
            elif not isinstance(value, cls):
                raise SettingError(name, f"must be a table of {name} settings, got {value!r}")

    def get(self, path: str):
        """The value of ``section.field``."""
        section, name = path.split(".", 1)
        return getattr(getattr(self, section), name)

    def with_absolute_paths(self, base: str | os.PathLike | None = None):
        """This job with every setting that names files (``setting(path=...)``) absolute, relative ones taken
        from ``base`` (default: the working directory): a saved job then runs the same from any directory. A
        setting that may be a name instead (a built-in model, a Hub id, ``builtin:docstrings``) is a path when
        it names something that exists."""
        base = os.path.abspath(base or os.getcwd())

        def absolute(value: str) -> str:
            return os.path.normpath(os.path.join(base, os.path.expanduser(value)))

        sections = {}
        for name in sections_of(type(self)):
            section = getattr(self, name)
            changes = {}
            for f in dataclasses.fields(section):
                kind, value = f.metadata.get("path"), getattr(section, f.name)
                if kind is None or not isinstance(value, str) or not value:
                    continue
                if kind == "paths":
                    changes[f.name] = ",".join(absolute(p.strip()) for p in value.split(","))
                elif kind == "path" or os.path.exists(absolute(value)):
                    changes[f.name] = absolute(value)
            sections[name] = dataclasses.replace(section, **changes) if changes else section
        return dataclasses.replace(self, **sections)

    def named_paths(self, *, written: bool | None = None) -> dict[str, str]:
        """Every file system path the job names (its ``setting(path=...)`` settings; one of several directories
        each by itself; a name that may be a built-in or a Hub id only when it exists here), by the flag that gives
        it (``section.field`` where the setting has no flag). ``written``: only those it writes (True) or only
        those it reads (False)."""
        out: dict[str, str] = {}
        for name in sections_of(type(self)):
            section = getattr(self, name)
            for f in dataclasses.fields(section):
                kind, value = f.metadata.get("path"), getattr(section, f.name)
                if kind is None or not isinstance(value, str) or not value:
                    continue
                if written is not None and f.metadata.get("writes", False) != written:
                    continue
                label = f"--{flat_name(f).replace('_', '-')}" if f.metadata.get("flag", True) else f"{name}.{f.name}"
                values = [p.strip() for p in value.split(",")] if kind == "paths" else [value]
                for i, v in enumerate(values):
                    if kind != "path_or_name" or os.path.exists(os.path.expanduser(v)):
                        out[label if len(values) == 1 else f"{label} ({i + 1})"] = os.path.expanduser(v)
        return out

    def to_dict(self, *, everything: bool = False) -> dict:
        """``{section: {field: value}}`` of the settings that differ from their defaults (all of them with
        ``everything``): what a saved job file holds. Tuples become lists (YAML and TOML have no tuples)."""
        out: dict = {}
        for name in sections_of(type(self)):
            section = getattr(self, name)
            for f in dataclasses.fields(section):
                value = getattr(section, f.name)
                if everything or value != f.default:
                    out.setdefault(name, {})[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(kw_only=True, slots=True)
class JobConfig(SectionedJob):
    """A language-model job: one section per concern, each validated when built. ``JobConfig()`` is the default
    job (the built-in model on the built-in corpus); sections may be given as mappings of their fields."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    validation: ValidationSection = field(default_factory=ValidationSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    store: StoreSection = field(default_factory=StoreSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    output: OutputSection = field(default_factory=OutputSection)
    lora: LoraSection = field(default_factory=LoraSection)
    offload: OffloadSection = field(default_factory=OffloadSection)
    disdp: DisdpSection = field(default_factory=DisdpSection)

    def __post_init__(self) -> None:
        SectionedJob.__post_init__(self)
        if self.schedule.optimizer != AUTO:  # the schedule's own word on clipping (terastack.plan.schedule_specs)
            try:
                schedule_specs.SCHEDULES[self.schedule.optimizer].check_clipping(self.training.max_grad_norm)
            except ValueError as exc:
                raise SettingError("schedule.optimizer", str(exc).split(": ", 1)[1]) from None


@functools.cache
def sections_of(job: type) -> dict[str, type]:
    """Section name -> its class, in the order of the job class ``job``'s fields."""
    return {f.name: f.default_factory for f in dataclasses.fields(job)}


@functools.cache
def flat_index(job: type) -> dict[str, str]:
    """Flat name (a top-level file key, an override's key, a flag's name) -> ``section.field``, over job class
    ``job``'s sections; a flat name shared by two settings is refused (it must name one)."""
    out: dict[str, str] = {}
    for name, cls in sections_of(job).items():
        for f in dataclasses.fields(cls):
            flat = flat_name(f)
            if flat in out:
                raise TypeError(f"job settings {out[flat]} and {name}.{f.name} share the flat name {flat!r}")
            out[flat] = f"{name}.{f.name}"
    return out


@functools.cache
def alternatives_of(job: type) -> tuple:
    """``section.field`` pairs of job class ``job`` of which a job gives at most one (a section's ALTERNATIVES)."""
    return tuple((f"{name}.{a}", f"{name}.{b}") for name, cls in sections_of(job).items()
                 for a, b in getattr(cls, "ALTERNATIVES", ()))


#: section name -> its class, in the job's order
SECTIONS: dict[str, type] = sections_of(JobConfig)


def build_section(cls, values: dict):
    """``cls(**values)``, an unknown field named with the section's known ones."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in known]
    if unknown:
        raise SettingError(f"{cls.SECTION}.{unknown[0]}", f"unknown setting (the {cls.SECTION} settings: "
                           f"{', '.join(known)})")
    return cls(**values)


#: flat name (a top-level file key, an override's key, a flag's name) -> ``section.field``
FLAT: dict[str, str] = flat_index(JobConfig)
#: ``section.field`` pairs of which a job gives at most one
ALTERNATIVES = alternatives_of(JobConfig)
