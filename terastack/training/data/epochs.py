"""Epochs over training text: non-overlapping token windows in a seeded order per epoch, and the job's length.

[Note: the data order of a job]
The training rows -- token windows of a text, or the examples of a record file
(:class:`terastack.training.data.examples.ExampleBatches`) -- form one stream across epochs: epoch ``e`` visits every
row once, in the order ``np.random.default_rng([seed, e]).permutation(rows)``, and micro-batch ``i`` holds
rows ``i * batch_size ... (i + 1) * batch_size - 1`` of the stream (a micro-batch may straddle two epochs).
The micro-batch is therefore a pure function of (seed, i): a checkpoint stores how many micro-batches the job
has consumed, and the resumed job continues the stream exactly where it stopped.
"""
from __future__ import annotations

import math

import numpy as np
import torch


class TokenWindows:
    """A text's tokens cut into ``seq_len`` windows, visited epoch after epoch (see [Note: the data order of a
    job]). ``step_inputs(i)`` are the keyword arguments of ``Trainer.step`` for micro-batch ``i`` (the labels are
    the inputs: every token is predicted)."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, batch_size: int, seed: int = 0):
        rows = tokens.size // seq_len
        if rows < 1:
            raise ValueError(f"the training text has {tokens.size} tokens; at least seq_len = {seq_len} are needed")
        self.windows = tokens[:rows * seq_len].reshape(rows, seq_len)
        self.batch_size, self.seed = batch_size, seed
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def rows(self) -> int:
        return self.windows.shape[0]

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.rows))
        return self._order[1]

    def batch(self, index: int) -> torch.Tensor:
        n = self.rows
        picks = range(index * self.batch_size, (index + 1) * self.batch_size)
        return torch.from_numpy(np.stack([self.windows[self._epoch_order(r // n)[r % n]] for r in picks]))

    def step_inputs(self, index: int) -> dict:
        return {"input_ids": self.batch(index)}


class DataOrder:
    """Where a job stands in its data order (see [Note: the data order of a job]): ``micro_batches`` of
    ``batch_size`` rows consumed from the stream of ``seed``. Its state is a checkpoint's part of the data: a
    resumed job continues the stream only with the same seed and micro-batch size."""

    def __init__(self, *, seed: int, batch_size: int, rows_per_epoch: int, micro_batches: int = 0):
        self.seed, self.batch_size, self.rows_per_epoch = seed, batch_size, rows_per_epoch
        self.micro_batches = micro_batches

    @property
    def epoch(self) -> float:
        """Epochs done (fractional): rows consumed over rows per epoch."""
        return self.micro_batches * self.batch_size / self.rows_per_epoch

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batch_size": self.batch_size, "micro_batches": self.micro_batches,
                "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("batch_size", self.batch_size), ("seed", self.seed)):
            if state.get(key) != mine:
                raise ValueError(f"--resume: the checkpoint's data order has {key} {state.get(key)}, this job "
                                 f"{mine}; give the same value to continue it")
        self.micro_batches = int(state["micro_batches"])


def windows_of(tokens: np.ndarray, seq_len: int, limit: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Held-out text as ``(input_ids, labels)`` batches of one window each, at most ``limit`` of them (the
    validation loss of :func:`terastack.training.data.examples.validation_loss`)."""
    rows = min(limit, tokens.size // seq_len)
    out = []
    for r in range(rows):
        ids = torch.from_numpy(tokens[r * seq_len:(r + 1) * seq_len].copy()).unsqueeze(0)
        out.append((ids, ids))
    if not out and tokens.size >= 2:  # a held-out text shorter than one window is still one (short) row
        ids = torch.from_numpy(tokens.copy()).unsqueeze(0)
        out.append((ids, ids))
    return out


def total_steps(*, steps: int | None, epochs: float | None, rows: int, batch_size: int, grad_accum: int) -> int:
    """The job's optimizer steps: ``steps``, or enough for ``epochs`` passes over ``rows`` training rows with
    ``batch_size * grad_accum`` rows per step (the last step may reach into the next epoch)."""
    if steps is not None:
        return steps
    return max(1, math.ceil(epochs * rows / (batch_size * grad_accum)))
