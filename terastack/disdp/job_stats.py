"""A job's figures: every rank writes its statistics file, the launcher reads them all back into one summary."""
from __future__ import annotations

import gc
import json
import statistics
from pathlib import Path

import torch

from terastack.atomic import atomic_write_json
from terastack.disdp.train_config import TrainConfig


def optimizer_state_bytes() -> int:
    """Bytes of optimizer state held by live ``torch.optim`` optimizers in this process."""
    total = 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer):
            for state in obj.state.values():
                for t in state.values():
                    if isinstance(t, torch.Tensor):
                        t = t.to_local() if hasattr(t, "to_local") else t   # a DTensor's local shard
                        total += t.numel() * t.element_size()
    return total


def stats_dir(config: TrainConfig) -> Path:
    return Path(config.run_dir) / "stats"


def stats_path(config: TrainConfig, rank: int) -> Path:
    return stats_dir(config) / f"rank-{rank}.json"


def write_stats(config: TrainConfig, rank: int, stats: dict) -> None:
    path = stats_path(config, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, stats)


def collect_stats(config: TrainConfig, world_size: int) -> dict:
    """The job's figures from every rank's statistics file."""
    roles = config.roles()
    per_rank = {}
    for rank in range(world_size):
        path = stats_path(config, rank)
        if path.exists():
            per_rank[rank] = json.loads(path.read_text())
    workers = [per_rank[r] for r in range(roles.workers) if r in per_rank]
    servers = [per_rank[roles.server_rank(s)] for s in range(roles.servers)
               if per_rank.get(roles.server_rank(s), {}).get("role") == "server"]
    out: dict = {"workers": roles.workers, "servers": roles.servers, "aggregator": roles.aggregator,
                 "agents": roles.agents, "steps": config.steps}
    if workers:
        n = min(len(w["step_s"]) for w in workers)
        step = [max(w["step_s"][i] for w in workers) for i in range(n)]
        # [Note: exposed communication] In a synchronous step the worker that finishes its backward first
        # also waits for the slowest one (load imbalance, not communication). The worker that waits least
        # is the one on the critical path; its waits are the communication the step could not hide.
        # Both figures are reported, for every system alike.
        wait = [min(w["wait_s"][i] for w in workers) for i in range(n)]
        wait_any = [max(w["wait_s"][i] for w in workers) for i in range(n)]
        steady = slice(1, None) if n > 1 else slice(None)   # the first step pays start-up costs
        out["step_s"] = statistics.median(step[steady])
        out["exposed_comm_fraction"] = sum(wait[steady]) / sum(step[steady])
        out["exposed_comm_fraction_incl_imbalance"] = sum(wait_any[steady]) / sum(step[steady])
        out["loss"] = [statistics.fmean(w["loss"][i] for w in workers) for i in range(n)]
        out["comm_s"] = statistics.median(wait[steady])
        # [Note: state a worker holds] in terastack.disdp.held_state: the census of the worker that holds most
        if all(w.get("held_state") is not None for w in workers):
            held = max((w["held_state"] for w in workers), key=lambda h: h["bytes"])
            out["worker_state_bytes"], out["worker_held_state"] = held["bytes"], held
        for key, field in (("worker_peak_param_bytes", "peak_param_bytes"), ("model_param_bytes", "model_param_bytes"),
                           ("worker_param_bytes_after_run", "param_bytes_after_run")):
            if all(field in w for w in workers):
                out[key] = max(w[field] for w in workers)
    if servers:
        n = min(len(s["ingress_bytes"]) for s in servers)
        out["server_ingress_bytes_per_step"] = max(max(s["ingress_bytes"][1:n] or s["ingress_bytes"][:n])
                                                   for s in servers)
        out["server_optimizer_bytes"] = sum(s["optimizer_state_bytes"] for s in servers)
        out["server_update_s"] = max(s["update_s"] for s in servers)
    out["per_rank"] = per_rank
    return out
