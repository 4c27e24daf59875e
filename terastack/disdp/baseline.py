"""What the workers-only baselines (:mod:`terastack.disdp.fsdp2`, :mod:`terastack.disdp.zero3`) share: joining
the process group, writing their statistics and handing back their final parameters as a checkpoint."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from terastack.disdp.comm import join_process_group
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.buckets import Layout
from terastack.disdp.job_stats import write_stats
from terastack.disdp.server_state import save_parameters


def init_baseline(config: TrainConfig, system: str) -> tuple[int, int]:
    """Start-up of a workers-only baseline rank: (rank, world size), gloo process group joined."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.workers:
        raise ValueError(f"the {system} baseline runs one rank per worker: {config.workers} workers, {world} ranks")
    torch.set_num_threads(config.threads)
    join_process_group("cpu", rank=rank, world_size=world, timeout_s=config.timeout_s)   # a CPU device mesh
    return rank, world


def finish_baseline(config: TrainConfig, rank: int, stats: dict) -> int:
    """Write the rank's statistics (``stats`` holds its ``held_state`` census, taken right after its steps) and
    leave the process group."""
    write_stats(config, rank, {"rank": rank, "role": "worker", "index": rank} | stats)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def save_final(config: TrainConfig, layout: Layout, flats: list[torch.Tensor], step: int) -> None:
    """Write full parameters as a checkpoint of the servers' state without moments (how the baselines hand back
    their result)."""
    save_parameters(config.checkpoint_dir, layout, flats, step)
