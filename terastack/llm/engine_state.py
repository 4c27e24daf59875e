"""The offloaded engine's part of a checkpoint: the model it trains and its tensors in the store.

:class:`EngineState` is the ``"model"`` component of a trainer's checkpoint (the manager and the other
components: terastack.training.checkpoint, [Note: checkpoint layout and atomicity]). Its state names the model
(type, config, LoRA spec) with a fingerprint of its parameters' names and shapes, and holds, per parameter, the
fp32 master and both AdamW moments (or the weight of a frozen tensor), streamed from the store one optimizer
chunk at a time; the chunking of the run that wrote it does not matter to the run that reads it.
:func:`rebuild_model` builds the skeleton a checkpoint's trainer is built on before the components load.

With ``beside_store`` the state's tensors are not copied: the store commits, pins that commit, and the state
refers to the records' extents in the store's data files ([Note: a checkpoint beside the store] in
terastack.training.checkpoint; [Note: resuming beside the store] below).

Checkpoints written before the components saved themselves (format ``terastack.llm.checkpoint``, version 1)
are read through :func:`upgrade_v1`: the same tensors, their state spread over the same components.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch

from pathlib import Path

from terastack.llm.engine.store_layout import compute_spec, records_for
from terastack.llm.machine import resolve_device, resolve_dtype
from terastack.tiers import Tier
from terastack.tiers.layout import data_file_name, manifest_versions
from terastack.training import checkpoint as manager
from terastack.training.loop import loop_components_from_extra

#: the format of checkpoints written before the checkpoint manager (one manifest written by this module)
V1_FORMAT = "terastack.llm.checkpoint"


def model_fingerprint(tensors: dict) -> str:
    """Names and shapes of every parameter: two checkpoints of one architecture share it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(f"{name}:{list(tensors[name].shape)};".encode())
    return h.hexdigest()[:32]


class EngineState:
    """The model and its training tensors in the store of ``runtime`` (a ``StepRuntime``), as a ``Stateful``.
    ``name``, ``hf_config`` and ``lora`` describe the model so that a checkpoint can rebuild it."""

    def __init__(self, runtime, *, name: str, hf_config, lora=None, beside_store: bool = False, commit=None,
                 slices: dict | None = None):
        """``commit``: a pinned commit of the store to refer to (beside the store) instead of committing anew;
        ``slices``: the model's vocabulary slices (terastack.llm.vocab_slices), saved so a resume slices alike."""
        self.rt, self.name, self.hf_config, self.lora = runtime, name, hf_config, lora
        self.slices = dict(slices or {})
        self.tensors = runtime.tensors
        self.beside_store = beside_store or commit is not None
        self.commit = commit
        self._release: list[int] = []  # pinned commits of earlier snapshots, let go once the new one is in place

    def _ordered(self) -> list[str]:
        return sorted(self.tensors, key=lambda n: self.tensors[n].index)

    def _parts(self, name: str) -> dict[str, list[str]]:
        """The store records holding each part (master, the optimizer format's state parts -- AdamW's exp_avg and
        exp_avg_sq --, or weight) of parameter ``name``."""
        rt = self.rt
        if self.tensors[name].trainable:
            out = {"master": rt.master_records(name)}
            out.update((part.key, recs) for part, recs in rt.state_parts(name).items())
            return out
        return {"weight": [rt.compute_record(name)]}

    def _layout(self, name: str, part: str) -> tuple[tuple, torch.dtype]:
        """Shape and dtype of part ``part`` of parameter ``name`` as a checkpoint holds it."""
        info = self.tensors[name]
        if part == "weight":  # the compute record as it rests (a frozen NF4 weight: its bytes)
            spec = compute_spec(self.rt, name)
            return spec.shape, spec.dtype
        for spec in self.rt.state_parts(name):
            if spec.key == part:
                return spec.shape(info.shape), spec.dtype
        return tuple(info.shape), torch.float32  # the master

    def state_dict(self) -> dict:
        lora = None if self.lora is None else {"spec": self.lora.spec_dict(), "base": self.lora.base_path,
                                               "keep_native": sorted(self.lora.keep_native)}
        out = {"name": self.name, "model_type": getattr(self.hf_config, "model_type", "?"),
               "config": self.hf_config.to_dict(), "fingerprint": model_fingerprint(self.tensors), "lora": lora,
               "optimizer": self.rt.format.name, "vocab_slices": self.slices}
        if self.beside_store:
            return self._referenced(out)
        for pname in self._ordered():
            for part, recs in self._parts(pname).items():
                # the dtype of the records, known before they are read: what the checkpoint's size is counted from
                shape, dtype = self._layout(pname, part)
                out[f"{part}:{pname}"] = manager.StreamedTensor(
                    shape, lambda recs=recs: (self.rt.read_record(r) for r in recs), dtype=dtype)
        return out

    def _referenced(self, out: dict) -> dict:
        """The state beside the store: commit and pin the store, refer to each record's extent."""
        store = self.rt.store
        commit = self.commit
        if commit is None:
            store.commit(pin=True)
            commit = store.last_commit()
        self._release = [g for g in store.pinned_generations() if g != commit.generation]
        out["store"] = {"dirs": [str(Path(d).absolute()) for d in store.dirs], "store_id": commit.store_id,
                        "generation": commit.generation}
        files = [str(Path(d).absolute() / data_file_name(i)) for i, d in enumerate(store.dirs)]
        for pname in self._ordered():
            for part, recs in self._parts(pname).items():
                infos = [store.record(r) for r in recs]
                pieces = tuple((files[commit.extents[r].dir], commit.extents[r].offset, info.nbytes)
                               for r, info in zip(recs, infos))
                out[f"{part}:{pname}"] = manager.ReferencedTensor(self._layout(pname, part)[0], infos[0].dtype,
                                                                  pieces)
        return out

    def checkpoint_saved(self, snapshot_dir) -> None:
        """The snapshot is in place: the commits only earlier snapshots referred to are let go."""
        for generation in self._release:
            self.rt.store.release(generation)
        self._release = []

    def load_state_dict(self, state: dict) -> None:
        """Put every tensor of ``state`` into the store (each checked against its size and CRC-32 as read); a
        state beside this very store resumes in place ([Note: resuming beside the store])."""
        if state.get("fingerprint") != model_fingerprint(self.tensors):
            raise ValueError("checkpoint: its model fingerprint differs from the rebuilt model's (another "
                             "architecture)")
        written = state.get("optimizer", "adamw")  # checkpoints before the formats hold AdamW's state
        if written != self.rt.format.name:
            raise ValueError(f"checkpoint: its optimizer state is {written}; this run's optimizer is "
                             f"{self.rt.format.name} (resume with optimizer {written})")
        ref = state.get("store")
        if ref is not None:
            if ref.get("store_id") == self.rt.store.store_id and self._resume_in_place(ref):
                return
            check_referenced_store(ref)
        for pname in self._ordered():
            for part, recs in self._parts(pname).items():
                key = f"{part}:{pname}"
                stored = state.get(key)
                if not isinstance(stored, manager.StoredTensor):
                    raise ValueError(f"checkpoint has no {part} for parameter {pname!r}: it was written for another "
                                     "model (or with other trainable parameters, or another optimizer format)")
                shape, dtype = self._layout(pname, part)
                floating = dtype.is_floating_point
                if list(stored.shape) != list(shape) or stored.dtype.is_floating_point != floating:
                    raise ValueError(f"checkpoint: {key} has shape {list(stored.shape)} "
                                     f"({str(stored.dtype).removeprefix('torch.')}); the model expects "
                                     f"{list(shape)} ({str(dtype).removeprefix('torch.')})")
                self._put(pname, part, recs, stored.read().reshape(-1))
        self.rt.store.wait(timeout=self.rt.timeout)

    def _resume_in_place(self, ref: dict) -> bool:
        """[Note: resuming beside the store]. True when the store's records are the plan's and nothing is to be
        copied; False after dropping them (their pinned extents stay) for the tensors to be put anew."""
        store, generation = self.rt.store, int(ref["generation"])
        if generation not in store.pinned_generations():
            raise ValueError(f"checkpoint: the store at {store.root} no longer keeps commit {generation} (it "
                             f"keeps {store.pinned_generations()}): it has moved past this checkpoint")
        if store.last_commit().generation != generation:
            store.revert(generation)  # a crash after a later commit, before its snapshot was in place
        for older in [g for g in store.pinned_generations() if g != generation]:
            store.release(older)  # a crash after the snapshot was in place, before they were let go
        wanted = {spec.record: spec for pname in self._ordered() for spec in records_for(self.rt, pname)}
        same = all(r in store and (i := store.record(r)).shape == tuple(spec.shape) and i.dtype == spec.dtype
                   for r, spec in wanted.items())
        for name in store.names():
            if not same or name not in wanted:
                store.delete(name)  # activations or gradients of the step that was under way; or another plan's
        if not same:
            return False
        for r, spec in wanted.items():
            if store.record(r).home is not spec.home:
                store.rehome(r, spec.home)  # placed in another tier by this budget: its bytes stay where they are
            if spec.home is not Tier.SSD:  # resident from the start, as after a put
                self.rt.wait(store.prefetch(r, spec.home if spec.home is Tier.HOST else Tier.DEVICE),
                             f"{r!r} reaching its home")
        return True

    def _put(self, name: str, part: str, recs: list[str], flat: torch.Tensor) -> None:
        rt = self.rt
        info = self.tensors[name]
        homes = {spec.record: spec for spec in records_for(rt, name)}
        if part == "master" and not rt.master_is_compute:
            low = rt.compute_record(name)
            rt.wait(rt.store.put(low, flat.view(info.shape).to(rt.compute_dtype), home=homes[low].home),
                    f"{low!r} reaching the store")
        for record in recs:
            spec = homes[record]
            data = flat.view(spec.shape) if spec.span is None else flat[spec.span[0]:spec.span[1]]
            data = data.to(spec.dtype)
            rt.wait(rt.store.put(record, data.contiguous(), home=spec.home), f"{record!r} reaching the store")


# ------------------------------------------------------------------ resuming
# [Note: resuming beside the store]
# A checkpoint beside the store names the store (its directories, identity and pinned generation). A trainer
# resumed from it opens that store where it is (``store_dirs``): a crash after a later commit but before the
# snapshot naming it was in place is undone (``revert``), commits of older snapshots are let go, and when the
# store's records are those the resuming plan asks for, nothing is copied -- the records rest in the pinned
# extents, which no write overwrites. A record the resuming plan places in another tier (its budget differs from
# the run's: a process's memory left is never the same twice) changes its home without a copy (``rehome``):
# rewriting it would hold the pinned version of every record, the whole state once more. Otherwise (another plan, or a trainer on another store) the tensors are read
# from the referenced extents and put anew, after checking that the referenced store is the one written beside.
#
# What it holds beyond the store: the pinned versions of the records rewritten since the checkpoint
# ("held" in the store's usage). Every fp32 master and both moments are rewritten once a step, so one step
# after the checkpoint that is the whole trainable state (12 bytes a parameter), and it stays there until the
# next checkpoint lets the commit go: up to the state once more, never a second copy beside it. A checkpoint
# that follows the steps holds a few units' old versions instead ([Note: a checkpoint that follows the step] in
# terastack.llm.step_checkpoint): its snapshots name commits of some records (``commit(names, pin=True)``) and
# a point inside a step, which the resumed trainer's next step finishes.
def check_referenced_store(ref: dict) -> None:
    """The store a checkpoint was written beside still holds its pinned commit (else an error naming why)."""
    root = Path(ref["dirs"][0])
    try:
        versions = manifest_versions(root)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint: the store it was written beside, {root}, is missing") from None
    if versions is None or versions.get("store_id") != ref.get("store_id"):
        raise ValueError(f"checkpoint: the store at {root} is not the one it was written beside (another store "
                         "was created there)")
    if str(ref.get("generation")) not in versions.get("pinned", {}):
        raise ValueError(f"checkpoint: the store at {root} no longer keeps commit {ref.get('generation')}: it has "
                         "moved past this checkpoint")


def store_dirs(snapshot: manager.Snapshot) -> list[Path] | None:
    """The directories of the store a snapshot was written beside, when it was and that store is there."""
    components = snapshot.manifest.get("components", {})
    ref = components.get("model", {}).get("store") if isinstance(components, dict) else None
    if not ref:
        return None
    dirs = [Path(d) for d in ref.get("dirs", [])]
    if not dirs or not all((d / data_file_name(i)).exists() for i, d in enumerate(dirs)):
        check_referenced_store(ref)  # the error naming what is missing
        raise FileNotFoundError(f"checkpoint {snapshot.path}: a data file of the store it was written beside, "
                                f"{', '.join(map(str, dirs))}, is missing")
    return dirs


@dataclass(slots=True)
class Rebuilt:
    """The skeleton of a checkpoint's model (with LoRA adapters if it had them), its config and its name."""

    model: object
    hf_config: object
    lora: object
    name: str
    #: the run's vocabulary slices (module path -> rows per part; none in a checkpoint from before them)
    slices: dict


def open_checkpoint(path: str | os.PathLike) -> manager.Snapshot:
    """The snapshot of checkpoint ``path``, also one written before components saved themselves."""
    return manager.open_checkpoint(path, upgrades={V1_FORMAT: upgrade_v1})


def rebuild_model(snapshot: manager.Snapshot, config, *, expect_model=None) -> Rebuilt:
    """Build the skeleton of the model that wrote ``snapshot`` (``config``: the resuming ``TrainerConfig``;
    ``expect_model``: a config the checkpoint must match)."""
    from transformers import AutoConfig

    from terastack.training.hf.model_files import build_skeleton

    model = snapshot.state("model")
    try:
        hf_config = AutoConfig.for_model(model["model_type"], **{k: v for k, v in model["config"].items()
                                                                 if k != "model_type"})
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{snapshot.path}: model config is unusable ({exc})") from None
    if expect_model is not None:
        _check_same_model(expect_model, hf_config, snapshot.path)
    skeleton = build_skeleton(hf_config, dtype=resolve_dtype(config.dtype, resolve_device(config.device)))
    lora = None
    if model.get("lora"):
        from terastack.llm.lora import LoraSpec, apply_lora

        spec = LoraSpec(**model["lora"]["spec"])
        skeleton, lora = apply_lora(skeleton, spec, base_path=model["lora"].get("base"))
        lora.keep_native = set(model["lora"].get("keep_native") or ())
    return Rebuilt(model=skeleton, hf_config=hf_config, lora=lora, name=model.get("name", str(snapshot.path)),
                   slices=dict(model.get("vocab_slices") or {}))


def _check_same_model(expected, hf_config, snap) -> None:
    """A resume must continue the same model: compare the architecture fields that shape its tensors."""
    keys = ("model_type", "vocab_size", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "intermediate_size",
            "ffn_dim", "num_attention_heads", "n_head", "num_key_value_heads", "tie_word_embeddings")
    exp = expected.to_dict() if hasattr(expected, "to_dict") else dict(expected)
    got = hf_config.to_dict()
    diffs = [f"{k}: checkpoint {got.get(k)!r}, model {exp.get(k)!r}" for k in keys
             if k in exp or k in got if exp.get(k) != got.get(k)]
    if diffs:
        raise ValueError(f"checkpoint {snap} belongs to another model ({'; '.join(diffs)})")


def upgrade_v1(manifest: dict, snap) -> dict:
    """A version-1 manifest (one ``trainer`` entry with step, RNG and optimizer state; the loop state in
    ``extra``) as the checkpoint manager's: the same data file and tensors, under the components that hold them
    now (``model``, ``optimizer``, ``progress``, ``rng``, ``extra``, and the loop's)."""
    if manifest.get("version") != 1:
        raise ValueError(f"{snap}: checkpoint format {V1_FORMAT} version {manifest.get('version')} (this "
                         "terastack reads version 1 of it)")
    try:
        trainer = manifest["trainer"]
        extra = dict(manifest.get("extra") or {})
        components = {"model": manifest["model"],
                      "optimizer": {"lr": trainer["lr"], "adam_steps": trainer["adam_steps"]},
                      "progress": {"step": trainer["step"]},
                      "rng": {"cpu": trainer["rng_cpu"]},
                      "trainer_config": trainer.get("config", {})}
        components.update(loop_components_from_extra(extra))  # takes the loop's keys out of extra
        components["extra"] = extra
        return {"format": manager.FORMAT, "version": manager.VERSION, "step": int(trainer["step"]),
                "data_file": manifest["data_file"], "data_bytes": manifest["data_bytes"], "components": components,
                "tensors": {f"model/{key}": entry for key, entry in manifest["tensors"].items()}}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{snap}: version-1 checkpoint manifest is incomplete ({exc!r})") from None
