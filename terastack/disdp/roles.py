"""Roles from ranks: which rank is a worker, a server shard, the aggregator or an agent.

Rank layout (one source of truth for every process):

    [0, W)                 workers
    [W, W+S)               parameter-server shards
    W+S                    the aggregator (when enabled)
    next W ranks           communication agents, agent i beside worker i (``agents="process"``)

With ``agents="thread"`` each worker's agent is a thread inside the worker
process, so the agent's rank is the worker's rank.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(str, enum.Enum):
    WORKER = "worker"
    SERVER = "server"
    AGGREGATOR = "aggregator"
    AGENT = "agent"


AGENT_MODES = ("thread", "process")


@dataclass(frozen=True, slots=True)
class RoleMap:
    workers: int
    servers: int
    aggregator: bool = True
    agents: str = "thread"

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers: need at least 1, got {self.workers}")
        if self.servers < 1:
            raise ValueError(f"servers: need at least 1, got {self.servers}")
        if self.agents not in AGENT_MODES:
            raise ValueError(f"agents: must be one of {', '.join(AGENT_MODES)}; got {self.agents!r}")

    @property
    def world_size(self) -> int:
        return self.workers + self.servers + int(self.aggregator) + (self.workers if self.agents == "process" else 0)

    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(
                f"world size {world_size} does not match the roles: {self.workers} workers + {self.servers} servers"
                f" + {int(self.aggregator)} aggregator" + (f" + {self.workers} agent processes"
                                                          if self.agents == "process" else "")
                + f" = {self.world_size} ranks (start torchrun with --nproc-per-node/--nnodes to match)")

    # ------------------------------------------------------------ rank -> role
    def role_of(self, rank: int) -> tuple[Role, int]:
        """(role, index within the role) of ``rank``."""
        W, S = self.workers, self.servers
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the job's {self.world_size} ranks")
        if rank < W:
            return Role.WORKER, rank
        if rank < W + S:
            return Role.SERVER, rank - W
        if self.aggregator and rank == W + S:
            return Role.AGGREGATOR, 0
        return Role.AGENT, rank - W - S - int(self.aggregator)

    def describe(self, rank: int) -> str:
        """A human label such as ``server 1 (rank 3)``, used in every error message."""
        role, index = self.role_of(rank)
        return f"{role.value} (rank {rank})" if role is Role.AGGREGATOR else f"{role.value} {index} (rank {rank})"

    # ------------------------------------------------------------ role -> rank
    def worker_rank(self, i: int) -> int:
        return i

    def server_rank(self, s: int) -> int:
        return self.workers + s

    @property
    def aggregator_rank(self) -> int | None:
        return self.workers + self.servers if self.aggregator else None

    def agent_rank(self, i: int) -> int:
        """The rank that talks to the servers and the aggregator on behalf of worker ``i``."""
        if self.agents == "thread":
            return i
        return self.workers + self.servers + int(self.aggregator) + i

    def agent_ranks(self) -> list[int]:
        return [self.agent_rank(i) for i in range(self.workers)]

    def table(self) -> str:
        """The role of every rank, one line each (printed at start)."""
        lines = []
        for rank in range(self.world_size):
            role, index = self.role_of(rank)
            extra = ""
            if role is Role.WORKER and self.agents == "thread":
                extra = "  + agent thread"
            elif role is Role.AGENT:
                extra = f"  -> serves worker {index} (rank {self.worker_rank(index)})"
            lines.append(f"  rank {rank:3d}: {role.value} {index}{extra}" if role is not Role.AGGREGATOR
                         else f"  rank {rank:3d}: aggregator")
        return "\n".join(lines)
