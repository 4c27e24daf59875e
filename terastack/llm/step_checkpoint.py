"""A checkpoint beside the store that follows training inside every step, holding a few units' old versions.

[Note: a checkpoint that follows the step]
A checkpoint beside the store pins one commit of it, so it holds the old version of every record rewritten
since: after one step, every master and moment, as much again as the state ([Note: resuming beside the store]
in terastack.llm.engine_state). ``Trainer.save_checkpoint(path, beside_store=True, follow=True)`` writes that
checkpoint and then keeps it moving: at points inside every later step ([Note: points inside a step] in
terastack.llm.engine.step_points) and at each step's end, a :class:`FollowingCheckpoint` thread

1. waits for the updates the point covers (the optimizer's gates),
2. commits the records of the tensors updated so far this step, pinned (``commit(names, pin=True)``: it waits
   for those records' writes only, and the records not named keep the version the previous commit named),
3. writes a snapshot referring to that commit, with the point's step count, learning rate, AdamW step counts,
   RNG state and, inside a step, the ``step_in_progress`` component (:class:`PendingStep`: the unit, the
   gradient at its inputs, the loss, the batch's digest),
4. lets go of the previous commit once the snapshot is in place (the checkpoint manager's ``checkpoint_saved``).

So the checkpoint holds the old versions of what was updated since the last point that was written: about
``1 / POINTS_PER_STEP`` of the state per point, plus what the thread has not caught up with. The thread is
never more than two points behind: one being written and one waiting. A third point waits on the training
thread until the waiting one is taken. Skipping points instead would let a disk slower than the step hold up
to the whole state again beyond the store, the very bytes a checkpoint beside the store exists to save; on a
disk that keeps up (3.4B here: a point every 7 s, written in 3.5 s) the training thread never waits. Before a
step's backward begins (its first update), the thread has written every point of the step before, so a commit
never sees a record that the next step is rewriting.

A kill at any moment leaves a snapshot that names a pinned commit: during a step, a point inside it; during a
point's commit or snapshot, the point before (a resume reverts the store to it). A resumed trainer whose
checkpoint is inside a step must be given that step's batch again first (``step`` checks the digest); it then
finishes the step from the point (:func:`terastack.llm.engine.step.finish_step`) and trains on as if never
interrupted, bit for bit. A trainer resumed from a following checkpoint follows it on (its snapshots say so),
with points in the rest of the finished step too.

Points inside a step need eager updates (with clipping, or in the horizontal order of accumulation, updates
run after backward and only the step's end is a point); with them, the checkpoint holds up to the state until
the step ends.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from terastack.llm import engine_state
from terastack.llm.engine.step_points import PointTaker, StepPoint
from terastack.llm.engine.store_layout import records_for
from terastack.training.checkpoint import JSONState, StoredTensor, save_checkpoint
from terastack.training.rng_state import RNGState

#: points offered per step at most (one after each 1/POINTS_PER_STEP of the state was updated)
POINTS_PER_STEP = 16
COMPONENT = "step_in_progress"


class PendingStep:
    """The ``step_in_progress`` component: a point inside a step (``point``; None between steps)."""

    def __init__(self, point: StepPoint | None = None, *, follow: bool = False):
        self.point = point
        self.follow = follow  # written by a following checkpoint: a trainer resumed from it follows it on

    def state_dict(self) -> dict:
        p = self.point
        if p is None or p.unit is None:
            return {"unit": None, "follow": self.follow}
        out = {"unit": p.unit, "follow": self.follow, "step": p.step, "loss": p.loss, "lr": p.lr, "batch": p.batch,
               "updated": list(p.updated), "boundary": [g is not None for g in p.boundary],
               "rng_cpu": p.rng_after_forward["cpu"], "rng_cuda": len(p.rng_after_forward.get("cuda", []))}
        for i, g in enumerate(p.rng_after_forward.get("cuda", [])):
            out[f"rng_cuda:{i}"] = g
        for i, g in enumerate(p.boundary):
            if g is not None:
                out[f"boundary:{i}"] = g
        return out

    def load_state_dict(self, state: dict) -> None:
        self.follow = bool(state.get("follow"))
        if state.get("unit") is None:
            self.point = None
            return

        def read(key: str) -> torch.Tensor:
            value = state.get(key)
            if not isinstance(value, StoredTensor):
                raise ValueError(f"checkpoint: {COMPONENT} has no tensor {key!r}")
            return value.read()

        rng = {"cpu": read("rng_cpu"), "cuda": [read(f"rng_cuda:{i}") for i in range(int(state["rng_cuda"]))]}
        self.point = StepPoint(step=int(state["step"]), unit=int(state["unit"]), loss=float(state["loss"]),
                               lr=float(state["lr"]), batch=str(state["batch"]), updated=tuple(state["updated"]),
                               boundary=[read(f"boundary:{i}") if has else None
                                         for i, has in enumerate(state["boundary"])],
                               adam_steps={}, rng_after_forward=rng, rng_start={})


class FollowingCheckpoint:
    """Writes the points of ``trainer``'s steps into checkpoint ``path`` on a thread of its own ([Note: a
    checkpoint that follows the step]); ``extra``: the JSON saved as the ``extra`` component."""

    def __init__(self, trainer, path, *, extra: dict | None = None, timeout: float = 600.0):
        self.trainer, self.path, self.extra, self.timeout = trainer, Path(path), extra, timeout
        rt = trainer.runtime
        self.records = {name: [spec.record for spec in records_for(rt, name)]
                        for name, info in rt.tensors.items() if info.trainable}
        state_bytes = {name: sum(rt.store.record(r).nbytes for r in recs) for name, recs in self.records.items()}
        self.taker = PointTaker(trainer.optimizer, state_bytes, min_bytes=sum(state_bytes.values()) // POINTS_PER_STEP,
                                on_point=self.offer, before_backward=self.drain)
        self.points_written = 0
        self.write_seconds = 0.0  # the thread's time spent writing points (commits and snapshots)
        #: per point written: its step and unit, the tensors it covers, the store's held bytes when the thread
        #: took it, and the seconds spent waiting for its updates, committing and writing the snapshot
        self.log: list[dict] = []
        #: called on the thread with each point once its snapshot is in place (e.g. progress, or a test's kill)
        self.on_written: list = []
        self._cv = threading.Condition()
        self._waiting: StepPoint | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="terastack-checkpoint", daemon=True)
        self._thread.start()

    def offer(self, point: StepPoint) -> None:
        """A new point, written after the one being written; waits while another point is still waiting."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._waiting is None or self._error is not None, self.timeout):
                raise TimeoutError(f"checkpoint {self.path}: a point still waiting after {self.timeout:.0f} s")
            self.raise_if_failed()
            self._waiting = point
            self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every point offered is written (or the thread failed: re-raised here)."""
        with self._cv:
            if not self._cv.wait_for(lambda: (self._waiting is None and not self._busy) or self._error is not None,
                                     self.timeout):
                raise TimeoutError(f"checkpoint {self.path}: a point still being written after {self.timeout:.0f} s")
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"checkpoint {self.path}: writing a point failed ({type(self._error).__name__}: "
                               f"{self._error})") from self._error

    def close(self) -> None:
        """Write what was offered, then stop the thread."""
        try:
            self.drain()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._thread.join(self.timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._waiting is not None or self._closed)
                if self._waiting is None:
                    return
                point, self._waiting, self._busy = self._waiting, None, True
                self._cv.notify_all()  # an offer waiting for the slot
            try:
                self._write(point)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the training thread
                self._error = exc
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _write(self, point: StepPoint) -> None:
        start = time.perf_counter()
        t = self.trainer
        store = t.runtime.store
        held = store.usage()["ssd"].get("held", 0)
        for gate in point.gates:
            gate.result(self.timeout)
        finished = point.unit is None
        # at the step's end its updates are done and the next step's wait for this thread: the counts are exact
        steps = dict(t.optimizer.steps) if finished else point.adam_steps
        waited = time.perf_counter()
        store.commit(names=[r for name in point.updated for r in self.records.get(name, ())], pin=True)
        committed = time.perf_counter()
        components = {
            "model": engine_state.EngineState(t.runtime, name=t.name, hf_config=t.hf_config, lora=t.lora,
                                              commit=store.last_commit(), slices=t.slicing.decision),
            # the optimizer's own state (its format's name among it), with the point's rate and step counts
            "optimizer": JSONState({**t.optimizer.state_dict(), "lr": point.lr, "adam_steps": steps}),
            "progress": JSONState({"step": point.step + finished}),
            "rng": RNGState(point.rng_start),
            "trainer_config": JSONState(t.config.to_dict()),
            "extra": JSONState(self.extra),
            COMPONENT: PendingStep(None if finished else point, follow=True)}
        save_checkpoint(self.path, components, step=point.step + finished)
        self.points_written += 1
        done = time.perf_counter()
        self.write_seconds += done - start
        self.log.append({"step": point.step + 1, "unit": point.unit, "updated": len(point.updated),
                         "held_before": held, "wait_s": waited - start, "commit_s": committed - waited,
                         "snapshot_s": done - committed})
        for listener in self.on_written:
            listener(point)
