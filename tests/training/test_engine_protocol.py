"""The job loop drives any engine through TrainingEngine: a plain in-memory PyTorch engine (no terastack.llm)
trains under FinetuneLoop exactly as a hand-written loop over the same batches and learning rates."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from terastack.training.data.epochs import TokenWindows, windows_of
from terastack.training.engine_protocol import StepStats, TrainingEngine
from terastack.training.loop import FinetuneLoop, LoopConfig
from terastack.training.lr_schedule import LRSchedule

VOCAB, DIM, SEQ = 32, 8, 6


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, VOCAB))


def _loss_sum(model, ids, labels):
    """Summed next-token loss and the number of target tokens."""
    labels = ids if labels is None else labels
    logits = model(ids)[:, :-1]
    targets = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="sum",
                                             ignore_index=-100)
    return loss, int((targets != -100).sum())


class PlainEngine:
    """The smallest engine: a PyTorch model and torch.optim.AdamW in memory."""

    def __init__(self, seed: int = 0):
        self.model = _model(seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.0)
        self.history: list[StepStats] = []
        self.step_count = 0
        n = sum(p.numel() for p in self.model.parameters())
        self.profile = SimpleNamespace(total_params=n, trainable_params=n)

    @property
    def lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self.opt.param_groups[0]["lr"] = value

    def step(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        return self.step_accumulated([{"input_ids": input_ids, "labels": labels}])

    def step_accumulated(self, micro_batches) -> float:
        self.opt.zero_grad()
        parts = [_loss_sum(self.model, b["input_ids"], b.get("labels")) for b in micro_batches]
        tokens = sum(n for _, n in parts)
        loss = sum(l for l, _ in parts) / tokens
        loss.backward()
        self.opt.step()
        self.step_count += 1
        self.history.append(StepStats(step=self.step_count, loss=loss.item(), seconds=1e-3, tokens=tokens))
        return loss.item()

    def loss(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        with torch.no_grad():
            total, n = _loss_sum(self.model, input_ids, labels)
        return float(total / n)

    def synchronize(self) -> None:
        pass

    def save_checkpoint(self, path, *, components=None):
        raise NotImplementedError("this test engine keeps no checkpoints")

    def save_pretrained(self, path, *, dtype=None, max_shard_size="5GB"):
        raise NotImplementedError("this test engine exports nothing")


def test_a_plain_engine_satisfies_the_protocol_and_a_partial_one_does_not():
    assert isinstance(PlainEngine(), TrainingEngine)
    assert not isinstance(SimpleNamespace(lr=1.0, step=lambda **k: 0.0), TrainingEngine)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_loop_on_a_plain_engine_equals_a_hand_written_loop(grad_accum):
    tokens = np.random.default_rng(0).integers(0, VOCAB, 40 * SEQ)
    data = TokenWindows(tokens[:32 * SEQ], seq_len=SEQ, batch_size=2, seed=3)
    val = windows_of(tokens[32 * SEQ:], SEQ, limit=4)
    schedule = LRSchedule(LRSchedule.Config(kind="cosine", lr=1e-2, total_steps=5, warmup_steps=1))
    engine = PlainEngine()
    result = FinetuneLoop(engine, data, schedule, LoopConfig(total_steps=5, batch_size=2, grad_accum=grad_accum,
                                                             rows_per_epoch=data.rows, eval_every=2),
                          val_batches=val).run()
    # the reference: the same model, batches in the data order, AdamW at the schedule's learning rates
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    losses = []
    for s in range(5):
        opt.param_groups[0]["lr"] = schedule.lr_at(s)
        opt.zero_grad()
        parts = [_loss_sum(model, data.batch(s * grad_accum + k), None) for k in range(grad_accum)]
        loss = sum(l for l, _ in parts) / sum(n for _, n in parts)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert result.losses == losses
    assert [s for s, _ in result.evaluations] == [0, 2, 4, 5]
    for a, b in zip(engine.model.parameters(), model.parameters()):
        assert torch.equal(a, b)
