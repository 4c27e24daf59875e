"""TieredStore: states, budgets as contracts, movement between tiers, atomic copy-on-write commits."""
import json

import pytest
import torch

from terastack.errors import BudgetError
from terastack.tiers import State, StripeBySize, Tier, TieredStore
from terastack.tiers.layout import data_file_name

KiB = 1024


def open_store(root: str, **kw) -> TieredStore:
    kw.setdefault("device_budget", "1MiB")
    kw.setdefault("host_budget", "1MiB")
    return TieredStore(TieredStore.Config(root=root, **kw))


@pytest.fixture
def make(store_dirs):
    """``make(tmp_path, **config)``: the test's store (over one directory or two, see conftest), reopened by
    calling it again."""
    return lambda tmp_path, **kw: open_store(store_dirs(tmp_path), **kw)


def test_put_prefetch_evict_cycle(tmp_path, make):
    store = make(tmp_path)
    a = torch.randn(300, 7)
    fut = store.put("a", a)
    fut.result(timeout=30)
    rec = store.record("a")
    assert rec.state is State.ON_SSD and rec.tier is Tier.SSD and rec.future is None
    t = store.get("a", "device")
    assert torch.equal(t, a) and store.record("a").state is State.RESIDENT
    assert store.usage()["device"]["used"] == 12 * KiB  # 8400 bytes padded to 4 KiB blocks
    t.add_(1)
    store.mark_dirty("a")
    store.evict("a").result(timeout=30)
    assert store.record("a").state is State.ON_SSD and store.usage()["device"]["used"] == 0
    assert torch.equal(store.get("a", "host"), a + 1)


def test_inflight_state_is_visible(tmp_path, make, monkeypatch):
    import threading

    store = make(tmp_path, host_budget="64MiB")
    store.put("big", torch.randn(1 << 20)).result()
    # the read's completion signals before it takes the store's lock to publish RESIDENT: the test waits for
    # the read to have finished (no sleep, no race), then sees that the record still says in flight
    read_done = threading.Event()
    arrived = store._arrived

    def signalling_arrived(*args):
        publish = arrived(*args)

        def on_done(done):
            read_done.set()
            publish(done)
        return on_done

    monkeypatch.setattr(store, "_arrived", signalling_arrived)
    with store._lock:  # the completion cannot publish RESIDENT while the store's lock is held
        fut = store.prefetch("big", "host")
        assert read_done.wait(30), "the read never completed"
        rec = store.record("big")
        assert rec.state is State.INFLIGHT_IN and rec.tier is Tier.HOST and rec.future is fut and not fut.done()
    assert fut.result(timeout=30).shape == (1 << 20,)
    assert store.record("big").state is State.RESIDENT and store.record("big").future is None


def test_budget_refusal_names_tier_and_shortfall(tmp_path, make):
    store = make(tmp_path, device_budget=64 * KiB)
    store.put("x", torch.zeros(10 * KiB)).result()  # 40 KiB
    store.put("y", torch.zeros(10 * KiB)).result()
    store.get("x", "device")
    with pytest.raises(BudgetError) as info:
        store.get("y", "device")
    e = info.value
    assert e.budget == "device" and e.needed == 40 * KiB and e.available == 24 * KiB and e.shortfall == 16 * KiB
    assert "device budget exceeded" in str(e) and "'y'" in str(e)
    assert store.record("y").state is State.ON_SSD  # a refused placement changes nothing
    store.evict("x").result()
    assert torch.equal(store.get("y", "device"), torch.zeros(10 * KiB))


def test_peak_device_bytes_follow_the_schedule(tmp_path, make):
    """Streaming N tensors with one prefetched ahead never holds more than two on the device."""
    n, numel = 6, 1000  # 4000 bytes -> one 4 KiB block each
    store = make(tmp_path, device_budget=2 * 4 * KiB)
    for i in range(n):
        store.put(f"w{i}", torch.full((numel,), float(i))).result()
    nxt = store.prefetch("w0")
    total = 0.0
    for i in range(n):
        cur = nxt.result()
        if i + 1 < n:
            nxt = store.prefetch(f"w{i + 1}")
        total += float(cur.sum())
        store.evict(f"w{i}").result()
    assert total == sum(i * numel for i in range(n))
    assert store.budgets[Tier.DEVICE].peak == 2 * 4 * KiB


def test_host_home_moves_to_device_and_back(tmp_path, make):
    store = make(tmp_path)
    store.put("h", torch.arange(100.0), home="host").result()
    assert store.record("h").state is State.RESIDENT and store.record("h").tier is Tier.HOST
    d = store.get("h", "device")
    d.mul_(3)
    store.mark_dirty("h")
    store.evict("h").result()
    assert store.record("h").tier is Tier.HOST
    assert torch.equal(store.tensor("h"), torch.arange(100.0) * 3)
    assert store.usage()["device"]["used"] == 0 and store.usage()["host"]["used"] == 4 * KiB


def test_create_resident_and_writeback(tmp_path, make):
    store = make(tmp_path)
    c = store.create("c", (10, 10), torch.float64, tier="host")
    c.fill_(2.5)
    store.writeback("c").result()
    store.evict("c").result()
    assert torch.equal(store.get("c", "device"), torch.full((10, 10), 2.5, dtype=torch.float64))
    assert store.create("z", (5,), torch.int32) is None
    assert torch.equal(store.get("z", "host"), torch.zeros(5, dtype=torch.int32))


def test_commit_reopen_and_crash_consistency(tmp_path, make):
    store = make(tmp_path)
    store.put("w", torch.ones(1000)).result()
    store.put("h", torch.arange(10.0), home="host").result()
    store.commit()
    w = store.get("w", "host")
    w.mul_(5)
    store.mark_dirty("w")
    store.writeback("w").result()  # written, but not committed: a crash now must keep the old state
    store.close()

    reopened = make(tmp_path)
    assert torch.equal(reopened.get("w", "host"), torch.ones(1000))
    assert torch.equal(reopened.get("h", "host"), torch.arange(10.0))
    w = reopened.tensor("w")
    w.mul_(7)
    reopened.mark_dirty("w")
    reopened.commit()
    reopened.close()
    again = make(tmp_path)
    assert torch.equal(again.get("w", "host"), torch.full((1000,), 7.0))
    assert sorted(again.names()) == ["h", "w"]


def test_copy_on_write_reuses_space_after_commit(tmp_path, make):
    store = make(tmp_path)
    store.put("w", torch.ones(1024)).result()
    store.commit()
    for step in range(5):
        w = store.get("w", "host")
        w.add_(1)
        store.mark_dirty("w")
        store.commit()
    # Old extents are freed at each commit, so the file stays at two extents' worth.
    assert store.usage()["ssd"]["used"] <= 3 * 4 * KiB
    assert torch.equal(store.get("w", "host"), torch.full((1024,), 6.0))


@pytest.mark.parametrize("hole", ["punched", "written"])
def test_created_tensors_are_zeros_in_reused_and_crash_left_space(tmp_path, make, hole, monkeypatch):
    from terastack.tiers import layout

    if hole == "written":  # a file system without hole punching: zeros are written
        monkeypatch.setattr(layout, "punch_hole", lambda fd, offset, length: False)
    store = make(tmp_path)
    store.put("a", torch.full((3000,), 5.0)).result()
    store.delete("a")  # its extent is free again (never committed)
    store.create("z", (3000,), torch.float32)
    assert torch.equal(store.get("z", "host"), torch.zeros(3000))
    store.put("b", torch.full((3000,), 9.0)).result()  # written, not committed: a crash leaves its bytes behind
    store.close()
    reopened = make(tmp_path)
    reopened.create("y", (6000,), torch.float32)
    assert torch.equal(reopened.get("y", "host"), torch.zeros(6000))


def test_bad_manifest_and_truncated_data_are_errors(tmp_path, make):
    store = make(tmp_path)
    store.put("w", torch.ones(5000)).result()
    store.commit()
    store.close()
    manifest = store.root / "manifest.json"
    good = manifest.read_text()
    entry = json.loads(good)
    where = entry["tensors"]["w"].get("dir", 0)
    data = store.dirs[where] / data_file_name(where)
    with open(data, "r+b") as f:
        f.truncate(4096)
    with pytest.raises(ValueError, match="truncated"):
        make(tmp_path)
    manifest.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        make(tmp_path)
    entry["tensors"]["w"]["nbytes"] = 12
    manifest.write_text(json.dumps(entry))
    with pytest.raises(ValueError, match="inconsistent"):
        make(tmp_path)


def test_config_validation():
    with pytest.raises(ValueError, match="host_budget"):
        TieredStore.Config(root="/tmp/x", host_budget="lots")
    with pytest.raises(ValueError, match="root"):
        TieredStore.Config(root="")
    with pytest.raises(ValueError, match="device"):
        TieredStore.Config(root="/tmp/x", device="tpu")


def test_duplicate_and_unknown_names(tmp_path, make):
    store = make(tmp_path)
    store.put("a", torch.ones(3)).result()
    with pytest.raises(KeyError, match="already exists"):
        store.put("a", torch.ones(3))
    with pytest.raises(KeyError, match="no tensor named 'b'"):
        store.get("b")
    store.delete("a")
    assert "a" not in store


def test_freed_buffers_are_reused_within_the_budget_and_trimmed(tmp_path, make):
    store = make(tmp_path, host_budget=64 * KiB)
    for name in ("a", "b", "c"):
        store.put(name, torch.full((5000,), 1.0)).result()  # 20000 bytes -> 20 KiB buffers
    first = store.get("a", "host").data_ptr()
    store.evict("a").result()
    assert store.get("b", "host").data_ptr() == first  # the freed buffer came back
    store.get("c", "host")
    store.evict("b").result()
    store.evict("c").result()
    ledger = store.budgets[Tier.HOST]
    assert ledger.used == 0 and store.pool.pooled(Tier.HOST) == 40 * KiB
    store.put("big", torch.zeros(14 * KiB // 4 * 4)).result()  # 56 KiB: the pool must shrink to make room
    store.get("big", "host")
    assert ledger.used + store.pool.pooled(Tier.HOST) <= ledger.limit
    store.evict("big").result()
    assert store.trim() > 0 and store.trim() == 0


def test_many_tensors_move_in_one_request_vector(tmp_path, make):
    """prefetch_many / evict_many equal prefetch / evict one by one; a budget that runs out part-way raises
    after the reads begun before it were submitted (they still arrive)."""
    store = make(tmp_path, host_budget="36KiB")
    tensors = {f"t{i}": torch.randn(1024 * (i + 1)) for i in range(4)}  # 4, 8, 12, 16 KiB
    for name, t in tensors.items():
        store.put(name, t, home=Tier.SSD).result(timeout=30)
    futs = store.prefetch_many(["t0", "t1"], Tier.HOST)
    assert [torch.equal(f.result(timeout=30), tensors[n]) for f, n in zip(futs, ["t0", "t1"])] == [True, True]
    store.tensor("t0").mul_(2)
    store.tensor("t1").add_(1)
    store.mark_dirty("t0")
    store.mark_dirty("t1")
    for fut in store.evict_many(["t0", "t1"]):
        fut.result(timeout=30)
    assert store.usage()["host"]["used"] == 0
    assert store.record("t0").state is State.ON_SSD and store.record("t1").state is State.ON_SSD
    with pytest.raises(BudgetError, match="host"):
        store.prefetch_many(["t0", "t1", "t2", "t3"], Tier.HOST)  # t0-t2 take 24 KiB: t3 does not fit
    assert torch.equal(store.get("t0", "host"), tensors["t0"] * 2)
    assert torch.equal(store.get("t2", "host"), tensors["t2"])
    assert torch.equal(store.get("t1", "host"), tensors["t1"] + 1)
    assert store.record("t3").state is State.ON_SSD


def test_a_second_prefetch_joins_the_read_under_way(tmp_path, make):
    """A prefetch of a tensor whose read is in flight shares that read (the same future): a prefetch chained
    behind it could run after the caller has used and evicted the tensor, and read it back for no one. The read is
    in flight until the test lets it land ([Note: a gated disk in tests])."""
    from tests.gated_disk import gated_disk

    a = torch.randn(64 << 10)
    with gated_disk(reads=True) as disk:
        store = make(tmp_path)
        put = store.put("a", a, home=Tier.SSD)
        disk.release()
        put.result(timeout=30)
        first = store.prefetch("a", Tier.HOST)
        assert store.record("a").state is State.INFLIGHT_IN
        assert store.prefetch("a", Tier.HOST) is first
        disk.release()
        assert torch.equal(first.result(timeout=30), a)
        store.mark_dirty("a")
        written = store.evict("a")
        disk.release()
        written.result(timeout=30)
        store.wait(timeout=30)
        assert store.record("a").state is State.ON_SSD and store.usage()["host"]["used"] == 0
        assert disk.held() == 0  # nothing else was read: the second prefetch made no request of its own


# ------------------------------------------------------------------ stores over several directories
def two_dirs(tmp_path) -> str:
    return f"{tmp_path / 'a'},{tmp_path / 'b'}"


def dir_bytes(store: TieredStore) -> list[int]:
    return [d["live"] for d in store.usage()["ssd"]["dirs"]]


@pytest.mark.parametrize("weights, share", [((), (1, 1)), ((1.0, 3.0), (1, 3)), ((500.0, 250.0), (2, 1))])
def test_default_placement_spreads_bytes_by_weight(tmp_path, weights, share):
    """Each directory receives its weighted share of the bytes: exactly, for equal-sized records, and to within
    one record for mixed sizes."""
    store = open_store(two_dirs(tmp_path), bandwidths=weights)
    for i in range(12 * sum(share)):
        store.put(f"t{i}", torch.full((1024,), float(i))).result(timeout=30)  # 4 KiB each
    assert dir_bytes(store) == [12 * s * 4 * KiB for s in share]
    ssd = store.usage()["ssd"]
    assert ssd["used"] == sum(d["used"] for d in ssd["dirs"]) and [d["dir"] for d in ssd["dirs"]] == [
        str(tmp_path / "a"), str(tmp_path / "b")]
    assert (tmp_path / "a" / "data.bin").exists() and (tmp_path / "b" / "data.1.bin").exists()
    gen = torch.Generator().manual_seed(0)
    for i in range(40):
        n = int(torch.randint(1, 40_000, (1,), generator=gen))
        store.put(f"r{i}", torch.zeros(n, dtype=torch.uint8)).result(timeout=30)
    got = dir_bytes(store)
    w = weights or (1.0, 1.0)
    ideal = [sum(got) * x / sum(w) for x in w]
    assert all(abs(g - i) <= 40 * KiB for g, i in zip(got, ideal))  # the largest record is < 40 KiB
    for i in range(12 * sum(share)):
        assert torch.equal(store.get(f"t{i}", "host"), torch.full((1024,), float(i)))
        store.evict(f"t{i}").result(timeout=30)


def test_placement_policy_is_pluggable_and_checked(tmp_path):
    class Last:
        def place(self, nbytes, placed):
            return len(placed) - 1

    store = TieredStore(TieredStore.Config(root=two_dirs(tmp_path), host_budget="1MiB"), placement=Last())
    store.put("x", torch.ones(3000)).result(timeout=30)
    assert dir_bytes(store) == [0, 12 * KiB]

    class Wrong:
        def place(self, nbytes, placed):
            return 2

    store = TieredStore(TieredStore.Config(root=two_dirs(tmp_path / "w")), placement=Wrong())
    with pytest.raises(ValueError, match="chose directory 2 of 2"):
        store.put("x", torch.ones(3))
    with pytest.raises(ValueError, match="weights: 3 given for 2"):
        StripeBySize(weights=(1, 2, 3)).place(4096, (0, 0))
    with pytest.raises(ValueError, match="bandwidths: 1 given for 2"):
        TieredStore.Config(root=two_dirs(tmp_path), bandwidths=[1.0])


def test_commit_over_two_directories_reopens_identical_tensors(tmp_path):
    gen = torch.Generator().manual_seed(1)
    tensors = {f"w{i}": torch.randn(int(torch.randint(1, 5000, (1,), generator=gen)), generator=gen)
               for i in range(16)}
    store = open_store(two_dirs(tmp_path))
    for name, t in tensors.items():
        store.put(name, t).result(timeout=30)
    store.put("h", torch.arange(10.0), home="host").result(timeout=30)
    store.create("z", (7, 3), torch.int64)
    store.get("w3", "host").mul_(2)  # a copy-on-write rewrite, committed
    store.mark_dirty("w3")
    tensors["w3"] = tensors["w3"] * 2
    store.commit()
    store.get("w5", "host").zero_()  # written but not committed: the reopened store must not see it
    store.mark_dirty("w5")
    store.writeback("w5").result(timeout=30)
    store.close()

    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["version"] == 2 and [d["data_file"] for d in manifest["dirs"]] == ["data.bin", "data.1.bin"]
    assert {e["dir"] for e in manifest["tensors"].values()} == {0, 1}
    again = open_store(two_dirs(tmp_path))
    assert sorted(again.names()) == sorted([*tensors, "h", "z"])
    for name, t in tensors.items():
        assert torch.equal(again.get(name, "host"), t), name
        again.evict(name).result(timeout=30)
    assert torch.equal(again.get("h", "host"), torch.arange(10.0))
    assert torch.equal(again.get("z", "host"), torch.zeros(7, 3, dtype=torch.int64))
    assert dir_bytes(again) == [sum(e["capacity"] for e in manifest["tensors"].values() if e["dir"] == d)
                                for d in (0, 1)]


def test_a_different_number_of_directories_is_refused_by_name(tmp_path):
    store = open_store(two_dirs(tmp_path))
    store.put("w", torch.ones(10)).result(timeout=30)
    store.commit()
    store.close()
    with pytest.raises(ValueError, match=r"describes 2 directories, but the store was opened with 1: .*a"):
        open_store(str(tmp_path / "a"))
    with pytest.raises(ValueError, match=r"describes 2 directories, but the store was opened with 3"):
        open_store(f"{two_dirs(tmp_path)},{tmp_path / 'c'}")
    assert not (tmp_path / "c").exists()  # a refused open creates nothing
    with pytest.raises(ValueError, match="holds a store manifest but is not the first"):
        open_store(f"{tmp_path / 'b'},{tmp_path / 'a'}")

    one = open_store(str(tmp_path / "one"))
    one.put("w", torch.ones(10)).result(timeout=30)
    one.commit()
    one.close()
    with pytest.raises(ValueError, match=r"describes 1 directory, but the store was opened with 2"):
        open_store(f"{tmp_path / 'one'},{tmp_path / 'two'}")


OLD_KEYS = {"format", "version", "data_file", "data_bytes", "tensors"}
OLD_ENTRY_KEYS = {"shape", "dtype", "nbytes", "home", "offset", "capacity"}


def test_an_old_one_directory_manifest_still_opens(tmp_path):
    """A store written before stores could span directories (data.bin + a version-1 manifest, written here as
    that code wrote them) opens, and committing it writes the same format again."""
    root = tmp_path / "old"
    root.mkdir()
    w = torch.arange(3000, dtype=torch.float32)  # 12000 bytes -> 12 KiB
    h = torch.arange(6, dtype=torch.int16).view(2, 3)
    data = bytearray(4 * 4096)
    data[:w.numel() * 4] = w.numpy().tobytes()
    data[3 * 4096:3 * 4096 + 12] = h.numpy().tobytes()
    (root / "data.bin").write_bytes(bytes(data))
    (root / "manifest.json").write_text(json.dumps({
        "format": "terastack.tiers", "version": 1, "data_file": "data.bin", "data_bytes": 4 * 4096,
        "tensors": {"w": {"shape": [3000], "dtype": "float32", "nbytes": 12000, "home": "ssd", "offset": 0,
                          "capacity": 12288},
                    "h": {"shape": [2, 3], "dtype": "int16", "nbytes": 12, "home": "host", "offset": 12288,
                          "capacity": 4096}}}, indent=1, sort_keys=True) + "\n")
    store = open_store(str(root))
    assert torch.equal(store.get("w", "host"), w) and torch.equal(store.get("h", "host"), h)
    store.tensor("w").add_(1)
    store.mark_dirty("w")
    store.commit()
    store.close()
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest) == OLD_KEYS and manifest["version"] == 1 and manifest["data_file"] == "data.bin"
    assert all(set(e) == OLD_ENTRY_KEYS for e in manifest["tensors"].values())
    assert sorted(p.name for p in root.iterdir()) == ["data.bin", "manifest.json"]
    assert torch.equal(open_store(str(root)).get("w", "host"), w + 1)


def test_root_forms(tmp_path):
    """root: one path, comma-separated paths, or a sequence; `root` is then the first and `dirs` all."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for root in (f"{a}, {b}", [a, b], (tmp_path / "a", tmp_path / "b")):
        config = TieredStore.Config(root=root)
        assert config.root == a and config.dirs == (a, b)
    assert TieredStore.Config(root=a).dirs == (a,)
    with pytest.raises(ValueError, match="root: directory .* is listed twice"):
        TieredStore.Config(root=[a, a])
    with pytest.raises(ValueError, match="root"):
        TieredStore.Config(root=f"{a},,{b}")
    store = open_store([a, b])
    assert store.root == tmp_path / "a" and store.dirs == (tmp_path / "a", tmp_path / "b")
    store.close()


def test_resident_answers_only_for_a_working_copy_in_that_tier(tmp_path, make):
    """``resident`` is prefetch's finished answer without a future: the tensor when it is resident in the asked
    tier with nothing in flight, None otherwise (on the SSD, in another tier, on its way)."""
    store = make(tmp_path, host_budget="64MiB")
    a = torch.randn(100, 3)
    store.put("a", a).result()
    assert store.resident("a", Tier.HOST) is None  # on the SSD only
    with store._lock:  # the read cannot complete while the lock is held
        store.prefetch("a", Tier.HOST)
        assert store.resident("a", Tier.HOST) is None  # on its way
    store.get("a", Tier.HOST)
    t = store.resident("a", Tier.HOST)
    assert torch.equal(t, a) and store.resident("a", Tier.DEVICE) is None
    assert t.data_ptr() == store.get("a", Tier.HOST).data_ptr()  # the working copy itself, not a copy
    assert store.padded("a") == store.record("a").padded == 4 * KiB
    with pytest.raises(KeyError):
        store.resident("missing", Tier.HOST)


def test_a_records_view_follows_its_buffer_and_does_not_pin_a_freed_one(tmp_path, make):
    """The typed view a record keeps for repeated requests is dropped when its buffer goes, so an evicted
    tensor's memory is not held by it, and a new working copy is never answered with the old one."""
    import weakref

    store = make(tmp_path, host_budget="64MiB")
    store.put("a", torch.arange(4096, dtype=torch.float32)).result()
    first = store.get("a", Tier.HOST)
    assert store.get("a", Tier.HOST) is first  # repeated requests share one view
    raw = store._records["a"].buffer
    gone = weakref.ref(raw)
    first.add_(1)
    store.evict_many(["a"], dirty=True)[0].result()
    assert store._records["a"].buffer is None and store._records["a"]._typed is None
    del first, raw
    store.trim()
    assert gone() is None  # nothing in the record keeps the freed buffer alive
    again = store.get("a", Tier.HOST)
    assert torch.equal(again, torch.arange(4096, dtype=torch.float32) + 1)  # dirty=True wrote it back


def test_evict_many_dirty_equals_mark_dirty_then_evict(tmp_path, make):
    store = make(tmp_path, host_budget="64MiB")
    for name in ("x", "y"):
        store.put(name, torch.zeros(2048)).result()
    for name in ("x", "y"):
        store.get(name, Tier.HOST).fill_(3.0)
    store.mark_dirty("x")
    store.evict("x").result()
    store.evict_many(["y"], dirty=True)[0].result()
    assert torch.equal(store.get("x", Tier.HOST), store.get("y", Tier.HOST))
    assert float(store.get("y", Tier.HOST)[0]) == 3.0
    store.put("z", torch.zeros(8)).result()  # on the SSD, no working copy: nothing to mark
    with pytest.raises(RuntimeError, match="no working copy"):
        store.evict_many(["z"], dirty=True)
