"""Roles from ranks: which rank is a worker, a server shard, the aggregator or an agent.

Rank layout (one source of truth for every process):

    [0, W)                 workers
    [W, W+S)               parameter-server shards
    W+S                    the aggregator (when enabled)
    next W ranks           communication agents, agent i beside worker i (``agents="process"``)

With ``agents="thread"`` each worker's agent is a thread inside the worker
process, so the agent's rank is the worker's rank.

[Note: ranks on several nodes]
Roles follow the *global* rank, whoever formed the world: ``terastack dist train`` on one machine, or one
torchrun per node (``torchrun --nnodes N --nproc-per-node K ...``), which gives node ``n`` (torchrun's
``GROUP_RANK``) the global ranks ``[n*K, (n+1)*K)``. So the layout above, filled node by node, decides where
each role runs: with 2 nodes of 3 ranks, 4 workers, 1 server and the aggregator, node 0 runs workers 0-2 and
node 1 worker 3, the server and the aggregator. Once the ranks have met, every rank knows each rank's node
and host (:meth:`RoleMap.with_nodes`), and every message naming a rank names its node too when there is more
than one.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import socket
from dataclasses import dataclass
from terastack.training.job.engine_sections import DISDP_AGENTS


class Role(str, enum.Enum):
    WORKER = "worker"
    SERVER = "server"
    AGGREGATOR = "aggregator"
    AGENT = "agent"


#: the communication agents' modes: the job's choices (one copy, in the job's disdp section)
AGENT_MODES = DISDP_AGENTS


def local_node() -> tuple[int, str]:
    """(node index, host name) of this process: torchrun's ``GROUP_RANK`` (0 outside torchrun) and the host."""
    return int(os.environ.get("GROUP_RANK", "0")), socket.gethostname()


@dataclass(frozen=True, slots=True)
class RoleMap:
    workers: int
    servers: int
    aggregator: bool = True
    agents: str = "thread"
    #: (node index, host name) of every rank, known once the ranks have met ([Note: ranks on several nodes])
    nodes: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers: need at least 1, got {self.workers}")
        if self.servers < 1:
            raise ValueError(f"servers: need at least 1, got {self.servers}")
        if self.agents not in AGENT_MODES:
            raise ValueError(f"agents: must be one of {', '.join(AGENT_MODES)}; got {self.agents!r}")
        if self.nodes and len(self.nodes) != self.world_size:
            raise ValueError(f"nodes: one (node, host) per rank, {self.world_size}; got {len(self.nodes)}")

    def with_nodes(self, nodes) -> "RoleMap":
        """These roles with every rank's (node index, host name)."""
        return dataclasses.replace(self, nodes=tuple((int(n), str(h)) for n, h in nodes))

    @property
    def multi_node(self) -> bool:
        return len({n for n, _ in self.nodes}) > 1

    def node_of(self, rank: int) -> tuple[int, str] | None:
        """(node index, host name) of ``rank``; None before the ranks have met."""
        return self.nodes[rank] if self.nodes else None

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
        where = f" on node {self.nodes[rank][0]}" if self.multi_node else ""
        return (f"{role.value} (rank {rank}{where})" if role is Role.AGGREGATOR
                else f"{role.value} {index} (rank {rank}{where})")

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
            if self.nodes:
                extra += f"  [node {self.nodes[rank][0]}, {self.nodes[rank][1]}]"
            lines.append(f"  rank {rank:3d}: {role.value} {index}{extra}" if role is not Role.AGGREGATOR
                         else f"  rank {rank:3d}: aggregator{extra}")
        return "\n".join(lines)
