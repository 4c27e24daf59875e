"""Data-parallel GNN training over torch.distributed: every rank trains on its share of each batch's seeds and
DistributedDataParallel averages the gradients.

[Note: data-parallel GNN training]
``terastack gnn train --nproc N`` starts N ranks on this machine under torchrun's elastic agent
(terastack.gnn.training.multi_process); the same command run by an outer ``torchrun --nnodes M --nproc-per-node K``
finds the rank torchrun gave it (``RANK``/``WORLD_SIZE`` in the environment) and runs as that rank.
Every rank opens the same dataset directory, pre-samples with the same seeds and fills its own cache from
``--host-cache`` (the budget is per rank), so every rank cuts the epoch into the same global batches;
rank r of W samples and trains on seeds r, r+W, ... of each (terastack.gnn.sampling.pipeline; a last global
batch with fewer than W seeds is dropped, so every rank makes the same number of steps). The model is
wrapped in ``DistributedDataParallel`` (gloo on the CPU, NCCL when every rank has a GPU of its own): a
step's gradients are averaged over the ranks, so with equal shares the update is the one a single process
makes for the mean loss over the global batch's seeds, and the parameters stay identical on every rank
(``check_sync`` gathers them after every step and records the largest difference; the tests require 0).
Evaluation runs on every rank over the whole held-out sets with the unwrapped model (identical weights, no
collectives); rank 0 reports and saves the model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's place in the job (rank 0 of 1 when torch.distributed is not initialized)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


def current_ranks() -> Ranks:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return Ranks()


def wrap(model: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when there are several ranks (else unchanged)."""
    if not ranks.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" \
        else None
    # a relation with no sampled edge in a batch still uses its weights (empty products), so no parameter is unused
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


class SyncCheck:
    """After every step: every rank's parameters gathered and compared; ``max_diff`` is the largest difference."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap(model)
        self.max_diff = 0.0
        self.steps = 0

    def __call__(self) -> None:
        import torch.distributed as dist

        flat = torch.cat([p.detach().reshape(-1).double() for p in self.model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        self.max_diff = max(self.max_diff, max(float((g - flat).abs().max()) for g in gathered))
        self.steps += 1

    def to_dict(self) -> dict:
        return {"max_param_diff": self.max_diff, "steps_checked": self.steps}


def checked_step(step, check: SyncCheck | None):
    """``step`` followed by ``check()`` (when given): the training step of a job that checks its ranks agree."""
    if check is None:
        return step

    def run(model, optimizer, data) -> float:
        loss = step(model, optimizer, data)
        check()
        return loss
    return run
