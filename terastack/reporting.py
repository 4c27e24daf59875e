"""What every benchmark result carries: the machine, the software versions, the command."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

from terastack.memory import mem_total


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - absent packages simply have no version
        return None


def fio_version() -> str | None:
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine() -> dict:
    """The machine a figure was measured on: CPU model, cores, memory, kernel and accelerator."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_bytes": mem_total(), "kernel": platform.release(),
            "gpu": gpu}


def environment(**extra) -> dict:
    """The machine, the versions and the command of a result; ``extra``: what the caller adds (a benchmark its
    I/O backend: :func:`terastack.io.backend.backend_record`). This module sits below every part, so it names
    none of them."""
    import numpy
    import torch

    import terastack

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": {"python": platform.python_version(), "terastack": terastack.__version__,
                     "torch": torch.__version__, "numpy": numpy.__version__, "fio": fio_version(),
                     "transformers": _version("transformers"), "torch_geometric": _version("torch_geometric"),
                     "deepspeed": _version("deepspeed")},
        "command": " ".join(["terastack"] + sys.argv[1:]) if sys.argv and sys.argv[0].endswith("terastack")
        else " ".join(sys.argv),
        **extra,
    }


def print_result(result: dict, *, title: str, headline: list[str] | None = None, stream=None) -> None:
    """Human-readable result: the headline ratios first, then every other scalar field."""
    stream = stream or sys.stdout
    print(f"== {title} ==", file=stream)
    keys = list(headline or []) + [k for k in result if k not in (headline or [])]
    for key in keys:
        if key not in result:  # a headline field this variant of the benchmark does not report
            continue
        value = result[key]
        if isinstance(value, (dict, list)) or key == "environment":
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        print(f"  {key:32s} {value}", file=stream)


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1, default=str)
