"""The one job runner (terastack.training.job_runner) on an engine of the test's own: a tiny Llama trained by plain
PyTorch AdamW in memory. What the runner owns -- the default learning rate, the data and its step count, the
schedule the engine is driven by, resume, metrics, the export, Ctrl-C and the result -- is checked here apart from
any offloading; each command (finetune, dist train) is that runner plus the choice of engine."""
from __future__ import annotations

import ast
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from terastack.training.checkpoint import save_checkpoint  # noqa: E402
from terastack.training.engine_protocol import StepStats, TrainingEngine  # noqa: E402
from terastack.training.interrupt import JobInterrupted  # noqa: E402
from terastack.training.job import build_job  # noqa: E402
from terastack.training.job_runner import (LR_FROM_SCRATCH, LR_LORA, LR_PRETRAINED, JobModel,  # noqa: E402
                                           JobRunner, job_lr)

ROOT = Path(__file__).resolve().parents[2] / "terastack"


class ModelState:
    """The model's and the optimizer's tensors as one checkpoint component."""

    def __init__(self, engine):
        self.engine = engine

    def state_dict(self) -> dict:
        return {"step": self.engine.steps, **{k: v.detach().clone() for k, v in self.engine.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.engine.steps = int(state["step"])
        self.engine.model.load_state_dict({k: v.read() for k, v in state.items() if k != "step"})


class InMemoryEngine:
    """A TrainingEngine: the whole model in memory, plain torch.optim.AdamW (``stop_at``: Ctrl-C before that
    step)."""

    def __init__(self, hf_config, lr: float, *, stop_at: int | None = None):
        import transformers

        torch.manual_seed(0)
        self.model = transformers.AutoModelForCausalLM.from_config(hf_config)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.lr, self.steps, self.history, self.stop_at = lr, 0, [], stop_at
        n = sum(p.numel() for p in self.model.parameters())
        self.profile = type("Counts", (), {"total_params": n, "trainable_params": n})()
        self.lrs: list[float] = []

    @property
    def step_count(self) -> int:
        return self.steps

    def step_accumulated(self, micro_batches) -> float:
        if self.stop_at is not None and self.steps + 1 == self.stop_at:
            raise KeyboardInterrupt
        for g in self.opt.param_groups:
            g["lr"] = self.lr
        self.lrs.append(self.lr)
        total = 0.0
        for mb in micro_batches:
            out = self.model(input_ids=torch.as_tensor(mb["input_ids"]), labels=torch.as_tensor(mb["labels"]))
            (out.loss / len(micro_batches)).backward()
            total += float(out.loss.detach()) / len(micro_batches)
        self.opt.step()
        self.opt.zero_grad()
        self.steps += 1
        self.history.append(StepStats(step=self.steps, loss=total, seconds=1.0, tokens=1))
        return total

    def step(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        return self.step_accumulated([{"input_ids": input_ids, "labels": input_ids if labels is None else labels}])

    @torch.no_grad()
    def loss(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float:
        return float(self.model(input_ids=torch.as_tensor(input_ids), labels=torch.as_tensor(labels)).loss)

    def synchronize(self) -> None:
        pass

    def save_checkpoint(self, path, *, components=None):
        return save_checkpoint(path, {"engine": ModelState(self), **(components or {})}, step=self.steps)

    def save_pretrained(self, path, *, dtype=None, max_shard_size="5GB"):
        self.model.save_pretrained(str(path), max_shard_size=max_shard_size)
        return Path(path)


class InMemoryChoice:
    command = "terastack finetune"

    def __init__(self, **kw):
        self.kw, self.engine = kw, None

    @contextmanager
    def open(self, start):
        self.engine = InMemoryEngine(start.model.hf_config, start.lr, **self.kw)
        if start.snapshot is not None:
            start.snapshot.load({"engine": ModelState(self.engine)}, optional=["engine"])
        yield self.engine

    def result(self, start, engine, done) -> dict:
        return {"engine": "in memory"}


def tiny_model() -> JobModel:
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=256, max_position_embeddings=64)
    return JobModel(name="tiny", hf_config=cfg, model_dir=None)


def job(tmp_path, **more):
    text = tmp_path / "text.txt"
    text.write_text("the job runner drives any engine the same way. " * 40)
    settings = {"data.path": str(text), "training.seq_len": 16, "training.batch_size": 2, "training.steps": 3,
                "training.warmup_steps": 1, "training.lr_schedule": "linear", **more}
    return build_job(settings)


def test_the_default_learning_rate_is_one_rule():
    model = tiny_model()
    assert job_lr(build_job({}), model) == LR_FROM_SCRATCH
    assert job_lr(build_job({}), JobModel(name="m", hf_config=model.hf_config, model_dir="/m")) == LR_PRETRAINED
    assert job_lr(build_job({"lora.rank": 4}), model) == LR_LORA
    assert job_lr(build_job({"training.lr": 2e-5}), model) == 2e-5


def test_runs_the_job_exports_and_reports(tmp_path):
    choice = InMemoryChoice()
    assert isinstance(InMemoryEngine(tiny_model().hf_config, 1e-3), TrainingEngine)
    out = tmp_path / "out"
    result = JobRunner(job(tmp_path, **{"output.dir": str(out)}), choice, loop_log=None).run(tiny_model())
    assert result["steps"] == 3 and result["engine"] == "in memory" and len(result["losses"]) == 3
    assert result["lr"] == LR_FROM_SCRATCH
    # the engine was driven by the job's schedule: 1 warmup step, then a linear decay to 0 over 3 steps
    assert choice.engine.lrs == pytest.approx([0.0, LR_FROM_SCRATCH, LR_FROM_SCRATCH / 2])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3]
    written = (out / "finetune.yaml").read_text()
    assert "lr: 0.0003" in written and "resume" not in written   # the job as run, to be run again
    assert (out / "config.json").exists()


def test_ctrl_c_names_the_checkpoint_and_the_resume_command(tmp_path):
    ckpt = tmp_path / "ckpt"
    settings = {"checkpoint.dir": str(ckpt), "checkpoint.every": 1}
    runner = JobRunner(job(tmp_path, **settings), InMemoryChoice(stop_at=3), loop_log=None,
                       argv=["finetune", "--steps", "3"])
    with pytest.raises(JobInterrupted) as info:
        runner.run(tiny_model())
    line = str(info.value)
    assert line.startswith("interrupted at step 2 of 3; last checkpoint") and "(step 2)" in line
    assert line.endswith(f"terastack finetune --steps 3 --resume {ckpt}")
    # resumed: the engine and the loop continue from the checkpoint, and the run ends at the job's length
    resumed = JobRunner(job(tmp_path, **settings, **{"checkpoint.resume": str(ckpt)}), InMemoryChoice(),
                        loop_log=None).run(tiny_model())
    assert resumed["first_step"] == 2 and resumed["steps"] == 3 and len(resumed["losses"]) == 1


@pytest.mark.parametrize("command", ["llm/finetune_cmd.py", "disdp/job_run.py"])
def test_the_commands_leave_the_job_to_the_runner(command):
    """Neither command wires the job's loop, data, metrics or output itself: those live in the runner once."""
    tree = ast.parse((ROOT / command).read_text())
    taken = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    wiring = {"terastack.training.loop", "terastack.training.metrics", "terastack.training.output_dir",
              "terastack.training.data.job_data", "terastack.training.data.epochs"}
    assert taken & wiring == set()
    assert "terastack.training.job_runner" in taken
