"""Each optimizer state format through each way the engine runs a step, with the state on the SSD, equal to its
reference library bit for bit (and ``Trainer.optimizer_state`` gives the state as the library keeps it):
global-norm clipping (the deferred schedule, on the optimizer thread), vertical and horizontal
accumulation, LoRA adapters, and a kill -9 resume (between steps, and inside one)."""
import pytest
import torch

from .llm_helpers import BATCH, SEQ, VOCAB, batches
from .test_checkpoint import resume_killed, run_killed
from .test_checkpoint_follow import STEPS, STREAMED, run_killed_inside
from .test_optimizer_formats import (config, make_wide_model, reference_accumulated, reference_optimizer,
                                     reference_train, stored_state)
from terastack.llm import LoraSpec, Trainer
from terastack.plan.llm_plan import PlanError
from terastack.plan.optimizer_formats import optimizer_format
from terastack.plan.optimizer_sizes import whole_gather_bytes

bnb = pytest.importorskip("bitsandbytes")

FORMATS = ["adamw8bit", "adafactor"]
CLIP = 0.5
#: not a multiple of bitsandbytes' block (256): the engine's own rounding of the optimizer chunk to whole blocks
#: is what keeps a chunk's quantization the library's
CHUNK = 1152


def assert_equal_to_library(trainer, ref, opt, steps: int) -> None:
    """Every trainable parameter of ``ref`` and its state in ``opt`` equal the trainer's, bit for bit: the state
    as the store holds it, and as ``Trainer.optimizer_state`` gives it (the library's keys, shapes and dtypes)."""
    checked = 0
    for name, p in ref.named_parameters():
        if not p.requires_grad:
            continue
        assert torch.equal(trainer.parameter(name), p.detach()), name
        st = opt.state[p]
        for key, value in stored_state(trainer, name).items():
            assert torch.equal(value, st[key].reshape(-1)), (name, key)
        state = trainer.optimizer_state(name)
        assert set(state) == set(st), name
        assert state.pop("step") == int(st["step"]) == steps, name
        for key, value in state.items():
            assert value.dtype == st[key].dtype and value.shape == st[key].shape, (name, key)
            assert torch.equal(value, st[key]), (name, key)
        checked += 1
    assert checked


def accumulation_steps():
    """Two steps of two micro-batches each."""
    g = torch.Generator().manual_seed(7)
    return [[{"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)} for _ in range(2)] for _ in range(2)]


def reference_stacked(ref, opt, steps, *, clip) -> None:
    """The library's training on each step's micro-batches as one batch (the vertical order's single pass)."""
    for mbs in steps:
        ids = torch.cat([mb["input_ids"] for mb in mbs])
        out = ref(input_ids=ids, labels=ids, num_items_in_batch=ids[:, 1:].numel(), use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("order", ["vertical", "horizontal"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_clipped_accumulated_steps_equal_reference_library(fmt, order, tmp_path, trainer_config):
    """Two micro-batches a step in each order, clipped over the step's gradient: weights and every state byte
    equal the library's. Vertical: one pass over the stacked rows (the reference runs them as one batch);
    horizontal: the engine's sums on the SSD (the reference adds each micro-batch's gradient into ``.grad``)."""
    ref = make_wide_model(tmp_path / "model")
    steps = accumulation_steps()
    cfg = config(trainer_config, fmt, grad_accum=2, accumulation=order, max_grad_norm=CLIP, optimizer_chunk=CHUNK)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        assert trainer.plan.accumulation == order
        assert set(trainer.plan.grad_home.values()) == (set() if order == "vertical" else {"ssd"})
        torch.manual_seed(5)
        for mbs in steps:
            trainer.step_accumulated(mbs)
        assert trainer.history[-1].grad_norm is not None and trainer.history[-1].ssd_read_bytes > 0
        opt = reference_optimizer(fmt, list(ref.parameters()))
        (reference_stacked if order == "vertical" else reference_accumulated)(ref, opt, steps, clip=CLIP)
        assert_equal_to_library(trainer, ref, opt, len(steps))


def make_adapter(base_dir, adapter_dir, rank: int):
    """peft's LoRA over ``base_dir`` with a non-zero B (the adapters change the output from the first step), saved
    to ``adapter_dir``; returns the in-memory reference."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    ref = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, task_type="CAUSAL_LM",
                                          target_modules=["q_proj", "v_proj", "up_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ref.save_pretrained(str(adapter_dir))
    ref.train()
    return ref


@pytest.mark.parametrize("clip,inline", [(None, None), (CLIP, False)], ids=["inline", "clip-thread"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_lora_adapters_through_the_format_equal_reference_library(fmt, clip, inline, tmp_path, trainer_config):
    """Rank 64 over a 64-wide model: most adapter matrices reach bitsandbytes' min_8bit_size (8-bit state), v_proj's
    B does not (fp32 state, the library's 32-bit update); every adapter is a matrix for Adafactor (row and column
    statistics). Only the adapters train, through the format, as the library trains them under peft."""
    make_wide_model(tmp_path / "base")
    ref = make_adapter(tmp_path / "base", tmp_path / "adapter0", rank=64)
    lora = LoraSpec(r=64, alpha=128, target_modules=("q_proj", "v_proj", "up_proj"), init_from=str(tmp_path / "adapter0"))
    data = batches(3)
    cfg = config(trainer_config, fmt, lora=lora, max_grad_norm=clip, inline_updates=inline, optimizer_chunk=CHUNK)
    with Trainer.from_pretrained(tmp_path / "base", cfg) as trainer:
        trainable = [n for n, info in trainer.tensors.items() if info.trainable]
        assert trainable and all(".lora_" in n for n in trainable)
        assert any(len(trainer.runtime.chunk_ranges(n)) > 1 for n in trainable)
        torch.manual_seed(5)
        for ids in data:
            trainer.step(ids)
        assert trainer.history[-1].ssd_read_bytes > 0
        params = [p for p in ref.parameters() if p.requires_grad]
        opt = reference_optimizer(fmt, params)
        torch.manual_seed(5)
        for ids in data:
            ref(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            opt.zero_grad()
        if fmt == "adamw8bit":  # both of the library's paths
            assert {opt.state[p]["state1"].dtype for p in params} == {torch.uint8, torch.float32}
        assert_equal_to_library(trainer, ref, opt, len(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_9_resumes_bit_equal(fmt, tmp_path, trainer_config):
    """A real process training with the format's state on the SSD, a checkpoint beside the store every two steps,
    killed with SIGKILL after the first: the resume continues in the killed run's store (its 8-bit records and
    block scales, or its factored statistics, as the kill left them committed) to the weights of a run never
    killed: the library's own run over the same six batches."""
    ref = make_wide_model(tmp_path / "model")
    cfg = config(trainer_config, fmt, optimizer_chunk=CHUNK)
    run_killed(tmp_path, cfg, tmp_path / "model", beside=True, kill_at="step", steps=6, kill_after=2)
    step, got = resume_killed(tmp_path, cfg, beside=True, steps=6)
    assert step in (2, 4)
    reference_train(ref, batches(6), fmt)  # the uninterrupted run: the library's, in memory
    assert all(torch.equal(got[k], p.detach()) for k, p in ref.named_parameters())


# ------------------------------------------------------------ Adafactor's whole-matrix gather
def test_adafactor_joins_adjacent_chunks_without_a_copy():
    """Chunks that are views of one tensor (a whole fp32 master, a gradient held whole) join as a view: no scratch,
    the master updated in place; chunks apart (records of their own) are joined into copies of one matrix's size
    and written back. Both give torch.optim.Adafactor's result."""
    from terastack.llm.engine.adamw import ChunkState
    from terastack.plan.optimizer_formats import optimizer_format

    fmt = optimizer_format("adafactor")
    g = torch.Generator().manual_seed(0)
    w0, grad = torch.randn(40, 30, generator=g), torch.randn(40, 30, generator=g)
    ref = torch.nn.Parameter(w0.clone())
    ref.grad = grad.clone()
    opt = torch.optim.Adafactor([ref], lr=1e-2, weight_decay=0.01)
    opt.step()
    for apart in (False, True):
        master = w0.clone()
        state = {part.key: torch.zeros(part.shape((40, 30))) for part in fmt.parts((40, 30))}
        chunks = []
        for k, lo in enumerate(range(0, 1200, 256)):
            hi = min(lo + 256, 1200)
            p, gr = master.view(-1)[lo:hi], grad.view(-1)[lo:hi]
            chunks.append(ChunkState(name="w", chunk=k, lo=lo, hi=hi, shape=(40, 30), param=p.clone() if apart else p,
                                     grad=gr.clone() if apart else gr, state=state if k == 0 else {}))
        steps = [0] * len(chunks)
        assert fmt.scratch_bytes(chunks, steps) == (2 * 4 * 1200 if apart else 0)
        fmt.update(chunks, steps, lr=1e-2, hyper=type("H", (), {"weight_decay": 0.01}), impl={})
        got = torch.cat([c.param for c in chunks]).view(40, 30)
        assert torch.equal(got, ref.detach()), apart
        assert torch.equal(master, ref.detach() if not apart else w0)  # in place only through the view
        assert torch.equal(state["row_var"], opt.state[ref]["row_var"])


def save_wide_mlp(path):
    """A Llama whose MLP matrices (32 x 4096: 512 KiB in fp32) are each larger than a small host tier's share."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                      eos_token_id=1)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))


def test_adafactor_gather_is_refused_when_one_matrix_cannot_fit_the_host_tier(tmp_path, trainer_config):
    """Mixed precision at a host budget whose tier holds AdamW's chunks but not one MLP matrix's master and its joined
    copy: refused before the first step by the planner, whose optimizer working set counts the gather (an update
    would otherwise fail half-way through a step for lack of room); the engine's own check, reading the same
    ``OptimizerFormat.gather_bytes``, refuses the tier the plan would have left it."""
    save_wide_mlp(tmp_path / "model")
    kw = dict(dtype="bfloat16", host_budget="2MiB", optimizer_chunk=4096, store_dir=str(tmp_path / "s1"))
    with pytest.raises(PlanError, match=r"host budget exceeded .* the optimizer's working set \(1\.\d+ MiB\)"):
        Trainer.from_pretrained(tmp_path / "model", config(trainer_config, "adafactor", **kw))
    with Trainer.from_pretrained(tmp_path / "model", config(trainer_config, "adamw", **kw)) as trainer:
        trainer.step(batches(1)[0])  # chunked updates fit the same tier
        # what the engine refuses: the largest matrix's gather beside the tier the plan gives it (budget less pool)
        fmt = optimizer_format("adafactor")
        name = max(trainer.optimizer.tensors, key=lambda n: trainer.optimizer.tensors[n].numel)
        needed = fmt.gather_bytes(tuple(trainer.optimizer.tensors[name].shape), 4096, master_is_compute=False,
                                  gradient_spilled=False)
        assert needed > (2 << 20) - trainer.plan.grad_pool_bytes


def test_the_planner_counts_the_adafactor_gather_the_engine_charges(tmp_path, trainer_config, monkeypatch):
    """Mixed precision: the copies the engine charges to the host ledger while an MLP matrix's update runs (its
    master joined from its chunk records) are within the gather the plan counts in the optimizer's working set,
    and the planner sizes that gather by the format's own count."""
    save_wide_mlp(tmp_path / "model")
    fmt_cls = type(optimizer_format("adafactor"))
    charged = []
    scratch = fmt_cls.scratch_bytes

    def measured(self, chunks, steps):
        charged.append(scratch(self, chunks, steps))
        return charged[-1]

    monkeypatch.setattr(fmt_cls, "scratch_bytes", measured)
    cfg = config(trainer_config, "adafactor", dtype="bfloat16", host_budget="3MiB", optimizer_chunk=4096)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        for ids in batches(2):
            trainer.step(ids)
        trainer.synchronize()
        plan = trainer.plan
        assert max(charged) >= 4 * 32 * 4096  # one MLP master joined from its chunks
        assert plan.gather_bytes >= max(charged) + 4 * 32 * 4096  # and the chunk records it was joined from
        assert plan.gather_bytes == whole_gather_bytes(trainer.profile, plan.schedule, plan.optimizer_chunk,
                                                       optimizer_format("adafactor"))
        assert trainer.plan.read_ahead_bytes + plan.writeback_bytes + plan.masters_bytes < plan.gather_bytes


def test_adafactor_joined_copies_are_charged_to_the_host_ledger(tmp_path, trainer_config):
    """Mixed precision: an MLP matrix's master chunks (records of their own) and the copy they are joined into for
    its update are held at once, and the host ledger's peak shows both."""
    save_wide_mlp(tmp_path / "model")
    cfg = config(trainer_config, "adafactor", dtype="bfloat16", host_budget="3MiB", optimizer_chunk=4096)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        assert not trainer.runtime.master_is_compute
        for ids in batches(2):
            trainer.step(ids)
        trainer.synchronize()
        host = trainer.usage()["host"]
        assert host["peak"] >= 2 * 4 * 32 * 4096 and host["used"] == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_9_inside_a_step_resumes_bit_equal(fmt, tmp_path, trainer_config):
    """A checkpoint that follows the step (points inside it, each naming the state it updated) with the format's
    state: killed with SIGKILL after a point inside step 3, the resume finishes step 3 from that point and ends
    at the library's weights and state."""
    ref = make_wide_model(tmp_path / "model")
    cfg = config(trainer_config, fmt, optimizer_chunk=CHUNK, **STREAMED)
    run_killed_inside(tmp_path, cfg, tmp_path / "model", kill_at="after-point")
    data = batches(STEPS)
    with Trainer.load_checkpoint(tmp_path / "ckpt", cfg) as resumed:
        assert resumed.step_count == 2 and resumed.resumed_point is not None  # inside step 3
        assert resumed.optimizer.format.name == fmt
        for ids in data[2:]:
            resumed.step(ids)
        opt = reference_optimizer(fmt, list(ref.parameters()))
        for ids in data:
            ref(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            opt.step()
            opt.zero_grad()
        assert_equal_to_library(resumed, ref, opt, STEPS)
