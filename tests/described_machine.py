"""A fixed machine description for the tests: the planner plans for it, so that tests neither probe this machine
(a quick probe measures its SSD and CPU for about ten seconds) nor depend on its timing."""
import json
from pathlib import Path

from terastack.plan.hardware import Hardware

TEST_MACHINE = Hardware(name="test machine", measured=True, cores=2, host_memory_bytes=8 << 30, cpu_flops=2e10,
                        memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=1e9, ssd_write_bytes_per_s=8e8,
                        cpu_adam_params_per_s=2e8)


def write_machine(path) -> str:
    """``TEST_MACHINE`` as a probe file at ``path``; returns the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(TEST_MACHINE.to_dict()))
    return str(path)
