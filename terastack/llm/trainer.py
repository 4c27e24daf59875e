"""Trainer: fine-tune a Hugging Face causal LM whose training state is larger than memory.

    from terastack.llm import Trainer, TrainerConfig
    cfg = TrainerConfig(store_dir="/nvme/run", device_budget="8GiB", host_budget="32GiB", lr=1e-5)
    with Trainer.from_pretrained("/models/llama-7b", cfg) as trainer:
        for batch in batches:
            loss = trainer.step(batch)          # one AdamW step; equals plain PyTorch training
        trainer.save_pretrained("/models/llama-7b-tuned")

[Note: the step schedule]
One step is one loop over the units, written as prologue / steady state /
epilogue:

prologue      prefetch the first unit's weights (after its pending update)
forward       per unit: prefetch next, acquire, compute, save activations by
              policy, release (the model's own forward drives the order)
backward      per unit, in reverse: prefetch previous (weights + swapped
              activations), acquire, recompute if planned, gradients, release,
              hand gradients to the optimizer thread (eager: its update starts)
epilogue      deferred/after_backward: global norm, updates scheduled in forward
              order (after_backward: awaited); sweep unused prefetches

Updates that are still running when ``step`` returns overlap with the next
step's forward; a unit's weights are fetched only after their update is done,
and anything that reads the weights (checkpoints, export) waits for all.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from pathlib import Path

import torch

from terastack import trace
from terastack.llm.config import MEMORY_BUDGET_ENV, TrainerConfig
from terastack.llm import records
from terastack.llm.fetch import WeightFetcher
from terastack.llm.model import (CheckpointReader, TESTED_FAMILIES, build_skeleton, checkpoint_key, find_units,
                                 load_hf_config, random_init, set_submodule)
from terastack.llm.optimizer import OffloadedAdamW
from terastack.llm.runtime import StepRuntime
from terastack.llm.units import StreamedUnit, UnitRunner
from terastack.plan.llm_planner import LLMPlanner
from terastack.tiers import State, Tier, TieredStore
from terastack.units import format_bytes

#: initial weights in flight to the SSD at once while the store is filled
_FILL_IN_FLIGHT = 256 << 20


@dataclasses.dataclass(slots=True)
class StepStats:
    step: int
    loss: float
    seconds: float
    tokens: int
    ssd_read_bytes: int
    ssd_write_bytes: int
    device_in_bytes: int
    grad_norm: float | None


class Trainer:
    """Offloaded fine-tuning of one causal LM. Build it with :meth:`from_pretrained`, :meth:`from_config` or
    :meth:`load_checkpoint`."""

    def __init__(self, model, hf_config, config: TrainerConfig, *, name: str, source: "CheckpointReader | None",
                 resume_state: dict | None = None, lora=None, source_dir: str | None = None):
        self.config = config
        self.source_dir = source_dir          # tokenizer files are copied from here on export
        self.resumed_extra: dict = {}         # what the writer of a resumed checkpoint stored with it
        self.hf_config = hf_config
        self.name = name
        self.model = model
        self.lora = lora
        self.device = _resolve_device(config.device)
        self.compute_dtype = _resolve_dtype(config.dtype, self.device)
        # [Note: inline updates without an accelerator]
        self.inline_updates = (self.device.type != "cuda" if config.inline_updates is None
                               else bool(config.inline_updates))
        self.units, self.tensors = find_units(model)
        self.family = getattr(hf_config, "model_type", "?")
        if self.family not in TESTED_FAMILIES:
            import warnings

            warnings.warn(f"{self.family} models are not among the families tested against plain PyTorch training "
                          f"({', '.join(TESTED_FAMILIES)}); units were found generically", stacklevel=3)
        self.step_count = 0
        self.history: list[StepStats] = []
        self._closed = False
        self._failed: BaseException | None = None
        self.runtime = StepRuntime(store=None, units=self.units, tensors=self.tensors, plan=None, policies={},
                                   compute_dtype=self.compute_dtype, timeout=config.timeout)
        self.runtime.chunk = config.optimizer_chunk
        for unit in self.units:
            set_submodule(model, unit.path, StreamedUnit(unit, self.runtime))
        if self.device.type == "cuda":
            for unit in self.units:
                unit.buffers = {k: v.to(self.device) for k, v in unit.buffers.items()}
            self._move_skeleton_buffers()
        # ---- plan
        from terastack.llm.profile import profile_model

        self.hardware = _hardware(config, self.device)
        self.profile = profile_model(self, batch=config.batch_size, seq_len=config.seq_len,
                                     compute_bytes=torch.empty((), dtype=self.compute_dtype).element_size(),
                                     name=name, calibrate=config.calibrate, device=self.device)
        self.planner, self.plan = self._make_plan()
        self.runtime.chunk = self.plan.optimizer_chunk
        self.runtime.plan = self.plan
        self.runtime.policies = {u.name: p for u, p in zip(self.profile.units, self.plan.policies)}
        kept_units = set(self.plan.retained_units)
        self.runtime.retained = {c for u in self.units if u.path in kept_units for c in u.tensors.values()
                                 if self.tensors[c].trainable and self.plan.state_home.get(c) == "ssd"}
        # ---- store
        self.run_dir = _make_run_dir(config.store_dir, self._ssd_bytes_needed())
        store = TieredStore(TieredStore.Config(
            root=str(self.run_dir), device_budget=self.plan.device_capacity,
            host_budget=self.plan.host_capacity - self.plan.grad_pool_bytes,
            device="cuda" if self.device.type == "cuda" else "cpu", copy_on_write=False))
        self.store = self.runtime.store = store
        try:
            self.runtime.device = store.device
            self.runtime.fetcher = WeightFetcher(self.runtime, self.units, depth=self.plan.prefetch_depth)
            self.runtime.fetcher.order = [next(u.index for u in self.units if u.path == p.name)
                                          for p in self.profile.units]
            self.runtime.fetcher._pos = {u: i for i, u in enumerate(self.runtime.fetcher.order)}
            self.runtime.runner = UnitRunner(self.runtime)
            self.optimizer = self.runtime.optimizer = OffloadedAdamW(
                config.optimizer_config(), self.runtime, self.tensors, grad_pool_bytes=self.plan.grad_pool_bytes,
                masters_bytes=self.plan.masters_bytes, writeback_bytes=self.plan.writeback_bytes,
                read_ahead_bytes=self.plan.read_ahead_bytes, inline=self.inline_updates)
            if resume_state is None:
                self._fill(source)
            else:
                self._fill_from_checkpoint(resume_state)
        except BaseException:
            self.close()
            raise

    def _make_plan(self):
        """The planner and its plan; a single memory budget is split where the plan predicts the fastest step."""
        from terastack.plan.llm_planner import PlanError

        config = self.config

        def planner_for(device_budget: int, host_budget: int) -> LLMPlanner:
            return LLMPlanner(LLMPlanner.Config(
                device_budget=device_budget, host_budget=host_budget, policy=config.activation_policy,
                mode=config.optimizer_mode, prefetch_depth=config.prefetch_depth,
                state_placement=config.state_placement, optimizer_chunk=config.optimizer_chunk,
                retain_weights=config.retain_weights, inline_updates=self.inline_updates))

        if config.memory_budget is None:
            planner = planner_for(*_budgets(config, self.device))
            return planner, planner.plan(self.profile, self.hardware)
        if self.device.type == "cuda":
            raise ValueError("memory_budget: only without an accelerator (give device_budget and host_budget)")
        _return_freed_memory()
        missing = [k for k in MEMORY_BUDGET_ENV if k not in os.environ]
        if missing:
            import warnings

            warnings.warn("memory_budget: for a strict bound on resident memory start the process with "
                          + " ".join(f"{k}={v}" for k, v in MEMORY_BUDGET_ENV.items()), stacklevel=3)
        # [Note: a memory budget bounds resident memory] the interpreter's own allocations (Python objects,
        # thread stacks, allocator slack) get a tenth; the tiers split the rest
        total = config.memory_budget - config.memory_budget // 10
        best, error = None, None
        for share in range(10, 95, 5):
            planner = planner_for(total * share // 100, total - total * share // 100)
            try:
                plan = planner.plan(self.profile, self.hardware)
            except PlanError as exc:
                if error is None or exc.shortfall < error.shortfall:
                    error = exc
                continue
            if best is None or plan.prediction.step_s < best[1].prediction.step_s:
                best = (planner, plan)
        if best is None:
            raise PlanError("memory", needed=total + error.shortfall, available=total, limit=total,
                            what=f"{self.name} with the best split between device and host tiers ({error})")
        return best

    # ------------------------------------------------------------ builders
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, config: TrainerConfig | None = None) -> "Trainer":
        """Fine-tune the checkpoint in ``path`` (a local Hugging Face directory with safetensors)."""
        config = config or TrainerConfig()
        hf_config = load_hf_config(path)
        reader = CheckpointReader(path)
        model = build_skeleton(hf_config, dtype=_resolve_dtype(config.dtype, _resolve_device(config.device)))
        lora = None
        if config.lora is not None:
            from terastack.llm.lora import apply_lora

            model, lora = apply_lora(model, config.lora, base_path=str(path))
        return cls(model, hf_config, config, name=str(path), source=reader, lora=lora, source_dir=str(path))

    @classmethod
    def from_config(cls, hf_config, config: TrainerConfig | None = None, *, name: str | None = None) -> "Trainer":
        """Train ``hf_config``'s model from a random initialization written straight to the store."""
        config = config or TrainerConfig()
        if config.lora is not None:
            raise ValueError("lora: adapters are trained on a pretrained base; use Trainer.from_pretrained")
        model = build_skeleton(hf_config, dtype=_resolve_dtype(config.dtype, _resolve_device(config.device)))
        return cls(model, hf_config, config, name=name or f"{hf_config.model_type} (random init)", source=None)

    @classmethod
    def load_checkpoint(cls, path: str | os.PathLike, config: TrainerConfig | None = None, *,
                        expect_model=None) -> "Trainer":
        """Resume from :meth:`save_checkpoint`'s directory. ``expect_model``: a config the checkpoint must match."""
        from terastack.llm.checkpoint import load_checkpoint

        return load_checkpoint(cls, path, config or TrainerConfig(), expect_model=expect_model)

    # ---------------------------------------------------------------- step
    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"lr: must be >= 0, got {value}")
        self.optimizer.lr = float(value)

    def step(self, input_ids, labels=None, attention_mask=None) -> float:
        """One optimizer step on a batch of token ids (batch, seq); returns the loss. See [Note: the step
        schedule]."""
        self._check_open()
        ids = self._as_batch(input_ids, "input_ids")
        labels = ids if labels is None else self._as_batch(labels, "labels")
        if attention_mask is not None:
            attention_mask = self._as_batch(attention_mask, "attention_mask")
        try:
            return self._step(ids, labels, attention_mask)
        except BaseException as exc:
            # A step that failed half-way leaves weights fetched, activations stashed and updates half done:
            # this trainer is not used again (its last checkpoint is the way back).
            self._failed = exc
            raise

    def _step(self, ids, labels, attention_mask) -> float:
        rt = self.runtime
        io0 = self.store.engine.stats.snapshot()
        fetched0 = rt.fetcher.bytes_in
        t0 = time.perf_counter()
        with trace.span(f"step {self.step_count}", track="step"):
            # prologue
            self.optimizer.begin_step()
            rt.fetcher.begin_forward()
            for u in rt.fetcher.first_units():
                rt.fetcher.prefetch(u)
            # steady state: the model's forward and autograd's backward drive the units
            with trace.span("forward", track="phase"):
                out = self.model(input_ids=ids, labels=labels, attention_mask=attention_mask, use_cache=False)
            rt.fetcher.end_forward()
            self.optimizer.begin_backward()
            with trace.span("backward", track="phase"):
                out.loss.backward()
            # epilogue
            with trace.span("epilogue", track="phase"):
                self.optimizer.end_step()
                rt.fetcher.sweep()
        loss = float(out.loss.detach())
        del out
        io1 = self.store.engine.stats.snapshot()
        self.step_count += 1
        stats = StepStats(step=self.step_count, loss=loss, seconds=time.perf_counter() - t0, tokens=ids.numel(),
                          ssd_read_bytes=io1["bytes_read"] - io0["bytes_read"],
                          ssd_write_bytes=io1["bytes_written"] - io0["bytes_written"],
                          device_in_bytes=rt.fetcher.bytes_in - fetched0, grad_norm=self.optimizer.last_grad_norm)
        self.history.append(stats)
        return loss

    @torch.no_grad()
    def loss(self, input_ids, labels=None) -> float:
        """The loss of a batch without training on it (weights streamed as in training)."""
        self._check_open()
        self.synchronize()
        ids = self._as_batch(input_ids, "input_ids")
        labels = ids if labels is None else self._as_batch(labels, "labels")
        self.runtime.fetcher.begin_forward()
        out = self.model(input_ids=ids, labels=labels, use_cache=False)
        self.runtime.fetcher.sweep()
        return float(out.loss)

    def _as_batch(self, x, what: str) -> torch.Tensor:
        t = torch.as_tensor(x)
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2:
            raise ValueError(f"{what}: expected a (batch, seq) tensor of token ids, got shape {tuple(t.shape)}")
        if t.shape[0] * t.shape[1] > self.config.batch_size * self.config.seq_len or t.shape[1] > self.config.seq_len:
            raise ValueError(f"{what}: batch shape {tuple(t.shape)} exceeds the planned "
                             f"({self.config.batch_size}, {self.config.seq_len}); set TrainerConfig.batch_size/"
                             "seq_len to the largest batch you will train on")
        vocab = getattr(self.hf_config, "vocab_size", None)
        if what != "attention_mask" and vocab is not None and t.numel():
            lo, hi = int(t.min()), int(t.max())
            if hi >= vocab or (lo < 0 and not (what == "labels" and lo == -100)):
                raise ValueError(f"{what}: token ids must be in [0, {vocab}) for this model, got [{lo}, {hi}]")
        return t.to(self.device, torch.long)

    # ------------------------------------------------------------- weights
    def synchronize(self) -> None:
        """Wait for every update and write in flight."""
        self.optimizer.synchronize()
        self.store.wait(timeout=self.config.timeout)

    def parameter(self, name: str) -> torch.Tensor:
        """A copy of parameter ``name`` (fp32 master if it trains, else its stored weight)."""
        self._check_open()
        self.synchronize()
        if name not in self.tensors:
            raise KeyError(f"no parameter named {name!r}")
        info = self.tensors[name]
        rt = self.runtime
        if info.trainable:
            parts = [self._read_record(r).reshape(-1) for r in rt.master_records(name)]
            return torch.cat(parts).view(info.shape) if len(parts) > 1 else parts[0].view(info.shape)
        return self._read_record(records.compute(name)).to(torch.float32)

    def _read_record(self, record: str) -> torch.Tensor:
        """A CPU copy of a record; a resident working copy is read where it is and stays there."""
        rt = self.runtime
        if self.store.record(record).state is State.RESIDENT:
            return self.store.tensor(record).to("cpu", copy=True)
        t = rt.wait(rt.with_room(lambda: self.store.prefetch(record, Tier.HOST), f"reading {record!r}"),
                    f"{record!r} from the SSD").clone()
        rt.track_write(self.store.evict(record))
        return t

    def named_parameters(self):
        """(name, fp32 copy) for every parameter, one at a time."""
        for name in sorted(self.tensors, key=lambda n: self.tensors[n].index):
            yield name, self.parameter(name)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter as an fp32 copy (small models only: it materializes the whole model)."""
        return dict(self.named_parameters())

    def optimizer_state(self, name: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(exp_avg, exp_avg_sq, step) of a trainable parameter (copies)."""
        self.synchronize()
        rt = self.runtime
        shape = self.tensors[name].shape
        m, v = (torch.cat([self._read_record(r) for r in rt.moment_records(name, w)]).view(shape) for w in (1, 2))
        return m, v, self.optimizer.steps[name]

    def save_checkpoint(self, path: str | os.PathLike, *, extra: dict | None = None) -> Path:
        """A consistent snapshot of weights, optimizer state and step, written atomically into ``path``
        (see [Note: checkpoint layout and atomicity]). ``extra`` (JSON) comes back as ``resumed_extra``."""
        from terastack.llm.checkpoint import save_checkpoint

        self._check_open()
        return save_checkpoint(self, path, extra=extra)

    def save_pretrained(self, path: str | os.PathLike, *, dtype: str | None = None) -> Path:
        """Export a directory ``transformers`` (or, for LoRA, ``peft``) loads."""
        from terastack.llm.checkpoint import export_pretrained

        self._check_open()
        return export_pretrained(self, path, dtype=dtype)

    # --------------------------------------------------------------- usage
    def usage(self) -> dict:
        """Ledger use and peaks: device and host tiers, gradient pool."""
        out = self.store.usage()
        out["grad_pool"] = self.optimizer.grad_pool.snapshot()
        return out

    def describe_plan(self) -> str:
        return self.plan.describe(self.profile)

    # ------------------------------------------------------------- closing
    def close(self) -> None:
        """Stop the optimizer thread, close the store and remove this run's scratch directory."""
        if self._closed:
            return
        self._closed = True
        opt = getattr(self, "optimizer", None)
        if opt is not None:
            opt.close()
        store = getattr(self, "store", None)
        if store is not None:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - closing after a failure must still remove the scratch dir
                pass
        run_dir = getattr(self, "run_dir", None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        if self._failed is not None:
            raise RuntimeError(f"a step of this Trainer failed ({type(self._failed).__name__}: {self._failed}); "
                               "start again from its last checkpoint (Trainer.load_checkpoint)")

    # ---------------------------------------------------------- filling in
    def _move_skeleton_buffers(self) -> None:
        for mod in self.model.modules():
            for name, buf in list(mod._buffers.items()):
                if buf is not None and buf.device.type != "meta":
                    mod._buffers[name] = buf.to(self.device)

    def _ssd_bytes_needed(self) -> int:
        plan, prof = self.plan, self.profile
        cb = prof.compute_bytes
        need = 0
        for name, n in prof.tensor_numel.items():
            # every record gets an SSD extent at the latest when it is first written back or committed
            if prof.tensor_trainable[name]:
                need += n * 12 + (n * cb if prof.mixed_precision else 0) + n * 4  # + a spilled gradient
            else:
                need += n * cb
        need += sum(u.act_bytes for u, p in zip(prof.units, plan.policies) if p == "ssd")
        return need

    def _records_for(self, name: str) -> list[tuple[str, torch.dtype, Tier, tuple, tuple | None]]:
        """(record, dtype, home, shape, flat range or None for a whole tensor) of every record of ``name``."""
        info = self.tensors[name]
        plan = self.plan
        rt = self.runtime
        out = []
        if info.trainable:
            home = Tier(plan.state_home[name])
            ranges = rt.chunk_ranges(name)
            if rt.master_is_compute:
                out.append((records.master(name), torch.float32, home, info.shape, None))
            else:
                out += [(r, torch.float32, home, (hi - lo,), (lo, hi))
                        for r, (lo, hi) in zip(rt.master_records(name), ranges)]
                out.append((rt.compute_record(name), self.compute_dtype, Tier(plan.compute_home[name]), info.shape,
                            None))
            for which in (1, 2):
                out += [(r, torch.float32, home, (hi - lo,), (lo, hi))
                        for r, (lo, hi) in zip(rt.moment_records(name, which), ranges)]
        else:
            out.append((rt.compute_record(name), self.compute_dtype, Tier(plan.compute_home[name]), info.shape, None))
        return out

    def _put_weights(self, name: str, tensor: torch.Tensor, in_flight: list) -> None:
        info = self.tensors[name]
        if tuple(tensor.shape) != info.shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)} in the checkpoint; the model "
                             f"expects {info.shape}")
        flat = tensor.reshape(-1)
        for record, dtype, home, shape, span in self._records_for(name):
            if records.kind(record) in (records.EXP_AVG, records.EXP_AVG_SQ):
                self.store.create(record, shape, dtype, home=home)
                continue
            data = (tensor if span is None else flat[span[0]:span[1]]).to(dtype).contiguous()
            fut = self.store.put(record, data, home=home)
            in_flight.append((fut, data.numel() * data.element_size()))
        while sum(n for _, n in in_flight) > _FILL_IN_FLIGHT:
            fut, _ = in_flight.pop(0)
            self.runtime.wait(fut, f"initial weights of {name!r} reaching the SSD")

    def _fill(self, source: "CheckpointReader | None") -> None:
        """Write every weight into the store, one tensor at a time, and create zero moments."""
        in_flight: list = []
        if source is None:
            for name, tensor in random_init(self.model, self.units, self.tensors, self.config.seed):
                self._put_weights(name, tensor, in_flight)
        else:
            keys = set(source.keys())
            prefix = getattr(self.model, "base_model_prefix", "")
            pending_lora = []
            for name in sorted(self.tensors, key=lambda n: self.tensors[n].index):
                key = checkpoint_key(keys, name, prefix)
                if key is None and self.lora is not None:
                    key = self.lora.base_key(keys, name, prefix)
                if key is None:
                    if self.lora is not None and self.lora.is_adapter(name):
                        pending_lora.append(name)
                        continue
                    raise ValueError(f"checkpoint {source.path} has no tensor for parameter {name!r}")
                self._put_weights(name, source.get(key).to(torch.float32), in_flight)
            if pending_lora:
                for name, tensor in self.lora.initial_adapter(self.model, self.units, self.tensors, pending_lora,
                                                              self.config.seed):
                    self._put_weights(name, tensor, in_flight)
            source.close()
        for fut, _ in in_flight:
            self.runtime.wait(fut, "initial weights reaching the SSD")

    def _fill_from_checkpoint(self, state: dict) -> None:
        from terastack.llm.checkpoint import fill_from_checkpoint

        fill_from_checkpoint(self, state)


# ------------------------------------------------------------------ helpers
def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def _budgets(config: TrainerConfig, device: torch.device) -> tuple[int, int]:
    from terastack.memory import mem_total

    device_budget, host_budget = config.device_budget, config.host_budget
    if device_budget == "auto":
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            device_budget = int(free * 0.9)
        else:
            device_budget = 1 << 30
    if host_budget == "auto":
        host_budget = max(256 << 20, mem_total() // 4)
    return int(device_budget), int(host_budget)


def _hardware(config: TrainerConfig, device: torch.device):
    """The machine the plan is made for: a given probe file, the cached probe, or quick measurements."""
    import json

    from terastack.plan.hardware import Hardware, load_probe

    if config.hardware:
        try:
            return Hardware.from_dict(json.loads(Path(config.hardware).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"hardware: cannot read probe file {config.hardware} ({exc})") from None
    hw = load_probe()
    if hw is not None:
        return hw
    from terastack.probe import measure_cpu_adam, measure_cpu_flops, measure_memcpy
    from terastack.memory import mem_total

    return Hardware(name="this machine (quick measurements; run `terastack probe` for SSD figures)", measured=True,
                    cores=os.cpu_count() or 1, host_memory_bytes=mem_total(),
                    cpu_flops=0.0 if config.calibrate else measure_cpu_flops(0.1, 512),
                    memcpy_bytes_per_s=measure_memcpy(0.05, 16 << 20),
                    cpu_adam_params_per_s=measure_cpu_adam(0.1, 1 << 20), ssd_read_bytes_per_s=1e9,
                    ssd_write_bytes_per_s=1e9)


def _return_freed_memory() -> None:
    """[Note: a memory budget bounds resident memory]

    A memory budget (CPU, ``TrainerConfig.memory_budget``) is a promise about
    resident memory, not only about the ledgers. glibc keeps freed blocks in
    its heaps and per-thread arenas and raises its mmap threshold as large
    blocks are freed, so a process whose tensors come and go keeps growing
    past what it uses. Blocks of 256 KiB and more are therefore always mmapped
    (returned to the OS when freed) and arenas are capped, at the price of
    page faults on fresh activations. Set here with mallopt, the settings miss
    the arenas threads made before; in the environment at process start
    (``MEMORY_BUDGET_ENV``) they cover everything: measured on the bench model,
    peak RSS 0.84 GB with mallopt only, 0.56 GB from the start, for a 0.62 GB
    budget. The setting is process-wide and made only when a memory budget is
    given.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 256 << 10)  # M_MMAP_THRESHOLD (also stops the threshold from growing)
        libc.mallopt(-8, 2)          # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: its allocator has its own policy


def _make_run_dir(store_dir: str, ssd_bytes: int) -> Path:
    root = Path(store_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        run_dir = root / f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir()
    except OSError as exc:
        raise PermissionError(f"store_dir {root} is not usable: {exc.strerror or exc}") from None
    if not os.access(run_dir, os.W_OK):
        shutil.rmtree(run_dir, ignore_errors=True)
        raise PermissionError(f"store_dir {root} is not writable")
    free = shutil.disk_usage(run_dir).free
    if free < ssd_bytes:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise OSError(28, f"store_dir {root} has {format_bytes(free)} free; the plan keeps up to "
                          f"{format_bytes(ssd_bytes)} of training state there")
    return run_dir
