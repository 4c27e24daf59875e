"""The engine's files in a Trainer's ``checkpoint-N`` folders and in ``save_model``'s directory.

[Note: checkpoint-N under the engine]
A Trainer's checkpoint folder holds its own files -- ``trainer_state.json``, ``scheduler.pt``, ``rng_state.pth``,
``training_args.bin``, the tokenizer -- and the model as ``save_model`` writes it (a directory ``from_pretrained``
loads, or a peft adapter). Under the engine the optimizer's state is not an ``optimizer.pt``: the engine's own
checkpoint (the fp32 masters, the optimizer format's state, its step counts, the engine's step) is written by
terastack's checkpoint manager (terastack.training.checkpoint) into ``checkpoint-N/terastack/``, streamed from
the store. Resuming (``train(resume_from_checkpoint=...)``) empties the store and loads that state into it; the
Trainer restores its own parts as it always does (its state, scheduler, RNG, the data loader's position), so
the run continues as if it had never stopped, to the bit.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

#: the engine's checkpoint inside a Trainer's checkpoint-N folder
ENGINE_DIR = "terastack"
#: the engine's components a resume loads (its RNG is the Trainer's to restore, with the data loader's position)
RESUMED = ("model", "optimizer", "progress")


def save_engine_state(engine, checkpoint_dir: str | os.PathLike) -> Path:
    """The engine's state into ``checkpoint_dir/terastack`` ([Note: checkpoint-N under the engine])."""
    return engine.save_checkpoint(Path(checkpoint_dir) / ENGINE_DIR)


def load_engine_state(engine, checkpoint_dir: str | os.PathLike) -> None:
    """Replace the engine's store contents with the state saved in ``checkpoint_dir`` (by :func:`save_engine_state`)."""
    from terastack.llm.engine_state import open_checkpoint

    path = Path(checkpoint_dir) / ENGINE_DIR
    if not path.exists():
        raise FileNotFoundError(f"resume_from_checkpoint: {checkpoint_dir} has no {ENGINE_DIR}/ folder with the "
                                "offloaded engine's state (it was written without offload(), or with "
                                "save_only_model=True)")
    snapshot = open_checkpoint(path)
    engine.synchronize()
    store = engine.store
    for name in list(store.names()):
        store.delete(name)
    components = engine.checkpoint_components()
    snapshot.load({name: components[name] for name in RESUMED})


def export_model(engine, output_dir: str | os.PathLike) -> None:
    """The trained model (or adapter) into ``output_dir``, beside whatever else is there (a Trainer's output
    directory holds its checkpoint-N folders): written whole into a staging folder, then each file moved in."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".terastack-export-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        engine.save_pretrained(staging)
        stale = [p for p in out.glob("model*.safetensors*") if not (staging / p.name).exists()]
        for p in stale:  # shards of an earlier, larger export
            p.unlink()
        for p in sorted(staging.iterdir()):
            os.replace(p, out / p.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
