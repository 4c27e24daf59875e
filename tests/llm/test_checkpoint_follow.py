"""A checkpoint beside the store that follows the step: it holds a fraction of the state, and a process killed
inside a step, or while a point is written, resumes to the weights and losses of a run never killed."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from .llm_helpers import VOCAB, batches, make_model
from terastack.llm import Trainer
from terastack.tiers import Tier

STEPS = 4
#: state on the SSD, weights one unit ahead, activations recomputed: what a step holds on the device is weights
STREAMED = dict(state_placement="ssd", prefetch_depth=1, activation_policy="recompute", retain_weights=False)


def make_llama(path, *, dropout: float = 0.1, layers: int = 6):
    """An untied tiny Llama with dropout in attention (a resumed forward must draw the same masks)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=1, attention_dropout=dropout)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))


_UNINTERRUPTED: list = []


def uninterrupted(model_dir, config) -> tuple[list[float], dict, int]:
    """Losses, final weights, and the device ledger's peak over the steps from the third on (computed once: every
    caller's model is ``make_llama``'s default, seeded, and its config STREAMED)."""
    if not _UNINTERRUPTED:
        with Trainer.from_pretrained(model_dir, config) as t:
            torch.manual_seed(5)
            losses = [t.step(ids) for ids in batches(STEPS)[:2]]
            t.store.budgets[Tier.DEVICE].reset_peak()
            losses += [t.step(ids) for ids in batches(STEPS)[2:]]
            _UNINTERRUPTED.append((losses, t.state_dict(), t.usage()["device"]["peak"]))
    return _UNINTERRUPTED[0]


KILL_DRIVER = r"""
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from llm_helpers import batches
from terastack.llm import Trainer, TrainerConfig, step_checkpoint
from terastack.tiers import TieredStore
kill_at, inside, current = {kill_at!r}, [0], [None]

def die_at(where):
    if kill_at == where and inside[0] == 2:  # the second point inside the third step
        os.kill(os.getpid(), signal.SIGKILL)

write, commit = step_checkpoint.FollowingCheckpoint._write, TieredStore.commit
def killed_write(self, point):
    current[0] = point
    inside[0] += point.unit is not None and point.step == 2
    write(self, point)
    die_at("after-point")
def killed_commit(self, *a, **k):  # the store names the point's pinned commit; no snapshot names it yet
    out = commit(self, *a, **k)
    if current[0] is not None and k.get("names") is not None:
        die_at("in-commit")
    return out
step_checkpoint.FollowingCheckpoint._write, TieredStore.commit = killed_write, killed_commit

cfg = TrainerConfig(**{cfg!r})
with Trainer.from_pretrained({model!r}, cfg) as t:
    torch.manual_seed(5)
    for i, ids in enumerate(batches({steps})):
        t.step(ids)
        if i == 1:
            t.save_checkpoint({ckpt!r}, beside_store=True, follow=True)
print("not killed", flush=True)
"""


def run_killed_inside(tmp_path, config, model_dir, *, kill_at: str, steps: int = STEPS) -> None:
    """Train ``model_dir`` under ``config`` in a real process (store ``tmp_path/store-killed``) with a checkpoint
    that follows the steps from the second on (``tmp_path/ckpt``), killed with SIGKILL inside step 3 at
    ``kill_at`` (after-point, in-commit)."""
    fields = config.replace(store_dir=str(tmp_path / "store-killed")).to_dict()   # the settings, by flat name
    script = KILL_DRIVER.format(tests=os.path.dirname(__file__), cfg=fields, model=str(model_dir),
                                ckpt=str(tmp_path / "ckpt"), kill_at=kill_at, steps=steps)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("kill_at", ["after-point", "in-commit"])
def test_kill_9_inside_a_step_resumes_bit_equal(tmp_path, trainer_config, kill_at):
    """Killed after a point inside step 3 was written, or between a point's commit and its snapshot: the resume
    finishes step 3 from the last snapshot's point and reaches the uninterrupted run's losses and weights."""
    make_llama(tmp_path / "model")
    run_killed_inside(tmp_path, trainer_config(**STREAMED), tmp_path / "model", kill_at=kill_at)
    losses, expected, device_peak = uninterrupted(tmp_path / "model", trainer_config(**STREAMED))
    data = batches(STEPS)
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(**STREAMED)) as resumed:
        point = resumed.resumed_point
        assert resumed.step_count == 2 and point is not None  # inside step 3
        assert point.updated and point.unit is not None
        with pytest.raises(ValueError, match="give that step's batch again"):
            resumed.step(data[3])  # refused before anything runs: the trainer stays usable
        with pytest.raises(ValueError, match="resumed inside a step"):
            resumed.loss(data[2])  # some weights are the step's, some the step before's
        resumed.store.budgets[Tier.DEVICE].reset_peak()
        got_losses = [resumed.step(ids) for ids in data[2:]]
        # the forward stopped at the point's unit leaves no more weights on the device than a step does
        assert resumed.usage()["device"]["peak"] <= device_peak
        # the resumed trainer follows the checkpoint on: points in the rest of step 3, and in step 4
        assert resumed.following is not None and resumed.following.points_written >= 3
        got = resumed.state_dict()
    assert got_losses == losses[2:]
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(**STREAMED)) as again:
        assert again.step_count == STEPS and again.resumed_point is None
        assert all(torch.equal(again.parameter(k), expected[k]) for k in expected)


def test_a_following_checkpoint_holds_a_fraction_of_the_state(tmp_path, trainer_config, monkeypatch):
    """Without follow, one step after the checkpoint the store holds the whole state's old versions; following,
    at most a few units' at any point of the step, and every step ends with a snapshot of it."""
    make_llama(tmp_path / "model", layers=8)
    data = batches(3)
    peaks = {}
    for follow in (False, True):
        cfg = trainer_config(state_placement="ssd", store_dir=str(tmp_path / f"store-{follow}"))
        with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
            t.step(data[0])
            t.save_checkpoint(tmp_path / f"ckpt-{follow}", beside_store=True, follow=follow)
            live = t.store.usage()["ssd"]["live"]
            held = []
            runner = t.runtime.runner
            original = type(runner).backward

            def sampled(self, ctx, grad_outs, t=t, held=held, original=original):
                # a unit of a model worth checkpointing takes far longer than writing a point; so here: the points
                # offered so far are written before the next unit's backward (waited for, not timed)
                if t.following is not None:
                    t.following.drain()
                held.append(t.store.usage()["ssd"]["held"])
                return original(self, ctx, grad_outs)

            monkeypatch.setattr(type(runner), "backward", sampled)
            for ids in data[1:]:
                t.step(ids)
            t.synchronize()
            held.append(t.store.usage()["ssd"]["held"])
            monkeypatch.undo()
            peaks[follow] = max(held) / live
            if follow:
                assert t.following.taker.chain  # a decoder stack: embedding, layers, norm, head in a chain
                assert t.following.points_written > 2 * len(data[1:])  # points inside each step, and its end
                assert t.store.usage()["ssd"]["held"] == 0  # the last snapshot names the step's end
    assert peaks[False] > 0.9
    assert peaks[True] <= 0.25, peaks


def test_a_checkpoint_slower_than_the_step_writes_every_point(tmp_path, trainer_config, monkeypatch):
    """A disk slower than the step: the thread writes every point offered, in order, and the training thread waits
    rather than let the checkpoint fall behind, so the old versions held stay a few points' worth, not the state."""
    from terastack.llm import step_checkpoint

    make_llama(tmp_path / "model", layers=8)
    data = batches(3)
    offered, written, held = [], [], []
    offer, write = step_checkpoint.FollowingCheckpoint.offer, step_checkpoint.FollowingCheckpoint._write

    def slow_write(self, point):
        time.sleep(0.05)  # far longer than a tiny unit's backward
        held.append(self.trainer.store.usage()["ssd"]["held"])
        write(self, point)
        written.append((point.step, point.unit))

    def counted_offer(self, point):
        offer(self, point)
        offered.append((point.step, point.unit))
        held.append(self.trainer.store.usage()["ssd"]["held"])

    cfg = trainer_config(state_placement="ssd", store_dir=str(tmp_path / "store"))
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        t.step(data[0])
        monkeypatch.setattr(step_checkpoint.FollowingCheckpoint, "_write", slow_write)
        monkeypatch.setattr(step_checkpoint.FollowingCheckpoint, "offer", counted_offer)
        t.save_checkpoint(tmp_path / "ckpt", beside_store=True, follow=True)
        live = t.store.usage()["ssd"]["live"]
        for ids in data[1:]:
            t.step(ids)
        t.synchronize()
    inside = [p for p in offered if p[1] is not None]
    assert len(inside) >= 2 * len(data[1:])  # several points inside each step
    assert written == offered  # none skipped
    # at most three points' updates held at once (one written, one waiting, one the training thread is offering)
    assert max(held) / live <= 0.5, max(held) / live


def test_tied_or_clipped_steps_follow_at_their_ends_only(tmp_path, trainer_config):
    """A tied embedding has gradient still to come until the step's last unit, and clipped updates run after
    backward: no point inside the step, each step's end is one, and a resume from it is exact (GPT-2's dropout
    included)."""
    make_model("gpt2", tmp_path / "gpt2")
    make_llama(tmp_path / "llama")
    data = batches(4)
    for model, extra in (("gpt2", {}), ("llama", {"max_grad_norm": 0.5})):
        cfg = trainer_config(state_placement="ssd", store_dir=str(tmp_path / f"store-{model}"), **extra)
        with Trainer.from_pretrained(tmp_path / model, cfg) as reference:
            torch.manual_seed(5)
            losses = [reference.step(ids) for ids in data]
            expected = reference.state_dict()
        with Trainer.from_pretrained(tmp_path / model, cfg) as followed:
            torch.manual_seed(5)
            followed.step(data[0])
            followed.save_checkpoint(tmp_path / f"ckpt-{model}", beside_store=True, follow=True)
            for ids in data[1:3]:
                followed.step(ids)
            followed.synchronize()
            assert followed.following.points_written == 2  # the ends of steps 2 and 3
            if model == "gpt2":
                # its token and position embeddings both feed its first block: a level of two units, no point
                # after either; above them the blocks are a chain, but the tied head's tensor waits for its
                # embedding's gradient, so no point is taken inside the step
                taker = followed.following.taker
                embeddings = {u.index for u in followed.units if u.path in ("transformer.wte", "transformer.wpe")}
                assert taker.active and len(embeddings) == 2 and taker.chain and not taker.chain & embeddings
            else:  # updates after backward: no point inside the step
                assert not followed.following.taker.active
        with Trainer.load_checkpoint(tmp_path / f"ckpt-{model}", cfg) as resumed:
            assert resumed.step_count == 3 and resumed.resumed_point is None
            assert resumed.step(data[3]) == losses[3]
            got = resumed.state_dict()
            assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_follow_is_refused_without_beside_store(tmp_path, trainer_config):
    make_llama(tmp_path / "model", layers=2)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        with pytest.raises(ValueError, match="follow: needs beside_store=True"):
            t.save_checkpoint(tmp_path / "ckpt", follow=True)
