"""A job's settings from its three layers: the ``--config`` file, the flags, trailing ``key=value`` words.

[Note: job config resolution]
A job's settings come from three layers, later ones winning: the ``--config`` file (YAML or TOML), the flags
given on the command line, and trailing ``key=value`` overrides (``terastack finetune --config job.yaml
training.lr=1e-5 epochs=2``, values parsed as YAML). Each layer is read into one mapping of ``section.field``
to value; the merged mapping builds :class:`~terastack.training.job.sections.JobConfig`, whose sections check
every value once. ``steps``/``epochs`` and ``warmup_steps``/``warmup_ratio`` are alternatives: a layer giving
one drops the other from the layers below. A refused value is named as the user gave it (a flag as
``--host-budget``, an override by its key, a file's key with the file), and an unknown key gets a "did you
mean" for its nearest known spelling (difflib).

A file is a mapping of sections (``training: {lr: 1e-5, epochs: 3}``) and flat names at its top level
(``lr: 1e-5``: a setting's flat name, the name of its flag). Files written for ``terastack finetune`` before the
job had sections still read (:mod:`terastack.training.job.legacy`): their ``trainer:`` table, their section
aliases; each old spelling is read as the setting it names now, and one note line on stderr lists them. Within
one file a new spelling wins over an old one (today's ``lr:`` over an old ``trainer: {lr: ...}``). Any other
key is refused, naming the key and the file.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import tomllib
from pathlib import Path
from typing import TextIO

from terastack.training.job.legacy import OLD_LORA_KEYS, old_section_key, old_trainer_key
from terastack.training.job.sections import JobConfig, alternatives_of, build_section, flat_index, sections_of
from terastack.training.job.setting import SettingError, flat_name

#: a layer: ``section.field`` -> value
Layer = dict


class _Reader:
    """Places the keys of one layer of job class ``job``'s settings, new spellings over old ones (only the
    language-model job has old ones), and collects the notes on old ones."""

    def __init__(self, where: str, job: type = JobConfig):
        self.where, self.sections, self.flat, self.legacy = where, sections_of(job), flat_index(job), job is JobConfig
        self.new: Layer = {}
        self.old: Layer = {}
        self.notes: list[str] = []

    def unknown(self, key: str, known: str, candidates=()) -> ValueError:
        return ValueError(f"{self.where}: unknown key {key!r}{did_you_mean(key, candidates)} ({known})")

    def moved(self, old: str, path: str, value) -> None:
        self.notes.append(f"{old} is now {path}")
        self.old[path] = value

    def top(self, key: str, value) -> None:
        """One top-level key: a section table, the old trainer table, or a flat name."""
        if key in self.sections and isinstance(value, dict):
            for inner, v in value.items():
                self.in_section(key, inner, v)
        elif key == "trainer" and self.legacy:
            if not isinstance(value, dict):
                raise ValueError(f"{self.where}: 'trainer' must be a table of settings")
            for inner, v in value.items():
                self.trainer_key(inner, v)
        elif key in self.flat:
            self.new[self.flat[key]] = value
        elif self.legacy and old_trainer_key(key):  # an old trainer field at the top level
            self.moved(key, old_trainer_key(key), value)
        else:
            raise self.unknown(key, f"sections: {', '.join(self.sections)}; or a setting's flat name: "
                                    f"{', '.join(self.flat)}", [*self.sections, *self.flat, *self.flat.values()])

    def in_section(self, section: str, key: str, value) -> None:
        fields = self.sections[section].__dataclass_fields__
        if key in fields:
            self.new[f"{section}.{key}"] = value
        elif self.legacy and old_section_key(section, key):
            self.moved(f"{section}.{key}", old_section_key(section, key), value)
        else:
            raise self.unknown(f"{section}.{key}", f"the {section} settings: {', '.join(fields)}",
                               [f"{section}.{f}" for f in fields] + [f"{section}.{f}" for f in self.flat])

    def trainer_key(self, key: str, value) -> None:
        if key == "lora" and isinstance(value, dict):
            for inner, v in value.items():
                if inner not in OLD_LORA_KEYS:
                    raise self.unknown(f"trainer.lora.{inner}", f"LoRA settings: {', '.join(OLD_LORA_KEYS)}")
                self.moved(f"trainer.lora.{inner}", OLD_LORA_KEYS[inner], v)
        elif key == "lora" and value is None:
            self.moved("trainer.lora", "lora.rank", None)
        elif old_trainer_key(key):
            self.moved(f"trainer.{key}", old_trainer_key(key), value)
        else:
            raise self.unknown(f"trainer.{key}", "not a setting of the offloaded trainer")

    def layer(self, log: TextIO | None) -> Layer:
        if self.notes and log is not None:
            print(f"note: {self.where}: {'; '.join(self.notes)}", file=log)
        return {**self.old, **self.new}


def did_you_mean(key: str, candidates) -> str:
    """``"; did you mean 'x'?"`` for the nearest of ``candidates`` to a mistyped ``key`` (difflib), or ""."""
    close = difflib.get_close_matches(key, list(dict.fromkeys(candidates)), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


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


def read_job_file(path: str | os.PathLike, *, log: TextIO | None = None, job: type = JobConfig) -> Layer:
    """The settings of a YAML or TOML job file as ``{section.field: value}`` (old spellings noted on ``log``)."""
    reader = _Reader(str(path), job)
    for key, value in _read_mapping(Path(path)).items():
        reader.top(key, value)
    return reader.layer(log)


def parse_overrides(items: list[str], *, log: TextIO | None = None, job: type = JobConfig) -> Layer:
    """``key=value`` words: ``section.field=VALUE`` or ``flat_name=VALUE`` (values parsed as YAML)."""
    import yaml

    out: Layer = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected key=value (e.g. lr=1e-5)")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        reader = _Reader(f"override {item!r}", job)
        head, dot, rest = key.partition(".")
        if dot and head == "trainer" and reader.legacy:
            reader.trainer_key(rest, value)
        elif dot and head in reader.sections:
            reader.in_section(head, rest, value)
        else:
            reader.top(key, value)
        out.update(reader.layer(log))
    return out


def merge_layers(*layers: Layer, job: type = JobConfig) -> Layer:
    """Later layers win setting by setting; a layer giving one of an alternative pair drops the other from the
    layers below."""
    out: Layer = {}
    for layer in layers:
        for a, b in alternatives_of(job):
            for mine, other in ((a, b), (b, a)):
                if layer.get(mine) is not None and layer.get(other) is None:
                    out.pop(other, None)
        out.update(layer)
    return out


def build_job(layer: Layer, job: type = JobConfig):
    """The job (of class ``job``) of a layer of ``section.field`` settings (every value checked by its section)."""
    sections: dict[str, dict] = {}
    for path, value in layer.items():
        section, name = path.split(".", 1)
        sections.setdefault(section, {})[name] = value
    return job(**{name: build_section(sections_of(job)[name], values) for name, values in sections.items()})


def resolve_job(*, file: str | os.PathLike | None, flags: Layer, overrides: list[str],
                log: TextIO | None | str = "stderr", job: type = JobConfig):
    """The job of [Note: job config resolution]: file < flags < ``key=value``. ``flags``: the settings the
    command line gave, as ``{section.field: value}`` (None values are ignored); ``log``: where notes on old
    spellings go (the process's stderr at the time of the call by default; None: nowhere)."""
    if log == "stderr":
        log = sys.stderr
    from_file = read_job_file(file, log=log, job=job) if file else {}
    if file:
        try:  # the file's own mistakes are named with the file
            build_job(from_file, job)
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from None
    given = {k: v for k, v in flags.items() if v is not None}
    spelled = {path: _flag_of(path, job) for path in given}  # a setting is named as the user gave it
    for item in overrides:
        key = item.partition("=")[0].strip()
        path = flat_index(job).get(key.replace("-", "_")) or key.replace("-", "_")
        spelled[path] = key
    try:
        return build_job(merge_layers(from_file, given, parse_overrides(overrides, log=log, job=job), job=job), job)
    except SettingError as exc:
        parts = exc.path.split("/")
        if not any(p in spelled for p in parts):
            raise
        raise SettingError("/".join(spelled.get(p, p) for p in parts), exc.reason) from None


def _flag_of(path: str, job: type = JobConfig) -> str:
    """The flag of setting ``section.field`` (``store.host_budget`` -> ``--host-budget``)."""
    section, name = path.split(".", 1)
    f = sections_of(job)[section].__dataclass_fields__[name]
    return "--" + flat_name(f).replace("_", "-")


def write_job_file(job: JobConfig, path: str | os.PathLike, *, command: str = "terastack finetune") -> None:
    """``finetune.yaml``: the resolved job's settings that differ from the defaults, in sections, so that
    ``terastack finetune --config finetune.yaml`` repeats it."""
    import yaml

    text = (f"# {command} job (repeat it: {command} --config {Path(path).name})\n"
            + yaml.safe_dump(job.to_dict(), sort_keys=False))
    Path(path).write_text(text)


__all__ = ["Layer", "SettingError", "build_job", "merge_layers", "other_engine_note", "parse_overrides",
           "read_job_file", "resolve_job", "with_settings", "write_job_file"]


def other_engine_note(job: JobConfig, section: str, *, command: str) -> str | None:
    """[Note: settings of the other engine]
    A job file runs on either engine (``terastack finetune``, ``terastack dist train``), so the section of one
    engine's own knobs (``offload``, ``disdp``) may stand in a job the other runs. The other engine's command
    takes no flag for them, and names the ones the job gives in one note line rather than refusing the file:
    they are not lost without a word, and the same file still runs on their engine. None when the job gives
    none of ``section``'s settings."""
    cls = sections_of(type(job))[section]
    values, default = getattr(job, section), cls()   # defaults as read (a size as bytes)
    given = [f"{section}.{f.name}" for f in dataclasses.fields(cls)
             if getattr(values, f.name) != getattr(default, f.name)]
    if not given:
        return None
    kind = "settings" if len(given) > 1 else "a setting"
    return f"note: {', '.join(given)}: {kind} of {cls.ENGINE}, not used by {command}"


def with_settings(job: JobConfig, changes: dict) -> JobConfig:
    """``job`` with ``changes`` (``section.field`` -> value) made, each changed section checked again (and the
    job's checks across sections)."""
    if not changes:
        return job
    by_section: dict[str, dict] = {}
    for path, value in changes.items():
        section, name = path.split(".", 1)
        by_section.setdefault(section, {})[name] = value
    sections = {}
    for name, values in by_section.items():
        current = getattr(job, name)
        known = {f.name for f in dataclasses.fields(current)}
        unknown = [k for k in values if k not in known]
        if unknown:
            raise SettingError(f"{name}.{unknown[0]}", f"unknown setting (the {name} settings: "
                               f"{', '.join(sorted(known))})")
        sections[name] = dataclasses.replace(current, **values)
    return dataclasses.replace(job, **sections)
