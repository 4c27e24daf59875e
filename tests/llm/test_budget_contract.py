"""A budget is a contract: building the trainer either refuses it (PlanError naming the budget and the
shortfall) or every step runs within it (no BudgetError, the ledgers' peaks within the plan's formulas).

Checked as a property over random tiny models (families, widths, depths, vocabularies, tied embeddings or
not) and random (device, host) budget pairs, with and without clipping, with both optimizer executors, and with
gradient accumulation (the gradient sums are part of the plan).

A refusal passes the contract without running anything, so each group of random cases also counts its outcomes:
most of them must train (the budgets are drawn so that most fit) and at least one must be refused (the refusal
side is exercised too). A planner that refused every case fails every group.
"""
import math
import random
import warnings

import pytest
import torch

from terastack.errors import BudgetError
from terastack.llm import Trainer
from terastack.training.hf.model_files import PACKING_FAMILIES
from terastack.plan.llm_planner import PlanError

KIB = 1 << 10
STEPS = 2
SEQ = 16
#: families and whether their head may be untied from the embeddings (GPT-2's is always tied)
FAMILIES = {"llama": True, "mistral": True, "qwen2": True, "gpt2": False, "opt": True}


def random_config(rng: random.Random):
    """A tiny causal LM config: family, hidden 32/64, 1-3 layers, vocab 96-300, tied or not."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, OPTConfig, Qwen2Config

    family = rng.choice(sorted(FAMILIES))
    hidden = rng.choice((32, 64))
    layers = rng.randint(1, 3)
    vocab = rng.randint(96, 300)
    tied = rng.random() < 0.5 if FAMILIES[family] else True
    common = dict(vocab_size=vocab, max_position_embeddings=64, bos_token_id=0, eos_token_id=1,
                  tie_word_embeddings=tied)
    if family == "gpt2":
        return GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=64, bos_token_id=0,
                          eos_token_id=1)
    if family == "opt":
        return OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                         word_embed_proj_dim=hidden, pad_token_id=2, **common)
    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[family]
    return cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=2, **common)


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def save_model(hf_config, path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(hf_config).save_pretrained(str(path))


def check_contract(model_dir, cfg, vocab: int, *, steps: int = STEPS) -> str:
    """Build a trainer under ``cfg``: a refusal must be a PlanError naming a budget and its shortfall; an
    accepted plan must run ``steps`` steps within its ledgers (``cfg.grad_accum`` > 1: accumulated steps of that
    many micro-batches, some labels -100). Returns "refused" or "trained"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # families not yet in TESTED_FAMILIES train with a warning
        try:
            trainer = Trainer.from_pretrained(model_dir, cfg)
        except PlanError as exc:
            assert exc.budget in ("device", "host") and exc.shortfall > 0, exc
            assert f"{exc.budget} budget exceeded" in str(exc) and "short by" in str(exc), exc
            return "refused"
    g = torch.Generator().manual_seed(1)
    with trainer as t:
        for _ in range(steps):
            try:
                if cfg.grad_accum == 1 and not cfg.packed:
                    t.step(torch.randint(0, vocab, (cfg.batch_size, SEQ), generator=g))
                    continue
                mbs = []
                for _ in range(cfg.grad_accum):
                    ids = torch.randint(0, vocab, (cfg.batch_size, SEQ), generator=g)
                    labels = ids.clone()
                    labels[:, int(torch.randint(0, SEQ - 1, (), generator=g)):] = -100
                    mbs.append({"input_ids": ids, "labels": labels})
                    if cfg.packed:  # two examples per row
                        cut = int(torch.randint(2, SEQ - 2, (), generator=g))
                        pos = torch.cat([torch.arange(cut), torch.arange(SEQ - cut)]).expand(cfg.batch_size, -1)
                        mbs[-1]["position_ids"] = pos
                t.step_accumulated(mbs)
            except BudgetError as exc:  # (a PlanError is one too: too late once the plan was accepted)
                pytest.fail(f"accepted plan failed inside a step: {exc}\n{t.describe_plan()}")
        t.synchronize()
        plan, pred, use = t.plan, t.plan.prediction, t.usage()
        assert use["device"]["peak"] <= pred.device_peak_bytes
        assert pred.device_peak_bytes + pred.transient_bytes <= plan.device_budget
        assert use["grad_pool"]["peak"] <= plan.grad_pool_bytes
        assert use["host"]["peak"] <= pred.host_peak_bytes - plan.grad_pool_bytes
        assert pred.host_peak_bytes <= plan.host_budget
    return "trained"


def test_tied_mistral_without_clipping_trains(tmp_path, trainer_config):
    """The reported case: tied embeddings, 4 MiB device, 1 MiB host, no clipping. The plan was accepted and
    the first step ran out of the gradient pool (the tied embedding's gradient, held from the head's backward to
    the embedding's, was not in the pool's size). The budgets hold this model, so each variant must train: a
    refusal would pass without reaching the case."""
    from transformers import MistralConfig

    hf = MistralConfig(vocab_size=257, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                       max_position_embeddings=64)
    save_model(hf, tmp_path / "model")
    for inline in (True, False):
        for clip in (None, 1.0):
            cfg = trainer_config(device_budget="4MiB", host_budget="1MiB", batch_size=1, seq_len=SEQ,
                                 max_grad_norm=clip, inline_updates=inline,
                                 store_dir=str(tmp_path / f"store-{inline}-{clip}"))
            assert check_contract(tmp_path / "model", cfg, 257) == "trained", (inline, clip)


def test_inline_update_groups_fit_the_writeback_allowance(tmp_path, trainer_config):
    """A lean plan (small host budget) with inline updates: the host ledger stayed within the budget but above
    the plan's formula, because an update group (up to the read-ahead allowance) was written back at once while
    the next unit's state was read ahead; groups now fit the write-back allowance too."""
    from transformers import OPTConfig

    hf = OPTConfig(vocab_size=111, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                   word_embed_proj_dim=32, pad_token_id=2, max_position_embeddings=64, bos_token_id=0,
                   eos_token_id=1, tie_word_embeddings=False)
    save_model(hf, tmp_path / "model")
    cfg = trainer_config(device_budget="8MiB", host_budget="459KiB", batch_size=1, seq_len=SEQ, inline_updates=True,
                         optimizer_chunk=1024, state_placement="ssd", activation_policy="ssd")
    assert check_contract(tmp_path / "model", cfg, 111) == "trained"


def run_cases(seeds, case) -> dict[str, list[int]]:
    """``case(seed)`` for every seed -> the seeds that trained and those refused; a failing case names its seed."""
    outcomes: dict[str, list[int]] = {"trained": [], "refused": []}
    for seed in seeds:
        try:
            outcomes[case(seed)].append(seed)
        except BaseException as exc:
            exc.add_note(f"budget contract case: seed {seed}")
            raise
    return outcomes


def assert_both_sides(outcomes: dict[str, list[int]]) -> None:
    """Most random cases trained (a planner refusing everything passes each case alone) and some were refused."""
    total = sum(map(len, outcomes.values()))
    assert len(outcomes["trained"]) >= total // 2, f"too few random cases trained: {outcomes}"
    assert outcomes["refused"], f"no random case was refused, the refusal side went unchecked: {outcomes}"


#: random cases in groups of 10 (each group a few seconds on a 2-core machine; each holds a refused case)
SEED_GROUPS = [range(0, 10), range(10, 20), range(20, 30), range(30, 40)]


@pytest.mark.parametrize("seeds", SEED_GROUPS, ids=lambda r: f"seeds{r.start}-{r.stop - 1}")
def test_budget_contract(seeds, tmp_path, trainer_config):
    def case(seed):
        rng = random.Random(seed)
        hf = random_config(rng)
        save_model(hf, tmp_path / f"model-{seed}")
        cfg = trainer_config(**random_budgets(rng), store_dir=str(tmp_path / f"store-{seed}"))
        return check_contract(tmp_path / f"model-{seed}", cfg, hf.vocab_size)

    assert_both_sides(run_cases(seeds, case))


def random_budgets(rng: random.Random) -> dict:
    """A random budget pair and the trainer settings that change how state moves within it."""
    return dict(device_budget=log_uniform(rng, 256 * KIB, 6 << 20), host_budget=log_uniform(rng, 256 * KIB, 4 << 20),
                batch_size=1, seq_len=SEQ, max_grad_norm=rng.choice((None, 1.0)),
                inline_updates=rng.choice((True, False)),
                optimizer_chunk=rng.choice((1024, 1 << 20)),  # small chunks: tensors in several optimizer records
                state_placement=rng.choice(("auto", "ssd")))


#: in groups of 8, each holding a refused case
ACCUM_SEED_GROUPS = [range(100, 108), range(108, 116)]


@pytest.mark.parametrize("seeds", ACCUM_SEED_GROUPS, ids=lambda r: f"seeds{r.start}-{r.stop - 1}")
def test_budget_contract_with_gradient_accumulation(seeds, tmp_path, trainer_config):
    """As above, with 2 or 3 micro-batches per step: the plan's gradient sums (host or SSD) and their working
    buffers stay within the budgets it accepted; for families that pack, some plans take packed rows (the
    block-diagonal mask's activations counted)."""
    def case(seed):
        rng = random.Random(seed)
        hf = random_config(rng)
        settings = random_budgets(rng)
        accum = rng.choice((2, 3))
        packed = hf.model_type in PACKING_FAMILIES and rng.random() < 0.5
        save_model(hf, tmp_path / f"model-{seed}")
        cfg = trainer_config(**settings, grad_accum=accum, packed=packed, store_dir=str(tmp_path / f"store-{seed}"))
        return check_contract(tmp_path / f"model-{seed}", cfg, hf.vocab_size)

    assert_both_sides(run_cases(seeds, case))
