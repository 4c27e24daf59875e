"""The process-group backend follows the device ([Note: process-group backend] in terastack.disdp.comm): gloo on
the CPU, NCCL on CUDA, refused without CUDA; every rank of terastack dist joins through one function; no message
is received from any source, and no message kind shares a channel with its reverse ([Note: two channels])."""
import ast
from pathlib import Path

import pytest
import torch

import terastack.disdp
from terastack.disdp import comm as comm_module
from terastack.disdp.comm import CHANNEL_OF, Comm, Kind, backend_for, wire_device
from terastack.disdp.roles import RoleMap

DISDP = Path(terastack.disdp.__file__).parent


def _calls(name: str):
    """(file, call) for every call of a function or method called ``name`` in terastack/disdp."""
    for path in sorted(DISDP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Attribute) and f.attr == name) or (isinstance(f, ast.Name) and f.id == name):
                    yield path.relative_to(DISDP).as_posix(), node


def test_backend_follows_the_device(monkeypatch):
    assert backend_for("cpu") == "gloo"
    assert backend_for(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend_for("cuda") == "nccl"
    assert backend_for("cuda:1") == "nccl"
    with pytest.raises(ValueError, match="device"):
        backend_for("meta")


def test_nccl_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        backend_for("cuda")


def test_a_job_asking_for_cuda_without_it_is_refused_before_any_rank_starts(tmp_path, monkeypatch):
    from terastack.disdp.launch import launch_local
    from terastack.disdp.train_config import TrainConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        launch_local(TrainConfig(device="cuda", run_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="device"):
        TrainConfig(device="tpu")


def test_the_wire_is_the_host_on_gloo_and_the_ranks_gpu_on_nccl(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert wire_device("gloo") == torch.device("cpu")
    assert wire_device("nccl") == torch.device("cuda", 3)   # by index: a bare "cuda" is GPU 0 on other threads
    assert Comm(RoleMap(workers=1, servers=1), 0, timeout_s=1.0, backend="gloo").wire == torch.device("cpu")


def test_every_rank_joins_through_the_one_function():
    places = [(f, node.lineno) for f, node in _calls("init_process_group")]
    assert [f for f, _ in places] == ["comm.py"], places
    assert {f for f, _ in _calls("join_process_group")} >= {"run.py", "job_run.py", "baseline.py",
                                                            "bench/ranks.py"}


def test_no_receive_from_any_source():
    """NCCL has no receive from any source: every receive in terastack/disdp names its peer."""
    for name in ("irecv", "recv"):
        for f, node in _calls(name):
            src = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "src"),
                                                                None)
            assert src is not None and not (isinstance(src, ast.Constant) and src.value is None), (f, node.lineno)


def test_comm_refuses_a_message_without_its_peer():
    comm = Comm(RoleMap(workers=1, servers=1), 0, timeout_s=1.0)
    with pytest.raises(ValueError, match="names its peer"):
        comm.irecv(torch.empty(1), None, comm_module.tag(Kind.GRAD, 0), "a gradient")


def test_on_each_channel_a_pair_of_roles_talks_one_way():
    """Who sends each kind to whom: a channel never carries a kind and one in the reverse direction (NCCL runs
    both directions of a pair in one stream, in posting order)."""
    route = {Kind.PARAM: ("server", "agent"), Kind.GRAD: ("agent", "aggregator|server"),
             Kind.AGG_GRAD: ("aggregator", "server"), Kind.RELAY_PARAM: ("agent", "worker"),
             Kind.RELAY_GRAD: ("worker", "agent"), Kind.CKPT: ("server", "server"), Kind.STATS: ("worker", "agent")}
    assert set(route) == set(Kind) == set(CHANNEL_OF)
    for a in Kind:
        for b in Kind:
            if CHANNEL_OF[a] != CHANNEL_OF[b]:
                continue
            sa, da = route[a][0], set(route[a][1].split("|"))
            sb, db = route[b][0], set(route[b][1].split("|"))
            # b in the reverse direction of a: b's sender is among a's receivers and a's sender among b's
            # (server -> server is a checkpoint's slices, always to server 0: one way)
            reverse = sb in da and sa in db and not (a == b == Kind.CKPT)
            assert not reverse, (a, b)


@pytest.mark.parametrize("roles", [RoleMap(workers=2, servers=2), RoleMap(workers=3, servers=1, aggregator=False),
                                   RoleMap(workers=2, servers=2, agents="process"),
                                   RoleMap(workers=1, servers=2, aggregator=False, agents="process")],
                         ids=["agg", "noagg", "agentproc", "agentproc-noagg"])
def test_the_pairs_connected_at_start_are_those_that_talk(roles):
    """Every route of a step (and of a checkpoint's slices) is among the pairs :meth:`Comm.connect` makes at
    start-up, and nothing else is."""
    from terastack.disdp.comm import talking_pairs

    servers = [roles.server_rank(s) for s in range(roles.servers)]
    agents = roles.agent_ranks()
    routes = [(Kind.PARAM, s, a) for s in servers for a in agents]
    routes += ([(Kind.GRAD, a, roles.aggregator_rank) for a in agents]
               + [(Kind.AGG_GRAD, roles.aggregator_rank, s) for s in servers] if roles.aggregator
               else [(Kind.GRAD, a, s) for a in agents for s in servers])
    routes += [(Kind.CKPT, s, servers[0]) for s in servers[1:]]
    if roles.agents == "process":
        routes += [(k, *pair) for w in range(roles.workers) for k, pair in
                   ((Kind.RELAY_PARAM, (roles.agent_rank(w), roles.worker_rank(w))),
                    (Kind.RELAY_GRAD, (roles.worker_rank(w), roles.agent_rank(w))))]
    expected = sorted({(CHANNEL_OF[k], min(a, b), max(a, b)) for k, a, b in routes})
    assert talking_pairs(roles) == expected
    # one direction per pair and channel
    directions = {}
    for k, a, b in routes:
        directions.setdefault((CHANNEL_OF[k], min(a, b), max(a, b)), set()).add((a, b))
    assert all(len(d) == 1 for d in directions.values()), directions
