"""Optimizer state formats equal their reference libraries: ``adamw8bit`` bitsandbytes' AdamW8bit (the 8-bit
state bytes and block scales too), ``adafactor`` torch.optim.Adafactor; chunked updates over state on the SSD,
through the real trainer, and a checkpoint resumed bit for bit."""
import pytest
import torch
import torch.nn.functional as F

from .llm_helpers import BATCH, SEQ, VOCAB, batches, offloaded_train
from .llm_helpers import reference_train as adamw_reference_train
from terastack.llm import Trainer
from terastack.llm.engine import records
from terastack.llm.engine.adamw import ChunkState
from terastack.plan import optimizer_formats as formats
from terastack.plan.optimizer_formats import FORMATS, optimizer_format

bnb = pytest.importorskip("bitsandbytes")

STEPS = 3
LR, WD = 1e-2, 0.01


class Hyper:
    betas, eps, weight_decay = (0.9, 0.999), 1e-8, WD


def chunked_update(fmt, params, states, grads, steps, chunk):
    """One update of ``fmt`` over every parameter in chunks of ``chunk`` elements (the state: views of the
    parts' whole tensors, as the engine's chunk records hold them)."""
    group = []
    for name, p in params.items():
        flat, g = p.view(-1), grads[name].reshape(-1)
        for k, lo in enumerate(range(0, p.numel(), chunk)):
            hi = min(lo + chunk, p.numel())
            st = {}
            for part in fmt.parts(tuple(p.shape)):
                if part.chunked:
                    a, b = part.span(lo, hi)
                    st[part.key] = states[name][part.key].view(-1)[a:b]
                elif k == 0:
                    st[part.key] = states[name][part.key]
            group.append(ChunkState(name=name, chunk=k, lo=lo, hi=hi, shape=tuple(p.shape), param=flat[lo:hi],
                                    grad=g[lo:hi], state=st))
    fmt.update(group, [steps[c.name] for c in group], lr=LR, hyper=Hyper, impl={})
    for name in params:
        steps[name] += 1


def zero_state(fmt, params):
    return {name: {part.key: torch.zeros(part.shape(tuple(p.shape)), dtype=part.dtype)
                   for part in fmt.parts(tuple(p.shape))} for name, p in params.items()}


SHAPES = {"w": (80, 70), "v": (5003,), "small": (30, 9), "bias": (100,)}


def random_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def test_adamw8bit_chunks_give_bitsandbytes_bytes():
    """Chunks of 1024 elements (4 blocks): parameters, 8-bit moments and absmax equal AdamW8bit's bytes; a
    parameter under min_8bit_size keeps fp32 moments, as the library does."""
    fmt = optimizer_format("adamw8bit")
    params = random_params()
    ref = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = bnb.optim.AdamW8bit(list(ref.values()), lr=LR, weight_decay=WD)
    states, steps = zero_state(fmt, params), dict.fromkeys(params, 0)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        grads = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
        for n, p in ref.items():
            p.grad = grads[n].clone()
        opt.step()
        chunked_update(fmt, params, states, grads, steps, fmt.chunk_elements(1100))
    for n, p in ref.items():
        st = opt.state[p]
        assert torch.equal(params[n], p.detach()), n
        assert states[n]["state1"].dtype == st["state1"].dtype
        assert states[n]["state1"].dtype == (torch.uint8 if p.numel() >= 4096 else torch.float32), n
        for key, value in states[n].items():
            assert torch.equal(value.view(-1), st[key].view(-1)), (n, key)
        if p.numel() >= 4096:  # the qmaps are the library's
            assert torch.equal(fmt.qmaps()[0], st["qmap1"]) and torch.equal(fmt.qmaps()[1], st["qmap2"])


def test_adamw8bit_is_not_fp32_adamw():
    """The check above can fail: AdamW with fp32 moments (the default format) gives other weights."""
    params = random_params()
    fmt = optimizer_format("adamw")
    ref = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = bnb.optim.AdamW8bit(list(ref.values()), lr=LR, weight_decay=WD)
    states, steps = zero_state(fmt, params), dict.fromkeys(params, 0)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        grads = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
        for n, p in ref.items():
            p.grad = grads[n].clone()
        opt.step()
        chunked_update(fmt, params, states, grads, steps, 1024)
    assert not torch.equal(params["w"], ref["w"].detach())


def test_adamw8bit_chunk_is_a_whole_number_of_blocks():
    fmt = optimizer_format("adamw8bit")
    assert [fmt.chunk_elements(c) for c in (1024, 1100, 100, 1 << 20)] == [1024, 1024, 256, 1 << 20]
    assert optimizer_format("adamw").chunk_elements(1100) == 1100


def test_adafactor_whole_matrix_groups_equal_torch():
    """Chunks of 512 elements cut rows of the matrix: gathered per parameter, the update is torch's."""
    fmt = optimizer_format("adafactor")
    params = random_params()
    ref = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = torch.optim.Adafactor(list(ref.values()), lr=LR, weight_decay=WD)
    states, steps = zero_state(fmt, params), dict.fromkeys(params, 0)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        grads = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
        for n, p in ref.items():
            p.grad = grads[n].clone()
        opt.step()
        chunked_update(fmt, params, states, grads, steps, 512)
    for n, p in ref.items():
        assert torch.equal(params[n], p.detach()), n
        st = opt.state[p]
        for key, value in states[n].items():
            assert torch.equal(value, st[key]), (n, key)


def test_adafactor_refuses_part_of_a_matrix():
    fmt = optimizer_format("adafactor")
    p, grad = torch.randn(8, 8), torch.randn(8, 8)
    st = {part.key: torch.zeros(part.shape((8, 8))) for part in fmt.parts((8, 8))}
    c = ChunkState(name="w", chunk=0, lo=0, hi=32, shape=(8, 8), param=p.view(-1)[:32], grad=grad.view(-1)[:32],
                   state=st)
    with pytest.raises(RuntimeError, match="part of its chunks"):
        fmt.update([c], [0], lr=LR, hyper=Hyper, impl={})


def test_state_bytes_per_format():
    shape = (4096, 1024)
    n = 4096 * 1024
    assert optimizer_format("adamw").state_bytes(shape) == 8 * n
    assert optimizer_format("adamw8bit").state_bytes(shape) == 2 * n + 2 * 4 * (n // 256)
    assert optimizer_format("adafactor").state_bytes(shape) == 4 * (4096 + 1024)
    assert optimizer_format("adafactor").state_bytes((1024,)) == 4 * 1024
    assert optimizer_format("adamw8bit").state_bytes((100,)) == 8 * 100  # under min_8bit_size: fp32
    with pytest.raises(ValueError, match="optimizer: must be one of adamw, adamw8bit, adafactor"):
        optimizer_format("sgd")


def test_state_part_record_names():
    assert (formats.EXP_AVG_KIND, formats.EXP_AVG_SQ_KIND, formats.OTHER_KIND) == \
        (records.EXP_AVG, records.EXP_AVG_SQ, records.OPTIMIZER_STATE)
    r = records.state_part("model.layers.0.w", records.OPTIMIZER_STATE, "absmax1", 3)
    assert r == "o.absmax1:model.layers.0.w#3"
    assert records.parse(r) == ("o", "model.layers.0.w", 3)
    assert records.parse("o.row_var:x.weight") == ("o", "x.weight", None)
    assert records.state_part("x", records.EXP_AVG, "state1", 0) == records.moment("x", 1, 0)
    for bad in ("o:x#1", "m.state1:x#1", "o.:x"):
        with pytest.raises(ValueError):
            records.parse(bad)


# ----------------------------------------------------------------- through the trainer
def make_wide_model(path, seed=0):
    """A tiny llama whose larger matrices reach bitsandbytes' min_8bit_size (4096) and whose norms, k and v do
    not: both of the library's paths in one model."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=1)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(path))
    model.train()
    return model


def reference_optimizer(fmt: str, params):
    if fmt == "adamw8bit":
        return bnb.optim.AdamW8bit(params, lr=LR, weight_decay=WD)
    return torch.optim.Adafactor(params, lr=LR, weight_decay=WD)


def reference_train(model, data, fmt, *, max_grad_norm=None, seed=5):
    """The reference library's optimizer of ``fmt`` in plain in-memory training."""
    return adamw_reference_train(model, data, max_grad_norm=max_grad_norm, seed=seed,
                                 opt=reference_optimizer(fmt, list(model.parameters())))


def reference_accumulated(ref, opt, steps, *, clip=None) -> None:
    """The library's training on the same micro-batches: each one's gradient of the token-weighted loss added into
    ``.grad`` (the order the engine adds its passes in), clipped over the sum (``clip``), then the library's step."""
    for mbs in steps:
        total = sum(mb["input_ids"][:, 1:].numel() for mb in mbs)
        for mb in mbs:
            ids = mb["input_ids"]
            logits = ref(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
                                   reduction="sum") / total
            loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.step()
        opt.zero_grad()


def stored_state(trainer, name):
    """part key -> the whole part of ``name`` read back from the store (all its chunk records)."""
    rt = trainer.runtime
    trainer.synchronize()
    return {part.key: torch.cat([rt.read_record(r).reshape(-1) for r in recs])
            for part, recs in rt.state_parts(name).items()}


def config(trainer_config, fmt, **kw):
    kw.setdefault("state_placement", "ssd")
    kw.setdefault("optimizer_chunk", 1024)  # several chunks per matrix (a 64x128 matrix: 8)
    return trainer_config(optimizer=fmt, lr=LR, weight_decay=WD, batch_size=BATCH, seq_len=SEQ, **kw)


@pytest.mark.parametrize("fmt,clip,inline", [("adamw8bit", None, None), ("adamw8bit", 0.5, False),
                                             ("adafactor", None, None), ("adafactor", 0.5, False)],
                         ids=["8bit", "8bit-clip-thread", "adafactor", "adafactor-clip-thread"])
def test_trainer_equals_reference_library(fmt, clip, inline, tmp_path, trainer_config):
    """State on the SSD in chunks, updated inline (as on a CPU) or on the optimizer thread, with and without
    a global-norm clip: weights and state equal the library's after several steps."""
    ref = make_wide_model(tmp_path / "model")
    data = batches(STEPS)
    cfg = config(trainer_config, fmt, max_grad_norm=clip, inline_updates=inline)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        assert trainer.runtime.format.name == fmt
        assert any(len(trainer.runtime.chunk_ranges(n)) > 1 for n in trainer.tensors)
        losses = offloaded_train(trainer, data)
        ref_losses, opt = reference_train(ref, data, fmt, max_grad_norm=clip)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        for name, p in ref.named_parameters():
            assert torch.equal(trainer.parameter(name), p.detach()), name
            st = opt.state[p]
            assert trainer.optimizer.steps[name] == int(st["step"]) == STEPS
            for key, value in stored_state(trainer, name).items():
                assert torch.equal(value, st[key].reshape(-1)), (name, key)
        used = {r.dtype for n in trainer.tensors for r in (trainer.store.record(x) for recs in
                trainer.runtime.state_parts(n).values() for x in recs)}
        assert used == ({torch.uint8, torch.float32} if fmt == "adamw8bit" else {torch.float32})
        moved = trainer.history[-1]
        assert moved.ssd_read_bytes > 0  # the state really travelled through the SSD
        # the byte ledger counts the format's records, as the planner predicts them (inline; on the optimizer
        # thread a few chunks read ahead are read again, with AdamW as well)
        predicted = trainer.plan.prediction.bytes_by_kind
        for kind in ("moments_read", "moments_written") if inline is None else ():
            assert moved.bytes_by_kind[kind] == predicted[kind] > 0, kind


@pytest.mark.parametrize("fmt", ["adamw8bit", "adafactor"])
def test_checkpoint_resumes_bit_equal(fmt, tmp_path, trainer_config):
    make_wide_model(tmp_path / "model")
    data = batches(4)
    cfg = config(trainer_config, fmt, optimizer_chunk=2048)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as full:
        offloaded_train(full, data[:2])
        full.save_checkpoint(tmp_path / "ckpt")
        for ids in data[2:]:
            full.step(ids)
        expected = full.state_dict()
        expected_state = {n: stored_state(full, n) for n in full.tensors}
    with Trainer.load_checkpoint(tmp_path / "ckpt", cfg) as resumed:
        assert resumed.step_count == 2
        for ids in data[2:]:
            resumed.step(ids)
        got = resumed.state_dict()
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        for n in resumed.tensors:
            state = stored_state(resumed, n)
            assert all(torch.equal(state[k], expected_state[n][k]) for k in state), n
    other = config(trainer_config, "adamw")
    with pytest.raises(ValueError, match=f"optimizer state is {fmt}"):
        Trainer.load_checkpoint(tmp_path / "ckpt", other)


def test_unknown_optimizer_is_refused(trainer_config):
    with pytest.raises(ValueError, match="optimizer: must be one of"):
        trainer_config(optimizer="lion")
    assert sorted(FORMATS) == ["adafactor", "adamw", "adamw8bit"]


# --------------------------------------------------------------------- the planner
def synthetic_profile(layers=6, rows=1024, cols=1024):
    from terastack.plan.llm_profile import ModelProfile, UnitProfile

    units, numel, shapes = [], {}, {}
    for i in range(layers):
        name = f"l{i}"
        numel[name], shapes[name] = rows * cols, (rows, cols)
        units.append(UnitProfile(name=f"layers.{i}", kind="layer", tensors=(name,), params=rows * cols,
                                 trainable=rows * cols, weight_bytes=4 * rows * cols, fwd_flops=1e9, bwd_flops=2e9,
                                 act_bytes=1 << 20, boundary_bytes=1 << 19, act_tensors=4, fwd_s=0.01, bwd_s=0.02))
    return ModelProfile(model="synthetic", batch=1, seq_len=64, compute_bytes=4, units=units, tensor_numel=numel,
                        tensor_trainable=dict.fromkeys(numel, True), tensor_shape=shapes)


@pytest.mark.parametrize("fmt", ["adamw", "adamw8bit", "adafactor"])
def test_planner_places_and_predicts_the_formats_state(fmt):
    """The planner's state bytes are the format's: at one host budget a smaller state leaves more of it in host
    memory, and the predicted moment bytes on the SSD are the format's records (padded as the store pads)."""
    from terastack.plan.hardware import Hardware
    from terastack.plan.llm_planner import LLMPlanner

    hw = Hardware(name="cpu", measured=True, cores=2, host_memory_bytes=16 << 30, cpu_flops=5e10,
                  memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9, ssd_write_bytes_per_s=1e9,
                  cpu_adam_params_per_s=3e8)
    prof = synthetic_profile()
    plans = {f: LLMPlanner(LLMPlanner.Config(device_budget=1 << 30, host_budget=56 << 20, optimizer=f,
                                             inline_updates=True)).plan(prof, hw) for f in FORMATS}
    p = plans[fmt]
    assert p.optimizer == fmt and p.summary()["optimizer"] == fmt
    on_host = {f: sum(1 for h in q.state_home.values() if h.value == "host") for f, q in plans.items()}
    assert on_host["adamw"] < on_host["adamw8bit"] <= on_host["adafactor"]
    spec = optimizer_format(fmt)
    on_ssd = [n for n, h in p.state_home.items() if h.value == "ssd"]
    expected = sum(spec.held_bytes(prof.shape(n), p.optimizer_chunk) for n in on_ssd)
    assert p.prediction.bytes_by_kind["moments_read"] == expected
    assert p.placement_bytes(prof)["state_ssd"] == sum(4 * prof.tensor_numel[n] + spec.state_bytes(prof.shape(n))
                                                       for n in on_ssd)
    assert prof.state_bytes(spec) == sum(4 * n for n in prof.tensor_numel.values()) + \
        sum(spec.state_bytes(s) for s in prof.tensor_shape.values())


@pytest.mark.parametrize("fmt", ["adamw", "adamw8bit", "adafactor"])
def test_plan_counts_the_records_the_store_holds(fmt, tmp_path, trainer_config):
    """The format's held bytes (what the planner counts) are the padded sizes of the records the engine makes."""
    make_wide_model(tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", config(trainer_config, fmt, optimizer_chunk=1100)) as trainer:
        rt, spec = trainer.runtime, optimizer_format(fmt)
        for name, info in trainer.tensors.items():
            held = sum(trainer.store.padded(r) for recs in rt.state_parts(name).values() for r in recs)
            assert held == spec.held_bytes(tuple(info.shape), 1100), name


@pytest.mark.parametrize("fmt", ["adamw8bit", "adafactor"])
def test_mixed_precision_inline_equals_thread(fmt, tmp_path, trainer_config):
    """bf16 compute: master chunks are records of their own (joined for a run or a whole matrix and written
    back); updates inline and on the optimizer thread give the same masters and state bytes."""
    make_wide_model(tmp_path / "model")
    data = batches(STEPS)
    results = []
    for inline in (True, False):
        cfg = config(trainer_config, fmt, dtype="bfloat16", inline_updates=inline, optimizer_chunk=4096)
        with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
            assert trainer.compute_dtype == torch.bfloat16 and not trainer.runtime.master_is_compute
            losses = offloaded_train(trainer, data)
            results.append((losses, trainer.state_dict(), {n: stored_state(trainer, n) for n in trainer.tensors}))
    (l1, w1, s1), (l2, w2, s2) = results
    assert l1 == l2 and all(s1[n][k].any() for n in s1 for k in s1[n])  # every state part was written
    assert all(torch.equal(w1[n], w2[n]) for n in w1)
    assert all(torch.equal(s1[n][k], s2[n][k]) for n in s1 for k in s1[n])


@pytest.mark.parametrize("fmt", ["adamw8bit", "adafactor"])
def test_horizontal_accumulation_equals_reference_library(fmt, tmp_path, trainer_config):
    """Two micro-batches a step, their gradient sums kept by the engine: the reference adds each micro-batch's
    gradient of the token-weighted loss into ``.grad`` and steps its library's optimizer: equal bit for bit."""

    ref = make_wide_model(tmp_path / "model")
    g = torch.Generator().manual_seed(7)
    steps = [[{"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)} for _ in range(2)]
             for _ in range(2)]
    cfg = config(trainer_config, fmt, grad_accum=2, accumulation="horizontal", optimizer_chunk=4096)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        torch.manual_seed(5)
        for mbs in steps:
            trainer.step_accumulated(mbs)
        opt = reference_optimizer(fmt, list(ref.parameters()))
        reference_accumulated(ref, opt, steps)
        for name, p in ref.named_parameters():  # bit for bit: the same sums in the same order
            assert torch.equal(trainer.parameter(name), p.detach()), name
            for key, value in stored_state(trainer, name).items():
                assert torch.equal(value, opt.state[p][key].reshape(-1)), (name, key)


def test_adamw8bit_joins_at_most_its_run_bound_and_stays_equal(tmp_path, trainer_config, monkeypatch):
    """One library call takes a run of chunks joined into one piece, at most ``max_run_bytes`` of them (a whole
    update group at 1.1B is hundreds of MiB, which the host ledger cannot hold twice): with the bound at three
    chunks the calls join no more than that, and the weights and state still equal bitsandbytes'."""
    from terastack.plan.optimizer_formats import AdamW8bitFormat

    bound = 3 * (1024 * (4 + 4 + 1 + 1) + 4 * 4 * 2)  # three chunks: master, gradient, two 8-bit moments, absmax
    monkeypatch.setattr(AdamW8bitFormat, "max_run_bytes", bound)
    charged = []
    scratch_bytes = AdamW8bitFormat.scratch_bytes

    def counted(self, chunks, steps):
        charged.append(scratch_bytes(self, chunks, steps))
        return charged[-1]

    monkeypatch.setattr(AdamW8bitFormat, "scratch_bytes", counted)
    ref = make_wide_model(tmp_path / "model")
    data = batches(STEPS)
    with Trainer.from_pretrained(tmp_path / "model", config(trainer_config, "adamw8bit")) as trainer:
        losses = offloaded_train(trainer, data)
        ref_losses, opt = reference_train(ref, data, "adamw8bit")
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        for name, p in ref.named_parameters():
            assert torch.equal(trainer.parameter(name), p.detach()), name
            for key, value in stored_state(trainer, name).items():
                assert torch.equal(value, opt.state[p][key].reshape(-1)), (name, key)
    assert 0 < max(charged) <= bound  # copies were made, and none beyond the bound
