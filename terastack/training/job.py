"""The settings of one ``terastack finetune`` job: a YAML or TOML file, command-line flags, ``key=value``s.

[Note: job config resolution]
A job's settings come from three layers, later ones winning: the ``--config`` file, the flags given on the
command line, and trailing ``key=value`` overrides (``terastack finetune --config job.yaml lr=1e-5 epochs=2``,
values parsed as YAML; ``trainer.KEY=VALUE`` sets a TrainerConfig field). ``steps``/``epochs`` and
``warmup_steps``/``warmup_ratio`` are alternatives: a layer giving one drops the other from the layers below.

The file is one mapping of job keys (the fields of :class:`JobConfig`), flat or grouped in sections --
``model:``, ``data:``, ``training:``, ``validation:``, ``output:``, ``checkpoint:`` -- whose keys are job keys
(plus ``path`` for the model, data and output, ``val`` for the validation data, ``dir``/``every`` for
checkpoints), and a ``trainer:`` table of :class:`~terastack.llm.trainer_config.TrainerConfig` fields. A top-level key
that is a TrainerConfig field and no job key (``calibrate``, ``store_dir``...) goes to the ``trainer`` table,
so a TOML file of ``[trainer]`` fields, or of bare TrainerConfig fields, is a job file too. A job key wins over
the same field in the ``trainer`` table. Any other key is refused, naming the key and the file.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from terastack.llm.trainer_config import TrainerConfig
from terastack.training.lr_schedule import SCHEDULES

DEFAULT_STEPS = 20
DEFAULT_SEQ_LEN = 128
DEFAULT_BATCH_SIZE = 4
#: section name -> {key in the section: job key} for keys that are not job keys themselves
SECTIONS = {"model": {"path": "model", "name": "model"}, "data": {"path": "data", "train": "data", "val": "val_data"},
            "training": {}, "validation": {"data": "val_data", "every": "eval_every", "fraction": "val_fraction"},
            "output": {"path": "output", "dir": "output"},
            "checkpoint": {"path": "checkpoint", "dir": "checkpoint", "every": "checkpoint_every"}}
#: pairs of keys of which a job gives at most one (see [Note: job config resolution])
ALTERNATIVES = (("steps", "epochs"), ("warmup_steps", "warmup_ratio"))


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """Everything a fine-tuning job needs besides the machine. None: not given (a default applies later: the
    learning rate depends on whether the model is pretrained, the seed and budgets come from the trainer
    table)."""

    model: str | None = None
    data: str | None = None
    #: validation data (same formats as ``data``), or a share of ``data`` held out (records: 0.05 by default)
    val_data: str | None = None
    val_fraction: float | None = None
    train_on_prompt: bool = False
    #: pack several short examples into one row (record files)
    pack: bool = False
    #: the job's length: optimizer steps, or epochs over the training rows (one of them; default 20 steps)
    steps: int | None = None
    epochs: float | None = None
    seq_len: int | None = None
    #: rows per micro-batch; an optimizer step takes ``grad_accum`` micro-batches
    batch_size: int | None = None
    grad_accum: int = 1
    lr: float | None = None
    lr_schedule: str = "constant"
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    min_lr: float = 0.0
    #: evaluate every N steps (0: before training and at the end only)
    eval_every: int = 0
    weight_decay: float | None = None
    max_grad_norm: float | None = None
    device_budget: str | int | None = None
    host_budget: str | int | None = None
    memory_budget: str | int | None = None
    #: where the training state lives (default: a temporary directory)
    store: str | None = None
    activation_policy: str | None = None
    dtype: str | None = None
    #: train a LoRA adapter of this rank
    lora: int | None = None
    seed: int | None = None
    #: the export directory: model, tokenizer, metrics.jsonl, finetune.yaml
    output: str | None = None
    #: metrics.jsonl elsewhere than in ``output``
    metrics: str | None = None
    #: the exported weights are split into safetensors shards of at most this size (with an index file)
    max_shard_size: str = "5GB"
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: str | None = None
    #: TrainerConfig fields
    trainer: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, kinds in _TYPES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if float in kinds and isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, float) and int in kinds and float not in kinds and value.is_integer():
                value = int(value)
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise ValueError(f"{name}: must be {' or '.join(_KIND_NAMES[k] for k in kinds)}, got {value!r}")
            setattr(self, name, float(value) if kinds == (float, int) else value)
        for a, b in ALTERNATIVES:
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise ValueError(f"{a}/{b}: give one of them, not both")
        if not isinstance(self.trainer, dict):
            raise ValueError(f"trainer: must be a table of TrainerConfig fields, got {self.trainer!r}")
        self.trainer = dict(self.trainer)
        if self.seq_len is None:
            self.seq_len = self.trainer.get("seq_len", DEFAULT_SEQ_LEN)
        if self.batch_size is None:
            self.batch_size = self.trainer.get("batch_size", DEFAULT_BATCH_SIZE)
        for name in ("steps", "seq_len", "batch_size", "grad_accum"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.epochs is not None and not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ValueError(f"epochs: must be > 0, got {self.epochs}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule: must be one of {', '.join(SCHEDULES)}; got {self.lr_schedule!r}")
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio: must be in [0, 1], got {self.warmup_ratio}")
        if not self.min_lr >= 0:
            raise ValueError(f"min_lr: must be >= 0, got {self.min_lr}")
        if self.val_fraction is not None and not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction: must be in [0, 1), got {self.val_fraction}")
        if self.val_data is not None and self.val_fraction:
            raise ValueError("val_data/val_fraction: give validation data or a share to hold out, not both")
        if self.lora is not None and self.lora < 1:
            raise ValueError(f"lora: the adapter rank must be >= 1, got {self.lora}")

    @property
    def length_in_epochs(self) -> bool:
        return self.epochs is not None

    @property
    def step_count(self) -> int | None:
        """``steps``, the default when neither length is given, or None when the length is in epochs."""
        return None if self.epochs is not None else (self.steps or DEFAULT_STEPS)

    def to_dict(self) -> dict:
        """The given settings (None left out), in field order: what ``finetune.yaml`` holds."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None and not (k == "trainer" and not v)}


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_TYPES = {"model": (str,), "data": (str,), "val_data": (str,), "val_fraction": (float, int),
          "train_on_prompt": (bool,), "pack": (bool,), "steps": (int,), "epochs": (float, int), "seq_len": (int,),
          "batch_size": (int,), "grad_accum": (int,), "lr": (float, int), "lr_schedule": (str,),
          "warmup_steps": (int,), "warmup_ratio": (float, int), "min_lr": (float, int), "eval_every": (int,),
          "weight_decay": (float, int), "max_grad_norm": (float, int), "device_budget": (str, int),
          "host_budget": (str, int), "memory_budget": (str, int), "store": (str,), "activation_policy": (str,),
          "dtype": (str,), "lora": (int,), "seed": (int,), "output": (str,), "metrics": (str,),
          "max_shard_size": (str, int),
          "checkpoint": (str,), "checkpoint_every": (int,), "resume": (str,)}
JOB_KEYS = tuple(f.name for f in dataclasses.fields(JobConfig))
TRAINER_KEYS = tuple(f.name for f in dataclasses.fields(TrainerConfig))


# ------------------------------------------------------------------ the three layers
def _read_mapping(path: Path) -> dict:
    suffix = path.suffix.lower()
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    elif suffix == ".toml":
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML ({exc})") from None
    else:
        raise ValueError(f"{path}: a config file is .yaml, .yml or .toml")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def _place(out: dict, key: str, value, where: str) -> None:
    """Put one (flat) key into a layer: a job key, a trainer table, or a TrainerConfig field."""
    if key == "trainer":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: 'trainer' must be a table of TrainerConfig fields")
        for k, v in value.items():
            if k not in TRAINER_KEYS:
                raise ValueError(f"{where}: unknown key 'trainer.{k}' (TrainerConfig fields: "
                                 f"{', '.join(TRAINER_KEYS)})")
            out.setdefault("trainer", {})[k] = v
    elif key in JOB_KEYS:
        out[key] = value
    elif key in TRAINER_KEYS:
        out.setdefault("trainer", {})[key] = value
    else:
        raise ValueError(f"{where}: unknown key {key!r} (job keys: {', '.join(JOB_KEYS)}; or a TrainerConfig "
                         "field)")


def read_job_file(path: str | os.PathLike) -> dict:
    """The job keys of a YAML or TOML file, sections flattened (see [Note: job config resolution])."""
    path = Path(path)
    out: dict = {}
    for key, value in _read_mapping(path).items():
        if key in SECTIONS and isinstance(value, dict):
            for inner, v in value.items():
                name = SECTIONS[key].get(inner, inner)
                if name == "trainer" or name not in JOB_KEYS:
                    raise ValueError(f"{path}: unknown key '{key}.{inner}' (job keys: {', '.join(JOB_KEYS)})")
                out[name] = v
        else:
            _place(out, key, value, str(path))
    return out


def parse_overrides(items: list[str]) -> dict:
    """``key=value`` words (values parsed as YAML; ``trainer.field=value`` for TrainerConfig fields)."""
    import yaml

    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected key=value (e.g. lr=1e-5)")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if key.startswith("trainer."):
            _place(out, "trainer", {key.split(".", 1)[1]: value}, f"override {item!r}")
        else:
            _place(out, key, value, f"override {item!r}")
    return out


def merge_layers(*layers: dict) -> dict:
    """Later layers win key by key; the trainer tables merge field by field; a layer giving one of an
    alternative pair drops the other from the layers below."""
    out: dict = {}
    for layer in layers:
        for a, b in ALTERNATIVES:
            for mine, other in ((a, b), (b, a)):
                if layer.get(mine) is not None and layer.get(other) is None:
                    out.pop(other, None)
        for key, value in layer.items():
            if key == "trainer":
                out["trainer"] = {**out.get("trainer", {}), **value}
            else:
                out[key] = value
    return out


def resolve_job(*, file: str | os.PathLike | None, flags: dict, overrides: list[str]) -> JobConfig:
    """The job of [Note: job config resolution]: file < flags < ``key=value``. ``flags``: the job keys the
    command line gave (None values are ignored)."""
    from_file = read_job_file(file) if file else {}
    if file:
        try:  # the file's own mistakes are named with the file
            JobConfig(**from_file)
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from None
    given = {k: v for k, v in flags.items() if v is not None}
    return JobConfig(**merge_layers(from_file, given, parse_overrides(overrides)))


def write_job_file(job: JobConfig, path: str | os.PathLike) -> None:
    """``finetune.yaml``: the resolved job, so ``terastack finetune --config finetune.yaml`` repeats it."""
    import yaml

    text = ("# terastack finetune job (repeat it: terastack finetune --config finetune.yaml)\n"
            + yaml.safe_dump(job.to_dict(), sort_keys=False))
    Path(path).write_text(text)
