"""Fixtures the disaggregated engine's job tests share."""
from __future__ import annotations

import pytest

from .job_helpers import finetune_export, write_chat_job


@pytest.fixture(scope="session")
def references(tmp_path_factory):
    """``terastack finetune``'s exports of the job, clipping off and on (one process each); built once for the
    session: test_job.py and test_order_matching.py compare against the same two exports."""
    pytest.importorskip("transformers", reason="the jobs' model is a transformers Llama")
    root = tmp_path_factory.mktemp("reference")
    out = {}
    for clip in (None, 0.5):
        job = write_chat_job(root, clip=clip)
        out[clip] = finetune_export(job, root / f"out-{clip}", root / f"store-{clip}")
    return out, root
