"""The demo's settings: :class:`TrainConfig` (from flags, TOML or the job file every rank reads), and the
fault-injection spec ``--kill-at`` that resilience tests use.

[Note: the demo's settings are the job's where they are the same]
The roles and their processes (workers, servers, agents, the state's place, timeouts, ...) are the job's
``disdp`` section (:class:`~terastack.training.job.sections.DisdpSection`): one name, one default and one check
per setting, whether ``terastack dist train`` or ``terastack dist demo`` runs them. What only the demo has -- its
model of random tokens, its steps, the servers' AdamW and its checkpoints -- is :class:`DemoSettings`, whose
defaults are those of the model spec and of the servers' AdamW. A :class:`TrainConfig` is the two, read and
written by their flat names (``TrainConfig(workers=2, steps=3)``, ``config.workers``, the ``[train]`` table);
``run_dir``, which the job leaves unset for the engine to choose, is ``runs/dist`` for the demo.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass

from terastack.configfile import read_toml_table
from terastack.disdp.roles import Role, RoleMap
from terastack.disdp.server import AdamWConfig
from terastack.disdp.workload import ModelSpec
from terastack.training.job.sections import DisdpSection
from terastack.training.job.setting import SettingError

#: the demo's run directory when ``run_dir`` is not given (the job leaves it unset: the engine chooses)
DEFAULT_RUN_DIR = "runs/dist"
_SPEC, _ADAMW = ModelSpec(), AdamWConfig()


@dataclass(kw_only=True, slots=True)
class DemoSettings:
    """What only the demo has ([Note: the demo's settings are the job's where they are the same])."""

    model: str = _SPEC.name
    dim: int = _SPEC.dim
    layers: int = _SPEC.layers
    vocab: int = _SPEC.vocab
    heads: int = _SPEC.heads
    seq_len: int = _SPEC.seq_len
    micro_batch: int = 4
    steps: int = 10
    seed: int = 0
    lr: float = _ADAMW.lr
    beta1: float = _ADAMW.beta1
    beta2: float = _ADAMW.beta2
    eps: float = _ADAMW.eps
    weight_decay: float = _ADAMW.weight_decay
    #: checkpoint every N steps (0: only after the last step)
    checkpoint_every: int = 0
    resume: bool = False
    #: count what each worker holds between steps beyond its model ([Note: state a worker holds]): a scan of every
    #: object the process holds, seconds per worker, so only the benchmarks that report it ask for it
    census: bool = False

    def __post_init__(self) -> None:
        for f in ("micro_batch", "steps"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        self.model_spec()
        self.adamw()

    def model_spec(self) -> ModelSpec:
        return ModelSpec(name=self.model, dim=self.dim, layers=self.layers, vocab=self.vocab, heads=self.heads,
                         seq_len=self.seq_len)

    def adamw(self) -> AdamWConfig:
        return AdamWConfig(lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                           weight_decay=self.weight_decay)


SECTION_FIELDS = tuple(f.name for f in dataclasses.fields(DisdpSection))
DEMO_FIELDS = tuple(f.name for f in dataclasses.fields(DemoSettings))


class TrainConfig:
    """The demo's settings by their flat names: the job's ``disdp`` section and :class:`DemoSettings` ([Note:
    the demo's settings are the job's where they are the same])."""

    __slots__ = ("disdp", "demo")
    #: every setting's name
    FIELDS = SECTION_FIELDS + DEMO_FIELDS

    def __init__(self, **settings):
        unknown = sorted(set(settings) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"TrainConfig: unknown setting {', '.join(unknown)} (known: {', '.join(self.FIELDS)})")
        try:
            section = DisdpSection(**{k: v for k, v in settings.items() if k in SECTION_FIELDS})
        except SettingError as exc:   # named as the demo names it
            raise ValueError(f"{exc.path.partition('.')[2]}: {exc.reason}") from None
        if section.kill_at:
            parse_kill_at(section.kill_at)
        object.__setattr__(self, "disdp", section)
        object.__setattr__(self, "demo", DemoSettings(**{k: v for k, v in settings.items() if k in DEMO_FIELDS}))

    def __getattr__(self, name: str):
        if name in DEMO_FIELDS:
            return getattr(self.demo, name)
        if name == "run_dir":
            return self.disdp.run_dir or DEFAULT_RUN_DIR
        if name in SECTION_FIELDS:
            return getattr(self.disdp, name)
        raise AttributeError(f"TrainConfig has no setting {name!r}")

    def __setattr__(self, name: str, value) -> None:
        changed = self.replace(**{name: value})   # checked as at construction
        object.__setattr__(self, "disdp", changed.disdp)
        object.__setattr__(self, "demo", changed.demo)

    def __reduce__(self):
        return TrainConfig.from_dict, (self.to_dict(),)

    def __eq__(self, other) -> bool:
        return isinstance(other, TrainConfig) and other.to_dict() == self.to_dict()

    def __repr__(self) -> str:
        return f"TrainConfig({self.to_dict()!r})"

    def replace(self, **settings) -> "TrainConfig":
        return TrainConfig(**(self.to_dict() | settings))

    def model_spec(self) -> ModelSpec:
        return self.demo.model_spec()

    def adamw(self) -> AdamWConfig:
        return self.demo.adamw()

    def roles(self) -> RoleMap:
        return RoleMap(workers=self.workers, servers=self.servers, aggregator=self.aggregator, agents=self.agents)

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")

    def to_dict(self) -> dict:
        """Every setting by its flat name (``run_dir`` as the demo reads it)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "config") -> "TrainConfig":
        unknown = sorted(set(data) - set(cls.FIELDS))
        if unknown:
            raise ValueError(f"{source}: unknown dist config fields: {', '.join(unknown)} (known: "
                             f"{', '.join(sorted(cls.FIELDS))})")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> "TrainConfig":
        return cls.from_dict(read_toml_table(path, "train"), source=str(path))


FAULTS = ("kill", "hang")


def parse_kill_at(text: str) -> tuple[Role, int, int, str]:
    """ROLE:INDEX:STEP[:FAULT]: FAULT "kill" (SIGKILL, the default) or "hang" (the rank stops answering)."""
    try:
        role, index, step, *fault = text.split(":")
        fault = fault[0].lower() if fault else "kill"
        if fault not in FAULTS or len(text.split(":")) > 4:
            raise ValueError(text)
        return Role(role), int(index), int(step), fault
    except ValueError:
        raise ValueError(f"kill_at: expected ROLE:INDEX:STEP[:FAULT] (ROLE one of worker, server, aggregator, "
                         f"agent; FAULT kill or hang), got {text!r}") from None


def inject_fault(kill_at: str, role: Role, index: int, step: int, who: str) -> None:
    """Fault injection (``kill_at``, ROLE:INDEX:STEP[:FAULT]): die or hang here when ``role``, ``index`` and
    ``step`` are the ones named; ``who`` names the rank in the line printed first."""
    if not kill_at:
        return
    kill = parse_kill_at(kill_at)
    if kill[:3] != (role, index, step):
        return
    print(f"terastack dist: fault injection: {kill[3]} {who} at step {step}", flush=True)
    if kill[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:        # "hang": alive (its network threads too) but never answers again
        time.sleep(3600)
