"""terastack dist on NCCL ([Note: process-group backend] in terastack.disdp.comm): one GPU per rank, the data plane
staged through each rank's GPU, the step messages on gloo. Needs as many GPUs as ranks (skipped otherwise: one
GPU cannot hold two NCCL ranks)."""
from __future__ import annotations

import pytest
import torch

from terastack.disdp.launch import launch_local
from terastack.disdp.train_config import TrainConfig

from .test_train import TINY, _check_equal

pytestmark = pytest.mark.gpu


def _need_gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs (one per rank), found {torch.cuda.device_count()}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers,servers,agents,aggregator", [
    (1, 1, "thread", False),
    (2, 1, "thread", True),
    (1, 1, "process", False),
], ids=["2-ranks", "4-ranks-agg", "3-ranks-agentproc"])
def test_demo_on_nccl_equals_adamw(tmp_path, workers, servers, agents, aggregator):
    roles = TrainConfig(workers=workers, servers=servers, agents=agents, aggregator=aggregator).roles()
    _need_gpus(roles.world_size)
    cfg = TrainConfig(**(TINY | {"timeout_s": 90}), workers=workers, servers=servers, agents=agents,
                      aggregator=aggregator, device="cuda", run_dir=str(tmp_path / "run"))
    _check_equal(cfg, launch_local(cfg, quiet=True))


@pytest.mark.timeout(300)
def test_a_two_rank_job_on_nccl_equals_the_same_job_on_gloo(tmp_path):
    """``terastack dist train`` with one worker and one server on NCCL: the same export as on gloo (the workers
    compute on the CPU either way; only the wire differs)."""
    _need_gpus(2)
    pytest.importorskip("transformers", reason="the jobs' model is a transformers Llama")
    from terastack.disdp.job_run import launch_job
    from terastack.training.job import resolve_job

    from ..exported import exported_weights
    from .job_helpers import write_chat_job

    job_file = write_chat_job(tmp_path, workers=1, clip=0.5)
    out = {}
    for device in ("cpu", "cuda"):
        job = resolve_job(file=job_file, flags={}, log=None,
                          overrides=[f"output.dir={tmp_path / device}", "disdp.aggregator=false",
                                     f"disdp.device={device}", f"disdp.run_dir={tmp_path / ('run-' + device)}"])
        result = launch_job(job, quiet=True)
        assert result["steps"] == 3
        out[device] = exported_weights(tmp_path / device)
    assert sorted(out["cpu"]) == sorted(out["cuda"])
    for name, t in out["cpu"].items():
        torch.testing.assert_close(out["cuda"][name], t, rtol=0, atol=1e-6)
