"""The checkpoints of a :class:`~terastack.llm.trainer.Trainer`: what it saves (each part a ``Stateful`` of
terastack.training.checkpoint), how it resumes, and the checkpoint that follows the steps beside the store
([Note: a checkpoint that follows the step] in terastack.llm.step_checkpoint)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from terastack.llm import engine_state
from terastack.llm.step_checkpoint import COMPONENT as STEP_IN_PROGRESS, FollowingCheckpoint, PendingStep
from terastack.llm.trainer_config import TrainerConfig
from terastack.training.checkpoint import JSONState, Snapshot, Stateful, save_checkpoint
from terastack.training.rng_state import RNGState

#: the components of a trainer's checkpoint; a caller's own components take other names
TRAINER_COMPONENTS = ("model", "optimizer", "progress", "rng", "trainer_config")


class TrainerCheckpoints:
    """Saving and resuming, for :class:`~terastack.llm.trainer.Trainer` (which provides the runtime, the
    optimizer, the step counter, ``synchronize`` and the open/closed checks)."""

    @classmethod
    def load_checkpoint(cls, path: "str | os.PathLike | Snapshot", config: TrainerConfig | None = None, *,
                        expect_model=None, components: Mapping[str, Stateful] | None = None):
        """Resume from :meth:`save_checkpoint`'s directory (or a snapshot of it,
        :func:`terastack.llm.engine_state.open_checkpoint`): the trainer of the model that wrote it is built, then
        its components (:meth:`checkpoint_components`) load their state, then ``components`` (more ``Stateful``
        parts saved with it: ``{"extra": JSONState()}`` receives ``save_checkpoint``'s ``extra``).
        ``expect_model``: a config the checkpoint must match."""
        config = config or TrainerConfig()
        snapshot = path if isinstance(path, Snapshot) else engine_state.open_checkpoint(path)
        rebuilt = engine_state.rebuild_model(snapshot, config, expect_model=expect_model)
        trainer = cls(rebuilt.model, rebuilt.hf_config, config, name=rebuilt.name, source=None, lora=rebuilt.lora,
                      empty=True, store_dirs=engine_state.store_dirs(snapshot), slices=rebuilt.slices)
        try:
            snapshot.load({**trainer.checkpoint_components(), STEP_IN_PROGRESS: trainer._pending,
                           **trainer._more_components(components)}, optional=(STEP_IN_PROGRESS,))
            if trainer._pending.follow:  # the checkpoint followed the steps: it goes on doing so
                trainer._follow(snapshot.path.parent, extra=snapshot.state("extra") if "extra" in snapshot.names
                                else None)
        except BaseException:
            trainer.close()
            raise
        return trainer

    def checkpoint_components(self, *, beside_store: bool = False) -> dict[str, Stateful]:
        """What a checkpoint of this trainer holds, each part saving itself: the model and its tensors in the
        store (masters, moments, frozen weights), the optimizer's learning rate and step counts, the steps taken
        and the RNG state (dropout draws). ``beside_store``: see :meth:`save_checkpoint`."""
        return {"model": engine_state.EngineState(self.runtime, name=self.name, hf_config=self.hf_config,
                                                  lora=self.lora, beside_store=beside_store,
                                                  slices=self.slicing.decision),
                "optimizer": self.optimizer, "progress": self.progress, "rng": RNGState()}

    def _more_components(self, components: Mapping[str, Stateful] | None) -> dict[str, Stateful]:
        taken = sorted(set(components or {}) & set(TRAINER_COMPONENTS))
        if taken:
            raise ValueError(f"components: {', '.join(taken)} is the trainer's own")
        return dict(components or {})

    def save_checkpoint(self, path: str | os.PathLike, *, extra: dict | None = None,
                        components: Mapping[str, Stateful] | None = None, beside_store: bool = False,
                        follow: bool = False) -> Path:
        """A consistent snapshot of weights, optimizer state and step, written atomically into ``path``
        (see [Note: checkpoint layout and atomicity] in terastack.training.checkpoint). ``components``: more
        ``Stateful`` parts saved beside the trainer's (a job's loop state); ``extra`` (JSON): saved as the
        ``extra`` component (``load_checkpoint(..., components={"extra": JSONState()})`` reads it back).
        ``beside_store``: the tensors are not copied; the store pins a commit and the checkpoint refers to it, so
        the store's directories are kept when the trainer closes and a resume opens the store where it is
        ([Note: resuming beside the store] in terastack.llm.engine_state). ``follow`` (beside the store): every
        later step moves the checkpoint forward, from points inside the step, so that it holds a few units' old
        versions instead of the state's ([Note: a checkpoint that follows the step] in
        terastack.llm.step_checkpoint); it follows until the trainer closes or saves another checkpoint."""
        self._check_open()
        more = self._more_components(components)
        if extra is not None and "extra" in more:
            raise ValueError("extra: given twice (as extra and as components['extra'])")
        if follow and (not beside_store or more):
            raise ValueError("follow: needs beside_store=True and no components of the caller's (their state "
                             "at each point inside a step is not known)")
        self._check_open(whole_model=True)
        self._stop_following()
        self.synchronize()
        saved = save_checkpoint(path, {**self.checkpoint_components(beside_store=beside_store),
                                       # what it was trained with, for whoever reads the checkpoint
                                       "trainer_config": JSONState(self.config.to_dict()),
                                       "extra": JSONState(extra), STEP_IN_PROGRESS: PendingStep(), **more},
                                step=self.step_count)
        if follow:
            self._follow(path, extra=extra)
        return saved

    def _follow(self, path, *, extra) -> None:
        self._following = FollowingCheckpoint(self, path, extra=extra, timeout=self.config.timeout)
        self.runtime.runner.points = self._following.taker

    @property
    def following(self) -> FollowingCheckpoint | None:
        """The checkpoint that follows the steps (``save_checkpoint(follow=True)``, or resumed from one), if any:
        its points written, their timings (``log``) and listeners (``on_written``)."""
        return self._following

    def _stop_following(self) -> None:
        following, self._following = self._following, None
        if following is not None:
            self.runtime.runner.points = None
            following.close()
