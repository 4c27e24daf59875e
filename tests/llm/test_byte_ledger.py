"""The byte ledger: a step's SSD bytes by kind, counted as the store submits them, against the plan's prediction
of the same kinds ([Note: the byte ledger] in terastack.llm.engine.byte_ledger)."""
from contextlib import nullcontext

from .llm_helpers import BATCH, SEQ, batches, make_model
from terastack.llm import Trainer
from terastack.llm.engine.byte_ledger import ByteLedger, difference

STATE_KINDS = ("weights_forward_read", "weights_backward_read", "masters_read", "masters_written", "moments_read",
               "moments_written")


def _last_step(tmp_path, trainer_config, *, accum: int = 1, **kw):
    make_model("llama", tmp_path / "model", layers=4)
    cfg = trainer_config(device_budget="4MiB", host_budget="3MiB", state_placement="ssd", grad_accum=accum,
                         batch_size=BATCH // accum, seq_len=SEQ, store_dir=str(tmp_path / f"store-{accum}"), **kw)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        for ids in batches(3):
            if accum == 1:
                t.step(ids)
            else:
                t.step_accumulated([{"input_ids": part} for part in ids.chunk(accum)])
        t.synchronize()
        return t.history[-1], t.plan.prediction


def test_state_bytes_by_kind_are_the_planned_ones_and_add_up_to_the_step(tmp_path, trainer_config):
    stats, pred = _last_step(tmp_path, trainer_config, activation_policy="keep", retain_weights=False)
    kinds = stats.bytes_by_kind
    # every byte the store read is in one kind, and the state's kinds are the planned ones
    assert sum(v for k, v in kinds.items() if k.endswith("_read")) == stats.ssd_read_bytes
    # fp32: forward and backward read the weights, backward hands them to the optimizer: no master is read again.
    # The state's bytes are the plan's to the byte, at any pace of the disk: a record written back is read again
    # from the SSD, never served from a copy its write has not yet freed ([Note: a write-back drops its copy as it
    # lands]), and backward hands over the masters the plan counts ([Note: the hand-over does not depend on the
    # disk's pace])
    for key in STATE_KINDS:
        assert kinds[key] == pred.bytes_by_kind[key], key
    assert kinds["masters_read"] == 0
    assert kinds["weights_backward_read"] == kinds["masters_written"] > 0
    assert 0 < kinds["weights_forward_read"] <= kinds["weights_backward_read"]
    assert kinds["moments_read"] == kinds["moments_written"] == 2 * kinds["masters_written"]


def test_a_lagging_disk_moves_the_same_bytes_within_the_same_peaks(tmp_path, trainer_config):
    """Every write-back still in flight when the next request is made -- what a slow disk does now and then on a
    loaded machine, here in every run ([Note: a lagging disk in tests]): the step reads and writes the same bytes
    of every kind as on the ordinary disk, the state's are the plan's, and the ledgers' peaks stay within the
    plan's. (A record's copy served from memory while its write-back was landing, and a read chained behind a
    write-back counted as a master read, showed here in every run as forward reads off the plan.)"""
    from ..gated_disk import gated_disk

    make_model("llama", tmp_path / "model", layers=4)
    seen = {}
    for lagging in (False, True):
        cfg = trainer_config(device_budget="4MiB", host_budget="3MiB", state_placement="ssd",
                             activation_policy="keep", retain_weights=False, store_dir=str(tmp_path / f"s{lagging}"))
        with gated_disk(lagging=True) if lagging else nullcontext() as disk:
            with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
                for ids in batches(3):
                    t.step(ids)
                t.synchronize()
                plan, pred, use = t.plan, t.plan.prediction, t.usage()
                seen[lagging] = t.history[-1].bytes_by_kind
            if lagging:
                assert disk.lagged > 0  # write-backs overtaken by later requests, counted
        assert use["host"]["peak"] <= pred.host_peak_bytes - plan.grad_pool_bytes, lagging
        assert use["device"]["peak"] <= pred.device_peak_bytes and use["grad_pool"]["peak"] <= plan.grad_pool_bytes
    assert seen[True] == seen[False]
    for key in STATE_KINDS:
        assert seen[True][key] == pred.bytes_by_kind[key], key


def test_weights_are_read_once_each_way_whatever_the_accumulation(tmp_path, trainer_config):
    """Vertical accumulation: two micro-batches per step read the weights once for forward and once for
    backward, the bytes of one micro-batch's step; the plan says so too."""
    one, _ = _last_step(tmp_path / "a", trainer_config, activation_policy="keep", retain_weights=False)
    two, pred = _last_step(tmp_path / "b", trainer_config, accum=2, activation_policy="keep", retain_weights=False,
                           accumulation="vertical")
    for key in ("weights_forward_read", "weights_backward_read", "moments_read"):
        assert two.bytes_by_kind[key] == one.bytes_by_kind[key] == pred.bytes_by_kind[key] > 0, key


def test_swapped_activations_are_their_own_kind(tmp_path, trainer_config):
    stats, pred = _last_step(tmp_path, trainer_config, activation_policy="ssd", retain_weights=False)
    assert stats.bytes_by_kind["activations_read"] > 0 and stats.bytes_by_kind["activations_written"] > 0
    assert pred.bytes_by_kind["activations_read"] > 0


def test_reads_are_labelled_by_the_phase_that_asked():
    ledger = ByteLedger()
    ledger.observe("p:layer.weight", "read", 10)           # the optimizer re-reading a master
    with ledger.reading("backward"):
        ledger.observe("p:layer.weight", "read", 20)
    with ledger.reading("forward"):
        ledger.observe("w:frozen.weight", "read", 30)
        ledger.observe("m:layer.weight#0", "read", 40)     # not a weight, whatever the phase
    ledger.observe("p:layer.weight", "write", 50)
    ledger.observe("w:layer.weight", "write", 60)
    ledger.observe("s:layer.weight#1", "write", 70)
    ledger.observe("a:3:1", "read", 80)
    ledger.observe("unknown", "read", 90)
    got = {k: v for k, v in ledger.snapshot().items() if v}
    assert got == {"masters_read": 10, "weights_backward_read": 20, "weights_forward_read": 30, "moments_read": 40,
                   "masters_written": 50, "compute_copies_written": 60, "gradients_written": 70,
                   "activations_read": 80, "other_read": 90}


def test_a_read_chained_behind_a_write_back_keeps_the_phase_that_asked(tmp_path):
    """A forward's read of a record whose write-back is still in flight is issued when the write lands, on the I/O
    thread that completes it: it is still the forward's read, at any pace of the disk (counted as the optimizer's
    master read when the label came from the issuing thread, the forward's reads fell short of the plan on a
    loaded machine). The write lands when the test says ([Note: a gated disk in tests])."""
    import torch

    from terastack.tiers import TieredStore, Tier

    from ..gated_disk import gated_disk

    ledger = ByteLedger()
    with gated_disk() as disk, TieredStore(TieredStore.Config(root=str(tmp_path / "store"), device_budget="1MiB",
                                                              host_budget="1MiB")) as store:
        store.traffic = ledger.observe
        put = store.put("p:layer.weight", torch.ones(1024))
        disk.release()  # the put lands
        put.result(timeout=30)
        store.get("p:layer.weight", Tier.DEVICE)
        before = ledger.snapshot()
        store.mark_dirty("p:layer.weight")
        written = store.evict("p:layer.weight")
        with ledger.reading("forward"):
            read = store.prefetch("p:layer.weight", Tier.DEVICE)
        assert not written.done() and not read.done()  # the read waits behind the write, as on a slow disk
        disk.release()
        read.result(timeout=30)
        got = difference(ledger.snapshot(), before)
    assert got["weights_forward_read"] == 4096 and got["masters_read"] == 0
