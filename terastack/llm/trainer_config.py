"""TrainerConfig: every knob of the offloading trainer, validated, loadable from TOML."""
from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass

from terastack.configfile import config_from_dict, read_toml_table
from terastack.units import parse_bytes

ACTIVATION_POLICIES = ("auto", "keep", "host", "ssd", "recompute")
#: glibc settings for a memory budget, best in the environment at process start (the bench's small-budget run
#: starts its process with them); see [Note: a memory budget bounds resident memory] (terastack.memory)
MEMORY_BUDGET_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(256 << 10)}


@dataclass(kw_only=True, slots=True)
class LoraSpec:
    """LoRA through ``peft``: only adapter weights (and their optimizer state) train; the base is read-only."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    #: module names to adapt (peft's ``target_modules``); "auto": peft's default for the family
    target_modules: tuple[str, ...] | str = "auto"
    #: a peft adapter directory to start from (adapter_model.safetensors); None: peft's initialization
    init_from: str | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r: must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha: must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, list):
            self.target_modules = tuple(self.target_modules)


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    #: where the training state lives (an SSD); a fresh subdirectory is made per run and removed on close.
    #: Several directories (one per SSD): a list, or one string with commas between them; kept as that string
    store_dir: str | list[str] = dataclasses.field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "terastack-llm"))
    #: accelerator memory terastack may use ("auto": 90% of the GPU, or 1 GiB of host memory without one)
    device_budget: int | str = "auto"
    #: host memory terastack may use for training state and working sets ("auto": a quarter of RAM)
    host_budget: int | str = "auto"
    #: without an accelerator, one budget for both tiers (both are host memory); the planner splits it
    memory_budget: int | str | None = None
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    #: global-norm gradient clipping (None: off); see the optimizer's [Note: clipping with eager updates]
    max_grad_norm: float | None = None
    #: compute dtype: "auto" (bfloat16 on a GPU, float32 on CPU), "float32" or "bfloat16"
    dtype: str = "auto"
    seed: int = 0
    #: the batch shape the plan is made for (a step with another shape is planned again)
    batch_size: int = 1
    seq_len: int = 256
    #: micro-batches per optimizer step (``Trainer.step_accumulated``); the plan holds their gradient sums within
    #: the budgets (see terastack.llm.engine.accumulate's [Note: gradient accumulation])
    grad_accum: int = 1
    #: batches pack several examples per row (``position_ids`` restarting at each example): the plan counts the
    #: block-diagonal attention mask such rows bring, and packed rows are refused without it
    packed: bool = False
    #: "auto" (the planner chooses per layer), one policy for every decoder layer ("keep", "host", "ssd",
    #: "recompute"), a comma-separated cycle of them over the decoder layers, or one policy per unit (a list)
    activation_policy: str | tuple = "auto"
    #: False runs the optimizer after the whole backward (the ablation of active gradient offloading)
    active_offload: bool = True
    #: eager updates on the training thread, right after each unit's backward (None: when computing on the CPU);
    #: see the optimizer's [Note: inline updates without an accelerator]
    inline_updates: bool | None = None
    prefetch_depth: int = 1
    #: "auto": state rests in host memory while the budget allows; "ssd": all of it on the SSD
    state_placement: str = "auto"
    optimizer_impl: str = "auto"
    #: elements per optimizer chunk: the optimizer reads and writes moments in pieces of this size
    optimizer_chunk: int = 1 << 20
    #: keep the updated weights of the first units in the device tier for the next forward, where they fit
    retain_weights: bool = True
    #: "auto", "cpu" or "cuda[:N]"
    device: str = "auto"
    #: time each distinct unit once on this machine so the plan predicts from measured times
    calibrate: bool = True
    #: a probe JSON (terastack probe --json) to plan with; None: the cached probe, else quick measurements
    hardware: str | None = None
    lora: LoraSpec | None = None
    #: every wait (a transfer, an update) gives up after this many seconds, naming what it waited for
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.store_dir, (list, tuple)):
            self.store_dir = ",".join(str(d) for d in self.store_dir)
        if not self.store_dir:
            raise ValueError("store_dir: a directory for the training state is required")
        if not all(d.strip() for d in self.store_dir.split(",")):
            raise ValueError(f"store_dir: {self.store_dir!r} names an empty directory")
        for name in ("device_budget", "host_budget"):
            value = getattr(self, name)
            if value != "auto":
                setattr(self, name, parse_bytes(value, field=name))
        if self.memory_budget is not None:
            self.memory_budget = parse_bytes(self.memory_budget, field="memory_budget")
            if self.device_budget != "auto" or self.host_budget != "auto":
                raise ValueError("memory_budget: give either memory_budget or device_budget/host_budget, not both")
        self.betas = tuple(float(b) for b in self.betas)
        self.optimizer_config()  # lr, betas, eps, weight_decay, max_grad_norm, optimizer_impl are its fields
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype: must be auto, float32 or bfloat16; got {self.dtype!r}")
        if self.batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"batch_size/seq_len: must be >= 1, got {self.batch_size}/{self.seq_len}")
        if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ValueError(f"grad_accum: must be an integer >= 1, got {self.grad_accum!r}")
        if isinstance(self.activation_policy, (list, tuple)):
            self.activation_policy = tuple(self.activation_policy)
            names = self.activation_policy
        else:
            names = [] if self.activation_policy == "auto" else self.activation_policy.split(",")
        bad = [p for p in names if p not in ACTIVATION_POLICIES or p == "auto"]
        if bad:
            raise ValueError(f"activation_policy: {bad[0]!r} is not one of {', '.join(ACTIVATION_POLICIES[1:])} "
                             f"(or auto)")
        if self.prefetch_depth < 0:
            raise ValueError(f"prefetch_depth: must be >= 0, got {self.prefetch_depth}")
        if self.state_placement not in ("auto", "ssd"):
            raise ValueError(f"state_placement: must be auto or ssd; got {self.state_placement!r}")
        if self.optimizer_chunk < 1024:
            raise ValueError(f"optimizer_chunk: must be >= 1024 elements, got {self.optimizer_chunk}")
        if self.device not in ("auto", "cpu") and not str(self.device).startswith("cuda"):
            raise ValueError(f"device: must be auto, cpu or cuda[:N]; got {self.device!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout: must be > 0 seconds, got {self.timeout}")
        if isinstance(self.lora, dict):
            self.lora = LoraSpec(**self.lora)

    def optimizer_config(self):
        """The optimizer's part of this config (validated by the optimizer's own Config)."""
        from terastack.llm.engine.optimizer import OffloadedAdamW

        try:
            return OffloadedAdamW.Config(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                         max_grad_norm=self.max_grad_norm, mode=self.optimizer_mode,
                                         impl=self.optimizer_impl, timeout=self.timeout)
        except ValueError as exc:
            msg = str(exc)
            raise ValueError("optimizer_" + msg if msg.startswith("impl:") else msg) from None

    @property
    def optimizer_mode(self) -> str:
        if not self.active_offload:
            return "after_backward"
        return "deferred" if self.max_grad_norm is not None else "eager"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        if isinstance(self.activation_policy, tuple):
            out["activation_policy"] = list(self.activation_policy)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "TrainerConfig":
        return config_from_dict(cls, data, what="trainer config")

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> "TrainerConfig":
        data = read_toml_table(path, "trainer")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
