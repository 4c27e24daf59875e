"""What every system of ``terastack bench dist --model`` trains: one :class:`BenchSpec` (the model, the global
batch, the steps, the roles), the same token batches and the same initial weights on every rank of every system.

[Note: the benchmark's initial weights]
Every tensor's initial values are a function of its name and the seed alone (:func:`init_tensor`): normal with
the model's ``initializer_range`` for matrices, ones for norm weights, zeros for biases. So each rank makes only
the slices it owns, one tensor at a time (a parameter server its shard, an FSDP2 rank its chunk), no process
ever holds the whole model to start, and the memory a system is measured at is the memory its training takes;
yet every system starts from the same weights (their first losses agree).
"""
from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SYSTEMS = ("terastack", "fsdp2", "zero3")
#: the figures' file every rank of a benchmark system writes into its run directory
STATS_DIR = "stats"


@dataclass(kw_only=True, slots=True)
class BenchSpec:
    """One system's run: what its ranks read back from ``spec.json``."""

    system: str
    #: a built-in name (``terastack.training.model_registry``), a model directory or a config.json
    model: str
    run_dir: str
    workers: int = 2
    servers: int = 1
    aggregator: bool = True
    #: rows of the global batch (split evenly among the workers)
    batch_size: int = 4
    seq_len: int = 128
    #: timed steps, after ``warmup`` steps that are not
    steps: int = 3
    warmup: int = 1
    seed: int = 0
    lr: float = 1e-4
    #: the terastack servers' state: "ssd" (the tiered store) or "memory"
    state: str = "ssd"
    prefetch: int = 1
    reshard: bool = True
    threads: int = 1
    timeout_s: float = 600.0
    #: with a directory: every rank of the terastack system writes its Chrome trace there (``--trace``)
    trace_dir: str = ""

    def __post_init__(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"system: must be one of {', '.join(SYSTEMS)}; got {self.system!r}")
        for name in ("workers", "servers", "batch_size", "seq_len", "steps", "prefetch", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if self.batch_size % self.workers:
            raise ValueError(f"batch_size: the global batch of {self.batch_size} rows does not split evenly among "
                             f"{self.workers} workers (every system gets the same rows per worker)")
        if self.state not in ("ssd", "memory"):
            raise ValueError(f"state: must be ssd or memory, got {self.state!r}")

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def save(self) -> Path:
        path = Path(self.run_dir) / "spec.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: str) -> "BenchSpec":
        return cls(**json.loads(Path(path).read_text()))

    def hf_config(self):
        from terastack.training.model_registry import resolve_model

        return resolve_model(self.model)[0]

    def job(self):
        """The job the terastack system runs (the job file's sections, as ``terastack dist train`` reads them)."""
        from terastack.training.job import JobConfig

        return JobConfig(
            model={"path": self.model},
            training={"seq_len": self.seq_len, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed,
                      "steps": self.total_steps},
            disdp={"workers": self.workers, "servers": self.servers, "aggregator": self.aggregator,
                   "state": self.state, "run_dir": self.run_dir, "prefetch": self.prefetch, "reshard": self.reshard,
                   "timeout_s": self.timeout_s, "threads": self.threads, "progress": False})


def global_batch(spec: BenchSpec, step: int, vocab: int) -> torch.Tensor:
    """The token rows of ``step`` (every system, every rank: a function of the seed and the step)."""
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + step)
    return torch.randint(0, vocab, (spec.batch_size, spec.seq_len), generator=gen)


def worker_rows(spec: BenchSpec, step: int, vocab: int, worker: int) -> torch.Tensor:
    rows = spec.batch_size // spec.workers
    return global_batch(spec, step, vocab)[worker * rows:(worker + 1) * rows]


def init_tensor(name: str, shape, *, seed: int, std: float) -> torch.Tensor:
    """Parameter ``name``'s initial values ([Note: the benchmark's initial weights])."""
    shape = tuple(shape)
    if len(shape) == 1:
        return torch.ones(shape) if name.endswith("weight") and "norm" in name else torch.zeros(shape)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape).normal_(0.0, std, generator=gen)


def init_std(hf_config) -> float:
    return float(getattr(hf_config, "initializer_range", 0.02))


def write_rank_stats(spec: BenchSpec, rank: int, stats: dict) -> None:
    from terastack.atomic import atomic_write_json

    path = Path(spec.run_dir) / STATS_DIR / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, stats)


def read_rank_stats(run_dir: str) -> list[dict]:
    folder = Path(run_dir) / STATS_DIR
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank-*.json"))] if folder.exists() else []
