"""Roles, layout, schedule, configs and checkpoints: single-process checks against plain PyTorch."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest
import torch

from terastack.disdp.train_config import TrainConfig
from terastack.disdp.launch import JobFailed, describe_failures
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.workload import ModelSpec, build_model, global_batch, loss_of, worker_batch
from terastack.disdp.roles import Role, RoleMap
from terastack.disdp.worker import ShardedModel

pytestmark = pytest.mark.timeout(60)
TOY = ModelSpec(name="toy", dim=16, layers=3, vocab=32, seq_len=8)


def test_roles_from_ranks_thread_agents():
    roles = RoleMap(workers=3, servers=2, aggregator=True, agents="thread")
    assert roles.world_size == 6
    assert [roles.role_of(r) for r in range(6)] == [
        (Role.WORKER, 0), (Role.WORKER, 1), (Role.WORKER, 2), (Role.SERVER, 0), (Role.SERVER, 1),
        (Role.AGGREGATOR, 0)]
    assert roles.agent_ranks() == [0, 1, 2]          # the agent thread lives in its worker's rank
    assert roles.aggregator_rank == 5
    assert roles.describe(4) == "server 1 (rank 4)"
    assert "agent thread" in roles.table()


def test_roles_from_ranks_process_agents_without_aggregator():
    roles = RoleMap(workers=2, servers=1, aggregator=False, agents="process")
    assert roles.world_size == 5
    assert roles.role_of(3) == (Role.AGENT, 0) and roles.role_of(4) == (Role.AGENT, 1)
    assert roles.agent_rank(1) == 4 and roles.aggregator_rank is None
    assert roles.describe(3) == "agent 0 (rank 3)"
    with pytest.raises(ValueError, match="world size 4 does not match"):
        roles.check_world(4)
    with pytest.raises(ValueError, match="agents"):
        RoleMap(workers=1, servers=1, agents="nic")
    with pytest.raises(ValueError, match="rank 9"):
        roles.role_of(9)


def test_layout_covers_every_parameter_once_and_shards_partition():
    model = build_model(TOY, seed=0)
    layout = Layout.of(model, servers=3)
    names = [p.name for b in layout.buckets for p in b.params]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert [b.name for b in layout.buckets] == ["root", "blocks.0", "blocks.1", "blocks.2", "head.norm",
                                                "head.head"]
    assert [p.name for p in layout.buckets[0].params] == ["embed.weight"]
    assert [p.name for p in layout.buckets[-2].params] == ["norm.weight", "norm.bias"]
    assert layout.layers == 3 and layout.tail == 2
    for b in range(len(layout.buckets)):
        cuts = [layout.shard(b, s) for s in range(3)]
        assert cuts[0][0] == 0 and cuts[-1][1] == layout.buckets[b].numel
        assert all(cuts[i][1] == cuts[i + 1][0] for i in range(2))
    assert layout.fingerprint() == Layout.of(build_model(TOY, seed=1, meta=True), servers=3).fingerprint()
    assert layout.fingerprint() != Layout.of(model, servers=2).fingerprint()


def test_no_bucket_holds_the_embedding_and_the_head_together():
    # [Note: the root and the head apart] at a 32K vocabulary both are larger than a layer
    pytest.importorskip("transformers", reason="the example causal LM needs the [dist] extra")
    from transformers import AutoConfig

    from terastack.training.hf.model_files import build_skeleton

    def llama(tied):
        return build_skeleton(AutoConfig.for_model("llama", vocab_size=512, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=2,
                                                   num_key_value_heads=2, tie_word_embeddings=tied))

    layout = Layout.of(llama(False), servers=1)
    for b in layout.buckets:
        names = {p.name for p in b.params}
        assert not ({"model.embed_tokens.weight", "lm_head.weight"} <= names), b.name
    # one bucket per module after the layers: the head's gradient leaves without a copy into a flat vector
    assert [[p.name for p in b.params] for b in layout.buckets[-2:]] == [["model.norm.weight"], ["lm_head.weight"]]
    # tied: one parameter under both names, used first and last: one root bucket, no head bucket
    tied = Layout.of(llama(True), servers=1)
    assert not tied.head and tied.layers == 2
    assert {p.name for p in tied.buckets[0].params} == {"model.embed_tokens.weight", "model.norm.weight"}


def test_schedule_orders():
    layout = Layout.of(build_model(TOY, seed=0), servers=1)
    s = Schedule(layout, reshard=True)
    assert [(f.bucket, f.phase) for f in s.fetch_order] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0),
                                                             (2, 1), (1, 1)]
    assert s.grad_order == [5, 4, 3, 2, 1, 0]
    assert [(f.bucket, f.phase) for f in Schedule(layout, reshard=False).fetch_order] == [(0, 0), (1, 0), (2, 0),
                                                                                          (3, 0), (4, 0), (5, 0)]


class _LocalLink:
    """Serves buckets from in-memory flat vectors, in the schedule's order, as an agent would."""

    def __init__(self, sharded: ShardedModel, flats):
        self.sharded, self.flats, self.grads, self.delivered = sharded, flats, {}, []
        self.resident_at = {}   # delivery -> the buckets resident when it was asked for

    def begin_step(self, step):
        pass

    def wait_params(self, slot):
        f = self.sharded.schedule.fetch_order[slot]
        bucket = self.sharded.buckets[f.bucket]
        assert not bucket.resident, f"bucket {f.bucket} delivered while still in use"
        self.resident_at[(f.bucket, f.phase)] = [b.index for b in self.sharded.buckets if b.resident]
        # Raw-memory write, as a network receive does (no autograd version bump).
        src, dst = self.flats[f.bucket].detach().contiguous(), bucket.materialize()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * 4)
        self.delivered.append((f.bucket, f.phase))

    def released(self, bucket):
        pass

    def push_grad(self, bucket, grad):
        self.grads[bucket] = grad

    def end_step(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("spec", [TOY, ModelSpec(name="tiny-llama", dim=16, layers=2, vocab=32, heads=2,
                                                 seq_len=8)], ids=["toy", "tiny-llama"])
def test_sharded_model_hooks_give_plain_pytorch_gradients(spec):
    if spec.name == "tiny-llama":
        pytest.importorskip("transformers", reason="the example causal LM needs the [dist] extra")
    reference = build_model(spec, seed=3)
    batch = global_batch(spec, step=0, seed=3, rows=2)
    loss_of(reference, batch).backward()
    meta = build_model(spec, seed=3, meta=True)
    layout = Layout.of(meta, servers=1)
    schedule = Schedule(layout, reshard=True)
    sharded = ShardedModel(meta, layout, schedule)
    ref_params = dict(reference.named_parameters())
    flats = [torch.cat([ref_params[p.name].detach().reshape(-1) for p in b.params]) for b in layout.buckets]
    sharded.link = link = _LocalLink(sharded, flats)
    sharded.begin_step(0)
    loss = loss_of(sharded.model, batch)
    loss.backward()
    sharded.finish_step()
    assert link.delivered == [(f.bucket, f.phase) for f in schedule.fetch_order]
    assert sharded.resident_param_bytes() == 0        # nothing stays on the worker after the step
    assert sharded.peak_param_bytes < layout.numel * 4 or layout.layers < 3
    # [Note: what stays resident on a worker] the head arrives after the last layer, and a root of embedding
    # tables has left by then: the embedding and the head are never resident together
    head = layout.layers + 1
    assert layout.head and layout.buckets[head].name.startswith("head.")
    assert link.resident_at[(head, 0)] == [layout.layers]
    assert link.resident_at[(head + 1, 0)] == [layout.layers, head]
    for b in layout.buckets:
        for p in b.params:
            got = link.grads[b.index][p.offset:p.offset + p.numel].view(p.shape)
            torch.testing.assert_close(got, ref_params[p.name].grad, rtol=1e-5, atol=1e-6)


def test_worker_batches_split_the_global_batch():
    full = global_batch(TOY, step=4, seed=1, rows=6)
    parts = [worker_batch(TOY, step=4, seed=1, micro_batch=2, worker=w, workers=3) for w in range(3)]
    assert torch.equal(torch.cat(parts), full)


def test_train_config_validation_and_shipped_toml():
    with pytest.raises(ValueError, match="workers"):
        TrainConfig(workers=0)
    with pytest.raises(ValueError, match="state"):
        TrainConfig(state="tape")
    with pytest.raises(ValueError, match="kill_at"):
        TrainConfig(kill_at="server:x")
    with pytest.raises(ValueError, match="kill_at"):
        TrainConfig(kill_at="server:0:1:explode")
    with pytest.raises(ValueError, match="model"):
        TrainConfig(model="/nonexistent/model")
    shipped = sorted((Path(__file__).parents[2] / "terastack" / "disdp" / "configs").glob("*.toml"))
    assert shipped
    for path in shipped:
        cfg = TrainConfig.from_toml(path)
        assert cfg.roles().world_size >= 3


def test_demo_role_settings_are_the_jobs_disdp_section(tmp_path):
    """The demo's role settings are the job's disdp section (its defaults, its checks), read by flat names."""
    import pickle

    from terastack.training.job.sections import DisdpSection

    assert TrainConfig().disdp == DisdpSection()
    cfg = TrainConfig(workers=3, state="ssd", steps=2, run_dir=str(tmp_path))
    assert cfg.disdp == DisdpSection(workers=3, state="ssd", run_dir=str(tmp_path)) and cfg.workers == 3
    assert cfg.steps == 2 and cfg.checkpoint_dir == str(tmp_path / "checkpoints")
    assert TrainConfig().run_dir == "runs/dist"
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg
    cfg.progress = False
    assert cfg.disdp.progress is False
    with pytest.raises(ValueError, match="threads"):
        cfg.threads = 0
    with pytest.raises(TypeError, match="wokers"):
        TrainConfig(wokers=3)


def test_bad_toml_field_is_named(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[train]\nworkers = 2\nwokers = 3\n")
    with pytest.raises(ValueError, match="wokers"):
        TrainConfig.from_toml(path)


def _server(layout, index):
    """A memory-state server of ``layout`` (nothing sent: its endpoint is never connected)."""
    from terastack.disdp.comm import Comm
    from terastack.disdp.server import AdamWConfig, ParameterServer

    roles = RoleMap(workers=1, servers=layout.servers)
    return ParameterServer(ParameterServer.Config(state="memory", store_root=""), index=index, roles=roles,
                           comm=Comm(roles, roles.server_rank(index), timeout_s=1.0), layout=layout,
                           schedule=Schedule(layout, reshard=True), adamw_config=AdamWConfig(),
                           initial=[torch.zeros(b.numel) for b in layout.buckets])


def test_checkpoint_round_trip_and_damage_detection(tmp_path):
    """The servers' state through the checkpoint manager: the parameters read back by name, each server's
    slices of parameters and moments by its resume (on another number of servers), a damaged byte caught by the
    checksum."""
    from terastack.disdp.server_state import ServerState, load_parameters, resume_server
    from terastack.training.checkpoint import save_checkpoint
    from terastack.training.engine_protocol import StepCount

    model = build_model(TOY, seed=0)
    layout = Layout.of(model, servers=2)
    params = dict(model.named_parameters())
    flats = layout.flatten(params)
    moments = [(torch.randn(b.numel), torch.rand(b.numel)) for b in layout.buckets]
    state = ServerState(layout, pull=lambda b: {"param": flats[b], "exp_avg": moments[b][0],
                                                "exp_avg_sq": moments[b][1]}, adam_step=3.0)
    save_checkpoint(tmp_path, {"servers": state, "progress": StepCount(3)}, step=3)
    loaded, step = load_parameters(tmp_path)
    assert step == 3 and loaded.keys() == params.keys()
    for name, p in params.items():
        assert torch.equal(loaded[name], p.detach())
    three = Layout.of(model, servers=3)   # the state is unsharded: any number of servers resumes it
    for s in range(3):
        server = _server(three, s)
        assert resume_server(server, tmp_path) == 3
        for b in range(len(three.buckets)):
            lo, hi = three.shard(b, s)
            assert torch.equal(server.params.get(b), flats[b][lo:hi])
            state = server.optimizer_state.get(b, 1.0)
            assert torch.equal(state["exp_avg"], moments[b][0][lo:hi])
            assert torch.equal(state["exp_avg_sq"], moments[b][1][lo:hi])
            assert float(server.adam_steps[b]) == 3.0
    # A damaged byte is caught by the checksum, naming the file.
    data = tmp_path / "step-00000003" / "state.bin"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="state.bin.*checksum"):
        load_parameters(tmp_path)
    # A pointer may not point outside its directory.
    (tmp_path / "LATEST").write_text(json.dumps({"checkpoint": "../elsewhere", "step": 3}))
    with pytest.raises(ValueError, match="escapes"):
        load_parameters(tmp_path)


def test_a_baselines_parameters_do_not_resume_a_job(tmp_path):
    """The parameters alone (a baseline's result) read back, and are refused as a job's state."""
    from terastack.disdp.server_state import load_parameters, resume_server, save_parameters

    model = build_model(TOY, seed=1)
    layout = Layout.of(model, servers=1)
    save_parameters(tmp_path, layout, layout.flatten(dict(model.named_parameters())), 4)
    loaded, step = load_parameters(tmp_path)
    assert step == 4 and all(torch.equal(loaded[n], p.detach()) for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="holds no b0.param|holds no b0.exp_avg"):
        resume_server(_server(layout, 0), tmp_path)


def test_failure_message_names_first_dead_rank_and_role(tmp_path):
    class F:
        def __init__(self, exitcode, message="", timestamp=0):
            self.exitcode, self.message, self.timestamp = exitcode, message, timestamp

    roles = RoleMap(workers=2, servers=2)
    text = describe_failures(roles, {
        0: F(1, {"message": "PeerError: worker 0 (rank 0): lost server 1 (rank 3) while receiving ..."}, 5),
        3: F(-9, "", 9), 4: F(-15)}, "; no checkpoint was completed")
    assert text.startswith("server 1 (rank 3) died (SIGKILL); then worker 0 (rank 0) failed: PeerError")
    assert "1 other rank(s) were stopped" in text and "no checkpoint" in text
    # torchrun's own note of a signal death counts as the signal; an error recorded before an abort at
    # teardown counts as the error; a SIGTERM note is a stop.
    text = describe_failures(roles, {
        1: F(1, "Signal 9 (SIGKILL) received by PID 77", 9),
        2: F(-6, {"message": "TimeoutError: worker 0 (rank 0): waited 8 s"}, 3),
        0: F(1, "Signal 15 (SIGTERM) received by PID 78", 10)}, "")
    assert text.startswith("worker 1 (rank 1) died (SIGKILL); then server 0 (rank 2) failed: TimeoutError")
    assert "1 other rank(s) were stopped" in text
    assert issubclass(JobFailed, RuntimeError)


def _small_llama(layers=2):
    pytest.importorskip("transformers", reason="the example causal LM needs the [dist] extra")
    return build_model(ModelSpec(name="tiny-llama", dim=16, layers=layers, vocab=64, heads=2, seq_len=8), seed=5)


def test_streamed_shard_makes_each_servers_slices_one_bucket_at_a_time():
    """[Note: a server's starting weights] the slices equal the model's flat buckets cut by Layout.shard, and a
    stream in bucket order never holds more than the bucket asked for."""
    from terastack.disdp.initial_weights import StreamedShard

    model = _small_llama(3)
    layout = Layout.of(model, servers=2)
    flats = layout.flatten(dict(model.named_parameters()))
    for server in range(2):
        shard = StreamedShard(layout, server, iter(list(model.named_parameters())), source="test")
        for b in range(len(layout.buckets)):
            lo, hi = layout.shard(b, server)
            torch.testing.assert_close(shard[b], flats[b][lo:hi], rtol=0, atol=0)
        assert shard.peak_bytes == max(hi - lo for b in range(len(layout.buckets))
                                       for lo, hi in [layout.shard(b, server)]) * 4
    short = StreamedShard(layout, 0, iter([]), source="nowhere")
    with pytest.raises(ValueError, match="nowhere: no weights for model.embed_tokens.weight"):
        short[0]


def test_random_init_is_made_per_bucket_and_the_same_on_every_server():
    from terastack.disdp.initial_weights import StreamedShard, random_init

    model = _small_llama(2)
    meta = build_model(ModelSpec(name="tiny-llama", dim=16, layers=2, vocab=64, heads=2, seq_len=8), seed=5,
                       meta=True)
    one, two = Layout.of(meta, servers=1), Layout.of(meta, servers=2)
    whole = StreamedShard(one, 0, random_init(meta, one, seed=7), source="init")
    halves = [StreamedShard(two, s, random_init(meta, two, seed=7), source="init") for s in range(2)]
    std = model.config.initializer_range
    for b, bucket in enumerate(one.buckets):
        flat = whole[b]
        torch.testing.assert_close(torch.cat([halves[0][b], halves[1][b]]), flat, rtol=0, atol=0)
        for slot in bucket.params:   # the model's own initialization: norms at one, matrices ~ N(0, std)
            values = flat[slot.offset:slot.offset + slot.numel]
            if "norm" in slot.name:
                assert bool((values == 1).all()), slot.name
            else:
                assert abs(float(values.std()) - std) < 0.3 * std, slot.name
        assert whole.peak_bytes <= max(b.numel for b in one.buckets) * 4
    assert all(p.device.type == "meta" for p in meta.parameters())   # the skeleton is left as it was


def test_state_store_stays_within_its_budget_and_reads_ahead_only_into_free_room(tmp_path):
    """[Note: the server's host memory] takes always succeed within the working set: read-ahead copies are dropped
    to make room, write-backs are finished first, and the ledger's peak never passes the budget."""
    from terastack.constants import padded_size
    from terastack.disdp.server_memory import StateStore

    n = 1000
    slot = padded_size(n * 4)
    store = StateStore(tmp_path / "s", 3 * slot)
    for i in range(6):
        store.add(f"t{i}", torch.full((n,), float(i)), 60)
    a = store.take("t0", 60)
    store.take("t1", 60)
    store.read_ahead("t2")          # the last free slot
    store.read_ahead("t3")          # no room: not read
    assert "t3" not in store._ahead and "t2" in store._ahead
    a.add_(10)
    store.put_back("t0", dirty=True)
    c = store.take("t4", 60)        # room from t0's finished write-back, t2's copy kept
    assert float(c[0]) == 4
    d = store.take("t5", 60)        # full: t2's read-ahead copy is dropped
    assert float(d[0]) == 5 and "t2" not in store._ahead
    assert store.host_bytes() <= 3 * slot
    for name in ("t1", "t4", "t5"):
        store.put_back(name, dirty=False)
    assert float(store.take("t0", 60)[0]) == 10   # the modified copy was written back
    store.close()


def test_server_refuses_a_host_budget_below_its_working_set():
    from terastack.disdp.server import ParameterServer

    config = ParameterServer.Config(state="ssd", store_root="x", tier_params=True, host_budget=1 << 20)
    assert config.working_set(1 << 20) == 7 << 20 and config.host_budget_of(1 << 20) == 1 << 20
    assert ParameterServer.Config(state="ssd", store_root="x", tier_params=True).host_budget_of(1 << 20) == 7 << 20
    with pytest.raises(ValueError, match="host_budget"):
        ParameterServer.Config(state="ssd", store_root="x", host_budget=0)


def _pushing_agent(left):
    """A ThreadAgent over a network whose push of bucket ``b`` lands once ``left[b]`` is set (waits bounded at a
    minute: hang bounds), its window two gradients, at step 0."""
    from types import SimpleNamespace

    from terastack.disdp.agent import ThreadAgent

    comm = SimpleNamespace(me="worker 0", wait_all=lambda pend: [e.wait(60) for e in pend])
    core = SimpleNamespace(comm=comm, worker=0, push=lambda b, grad, step: [left[b]])
    schedule = Schedule(Layout.of(build_model(TOY, seed=0), servers=1), reshard=True)
    agent = ThreadAgent(core, schedule, [], first_step=0, steps=0, prefetch=1, timeout_s=60, grad_window=2)
    agent.begin_step(0)
    return agent


def test_thread_agent_holds_at_most_its_window_of_gradients():
    """[Note: gradients in flight] the third push waits until the first gradient has left."""
    import threading

    left = [threading.Event() for _ in range(3)]
    agent = _pushing_agent(left)
    agent.push_grad(0, torch.zeros(1))
    agent.push_grad(1, torch.zeros(1))
    third = threading.Thread(target=agent.push_grad, args=(2, torch.zeros(1)))
    third.start()
    third.join(0.3)
    assert third.is_alive()            # two gradients have not left: the compute thread waits
    left[0].set()
    third.join(60)
    assert not third.is_alive()
    left[1].set()
    left[2].set()
    agent.close()


def test_a_worker_waits_for_its_last_gradients_to_leave_before_its_census():
    """ThreadAgent.sent() returns once every gradient pushed has left, not before: the census of what a worker holds
    between steps (run_worker) is taken after it, so the last step's gradients still on their way out are not
    counted as state (on a busy machine the push thread was still sending them)."""
    import threading

    left = [threading.Event() for _ in range(2)]
    agent = _pushing_agent(left)
    agent.push_grad(0, torch.zeros(1))
    agent.push_grad(1, torch.zeros(1))
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (agent.sent(), done.set()))
    waiter.start()
    left[0].set()
    assert not done.wait(0.3)          # one gradient has not left: still waiting (a hang bound, not a pace)
    left[1].set()
    assert done.wait(60)
    waiter.join(60)
    agent.push_grad(0, torch.zeros(1))  # the window is whole again: a push after it does not wait
    agent.close()


def test_a_job_without_a_model_directory_starts_its_servers_one_bucket_at_a_time():
    """job_run.initial_shard: no model directory, a seeded initialization per bucket; a server's slices never
    stand whole in memory, and two servers' slices put together are one server's."""
    from types import SimpleNamespace

    from terastack.disdp.job_run import initial_shard
    from terastack.training.hf.model_files import build_skeleton
    from terastack.training.model_registry import resolve_model

    pytest.importorskip("transformers", reason="the built-in model is a transformers Llama")
    hf_config = resolve_model("tiny-llama")[0]

    def shard_of(index, servers):
        layout = Layout.of(build_skeleton(hf_config), servers)
        me = SimpleNamespace(layout=layout, index=index, model_dir=None, hf_config=hf_config,
                             job=SimpleNamespace(training=SimpleNamespace(seed=3), model=SimpleNamespace(path=None)))
        shard = initial_shard(me)
        slices = [shard[b] for b in range(len(layout.buckets))]
        largest = max(hi - lo for b in range(len(layout.buckets)) for lo, hi in [layout.shard(b, index)])
        assert shard.peak_bytes == largest * 4
        return slices

    whole = shard_of(0, 1)
    halves = [shard_of(s, 2) for s in range(2)]
    for b, flat in enumerate(whole):
        torch.testing.assert_close(torch.cat([halves[0][b], halves[1][b]]), flat, rtol=0, atol=0)
