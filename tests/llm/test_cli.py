"""`terastack finetune` (the README's main job), `terastack plan llm`, and the built-in corpus."""
import json

import numpy as np
import pytest

from terastack.cli import main


def test_finetune_default_run_trains_offloaded(tmp_path, capsys, monkeypatch):
    """The no-argument job at a few steps: the built-in tiny Llama on the standard-library corpus."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["finetune", "--steps", "3", "--json", "--store", str(tmp_path / "store"),
                 "--checkpoint", str(tmp_path / "ckpt"), "--save", str(tmp_path / "export")]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["model"] == "tiny-llama" and r["steps"] == 3 and len(r["losses"]) == 3
    assert r["data"]["tokenizer"] == "bytes" and "standard-library" in r["data"]["source"]
    assert r["ssd_read_bytes_per_step"] > 0 and r["plan"]["state_tensors_on_ssd"] > 0  # most state on the SSD
    assert "finetune: 3/3 step" in captured.err and "tok/s" in captured.err
    # the measured step beside the plan's (the mean of the steps after the first)
    assert r["predicted_step_s"] == r["plan"]["predicted_step_s"] > 0 and r["measured_steps"] == 2
    from terastack.training.job_runner import summary_lines

    line = next(line for line in summary_lines(r) if line.startswith("step "))
    assert f"{r['measured_step_s']:.3f} s measured (mean of 2 steps after the first)" in line
    assert f"{r['predicted_step_s']:.3f} s predicted by the plan" in line
    assert (tmp_path / "ckpt" / "LATEST").exists() and (tmp_path / "export" / "model.safetensors").exists()
    # resume continues from the checkpoint, refuses another model
    assert main(["finetune", "--steps", "4", "--resume", str(tmp_path / "ckpt"), "--store", str(tmp_path / "s2"),
                 "--json"]) == 0
    r2 = json.loads(capsys.readouterr().out)
    assert r2["first_step"] == 3 and r2["steps"] == 4
    assert main(["finetune", "--model", "llama-150m", "--steps", "4", "--resume", str(tmp_path / "ckpt")]) == 2
    assert "another model" in capsys.readouterr().err
    assert not list((tmp_path / "store").glob("run-*"))  # scratch stores are removed


def test_finetune_bad_input_is_one_clear_line(tmp_path, capsys):
    assert main(["finetune", "--model", str(tmp_path / "missing"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert main(["finetune", "--data", str(tmp_path / "none.txt"), "--steps", "1"]) == 2
    assert "data file" in capsys.readouterr().err


def test_plan_llm_paper_scale_prediction(capsys):
    assert main(["plan", "llm", "--model", "opt-175b", "--hardware", "rtx4090-workstation", "--seq-len", "2048",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prediction"] is True and r["fits"] is True and r["parameters"] > 1.7e11
    plan = r["plan"]
    assert plan["predicted_step_s"] > 0 and plan["predicted_bottleneck"]
    assert plan["predicted_device_peak_bytes"] + plan["predicted_transient_bytes"] <= 24 * 2**30
    assert main(["plan", "llm", "--model", "opt-175b", "--hardware", "rtx4090-workstation", "--host-mem", "4GB"]) \
        == 3  # does not fit: an exit status scripts can tell from a plan (0) and an error (2)
    out = capsys.readouterr().out
    assert "does not fit" in out and "host budget" in out and "short by" in out


def test_plan_llm_text_names_bottleneck(capsys):
    assert main(["plan", "llm", "--model", "llama-2-7b", "--gpu-mem", "24GB", "--gpu-tflops", "165",
                 "--host-mem", "64GB", "--ssd-bw", "6.8/4.5", "--hardware", "rtx4090-workstation",
                 "--batch-size", "4", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "hypothetical" in out and "bottleneck" in out and "tokens/s" in out


def test_stdlib_corpus_and_batches_are_deterministic():
    from terastack.training.data.stdlib_corpus import ByteTokenizer, TokenBatches, load_tokens

    a, info = load_tokens(None, None)
    b, _ = load_tokens(None, None)
    assert np.array_equal(a, b) and info["tokens"] == a.size > 100_000 and a.max() < 256
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
    batches = TokenBatches(a, seq_len=32, batch_size=3, seed=7)
    assert np.array_equal(batches.batch(5), TokenBatches(a, seq_len=32, batch_size=3, seed=7).batch(5))
    assert not np.array_equal(batches.batch(5), batches.batch(6))
    with pytest.raises(ValueError, match="at least seq_len"):
        TokenBatches(a[:10], seq_len=32, batch_size=1)
