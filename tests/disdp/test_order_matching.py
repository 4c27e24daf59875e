"""NCCL matches point-to-point messages between two ranks by their order alone (it has no tags, and no receive from
any source). Every rank of these jobs runs with torch.distributed's point-to-point calls wrapped (a
``sitecustomize`` on the ranks' ``PYTHONPATH``): every tag becomes 0 and a receive without a source is refused,
so gloo matches messages the way NCCL does. The jobs must still equal their references."""
from __future__ import annotations

import textwrap

import pytest

from terastack.disdp.launch import launch_local
from terastack.disdp.train_config import TrainConfig

from .test_train import TINY, _check_equal

pytest.importorskip("transformers", reason="the jobs' model is a transformers Llama")

from terastack.disdp.job_run import launch_job  # noqa: E402
from terastack.training.job import resolve_job  # noqa: E402

from ..exported import exported_weights  # noqa: E402
from .job_helpers import write_chat_job  # noqa: E402
from .test_job import _max_diff  # noqa: E402

#: what every rank imports at start-up: tags dropped, src=None refused
WRAPPER = textwrap.dedent('''
    import torch.distributed as dist

    def _wrap(op, peer_name):
        def wrapped(tensor, *args, **kwargs):
            kwargs.pop("tag", None)
            args = list(args)
            if len(args) >= 3:      # (peer, group, tag)
                args = args[:2]
            peer = args[0] if args else kwargs.get(peer_name, kwargs.get("group_" + peer_name))
            if peer is None:
                raise RuntimeError(f"{op.__name__} without a {peer_name}: NCCL cannot receive from any source")
            return op(tensor, *args, **kwargs)
        wrapped.__name__ = op.__name__
        return wrapped

    dist.isend, dist.send = _wrap(dist.isend, "dst"), _wrap(dist.send, "dst")
    dist.irecv, dist.recv = _wrap(dist.irecv, "src"), _wrap(dist.recv, "src")
''')


@pytest.fixture
def tags_ignored(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WRAPPER)
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers,servers,agents,aggregator,extra", [
    (2, 2, "thread", True, {}),
    (1, 2, "process", False, {}),
    (2, 1, "thread", False, {"state": "ssd", "reshard": False}),
], ids=["w2-s2-agg", "w1-s2-agentproc-noagg", "w2-s1-ssd-noreshard"])
def test_demo_jobs_equal_adamw_with_tags_ignored(tmp_path, tags_ignored, workers, servers, agents, aggregator,
                                                 extra):
    cfg = TrainConfig(**(TINY | extra | {"steps": 4, "timeout_s": 30}), workers=workers, servers=servers,
                      agents=agents, aggregator=aggregator, run_dir=str(tmp_path / "run"))
    _check_equal(cfg, launch_local(cfg, quiet=True))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("agents", ["process"])  # thread agents ignore tags in the demo jobs above
def test_a_job_equals_finetune_with_tags_ignored(tmp_path, tags_ignored, references, agents):
    """The job of ``terastack dist train`` (2 workers, 2 servers, the aggregator, clipping: the servers' norm and
    the step messages too) against ``terastack finetune``'s export."""
    refs, _ = references
    job = resolve_job(file=write_chat_job(tmp_path, workers=2, clip=0.5), flags={},
                      overrides=[f"output.dir={tmp_path / 'out'}", f"disdp.agents={agents}"], log=None)
    result = launch_job(job, quiet=True)
    assert result["steps"] == 3
    assert _max_diff(exported_weights(tmp_path / "out"), refs[0.5]) <= 1e-5
