"""The loop of `terastack finetune`: LR schedules against transformers, epochs, the trainer's settings from a
job, a job file of the format before sections, metrics, validation, the staged output directory and exact
resume. (The job's own reading: tests/training/test_job.py.)"""
import json
import math

import numpy as np
import pytest
import torch

from terastack.training.data.epochs import TokenWindows, total_steps, windows_of
from terastack.training.job import FLAT, JobConfig, build_job, resolve_job
from terastack.training.lr_schedule import LRSchedule, warmup_from_ratio

from ..exported import exported_weights

SEQ = 16
#: the bytes of the test texts: all below the tiny models' vocabulary
ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789\n", dtype=np.uint8)


# ------------------------------------------------------------------ schedules
def _reference_lrs(kind: str, lr: float, warmup: int, total: int, min_lr: float = 0.0) -> list[float]:
    """The learning rate of each optimizer step under transformers' scheduler (stepped after each step)."""
    import transformers.optimization as hf

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    if kind == "constant":
        sched = hf.get_constant_schedule_with_warmup(opt, warmup)
    elif kind == "linear":
        sched = hf.get_linear_schedule_with_warmup(opt, warmup, total)
    elif min_lr:
        sched = hf.get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total, min_lr=min_lr)
    else:
        sched = hf.get_cosine_schedule_with_warmup(opt, warmup, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 4])
def test_schedules_match_transformers(kind, warmup):
    total, lr = 13, 3e-4
    ours = LRSchedule(LRSchedule.Config(kind=kind, lr=lr, total_steps=total, warmup_steps=warmup))
    assert [ours.lr_at(s) for s in range(total)] == pytest.approx(_reference_lrs(kind, lr, warmup, total),
                                                                  rel=1e-12, abs=1e-18)


def test_cosine_min_lr_matches_transformers_and_bad_settings_are_named():
    ours = LRSchedule(LRSchedule.Config(kind="cosine", lr=1e-3, total_steps=10, warmup_steps=2, min_lr=1e-4))
    ref = _reference_lrs("cosine", 1e-3, 2, 10, min_lr=1e-4)
    assert [ours.lr_at(s) for s in range(10)] == pytest.approx(ref, rel=1e-12)
    assert ours.lr_at(10) == pytest.approx(1e-4)  # the floor, one step after the last
    lin = LRSchedule(LRSchedule.Config(kind="linear", lr=1e-3, total_steps=10, min_lr=1e-4))
    assert lin.lr_at(0) == pytest.approx(1e-3) and lin.lr_at(10) == pytest.approx(1e-4)
    assert warmup_from_ratio(0.1, 13) == 2 and warmup_from_ratio(0.0, 13) == 0
    with pytest.raises(ValueError, match="lr_schedule"):
        LRSchedule.Config(kind="step", lr=1e-3, total_steps=3)
    with pytest.raises(ValueError, match="min_lr"):
        LRSchedule.Config(kind="cosine", lr=1e-3, total_steps=3, min_lr=1e-2)


# ------------------------------------------------------------------ epochs
def test_token_windows_visit_every_window_once_per_epoch():
    tokens = np.arange(7 * 4 + 3)  # 7 windows of 4, 3 tokens left over
    w = TokenWindows(tokens, seq_len=4, batch_size=2, seed=3)
    assert w.rows == 7
    # micro-batch i holds rows 2i, 2i+1 of the stream; 7 micro-batches = 2 epochs
    rows = torch.cat([w.batch(i) for i in range(7)])
    starts = (rows[:, 0] // 4).tolist()
    first, second = starts[:7], starts[7:]
    assert sorted(first) == list(range(7)) and sorted(second) == list(range(7)) and first != second
    assert all(torch.equal(r, torch.arange(s * 4, s * 4 + 4)) for r, s in zip(rows, starts))
    again = TokenWindows(tokens, seq_len=4, batch_size=2, seed=3)
    assert torch.equal(again.batch(5), w.batch(5))  # a pure function of (seed, index): what resuming relies on
    assert not torch.equal(TokenWindows(tokens, seq_len=4, batch_size=2, seed=4).batch(0), w.batch(0))
    # job length
    assert total_steps(steps=None, epochs=2, rows=7, batch_size=2, grad_accum=1) == 7
    assert total_steps(steps=None, epochs=2, rows=7, batch_size=2, grad_accum=2) == 4
    assert total_steps(steps=None, epochs=0.5, rows=100, batch_size=4, grad_accum=1) == 13
    assert total_steps(steps=5, epochs=None, rows=100, batch_size=4, grad_accum=1) == 5
    held = windows_of(tokens, 4, limit=3)
    assert len(held) == 3 and all(torch.equal(ids, labels) for ids, labels in held)
    with pytest.raises(ValueError, match="at least seq_len"):
        TokenWindows(tokens[:3], seq_len=4, batch_size=1)


# ------------------------------------------------------------------ job files
def test_trainer_config_is_built_from_the_job():
    """A TrainerConfig is a view of the job: every setting reads the job's, by its flat name; unset settings read
    as what the engine chooses ("auto", a scratch store) and keep the job's one default; the optimizer's and the
    planner's settings follow from it."""
    from terastack.llm import LoraSpec, TrainerConfig

    job = build_job({"training.lr": 2e-5, "training.betas": [0.8, 0.9], "training.max_grad_norm": 1.0,
                     "training.seq_len": 64, "training.batch_size": 2, "training.grad_accum": 3,
                     "store.dirs": ["/a", "/b"], "store.host_budget": "64MiB", "data.pack": True,
                     "schedule.activation_policy": "keep,ssd", "offload.calibrate": False,
                     "offload.prefetch_depth": 2, "offload.optimizer_chunk": 4096, "lora.rank": 4})
    cfg = TrainerConfig.from_job(job, device_budget="8MiB")
    assert (cfg.lr, cfg.betas, cfg.max_grad_norm, cfg.seq_len, cfg.batch_size, cfg.grad_accum) == \
        (2e-5, (0.8, 0.9), 1.0, 64, 2, 3)
    assert (cfg.store_dir, cfg.host_budget, cfg.device_budget, cfg.packed) == ("/a,/b", 64 << 20, 8 << 20, True)
    assert (cfg.activation_policy, cfg.calibrate, cfg.prefetch_depth) == ("keep,ssd", False, 2)
    assert cfg.lora == LoraSpec(r=4, alpha=8)  # alpha: twice the rank unless given
    assert cfg.eps == TrainerConfig().eps and cfg.timeout == TrainerConfig().timeout and cfg.dtype == "auto"
    # one default per setting: the trainer's are the job's (no copy with defaults of its own)
    default, plain = TrainerConfig(), JobConfig()
    for name in ("batch_size", "seq_len", "grad_accum", "eps", "weight_decay", "seed", "optimizer_chunk"):
        assert getattr(default, name) == plain.get(FLAT[name]), name
    assert default.lr is None and default.device_budget == "auto" and default.store_dir
    with pytest.raises(TypeError, match="unknown setting 'learning_rate'"):
        TrainerConfig(learning_rate=1e-3)
    opt = cfg.optimizer_config(lr=cfg.lr)
    assert (opt.lr, opt.betas, opt.max_grad_norm, opt.optimizer_schedule) == (2e-5, (0.8, 0.9), 1.0, "deferred")
    plan = cfg.planner_config(device_budget=1 << 20, host_budget=2 << 20, inline_updates=True)
    assert (plan.policy, plan.prefetch_depth, plan.optimizer_chunk, plan.grad_accum) == ("keep,ssd", 2, 4096, 3)
    # a TrainerConfig is checked by the job's sections, in its own field names
    with pytest.raises(ValueError, match="^store_dir: '/a,' names an empty directory"):
        TrainerConfig(store_dir="/a,")
    with pytest.raises(ValueError, match="^optimizer_impl: must be one of"):
        TrainerConfig(optimizer_impl="fast")
    with pytest.raises(ValueError, match="^memory_budget: give either"):
        TrainerConfig(memory_budget="1GiB", host_budget="1GiB")
    with pytest.raises(ValueError, match="^optimizer_schedule: eager updates cannot apply a global-norm clip"):
        TrainerConfig(optimizer_schedule="eager", max_grad_norm=1.0)
    # the optimizer mode: a schedule named in the job, else eager / deferred with clipping / after backward
    for settings, mode in (({}, "eager"), ({"training.max_grad_norm": 1.0}, "deferred"),
                           ({"schedule.active_offload": False}, "after_backward"),
                           ({"schedule.optimizer": "after_backward"}, "after_backward"),
                           ({"schedule.optimizer": "deferred"}, "deferred")):
        assert TrainerConfig.from_job(build_job(settings)).optimizer_config(lr=1e-3).optimizer_schedule == mode, \
            settings


def test_shipped_configs_are_job_files():
    """The shipped configs are sectioned job files (no old spelling to note); TrainerConfig reads them too."""
    import io
    from pathlib import Path

    import terastack.llm
    from terastack.llm import TrainerConfig

    configs = sorted((Path(terastack.llm.__file__).parent / "configs").glob("*.toml"))
    assert len(configs) >= 2
    for path in configs:
        log = io.StringIO()
        job = resolve_job(file=path, flags={}, overrides=[], log=log)
        assert log.getvalue() == ""
        cfg = TrainerConfig.from_toml(path)
        assert (cfg.lr, cfg.seq_len, cfg.host_budget, cfg.dtype) == \
            (job.training.lr, job.training.seq_len, job.store.host_budget, job.store.dtype)


def test_bad_job_file_is_one_line_before_any_model_is_built(tmp_path, capsys):
    from terastack.cli import main

    path = tmp_path / "job.yaml"
    path.write_text("lr: 1e-4\nlearnig_rate: 3\n")
    assert main(["finetune", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown key 'learnig_rate'" in err and str(path) in err
    assert main(["finetune", "--steps", "2", "nonsense=1"]) == 2
    assert "unknown key 'nonsense'" in capsys.readouterr().err


# ------------------------------------------------------------------ the loop on a trainer
def _text_tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).choice(ALPHABET, n).astype(np.int64)


def test_loop_metrics_follow_the_trainer_and_validation_runs_every_n(tmp_path, trainer_config):
    """Every metrics line is the trainer's own StepStats at the schedule's lr; evaluations at 0, 2, 4 and the
    end, each equal to a validation loss computed on the trainer at that point."""
    from terastack.llm import Trainer
    from terastack.training.loop import FinetuneLoop, LoopConfig
    from terastack.training.metrics import MetricsLog, model_flops_per_token
    from terastack.training.data.examples import validation_loss

    from .llm_helpers import tiny_config

    tokens = _text_tokens(20 * SEQ)
    data = TokenWindows(tokens[:16 * SEQ], seq_len=SEQ, batch_size=2, seed=1)
    val = windows_of(tokens[16 * SEQ:], SEQ, limit=4)
    schedule = LRSchedule(LRSchedule.Config(kind="linear", lr=1e-3, total_steps=5, warmup_steps=2))
    with Trainer.from_config(tiny_config("llama", 2), trainer_config(max_grad_norm=1.0)) as trainer:
        from terastack.training.engine_protocol import TrainingEngine

        assert isinstance(trainer, TrainingEngine)  # the offloaded engine is one the loop can drive
        seen = []
        original = trainer.step

        def step(**inputs):  # record what the loop trains on, at which lr
            seen.append((trainer.lr, inputs["input_ids"].clone()))
            return original(**inputs)

        trainer.step = step
        with MetricsLog(tmp_path / "m.jsonl") as metrics:
            loop = FinetuneLoop(trainer, data, schedule, LoopConfig(total_steps=5, batch_size=2, rows_per_epoch=16,
                                                                    eval_every=2), val_batches=val, metrics=metrics)
            result = loop.run()
        final_val = validation_loss(trainer, val)
        lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
        steps = [r for r in lines if "loss" in r]
        evals = [r for r in lines if "val_loss" in r]
        assert [r["step"] for r in steps] == [1, 2, 3, 4, 5] and len(trainer.history) == 5
        flops = model_flops_per_token(trainer.profile.total_params, trainer.profile.trainable_params)
        assert flops == 6 * trainer.profile.total_params  # full fine-tuning
        for r, h, s in zip(steps, trainer.history, range(5)):
            assert set(r) == {"step", "epoch", "loss", "lr", "grad_norm", "tokens", "target_tokens", "seconds",
                              "tokens_per_s", "model_tflops", "ssd_read_bytes", "ssd_write_bytes", "device_in_bytes"}
            assert r["target_tokens"] == 2 * (SEQ - 1)  # text: every token after the first of a row is a target
            assert (r["loss"], r["tokens"], r["ssd_read_bytes"], r["ssd_write_bytes"]) == \
                (h.loss, h.tokens, h.ssd_read_bytes, h.ssd_write_bytes)
            assert r["grad_norm"] == h.grad_norm and r["grad_norm"] > 0  # measured: clipping is on
            assert r["lr"] == pytest.approx(schedule.lr_at(s)) and seen[s][0] == pytest.approx(r["lr"])
            assert r["tokens"] == 2 * SEQ and r["epoch"] == pytest.approx((s + 1) * 2 / 16)
            assert r["tokens_per_s"] == pytest.approx(h.tokens / h.seconds)
            assert r["model_tflops"] == pytest.approx(flops * h.tokens / h.seconds / 1e12)
        assert [ids for _, ids in seen] and all(torch.equal(ids, data.batch(i)) for i, (_, ids) in enumerate(seen))
        assert [e["step"] for e in evals] == [0, 2, 4, 5] == [s for s, _ in result.evaluations]
        assert evals[-1]["val_loss"] == pytest.approx(final_val, rel=1e-6)
        assert all(e["val_ppl"] == pytest.approx(math.exp(e["val_loss"])) for e in evals)
        assert result.losses == [h.loss for h in trainer.history]


# ------------------------------------------------------------------ the command
def _byte_model(path):
    """A tiny Llama over the byte vocabulary (BOS/EOS/PAD included), saved without a tokenizer: bytes."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=256,
                      eos_token_id=257, pad_token_id=258)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return str(path)


#: the job of the fixture below in the format before sections: flat keys and a trainer: table
OLD_FORMAT = ("model: {model}\ndata: {data}\nseq_len: {seq}\nbatch_size: 2\nepochs: 2\nlr: 5e-3\n"
              "lr_schedule: cosine\nwarmup_steps: 2\nmax_grad_norm: 1.0\n"
              "trainer:\n  calibrate: false\n  hardware: {hardware}\n  device_budget: 64MiB\n"
              "  host_budget: 64MiB\n  optimizer_impl: single\n")


@pytest.fixture
def job(tmp_path, hardware_file, capsys):
    """A model, 6 windows of training text plus held-out text, and a YAML job file for them."""
    model = _byte_model(tmp_path / "model")
    text = tmp_path / "train.txt"
    text.write_bytes(_text_tokens(6 * SEQ + 5).astype(np.uint8).tobytes())
    (tmp_path / "val.txt").write_bytes(_text_tokens(2 * SEQ, seed=9).astype(np.uint8).tobytes())
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {model}\ndata: {text}\n"
                    f"training: {{seq_len: {SEQ}, batch_size: 2, epochs: 2, lr: 5e-3, lr_schedule: cosine, "
                    "warmup_steps: 2, max_grad_norm: 1.0}\n"
                    "store: {device_budget: 64MiB, host_budget: 64MiB}\n"
                    f"offload: {{calibrate: false, hardware: {hardware_file}, optimizer_impl: single}}\n")
    (tmp_path / "old.yaml").write_text(OLD_FORMAT.format(model=model, data=text, seq=SEQ, hardware=hardware_file))
    capsys.readouterr()  # whatever importing transformers printed
    return path


def test_a_job_file_of_the_old_format_runs_unchanged(tmp_path, job, capsys):
    """The fixture's job written as before sections (flat keys, a trainer: table) reads as the same job, runs,
    and trains exactly as the sectioned file does; the moved keys are named in one note line."""
    from terastack.cli import main

    old = tmp_path / "old.yaml"
    assert resolve_job(file=old, flags={}, overrides=[], log=None) == resolve_job(file=job, flags={}, overrides=[])
    losses, notes = [], []
    for i, path in enumerate((old, job)):
        assert main(["finetune", "--config", str(path), "--steps", "3", "--store", str(tmp_path / f"s{i}"),
                     "--json"]) == 0
        captured = capsys.readouterr()
        losses.append(json.loads(captured.out[captured.out.index("{\n"):])["losses"])
        notes.append([line for line in captured.err.splitlines() if line.startswith("note:")])
    assert len(notes[0]) == 1 and notes[1] == []
    assert "trainer.calibrate is now offload.calibrate" in notes[0][0]
    assert "trainer.host_budget is now store.host_budget" in notes[0][0]
    assert len(losses[0]) == 3 and losses[0] == losses[1]


def test_resumed_job_equals_the_uninterrupted_one(tmp_path, job, capsys, monkeypatch):
    """6 steps (2 epochs of 6 windows, 2 per step) with cosine + warmup: once straight through, once failing
    at step 4 after a checkpoint at step 3 and resumed. The failure leaves no export, one error line and the
    metrics so far; the resumed run ends with the same weights, learning rates and losses."""
    from terastack.cli import main
    from terastack.llm.trainer import Trainer

    store = ["--store", str(tmp_path / "store")]
    assert main(["finetune", "--config", str(job), "--output", str(tmp_path / "full"), *store]) == 0
    capsys.readouterr()
    full = tmp_path / "full"
    assert {"config.json", "metrics.jsonl", "finetune.yaml"} <= {p.name for p in full.iterdir()}
    assert not (tmp_path / "full.partial").exists()
    # the export loads with transformers, and finetune.yaml repeats the job
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(full)).config.vocab_size == 259
    again = resolve_job(file=full / "finetune.yaml", flags={}, overrides=[])
    t = again.training
    assert t.epochs == 2 and t.lr == 5e-3 and t.lr_schedule == "cosine" and again.output.dir == str(full)

    original = Trainer.step

    def failing(self, *a, **k):
        if self.step_count == 3:
            raise ValueError("bad record in the middle of the run")
        return original(self, *a, **k)

    monkeypatch.setattr(Trainer, "step", failing)
    cut = tmp_path / "cut"
    args = ["finetune", "--config", str(job), "--output", str(cut), *store, "--checkpoint", str(tmp_path / "ck"),
            "--checkpoint-every", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "bad record in the middle" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not cut.exists()  # nothing that looks like a finished export
    partial = [json.loads(line) for line in (tmp_path / "cut.partial" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in partial] == [1, 2, 3]
    monkeypatch.setattr(Trainer, "step", original)
    assert main(args + ["--resume", str(tmp_path / "ck")]) == 0
    capsys.readouterr()
    a, b = exported_weights(full), exported_weights(cut)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-7, msg=k)
    lines_a = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    lines_b = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines_b] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in lines_b] == [r["lr"] for r in lines_a] == \
        pytest.approx(_reference_lrs("cosine", 5e-3, 2, 6), rel=1e-12, abs=1e-18)
    assert [r["loss"] for r in lines_b] == pytest.approx([r["loss"] for r in lines_a], rel=1e-6)
    assert lines_b[-1]["epoch"] == pytest.approx(2.0)


def test_validation_every_n_steps_through_the_command(tmp_path, job, capsys):
    from terastack.cli import main

    assert main(["finetune", "--config", str(job), "--val-data", str(tmp_path / "val.txt"), "--eval-every", "2",
                 "--metrics", str(tmp_path / "m.jsonl"), "--store", str(tmp_path / "store"), "--json",
                 "lr_schedule=linear", "warmup_steps=0"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out[captured.out.index("{\n"):])
    assert r["total_steps"] == 6 and r["steps"] == 6 and r["epochs"] == pytest.approx(2.0)
    assert [e["step"] for e in r["evaluations"]] == [0, 2, 4, 6]
    assert "validation loss before training: " in captured.err and "validation loss at step 4: " in captured.err
    assert "perplexity" in captured.err
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [x["val_loss"] for x in lines if "val_loss" in x] == [e["val_loss"] for e in r["evaluations"]]
    assert [x["loss"] for x in lines if "loss" in x] == r["losses"]
    assert [x["lr"] for x in lines if "lr" in x] == pytest.approx(_reference_lrs("linear", 5e-3, 0, 6), rel=1e-12)


def test_grad_accum_equals_the_larger_batch(tmp_path, job, capsys):
    """Two micro-batches of one full window accumulated equal one batch of both windows (same target tokens)."""
    from terastack.cli import main

    common = ["--config", str(job), "--store", str(tmp_path / "store"), "--steps", "3"]
    assert main(["finetune", *common, "--batch-size", "2", "--output", str(tmp_path / "big")]) == 0
    assert main(["finetune", *common, "--batch-size", "1", "--grad-accum", "2", "--output",
                 str(tmp_path / "acc")]) == 0
    capsys.readouterr()
    a, b = exported_weights(tmp_path / "big"), exported_weights(tmp_path / "acc")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    steps = [json.loads(line) for line in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in steps] == [2 * SEQ] * 3


def test_pack_trains_on_records(tmp_path, job, capsys):
    from terastack.cli import main

    records = tmp_path / "pc.jsonl"
    records.write_text("\n".join(json.dumps({"prompt": f"Q{i} ", "completion": f"A{i % 3}"}) for i in range(40)))
    assert main(["finetune", "--config", str(job), "--store", str(tmp_path / "store"), "--data", str(records),
                 "--pack", "--steps", "2", "--output", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2]


def test_output_is_sharded_above_max_shard_size_and_loads_with_transformers(tmp_path, job, capsys):
    """--max-shard-size splits the export as transformers does; the directory loads with from_pretrained."""
    from transformers import AutoModelForCausalLM

    from terastack.cli import main

    out = tmp_path / "out"
    assert main(["finetune", "--config", str(job), "--store", str(tmp_path / "store"), "--steps", "1",
                 "--max-shard-size", "20KB", "--output", str(out)]) == 0
    capsys.readouterr()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {p.name for p in shards}
    model = AutoModelForCausalLM.from_pretrained(str(out))
    weights = exported_weights(out)
    for name, p in model.state_dict().items():
        if name in weights:
            torch.testing.assert_close(p, weights[name], rtol=0, atol=0, msg=name)
