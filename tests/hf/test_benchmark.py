"""benchmarks/hf_sft_offload.py at tiny size: the SFT script through offload and terastack finetune, each in a
forked child under the RSS watchdog, their peaks and step times measured and compared (the figures themselves are
the quiet full-size run's, not this test's)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..described_machine import write_machine

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_script_runs_both_contenders(tmp_path):
    pytest.importorskip("trl")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(4 << 20)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hf_sft_offload.py"), "--size", "tiny",
                           "--dir", str(tmp_path / "run"), "--budget", "64MiB", "--steps", "2", "--warmup", "1",
                           "--seq-len", "32", "--batch", "2", "--grad-accum", "2", "--rss-limit", "6GiB",
                           "--hardware", write_machine(tmp_path / "hw.json"), "--no-calibrate", "--fork", "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    for contender in ("sft", "finetune"):
        run = r["runs"][contender]
        assert len(run["step_s"]) == 2 and len(run["losses"]) == 2 and run["peak_rss_bytes"] > 0
    assert r["step_ratio"] == r["sft_step_s"] / r["finetune_step_s"] > 0
    assert r["sft_peak_rss_bytes"] == r["runs"]["sft"]["peak_rss_bytes"]
    # both trained on the same rows (the SFT script's dataset is finetune's windows), and left no store behind
    assert not (tmp_path / "run" / "sft" / "store").exists() and not (tmp_path / "run" / "finetune" / "store").exists()
