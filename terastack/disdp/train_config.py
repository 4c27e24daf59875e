"""A training job's settings: :class:`TrainConfig` (from flags, TOML or the job file every rank reads) and
the fault-injection spec ``--kill-at`` that resilience tests use."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from terastack.configfile import config_from_dict, read_toml_table
from terastack.disdp.comm import DEVICES
from terastack.disdp.workload import ModelSpec
from terastack.disdp.roles import AGENT_MODES, Role, RoleMap
from terastack.disdp.server import STATES, AdamWConfig


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    workers: int = 2
    servers: int = 1
    aggregator: bool = True
    agents: str = "thread"
    model: str = "tiny-llama"
    dim: int = 64
    layers: int = 2
    vocab: int = 256
    heads: int = 4
    seq_len: int = 32
    micro_batch: int = 4
    steps: int = 10
    seed: int = 0
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    #: where the servers keep optimizer state: "memory" or "ssd" (through terastack.tiers)
    state: str = "memory"
    run_dir: str = "runs/dist"
    #: checkpoint every N steps (0: only after the last step)
    checkpoint_every: int = 0
    resume: bool = False
    #: bucket deliveries an agent may run ahead of its worker's compute
    prefetch: int = 2
    #: release each layer after its forward and fetch it again for its backward (ZeRO-3 / FSDP behaviour)
    reshard: bool = True
    #: bound on every wait (seconds); a peer silent for longer is reported by rank and role
    timeout_s: float = 120.0
    #: torch intra-op threads per process
    threads: int = 1
    #: niceness added to servers, the aggregator and agent processes: roles that stand in for separate
    #: hardware (SmartNIC, switch, storage servers) yield the CPU to the workers when they share a machine
    helper_nice: int = 10
    #: fault injection for resilience tests: "ROLE:INDEX:STEP[:FAULT]" kills that rank with SIGKILL (FAULT
    #: "kill", the default) or makes it stop answering ("hang") at the start of that step
    kill_at: str = ""
    progress: bool = True
    #: write a Chrome trace per rank into this directory
    trace_dir: str = ""
    #: where the ranks' messages travel: "cpu" (gloo) or "cuda" (NCCL, each rank on GPU LOCAL_RANK;
    #: [Note: process-group backend] in terastack.disdp.comm)
    device: str = "cpu"

    def __post_init__(self) -> None:
        for f in ("workers", "servers", "micro_batch", "steps", "prefetch", "threads"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        if self.agents not in AGENT_MODES:
            raise ValueError(f"agents: must be one of {', '.join(AGENT_MODES)}; got {self.agents!r}")
        if self.state not in STATES:
            raise ValueError(f"state: must be one of {', '.join(STATES)}; got {self.state!r}")
        if not 0 <= self.helper_nice <= 19:
            raise ValueError(f"helper_nice: must be in [0, 19], got {self.helper_nice}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: must be >= 0, got {self.checkpoint_every}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {', '.join(DEVICES)}; got {self.device!r}")
        if self.kill_at:
            parse_kill_at(self.kill_at)
        self.model_spec()
        self.adamw()

    def model_spec(self) -> ModelSpec:
        return ModelSpec(name=self.model, dim=self.dim, layers=self.layers, vocab=self.vocab, heads=self.heads,
                         seq_len=self.seq_len)

    def adamw(self) -> AdamWConfig:
        return AdamWConfig(lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                           weight_decay=self.weight_decay)

    def roles(self) -> RoleMap:
        return RoleMap(workers=self.workers, servers=self.servers, aggregator=self.aggregator, agents=self.agents)

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "config") -> "TrainConfig":
        try:
            return config_from_dict(cls, data, what="dist config")
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
