"""benchmarks/gpu-check.sh on a machine without a GPU: it stops at once with one line saying so, writes nothing."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs for minutes")
def test_gpu_check_without_a_gpu_stops_at_once(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu-check.sh"), str(out)], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    # one line and no step's own ("gpu-check: NAME (at most ...)"): it stopped before running anything
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], proc.stdout
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would train")
def test_gpu_check_helper_refuses_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "llm", "--out",
                           str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr
