"""Gradient accumulation and packed rows against plain PyTorch / transformers.

Accumulation: ``Trainer.step_accumulated`` over N micro-batches with different numbers of target tokens equals
one torch.optim.AdamW step on the micro-batches concatenated, with the loss summed over all target tokens and
divided by their total (computed here from the logits, not through the model's ``num_items_in_batch``).
Packing: a packed row's loss equals the token-weighted loss of its examples run one by one, and a step on
packed rows equals plain training on the same inputs.
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from terastack.llm import Trainer
from terastack.training.hf.model_files import PACKING_FAMILIES, check_packing
from terastack.training.data.examples import IGNORE, Example, ExampleBatches, SupervisedData, pack_rows, packed_batch

from .llm_helpers import BATCH, SEQ, VOCAB, max_weight_diff, tiny_config

TOL = 1e-5
N_MICRO = 3


def save_model(hf_config, path, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config)
    model.save_pretrained(str(path))
    model.train()
    return model


def no_dropout_config(family: str, layers: int = 3):
    """A tiny config without dropout: the reference runs the micro-batches as one batch, so dropout masks would
    be drawn differently."""
    cfg = tiny_config(family, layers)
    if family == "gpt2":  # tied embeddings: the embedding's gradient has two users in every micro-batch
        cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    return cfg


def micro_batches(step: int):
    """N_MICRO micro-batches of (BATCH, SEQ) whose numbers of target tokens differ: one with every label, one
    right-padded (pads outside the loss), one with a prompt outside the loss."""
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for i in range(N_MICRO):
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
        labels = ids.clone()
        if i == 1:
            ids[0, 11:] = 2
            labels[0, 11:] = IGNORE
            ids[1, 5:] = 2
            labels[1, 5:] = IGNORE
        elif i == 2:
            labels[:, :7] = IGNORE
        out.append({"input_ids": ids, "labels": labels})
    return out


def reference_step(model, opt, mbs, *, max_grad_norm=None) -> float:
    """Plain PyTorch: the micro-batches as one batch, loss = sum over target tokens / their total."""
    ids = torch.cat([m["input_ids"] for m in mbs])
    labels = torch.cat([m["labels"] for m in mbs])
    logits = model(input_ids=ids, use_cache=False).logits
    shift = labels[:, 1:]
    total = int((shift != IGNORE).sum())
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), shift.reshape(-1),
                           ignore_index=IGNORE, reduction="sum") / total
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    opt.step()
    opt.zero_grad()
    return loss.item()


def assert_moments_equal(trainer, ref, opt, steps: int) -> None:
    for name, p in ref.named_parameters():
        state, st = trainer.optimizer_state(name), opt.state[p]
        assert state["step"] == int(st["step"]) == steps, name
        for key in ("exp_avg", "exp_avg_sq"):
            assert (state[key] - st[key]).abs().max() <= TOL, (name, key)


CASES = {
    # name: (family, TrainerConfig overrides)
    "eager-inline-ssd": ("llama", dict(state_placement="ssd", optimizer_chunk=1024)),
    "eager-thread-ssd-tied": ("gpt2", dict(state_placement="ssd", inline_updates=False)),
    "deferred-clip-ssd": ("llama", dict(state_placement="ssd", max_grad_norm=0.5, optimizer_chunk=1024)),
    "after-backward-ssd": ("qwen2", dict(state_placement="ssd", active_offload=False, max_grad_norm=1.0)),
    "eager-host": ("llama", dict()),
}


@pytest.mark.parametrize("order", ["horizontal", "vertical", "grouped-2"])  # grouped-2 of 3: passes of 2 and 1
@pytest.mark.parametrize("case", sorted(CASES))
def test_accumulated_step_equals_one_step_on_all_micro_batches(case, order, tmp_path, trainer_config):
    family, overrides = CASES[case]
    ref = save_model(no_dropout_config(family), tmp_path / "model")
    clip = overrides.get("max_grad_norm")
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    cfg = trainer_config(grad_accum=N_MICRO, accumulation=order, **overrides)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        assert trainer.plan.grad_accum == N_MICRO and trainer.plan.accumulation == order
        sums_home = set(trainer.plan.grad_home.values())
        if order == "vertical":  # the micro-batches' gradients add up inside each unit's backward: no sums
            assert sums_home == set()
        else:
            assert sums_home == ({"ssd"} if overrides.get("state_placement") == "ssd" else {"host"})
        steps = 2
        for step in range(steps):
            mbs = micro_batches(step)
            loss = trainer.step_accumulated(mbs)
            ref_loss = reference_step(ref, opt, mbs, max_grad_norm=clip)
            assert loss == pytest.approx(ref_loss, abs=1e-6)
            stats = trainer.history[-1]
            assert stats.step == step + 1 and stats.tokens == N_MICRO * BATCH * SEQ and stats.loss == loss
        assert trainer.step_count == steps
        assert max_weight_diff(trainer, ref) <= TOL
        assert_moments_equal(trainer, ref, opt, steps)
        if clip is not None:
            assert trainer.history[-1].grad_norm is not None
        if "ssd" in sums_home:
            assert trainer.history[-1].ssd_read_bytes > 0
        # every sum was taken in by its update: no accumulated-gradient record is left in the store
        assert not [r for r in trainer.store.names() if r.startswith("s:")]


def test_eager_updates_run_only_in_the_last_micro_batch(tmp_path, trainer_config):
    save_model(no_dropout_config("llama"), tmp_path / "model")
    cfg = trainer_config(grad_accum=N_MICRO, state_placement="ssd", accumulation="horizontal")
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        opt = trainer.optimizer
        assert opt.inline
        seen = []  # (micro-batch, updated parameters, moment records written) at each end of backward
        end_step, begin = opt.end_step, opt.begin_step

        def moment_writes():
            return trainer.store.engine.stats.snapshot()["bytes_written"]

        def wrapped_begin(**kw):
            seen.append(("begin", opt.updated_params, moment_writes()))
            begin(**kw)

        def wrapped_end():
            seen.append(("end", opt.updated_params, moment_writes()))
            end_step()

        opt.begin_step, opt.end_step = wrapped_begin, wrapped_end
        trainable = sum(info.numel for info in opt.tensors.values())
        trainer.step_accumulated(micro_batches(0))
        ups = [u for _, u, _ in seen]
        # no update in micro-batches 1 and 2; in the last one every update ran during its backward (inline)
        assert ups == [0, 0, 0, 0, 0, trainable]
        assert set(opt.steps.values()) == {1}
        # the sums rest on the SSD: micro-batches 1 and 2 wrote only them (4 bytes per parameter each, padded
        # to blocks), never masters or moments (12 bytes per parameter); a sum's write-back may still be on its
        # way when its micro-batch ends, so the sums written are counted over the step
        writes = [w for _, _, w in seen]
        assert writes[1] - writes[0] < 12 * trainable
        assert writes[3] - writes[2] < 12 * trainable
        assert trainer.history[-1].bytes_by_kind["gradients_written"] >= 2 * 4 * trainable


def test_one_micro_batch_equals_step(tmp_path, trainer_config):
    """A single micro-batch is an ordinary step (its loss normalised by its own target tokens)."""
    save_model(no_dropout_config("llama"), tmp_path / "model")
    mb = micro_batches(0)[2]
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as a:
        loss_a = a.step_accumulated([mb])
        weights_a = a.state_dict()
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(store_dir=str(tmp_path / "b"))) as b:
        loss_b = b.step(**mb)
        assert loss_a == pytest.approx(loss_b, abs=1e-6)
        assert all((weights_a[n] - w).abs().max() <= 1e-6 for n, w in b.state_dict().items())


def test_accumulation_refusals(tmp_path, trainer_config):
    save_model(no_dropout_config("llama", 1), tmp_path / "model")
    with pytest.raises(ValueError, match="grad_accum"):
        trainer_config(grad_accum=0)
    mbs = micro_batches(0)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as trainer:
        with pytest.raises(ValueError, match="grad_accum"):
            trainer.step_accumulated(mbs)  # the plan has no room for gradient sums
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(grad_accum=2)) as trainer:
        with pytest.raises(ValueError, match="non-empty"):
            trainer.step_accumulated([])
        with pytest.raises(ValueError, match=r"micro_batches\[1\]: unknown key 'mask'"):
            trainer.step_accumulated([mbs[0], {"input_ids": mbs[1]["input_ids"], "mask": 1}])
        with pytest.raises(ValueError, match="no target token"):
            trainer.step_accumulated([{"input_ids": m["input_ids"], "labels": torch.full((BATCH, SEQ), IGNORE)}
                                      for m in mbs[:2]])
        with pytest.raises(ValueError, match=r"micro_batches\[0\].labels: shape"):
            trainer.step_accumulated([{"input_ids": mbs[0]["input_ids"], "labels": mbs[0]["labels"][:, :4]}])
        assert trainer.step_count == 0
        trainer.step_accumulated(mbs[:2])  # nothing above left the trainer unusable
        assert trainer.step_count == 1


# ------------------------------------------------------------------ packing
def random_examples(n: int, seed: int, lo: int = 3, hi: int = 9) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(3, VOCAB, int(rng.integers(lo, hi))).astype(np.int64)
        labels = ids.copy()
        labels[: int(rng.integers(0, 2))] = IGNORE  # some examples start with a prompt
        out.append(Example(ids=ids, labels=labels))
    return out


def test_packed_rows():
    examples = random_examples(9, seed=1)
    rows = pack_rows(examples, SEQ)
    assert [ex for row in rows for ex in row] == examples  # next-fit keeps the order, uses every example once
    assert all(sum(ex.ids.size for ex in row) <= SEQ for row in rows)
    assert all(sum(ex.ids.size for ex in a) + b[0].ids.size > SEQ for a, b in zip(rows, rows[1:]))
    ids, labels, pos = packed_batch(rows, pad_id=2)
    row, at = rows[0], 0
    for ex in row:
        n = ex.ids.size
        assert ids[0, at:at + n].tolist() == ex.ids.tolist()
        assert pos[0, at:at + n].tolist() == list(range(n))
        assert labels[0, at] == IGNORE and labels[0, at + 1:at + n].tolist() == ex.labels[1:].tolist()
        at += n
    assert (labels[0, at:] == IGNORE).all() and (torch.diff(pos[0, at - 1:]) == 1).all()  # pads continue


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "mistral"])
def test_packed_loss_equals_examples_run_separately(family, tmp_path, trainer_config):
    assert family in PACKING_FAMILIES
    if family == "mistral":
        from transformers import MistralConfig

        hf = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=4)
    else:
        hf = no_dropout_config(family, 2)
    ref = save_model(hf, tmp_path / "model")
    ref.eval()
    rows = pack_rows(random_examples(8, seed=2), SEQ)[:BATCH]
    ids, labels, pos = packed_batch(rows, pad_id=2)
    total = n_total = 0.0
    with torch.no_grad():
        for ex in [ex for row in rows for ex in row]:
            n = float((ex.labels[1:] != IGNORE).sum())
            t = torch.from_numpy(ex.ids)[None]
            total += ref(input_ids=t, labels=torch.from_numpy(ex.labels)[None], use_cache=False).loss.item() * n
            n_total += n
        expected = total / n_total
        assert ref(input_ids=ids, labels=labels, position_ids=pos, use_cache=False).loss.item() == \
            pytest.approx(expected, abs=1e-5)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(packed=True)) as trainer:
        trainer.model.eval()
        assert trainer.loss(ids, labels, position_ids=pos) == pytest.approx(expected, abs=1e-5)
        # without the restarting positions the examples would see each other: a different loss
        assert abs(trainer.loss(ids, labels) - expected) > 1e-4


def test_step_on_packed_data_equals_plain_training(tmp_path, trainer_config):
    """SupervisedData with pack=True -> ExampleBatches.step_inputs -> Trainer.step, against transformers on the
    same packed inputs (and the same for an accumulated step over two packed micro-batches)."""
    from terastack.training.data.stdlib_corpus import BYTE_VOCAB

    hf = tiny_config("llama", 2)  # with the byte tokenizer's vocabulary
    hf.vocab_size = BYTE_VOCAB
    ref = save_model(hf, tmp_path / "bytes")
    words = ["ab", "hello", "packed", "rows", "x", "terastack", "ssd", "tiers", "adamw", "mask"]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": w, "completion": w[::-1]}) for w in words) + "\n")
    data = SupervisedData.load(str(path), None, SupervisedData.Config(seq_len=SEQ, pack=True, val_fraction=0))
    batches = data.batches(BATCH, seed=3)
    assert isinstance(batches, ExampleBatches) and batches.pack_len == SEQ
    first = batches.step_inputs(0)
    assert set(first) == {"input_ids", "labels", "position_ids"}
    assert (first["position_ids"][:, 1:] - first["position_ids"][:, :-1] != 1).any()  # rows hold several examples
    assert data.batches(BATCH, seed=3).step_inputs(5)["input_ids"].equal(batches.step_inputs(5)["input_ids"])
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    with Trainer.from_pretrained(tmp_path / "bytes", trainer_config(grad_accum=2, packed=True)) as trainer:
        for step in range(2):
            inputs = batches.step_inputs(step)
            loss = trainer.step(**inputs)
            out = ref(**inputs, use_cache=False)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            assert loss == pytest.approx(out.loss.item(), abs=1e-6)
        mbs = [batches.step_inputs(2), batches.step_inputs(3)]
        trainer.step_accumulated(mbs)
        total = sum(int((m["labels"][:, 1:] != IGNORE).sum()) for m in mbs)
        for m in mbs:  # plain accumulation in transformers: each loss a sum over its targets / the total
            ref(**m, use_cache=False, num_items_in_batch=total).loss.backward()
        opt.step()
        assert max_weight_diff(trainer, ref) <= TOL


def test_packing_refused_where_attention_would_cross_examples(tmp_path, trainer_config):
    hf = tiny_config("opt", 1)
    save_model(hf, tmp_path / "model")
    with pytest.raises(ValueError, match="pack: .*not for opt"):
        check_packing(hf)
    with pytest.raises(ValueError, match="packed: .*not for opt"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config(packed=True))
    rows = pack_rows(random_examples(4, seed=3), SEQ)[:1]
    ids, labels, pos = packed_batch(rows, pad_id=2)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as trainer:
        with pytest.raises(ValueError, match="position_ids: packing .*not for opt"):
            trainer.step(ids, labels, position_ids=pos)
        # consecutive positions (no packing) are fine for any family
        trainer.step(ids, labels, position_ids=torch.arange(ids.shape[1])[None])
    llama = tiny_config("llama", 1)
    save_model(llama, tmp_path / "llama")
    with Trainer.from_pretrained(tmp_path / "llama", trainer_config(store_dir=str(tmp_path / "s2"))) as trainer:
        with pytest.raises(ValueError, match="position_ids: packed rows .*TrainerConfig.packed=True"):
            trainer.step(ids, labels, position_ids=pos)  # the plan did not count the packed rows' mask
    with Trainer.from_pretrained(tmp_path / "llama", trainer_config(store_dir=str(tmp_path / "s3"),
                                                                    packed=True)) as trainer:
        with pytest.raises(ValueError, match="attention_mask: packed rows"):
            trainer.step(ids, labels, attention_mask=torch.ones_like(ids), position_ids=pos)
        assert trainer.step_count == 0
        trainer.step(ids, labels, position_ids=pos)


def test_the_plan_counts_the_mask_of_packed_rows(tmp_path, trainer_config):
    """Packed rows bring an explicit block-diagonal mask that each attention saves: ``packed=True`` profiles with
    it, so the layers' planned activations grow."""
    save_model(tiny_config("llama", 2), tmp_path / "model")
    acts = []
    for packed in (False, True):
        cfg = trainer_config(packed=packed, seq_len=32, store_dir=str(tmp_path / f"s{packed}"))
        with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
            acts.append([u.act_bytes for u in trainer.profile.units if u.kind == "layer"])
    assert all(p > u for u, p in zip(*acts))


def test_the_plan_holds_the_gradient_sums(tmp_path, trainer_config):
    """grad_accum: the plan's step is N micro-batches (compute N times, one optimizer pass), and its host peak
    holds every trainable tensor's gradient sum when they rest in host memory."""
    from terastack.plan.llm_profile import chunked_bytes

    save_model(tiny_config("llama", 2), tmp_path / "model")
    plans = {}
    for accum in (1, 3):
        cfg = trainer_config(grad_accum=accum, store_dir=str(tmp_path / f"s{accum}"), accumulation="horizontal")
        with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
            plans[accum] = (trainer.plan, trainer.profile)
    (one, profile), (three, _) = plans[1], plans[3]
    assert one.grad_home == {} and set(three.grad_home.values()) == {"host"}
    assert three.prediction.compute_s == pytest.approx(3 * one.prediction.compute_s)
    assert three.prediction.optimizer_s == pytest.approx(one.prediction.optimizer_s)
    sums = sum(chunked_bytes(n, 4, three.optimizer_chunk) for name, n in profile.tensor_numel.items()
               if profile.tensor_trainable[name])
    assert three.prediction.host_peak_bytes >= one.prediction.host_peak_bytes + sums


# ------------------------------------------------------- vertical accumulation
def separate_reference_step(model, opt, mbs) -> float:
    """Plain PyTorch, each micro-batch its own forward (as given: its own length, mask and positions), the loss
    of each summed over its target tokens and divided by the step's total, then ONE AdamW step."""
    total = sum(int((m["labels"][:, 1:] != IGNORE).sum()) for m in mbs)
    loss_sum = 0.0
    for m in mbs:
        kw = {k: m[k] for k in ("attention_mask", "position_ids") if m.get(k) is not None}
        logits = model(input_ids=m["input_ids"], use_cache=False, **kw).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), m["labels"][:, 1:].reshape(-1),
                               ignore_index=IGNORE, reduction="sum") / total
        loss.backward()
        loss_sum += loss.item()
    opt.step()
    opt.zero_grad()
    return loss_sum


def ragged_micro_batches(step: int, *, masked: bool, packed: bool):
    """Micro-batches of different lengths and row counts; with ``masked`` one has a left-padding mask, with
    ``packed`` one packs two examples per row (positions restarting) and another gives plain positions."""
    g = torch.Generator().manual_seed(300 + step)
    out = []
    for i, (rows, length) in enumerate(((BATCH, SEQ), (1, SEQ - 5), (BATCH, SEQ - 9))):
        ids = torch.randint(3, VOCAB, (rows, length), generator=g)
        labels = ids.clone()
        mb = {"input_ids": ids, "labels": labels}
        if masked and i == 1:
            mask = torch.ones_like(ids)
            mask[0, :3] = 0
            labels[0, :3] = IGNORE
            mb["attention_mask"] = mask
        if packed and i == 0:
            cut = length // 2
            mb["position_ids"] = torch.cat([torch.arange(cut), torch.arange(length - cut)]).expand(rows, length)
        if packed and i == 2:
            mb["position_ids"] = torch.arange(length).expand(rows, length)
        out.append(mb)
    return out


@pytest.mark.parametrize("kind", ["plain", "masked", "packed"])
def test_vertical_step_of_ragged_micro_batches_equals_them_run_separately(kind, tmp_path, trainer_config):
    """Micro-batches of different lengths stack into one batch, padded where the loss does not look (with masks,
    with packed rows): the step equals plain training on each micro-batch as given."""
    family = "llama"
    ref = save_model(no_dropout_config(family), tmp_path / "model")
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    cfg = trainer_config(grad_accum=N_MICRO, accumulation="vertical", packed=kind == "packed",
                         state_placement="ssd", max_grad_norm=0.5)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        for step in range(2):
            mbs = ragged_micro_batches(step, masked=kind == "masked", packed=kind == "packed")
            ref_loss = reference_step_clipped(ref, opt, mbs, max_grad_norm=0.5)
            loss = trainer.step_accumulated(mbs)
            assert loss == pytest.approx(ref_loss, abs=1e-6)
            # the stats count the micro-batches' own tokens, not the padding
            assert trainer.history[-1].tokens == sum(m["input_ids"].numel() for m in mbs)
        assert max_weight_diff(trainer, ref) <= TOL
        assert_moments_equal(trainer, ref, opt, 2)


def reference_step_clipped(model, opt, mbs, *, max_grad_norm):
    step = opt.step
    opt.step = lambda: (torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm), step())
    try:
        return separate_reference_step(model, opt, mbs)
    finally:
        opt.step = step


def no_dropout_model_parameters():
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_config(no_dropout_config("llama")).parameters())


def test_vertical_reads_each_unit_once_per_step_and_spills_no_gradient(tmp_path, trainer_config):
    """With N micro-batches the horizontal order brings every unit's weights into the device tier N times per
    step and writes gradient sums to the SSD; the vertical order brings them once, as a one-batch step does, and
    writes only the state's update."""
    save_model(no_dropout_config("llama"), tmp_path / "model")
    mbs = micro_batches(0)
    stats = {}
    trainable = sum(p.numel() for p in no_dropout_model_parameters())
    for order in ("horizontal", "vertical", "grouped-2", "one batch"):
        accum = 1 if order == "one batch" else N_MICRO
        cfg = trainer_config(grad_accum=accum, accumulation="vertical" if accum == 1 else order,
                             state_placement="ssd", retain_weights=False, store_dir=str(tmp_path / order))
        with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
            if accum == 1:
                trainer.step(**mbs[0])
            else:
                trainer.step_accumulated(mbs)
            stats[order] = trainer.history[-1]
    one, vertical, horizontal = stats["one batch"], stats["vertical"], stats["horizontal"]
    assert vertical.device_in_bytes == one.device_in_bytes > 0
    assert horizontal.device_in_bytes == N_MICRO * one.device_in_bytes
    # groups of 2 of the 3 micro-batches: two passes, one set of sums written and read back (counted by the byte
    # ledger as the writes are issued: the engine's count at the step's end may miss write-backs still on their way)
    grouped = stats["grouped-2"]
    assert grouped.device_in_bytes == 2 * one.device_in_bytes
    sums = {order: stats[order].bytes_by_kind["gradients_written"] for order in ("vertical", "grouped-2",
                                                                                "horizontal")}
    assert sums["vertical"] == 0
    assert 4 * trainable <= sums["grouped-2"] < (N_MICRO - 1) * 4 * trainable <= sums["horizontal"]
    # horizontal: the sums of micro-batches 1..N-1 go to the SSD and come back (4 bytes a parameter each time);
    # vertical: none, and the step reads what a one-batch step reads, byte for byte
    assert vertical.bytes_by_kind == one.bytes_by_kind
    assert vertical.ssd_read_bytes == one.ssd_read_bytes
    assert horizontal.ssd_read_bytes - vertical.ssd_read_bytes >= (N_MICRO - 1) * 4 * trainable


def test_auto_is_the_fewest_passes_that_fit(tmp_path, trainer_config):
    """accumulation="auto": vertical while N micro-batches' activations fit the device budget; a budget that
    only fits fewer stacked gets the grouped order of the most that fit, and one that fits only one micro-batch
    the horizontal order (each with its gradient sums)."""
    from terastack.plan.llm_plan import PlanError

    save_model(no_dropout_config("llama", 2), tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(grad_accum=8)) as trainer:
        assert trainer.plan.accumulation == "vertical" and not trainer.plan.sums_gradients
    # what each order needs of the device budget (long rows: activations dominate), from its refusal of 256 KiB
    orders = ("vertical", "grouped-4", "grouped-2", "horizontal")
    budgets = {}
    for order in orders:
        cfg = trainer_config(grad_accum=8, accumulation=order, seq_len=64, batch_size=4, device_budget="256KiB",
                             store_dir=str(tmp_path / order))
        with pytest.raises(PlanError) as info:
            Trainer.from_pretrained(tmp_path / "model", cfg)
        budgets[order] = info.value.needed
    assert [budgets[o] for o in orders] == sorted(budgets.values(), reverse=True)
    for wider, expect in (("vertical", "grouped-4"), ("grouped-2", "horizontal")):
        between = (budgets[wider] + budgets[expect]) // 2
        with pytest.raises(PlanError, match="device"):
            Trainer.from_pretrained(tmp_path / "model", trainer_config(
                grad_accum=8, accumulation=wider, seq_len=64, batch_size=4, device_budget=between,
                store_dir=str(tmp_path / f"refused-{wider}")))
        with Trainer.from_pretrained(tmp_path / "model", trainer_config(
                grad_accum=8, seq_len=64, batch_size=4, device_budget=between,
                store_dir=str(tmp_path / f"auto-{expect}"))) as trainer:
            assert trainer.plan.accumulation == expect and trainer.plan.sums_gradients


def test_vertical_refuses_what_does_not_stack(tmp_path, trainer_config):
    save_model(no_dropout_config("llama", 1), tmp_path / "model")
    mbs = ragged_micro_batches(0, masked=True, packed=True)
    cfg = trainer_config(grad_accum=N_MICRO, accumulation="vertical", packed=True)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        with pytest.raises(ValueError, match=r"micro_batches\[0\].position_ids: packed rows .*'horizontal'"):
            trainer.step_accumulated(mbs)
        assert trainer.step_count == 0
        # more rows of shorter micro-batches fit one by one, but padded to the longest they exceed the plan
        wide = [{"input_ids": torch.randint(3, VOCAB, (BATCH * 4, SEQ // 4))} for _ in range(N_MICRO - 1)]
        with pytest.raises(ValueError, match=r"micro_batches: stacked .* 18 x 16 tokens, more than the planned 3 x 2"):
            trainer.step_accumulated([*wide, {"input_ids": torch.randint(3, VOCAB, (BATCH, SEQ))}])
        assert trainer.step_count == 0
        trainer.step_accumulated(ragged_micro_batches(0, masked=False, packed=True))  # still usable
        assert trainer.step_count == 1


@pytest.mark.parametrize("order", ["vertical", "horizontal"])
def test_a_vertical_plan_is_calibrated_with_the_micro_batches_stacked(order, tmp_path, trainer_config):
    """Calibrated for vertical accumulation, the units are timed at the stacked width as well, and the plan's
    compute is those times; a horizontal-only trainer does not time them."""
    save_model(no_dropout_config("llama"), tmp_path / "model")
    cfg = trainer_config(calibrate=True, grad_accum=2, batch_size=BATCH // 2, accumulation=order,
                         activation_policy="keep")   # no recomputed forward in the plan's compute
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        stacked = t.profile.stacked_times
        if order == "horizontal":
            assert stacked == {}
            return
        assert list(stacked) == [2] and len(stacked[2]) == len(t.profile.units)
        assert all(f > 0 and b >= 0 for f, b in stacked[2])
        assert t.plan.prediction.compute_s == pytest.approx(sum(f + b for f, b in stacked[2]), rel=1e-9)


def test_a_calibrated_plan_times_only_the_width_it_runs(tmp_path, trainer_config):
    """With 4 micro-batches auto may choose the vertical order (4 stacked) or groups of 2; the units are timed at
    the one width the plan runs ([Note: calibrating the stacked width]), and its compute is its passes at that
    width: 4 stacked where the budget fits them, 2 where it only fits 2 (the 4-wide pass never timed)."""
    from terastack.plan.llm_plan import PlanError

    save_model(no_dropout_config("llama"), tmp_path / "model")
    base = dict(grad_accum=4, batch_size=BATCH // 2, activation_policy="keep", seq_len=64)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(**base, calibrate=True)) as t:
        stacked = t.profile.stacked_times
        assert list(stacked) == [4] and t.plan.accumulation == "vertical"
        assert t.plan.prediction.compute_s == pytest.approx(sum(f + b for f, b in stacked[4]), rel=1e-9)
    needed = {}
    for order in ("vertical", "grouped-2"):
        with pytest.raises(PlanError) as info:
            Trainer.from_pretrained(tmp_path / "model", trainer_config(
                **base, accumulation=order, device_budget="1MiB", store_dir=str(tmp_path / order)))
        needed[order] = info.value.needed
    between = (needed["vertical"] + needed["grouped-2"]) // 2
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(
            **base, calibrate=True, device_budget=between, store_dir=str(tmp_path / "g"))) as t:
        stacked = t.profile.stacked_times
        assert list(stacked) == [2] and t.plan.accumulation == "grouped-2"
        assert t.plan.prediction.compute_s == pytest.approx(2 * sum(f + b for f, b in stacked[2]), rel=1e-9)
