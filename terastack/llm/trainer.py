"""Trainer: fine-tune a Hugging Face causal LM whose training state is larger than memory.

    from terastack.llm import Trainer, TrainerConfig
    cfg = TrainerConfig(store_dir="/nvme/run", device_budget="8GiB", host_budget="32GiB", lr=1e-5)
    with Trainer.from_pretrained("/models/llama-7b", cfg) as trainer:
        for batch in batches:
            loss = trainer.step(batch)          # one AdamW step; equals plain PyTorch training
        trainer.save_pretrained("/models/llama-7b-tuned")

Several micro-batches per AdamW step: ``TrainerConfig(grad_accum=4)`` and ``trainer.step_accumulated([{"input_ids":
..., "labels": ...}, ...])`` ([Note: gradient accumulation] in terastack.llm.engine.accumulate).

The step itself reads top to bottom in :func:`terastack.llm.engine.step.train_step` ([Note: the step schedule]).
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from terastack.llm.export import export_pretrained
from terastack.llm.engine import store_layout as layout
from terastack.llm.trainer_config import TrainerConfig
from terastack.training.job_runner import default_lr
from terastack.llm.machine import (discover_hardware, make_plan, resolve_device, resolve_dtype, setup_budget,
                                   store_settings)
from terastack.training.hf.keys import CheckpointKeys
from terastack.llm.model import TESTED_FAMILIES, find_decoder_stack, find_units
from terastack.llm.trainer_weights import TrainerWeights
from terastack.llm import vocab_slices
from terastack.training.hf.model_files import CheckpointReader, build_skeleton, check_packing, load_hf_config
from terastack.training.hf.sharded_writer import DEFAULT_MAX_SHARD_SIZE
from terastack.llm.engine.profile import profile_model, unit_times_path, with_stacked_times
from terastack.llm.engine.runtime import StepRuntime
from terastack.llm.engine.accumulate import stack_micro_batches
from terastack.llm.engine.byte_ledger import difference
from terastack.llm.engine.step import accumulated_step, eval_loss, finish_step, train_step
from terastack.llm.engine.step_points import StepPoint, batch_digest
from terastack.llm.step_checkpoint import FollowingCheckpoint, PendingStep
from terastack.training.data.examples import IGNORE
from terastack.llm.batch_check import BatchCheck
from terastack.llm.weight_fill import fill_store
from terastack.llm.trainer_checkpoints import TrainerCheckpoints
from terastack.llm.engine.family_check import check_family, needs_check
from terastack.llm.engine.streamed_units import install_units
from terastack.plan.accumulation_specs import accumulation_spec
from terastack.errors import Notice
from terastack.tiers import TieredStore
from terastack.training.engine_protocol import StepCount, StepStats

#: the keys a batch (``step``'s arguments, a micro-batch of ``step_accumulated``) may have
BATCH_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")


class Trainer(TrainerCheckpoints, TrainerWeights):
    """Offloaded fine-tuning of one causal LM. Build it with :meth:`from_pretrained`, :meth:`from_config` or
    :meth:`load_checkpoint`."""

    def __init__(self, model, hf_config, config: TrainerConfig, *, name: str, source: "CheckpointReader | None",
                 source_keys: CheckpointKeys | None = None, lora=None, source_dir: str | None = None,
                 empty: bool = False, store_dirs: Sequence[Path] | None = None, slices: dict | None = None,
                 no_decay: Sequence[str] = (), full_width_state: Sequence[str] = ()):
        # empty: the store is left without weights, for load_checkpoint to load a checkpoint's into; store_dirs:
        # an existing store's directories to open instead of new run directories (a checkpoint beside the store);
        # slices: a checkpoint's vocabulary slices (module path -> rows per part), else the job's rule decides;
        # no_decay: parameters (the model's names) updated without weight decay (OffloadedAdamW.Config.no_decay);
        # full_width_state: parameters whose optimizer state the format keeps at full width (TensorInfo.full_width)
        self.config = config
        self.no_decay = frozenset(no_decay)
        self.source_dir = source_dir          # tokenizer files are copied from here on export
        self.hf_config = hf_config
        self.name = name
        self.model = model
        self.lora = lora
        self.device = resolve_device(config.device)
        self.compute_dtype = resolve_dtype(config.dtype, self.device)
        # [Note: inline updates without an accelerator]
        self.inline_updates = (self.device.type != "cuda" if config.inline_updates is None
                               else bool(config.inline_updates))
        # checkpoint keys -> parameters, decided on the unmodified skeleton ([Note: checkpoint keys]); with LoRA
        # the caller decides them on a skeleton peft did not wrap
        if source is not None and source_keys is None:
            if lora is not None:
                raise ValueError("a LoRA trainer's base checkpoint needs its keys decided on the unwrapped model")
            source_keys = CheckpointKeys(model, source.keys())
        self.slicing = vocab_slices.slice_model(model, find_decoder_stack(model)[1], max_bytes=config.vocab_slice,
                                                optimizer=config.optimizer, decision=slices)
        self.units, self.tensors = find_units(model)
        if lora is not None:
            lora.mark_base(self.tensors)  # the frozen weights that rest as NF4 (lora.base_format)
        for name in full_width_state:
            for part in self.slicing.parts.get(name, [name]):
                self.tensors[part].full_width = True
        self.family = getattr(hf_config, "model_type", "?")
        self._source_keys = source_keys
        if self.family not in TESTED_FAMILIES:
            warnings.warn(f"{self.family} models are not among the families tested against plain PyTorch training "
                          f"({', '.join(TESTED_FAMILIES)}); units were found generically and are checked against "
                          "the model's own before the first step (check_family)", Notice, stacklevel=3)
        self.progress = StepCount()
        self.history: list[StepStats] = []
        self._closed = False
        self._failed: BaseException | None = None
        self._following: FollowingCheckpoint | None = None  # save_checkpoint(follow=True)
        self._pending = PendingStep()  # a resumed checkpoint's point inside a step, finished by the next step
        self.run_dirs: list[Path] = []
        if self.device.type == "cuda":
            for unit in self.units:
                unit.buffers = {k: v.to(self.device) for k, v in unit.buffers.items()}
            self._move_skeleton_buffers()
        self.batch_check = BatchCheck(hf_config=hf_config, batch_size=config.batch_size, seq_len=config.seq_len,
                                      packed=config.packed, device=self.device)
        self._plan_steps()
        self._open_store(store_dirs)
        try:
            self._start_runtime(source, empty=empty)
        except BaseException:
            self.close()
            raise

    def _plan_steps(self) -> None:
        """The machine, the model's profile on it and the plan (planned again at the stacked width it chose)."""
        config, model = self.config, self.model
        self.hardware = discover_hardware(config, self.device)
        if config.packed:
            check_packing(self.hf_config, where="packed")
        # the units' calibrated times are kept beside the machine's probe, as plan llm keeps them: a later run (a
        # resume, the next job) plans from the same times instead of timing every unit again
        measure = dict(packed=config.packed, device=self.device, compute_bytes=self.compute_dtype.itemsize,
                       times_file=unit_times_path() if config.calibrate else None,
                       budget=setup_budget(config, self.device) if config.calibrate else None)
        self.profile = profile_model(model, self.units, self.tensors, batch=config.batch_size,
                                     seq_len=config.seq_len, name=self.name, **measure)
        if config.calibrate:
            # [Note: the batch is priced] (terastack.plan.llm_profile): calibration runs units at the batch's
            # shape, so a plan without their times comes first (whether it fits needs none; a machine known only
            # by its calibrated units has no FLOP rate, and any rate stands in): a batch the budgets cannot hold
            # is refused before anything of its size exists
            hw = self.hardware
            make_plan(config, self.profile, hw if hw.compute_flops > 0 else hw.with_overrides(cpu_flops=1e9),
                      self.device, inline_updates=self.inline_updates, name=self.name)
            self.profile = profile_model(model, self.units, self.tensors, batch=config.batch_size,
                                         seq_len=config.seq_len, name=self.name, calibrate=True, **measure)
        self.planner, self.plan = self._make_plan()
        width = accumulation_spec(self.plan.accumulation).group(config.grad_accum)
        if config.calibrate and width > 1:
            # [Note: calibrating the stacked width]
            self.profile = with_stacked_times(self.profile, model, self.units, self.tensors, micro=width, **measure)
            self.planner, self.plan = self._make_plan(accumulation=self.plan.accumulation)

    def _open_store(self, store_dirs: Sequence[Path] | None) -> None:
        """The tiered store over new run directories (or ``store_dirs``, an existing store's)."""
        config = self.config
        self._own_dirs = not store_dirs  # an existing store's directories are never removed on close
        self.run_dirs = (list(store_dirs) if store_dirs else
                         layout.make_run_dirs(config.store_dir, layout.ssd_bytes_needed(self.profile, self.plan)))
        self.store = TieredStore(TieredStore.Config(
            root=layout.store_root(self.run_dirs),
            # each SSD receives its share of the bytes by its probed bandwidth (equal shares if not probed)
            bandwidths=self.hardware.dir_bandwidths(layout.split_store_dirs(config.store_dir)),
            # ledgers, pinned staging cap and the device with its index ("cuda" would be device 0 off this thread)
            **store_settings(self.plan, self.profile, self.device), copy_on_write=False))

    def _start_runtime(self, source, *, empty: bool) -> None:
        """The step's services, complete (the units' stand-ins call them from then on); the weights filled in
        unless ``empty``; a model family the tests do not verify checked ([Note: the family check])."""
        config = self.config
        self.runtime = StepRuntime(
            store=self.store, units=self.units, tensors=self.tensors, plan=self.plan,
            policies={u.name: p for u, p in zip(self.profile.units, self.plan.policies)},
            order=[next(u.index for u in self.units if u.path == p.name) for p in self.profile.units],
            compute_dtype=self.compute_dtype, timeout=config.timeout,
            optimizer_config=config.optimizer_config(lr=self._initial_lr(source), no_decay=frozenset(
                part for name in self.no_decay for part in self.slicing.parts.get(name, [name]))),
            inline_updates=self.inline_updates)
        self.optimizer = self.runtime.optimizer
        install_units(self.model, self.units, self.runtime.runner)
        if not empty:
            self._fill(source)
        #: what the check before training compared; None: not checked (a resumed run was checked when it started)
        self.family_check = None
        if not empty and needs_check(self.family, config.check_family, TESTED_FAMILIES):
            self.family_check = check_family(self.model, self.units, self.runtime, family=self.family,
                                             vocab_size=self.hf_config.get_text_config().vocab_size,
                                             seq_len=config.seq_len, seed=config.seed)

    @property
    def step_count(self) -> int:
        """Optimizer steps taken (a resumed trainer counts its checkpoint's)."""
        return self.progress.step

    @step_count.setter
    def step_count(self, value: int) -> None:
        self.progress.step = value

    @property
    def resumed_point(self) -> StepPoint | None:
        """The point inside a step that a checkpoint was taken at and this trainer resumed from: some weights are
        that step's, some the step before's, until the next :meth:`step` (given the same batch) finishes it.
        None between steps."""
        return self._pending.point

    @property
    def run_dir(self) -> Path:
        """This run's scratch directory (the first, where the store spans several)."""
        return self.run_dirs[0]

    def _make_plan(self, accumulation: str | None = None):
        """The planner and its plan (``accumulation``: the order to plan, in place of the configured one)."""
        return make_plan(self.config, self.profile, self.hardware, self.device, inline_updates=self.inline_updates,
                         name=self.name, accumulation=accumulation)

    # ------------------------------------------------------------ builders
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, config: TrainerConfig | None = None, *,
                        hf_config=None) -> "Trainer":
        """Fine-tune the checkpoint in ``path`` (a local Hugging Face directory with safetensors). ``hf_config``:
        its config as loaded and adjusted by the caller (RoPE scaling); default: read from ``path``."""
        config = config or TrainerConfig()
        hf_config = load_hf_config(path) if hf_config is None else hf_config
        reader = CheckpointReader.of_model(path, hf_config)  # a 4-bit model: read dequantized, built unquantized
        dtype = resolve_dtype(config.dtype, resolve_device(config.device))
        model = build_skeleton(hf_config, dtype=dtype)
        keys = CheckpointKeys(model, reader.keys())
        lora = None
        if config.lora is not None:
            from terastack.llm.lora import apply_lora

            # The frozen base loads through the same key conversions as a full fine-tune, decided above on an
            # unwrapped skeleton: peft wraps a skeleton of its own, so conversions that look a parameter up by its
            # name in the model (a split sized like its targets) never see peft's names.
            model, lora = apply_lora(build_skeleton(hf_config, dtype=dtype), config.lora, base_path=str(path))
            lora.keep_unquantized(keys, reader)
        return cls(model, hf_config, config, name=str(path), source=reader, source_keys=keys, lora=lora,
                   source_dir=str(path))

    @classmethod
    def from_config(cls, hf_config, config: TrainerConfig | None = None, *, name: str | None = None) -> "Trainer":
        """Train ``hf_config``'s model from a random initialization written straight to the store. With
        ``config.lora``: adapters on a frozen random base (the plain model's initialization from the same seed, NF4
        under ``lora.base_format`` nf4), to measure a LoRA step at a size whose base is not at hand."""
        config = config or TrainerConfig()
        model = build_skeleton(hf_config, dtype=resolve_dtype(config.dtype, resolve_device(config.device)))
        lora = None
        if config.lora is not None:
            from terastack.llm.lora import apply_lora

            model, lora = apply_lora(model, config.lora)
        return cls(model, hf_config, config, name=name or f"{hf_config.model_type} (random init)", source=None,
                   lora=lora)

    def _initial_lr(self, source) -> float:
        """The job's learning rate, else the default for this model ([Note: default learning rates]); a job's loop
        sets each step's from its schedule, a resumed optimizer its checkpoint's."""
        if self.config.lr is not None:
            return self.config.lr
        return default_lr(pretrained=source is not None, lora=self.lora is not None)

    # ---------------------------------------------------------------- step
    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"lr: must be >= 0, got {value}")
        self.optimizer.lr = float(value)

    def step(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        """One optimizer step on a batch of token ids (batch, seq); returns the loss. ``position_ids`` (batch, seq):
        positions restarting inside a row pack several examples into it, attending only within each (families
        of :data:`terastack.llm.model.PACKING_FAMILIES`). See [Note: the step schedule]."""
        self._check_open()
        inputs = self._inputs(input_ids, labels, attention_mask, position_ids)
        point = self._pending.point
        if point is not None and batch_digest(inputs) != point.batch:  # refused before anything runs
            raise ValueError(f"this trainer resumed inside step {point.step + 1}: give that step's batch again "
                             "first (this one differs)")
        try:
            return self._step(inputs)
        except BaseException as exc:
            # A step that failed half-way leaves weights fetched, activations stashed and updates half done:
            # this trainer is not used again (its last checkpoint is the way back).
            self._failed = exc
            raise

    def step_accumulated(self, micro_batches: Sequence[Mapping[str, torch.Tensor]]) -> float:
        """ONE optimizer step over several micro-batches (gradient accumulation), equal to plain training on all
        of them together with the loss averaged over their target tokens (labels other than -100 after the
        shift) -- not a mean of per-micro-batch means. Each micro-batch is a mapping with ``input_ids`` and
        optionally ``labels``, ``attention_mask``, ``position_ids`` (as :meth:`step` takes them). Returns that
        token-weighted loss. In the plan's vertical order (``TrainerConfig.accumulation``) the micro-batches run as
        one batch, each unit for all of them at once; in the horizontal order eager updates run during the last
        micro-batch's backward and the earlier ones only add their gradients to sums kept within the plan's
        budgets (``TrainerConfig.grad_accum`` > 1 plans either). See [Note: vertical and horizontal accumulation]
        in terastack.plan.accumulation_specs and [Note: gradient accumulation] in terastack.llm.engine.accumulate."""
        self._check_open()
        if isinstance(micro_batches, Mapping) or not isinstance(micro_batches, Sequence) or not micro_batches:
            raise ValueError("micro_batches: expected a non-empty sequence of mappings with input_ids")
        if len(micro_batches) > 1 and self.plan.grad_accum == 1:
            raise ValueError(f"micro_batches: {len(micro_batches)} micro-batches, but the plan was made without "
                             "gradient accumulation; set TrainerConfig.grad_accum (their gradient sums are part "
                             "of the budgets)")
        batches = []
        for i, mb in enumerate(micro_batches):
            where = f"micro_batches[{i}]"
            if not isinstance(mb, Mapping) or "input_ids" not in mb:
                raise ValueError(f"{where}: expected a mapping with input_ids, got {type(mb).__name__}")
            unknown = sorted(set(mb) - set(BATCH_KEYS))
            if unknown:
                raise ValueError(f"{where}: unknown key {unknown[0]!r} (a micro-batch has "
                                 f"{', '.join(BATCH_KEYS)})")
            batches.append(self._inputs(mb["input_ids"], mb.get("labels"), mb.get("attention_mask"),
                                        mb.get("position_ids"), where=where))
        targets = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
        if targets == 0:
            raise ValueError("micro_batches: no target token in any micro-batch (every label after the shift is "
                             "-100); the token-weighted loss is undefined")
        for b in batches:
            b["num_items_in_batch"] = targets
        tokens = sum(b["input_ids"].numel() for b in batches)
        group = self.plan.accumulation_spec.group(self.plan.grad_accum)
        if group > 1 and len(batches) > 1:
            # vertical and grouped orders: one pass over the units for each group of micro-batches, stacked
            batches = [stack_micro_batches(batches[i:i + group]) for i in range(0, len(batches), group)]
            for b in batches:
                rows, cols = b["input_ids"].shape
                if rows * cols > group * self.config.batch_size * self.config.seq_len:
                    raise ValueError(f"micro_batches: stacked for the {self.plan.accumulation} order (padded to the "
                                     f"longest) a pass makes {rows} x {cols} tokens, more than the planned {group} x "
                                     f"{self.config.batch_size} x {self.config.seq_len}; give micro-batches of the "
                                     "planned shape, or set TrainerConfig.accumulation='horizontal'")
        try:
            return self._step_accumulated(batches, tokens)
        except BaseException as exc:
            self._failed = exc  # as in step(): a step that failed half-way is not continued
            raise

    def _begin_stats(self) -> tuple:
        return (self.store.engine.stats.snapshot(), self.runtime.fetcher.bytes_in, self.runtime.bytes.snapshot(),
                time.perf_counter())

    def _end_stats(self, start: tuple, loss: float, tokens: int) -> None:
        io0, fetched0, kinds0, t0 = start
        io1 = self.store.engine.stats.snapshot()
        self.step_count += 1
        self.history.append(StepStats(
            step=self.step_count, loss=loss, seconds=time.perf_counter() - t0, tokens=tokens,
            ssd_read_bytes=io1["bytes_read"] - io0["bytes_read"],
            ssd_write_bytes=io1["bytes_written"] - io0["bytes_written"],
            device_in_bytes=self.runtime.fetcher.bytes_in - fetched0, grad_norm=self.optimizer.last_grad_norm,
            bytes_by_kind=difference(self.runtime.bytes.snapshot(), kinds0)))

    def _step(self, inputs: dict) -> float:
        start = self._begin_stats()
        if self._pending.point is not None:
            loss = self._finish_pending(inputs)
        else:
            self._begin_points(inputs, accumulate=False)
            out = train_step(self.model, self.runtime, inputs=inputs, step_index=self.step_count)
            loss = float(out.loss.detach())
            del out
        self._end_stats(start, loss, inputs["input_ids"].numel())
        self._step_end_point()
        return loss

    def _step_accumulated(self, batches: list[dict], tokens: int) -> float:
        if self._pending.point is not None:
            raise ValueError("this trainer resumed inside a step of one batch: give that batch to step() first")
        start = self._begin_stats()
        # the horizontal order's micro-batches each run a backward: only the step's end is a point
        self._begin_points({f"{i}:{k}": v for i, b in enumerate(batches) for k, v in b.items()},
                           accumulate=len(batches) > 1)
        losses = accumulated_step(self.model, self.runtime, batches, step_index=self.step_count)
        # each micro-batch's loss is its sum over target tokens divided by the step's total: they add up
        loss = float(sum(losses))
        self._end_stats(start, loss, tokens)
        self._step_end_point()
        return loss

    # ------------------------------------------ a checkpoint that follows the step
    def _begin_points(self, inputs: dict, *, accumulate: bool) -> None:
        if self._following is not None:
            self._following.taker.begin_step(step=self.step_count, batch=batch_digest(inputs), accumulate=accumulate)

    def _step_end_point(self) -> None:
        if self._following is not None:
            self._following.offer(self._following.taker.step_end())

    def _finish_pending(self, inputs: dict) -> float:
        """The first step after resuming inside a step: that step, finished from its point ([Note: a checkpoint
        that follows the step] in terastack.llm.step_checkpoint)."""
        point = self._pending.point
        loss = finish_step(self.model, self.runtime, inputs=inputs, point=point, step_index=self.step_count)
        self._pending.point = None
        return loss

    @torch.no_grad()
    def loss(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        """The loss of a batch without training on it (weights streamed as in training); the arguments as
        :meth:`step` takes them."""
        self._check_open(whole_model=True)
        self.synchronize()
        inputs = self._inputs(input_ids, labels, attention_mask, position_ids)
        if inputs.get("attention_mask") is None:
            inputs.pop("attention_mask")
        return eval_loss(self.model, self.runtime, inputs=inputs)

    def _inputs(self, input_ids, labels, attention_mask, position_ids, *, where: str = "") -> dict:
        """The model call's keyword arguments, checked against the plan (``where``: the micro-batch named in
        errors)."""
        return self.batch_check.inputs(input_ids, labels, attention_mask, position_ids, where=where)

    # ------------------------------------------------------------- weights
    def synchronize(self) -> None:
        """Wait for every update and write in flight (and a following checkpoint's points)."""
        self.optimizer.synchronize()
        if self._following is not None:
            self._following.drain()
        self.store.wait(timeout=self.config.timeout)

    def save_pretrained(self, path: str | os.PathLike, *, dtype: str | None = None,
                        max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Path:
        """Export a directory ``transformers`` (or, for LoRA, ``peft``) loads: ``model.safetensors``, or above
        ``max_shard_size`` shards named and indexed as transformers' ``save_pretrained`` names them ([Note: sharded
        export]); ``dtype``: float32 (default), bfloat16 or float16."""
        self._check_open(whole_model=True)
        return export_pretrained(self, path, dtype=dtype, max_shard_size=max_shard_size)

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
        try:
            self._stop_following()
        except Exception:  # noqa: BLE001 - closing after a failure still closes the rest
            pass
        opt = getattr(self, "optimizer", None)
        if opt is not None:
            opt.close()
        store = getattr(self, "store", None)
        keep = not getattr(self, "_own_dirs", True)  # a checkpoint beside the store needs its directories
        if store is not None:
            try:
                keep = bool(store.pinned_generations())
                store.close()
            except Exception:  # noqa: BLE001 - closing after a failure must still remove the scratch dir
                pass
        if not keep:
            layout.remove_run_dirs(getattr(self, "run_dirs", []))

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self, *, whole_model: bool = False) -> None:
        """``whole_model``: the caller uses every weight, which a step resumed from inside is still updating."""
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        if whole_model and self._pending.point is not None:
            raise ValueError("this trainer resumed inside a step: finish it (step() with its batch) first")
        if self._failed is not None:
            raise RuntimeError(f"a step of this Trainer failed ({type(self._failed).__name__}: {self._failed}); "
                               "start again from its last checkpoint (Trainer.load_checkpoint)")

    # ---------------------------------------------------------- filling in
    def _move_skeleton_buffers(self) -> None:
        for mod in self.model.modules():
            for name, buf in list(mod._buffers.items()):
                if buf is not None and buf.device.type != "meta":
                    mod._buffers[name] = buf.to(self.device)

    @property
    def fill_room(self) -> int | None:
        """What filling the store may hold at once ([Note: the fill within the budget] in weight_fill)."""
        return self.plan.device_budget if self.device.type == "cpu" else None

    def _fill(self, source: "CheckpointReader | None") -> None:
        """Write every weight into the store, one tensor at a time, and create zero moments."""
        fill_store(self.runtime, self.model, self.units, self.tensors, seed=self.config.seed, source=source,
                   source_keys=self._source_keys, lora=self.lora, slicing=self.slicing, room=self.fill_room)
