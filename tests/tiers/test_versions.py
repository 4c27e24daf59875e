"""Pinned commits: their extents outlive later commits and rewrites, survive a reopen and a kill -9, and are freed
on release; a commit of some records moves only theirs."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from terastack.tiers import TieredStore
from terastack.tiers.layout import data_file_name

KiB = 1024


def open_store(root: str, **kw) -> TieredStore:
    kw.setdefault("device_budget", "1MiB")
    kw.setdefault("host_budget", "1MiB")
    return TieredStore(TieredStore.Config(root=root, **kw))


@pytest.fixture
def make(store_dirs):
    return lambda tmp_path, **kw: open_store(store_dirs(tmp_path), **kw)


def read_extent(store: TieredStore, ext, numel: int) -> torch.Tensor:
    """The float32 values at ``ext`` in the store's data file, read past the store (as a checkpoint reads)."""
    path = store.dirs[ext.dir] / data_file_name(ext.dir)
    with open(path, "rb") as f:
        f.seek(ext.offset)
        return torch.frombuffer(bytearray(f.read(numel * 4)), dtype=torch.float32)


def rewrite(store: TieredStore, name: str, value: float) -> None:
    store.get(name, "host").fill_(value)
    store.mark_dirty(name)
    store.evict(name).result()


@pytest.mark.parametrize("copy_on_write", [True, False])
def test_a_pinned_commit_outlives_rewrites_and_later_commits(tmp_path, make, copy_on_write):
    store = make(tmp_path, copy_on_write=copy_on_write)
    store.put("w", torch.full((1000,), 1.0)).result()
    store.put("v", torch.full((3000,), 2.0)).result()
    store.commit(pin=True)
    pinned = store.last_commit()
    assert pinned.generation == 1 and set(pinned.extents) == {"v", "w"}
    for value in (3.0, 4.0, 5.0):
        rewrite(store, "w", value)
        rewrite(store, "v", value)
        store.commit()  # unpinned commits come and go; the pinned one stays
    assert torch.equal(read_extent(store, pinned.extents["w"], 1000), torch.full((1000,), 1.0))
    assert torch.equal(read_extent(store, pinned.extents["v"], 3000), torch.full((3000,), 2.0))
    assert store.usage()["ssd"]["held"] == 4 * KiB + 12 * KiB  # one old version of each, no more
    store.release(pinned.generation)
    assert store.usage()["ssd"]["held"] == 0
    with pytest.raises(KeyError, match="not kept"):
        store.pinned_commit(pinned.generation)
    assert torch.equal(store.get("w", "host"), torch.full((1000,), 5.0))


def test_pinned_extents_survive_a_reopen_and_are_never_reused(tmp_path, make):
    store = make(tmp_path)
    store.put("w", torch.full((1000,), 1.0)).result()
    store.commit(pin=True)
    pinned, store_id = store.last_commit(), store.store_id
    rewrite(store, "w", 7.0)
    store.commit()
    store.close()

    reopened = make(tmp_path)
    assert reopened.store_id == store_id and reopened.last_commit().generation == 2
    assert reopened.pinned_commit(1).extents == pinned.extents
    assert torch.equal(reopened.get("w", "host"), torch.full((1000,), 7.0))
    for i in range(8):  # new records fill free space first: none may land on the pinned extent
        reopened.put(f"n{i}", torch.full((1000,), 9.0)).result()
    assert torch.equal(read_extent(reopened, pinned.extents["w"], 1000), torch.full((1000,), 1.0))
    reopened.release(1)
    reopened.close()
    again = make(tmp_path)
    with pytest.raises(KeyError):
        again.pinned_commit(1)
    assert again.usage()["ssd"]["held"] == 0


def test_a_store_never_pinned_writes_its_manifest_as_before(tmp_path, make):
    import json

    store = make(tmp_path)
    store.put("w", torch.ones(10)).result()
    store.commit()
    store.close()
    assert "versions" not in json.loads((store.root / "manifest.json").read_text())


def test_a_commit_of_some_records_moves_only_theirs(tmp_path, make):
    store = make(tmp_path)
    store.put("a", torch.full((1000,), 1.0)).result()
    store.put("b", torch.full((1000,), 1.0)).result()
    store.commit(pin=True)
    rewrite(store, "a", 2.0)
    rewrite(store, "b", 2.0)
    store.commit(["a"])
    assert store.usage()["ssd"]["held"] == 2 * 4 * KiB  # both old versions: the pinned commit names them
    store.release(1)
    assert store.usage()["ssd"]["held"] == 4 * KiB  # b's old version: the head still names it
    with pytest.raises(KeyError, match="no tensor"):
        store.commit(["nope"])
    store.close()
    reopened = make(tmp_path)
    assert torch.equal(reopened.get("a", "host"), torch.full((1000,), 2.0))
    assert torch.equal(reopened.get("b", "host"), torch.full((1000,), 1.0))


KILLED_WRITER = """
import sys, torch
sys.path.insert(0, {repo!r})
from terastack.tiers import TieredStore
store = TieredStore(TieredStore.Config(root={root!r}, device_budget="1MiB", host_budget="1MiB"))
names = [f"t{{i}}" for i in range(6)]
for n in names:
    store.put(n, torch.zeros(5000)).result()
store.commit(pin=True)
print("committed", 0, store.last_commit().generation, flush=True)
k = 0
while True:
    k += 1
    for n in names:
        store.get(n, "host").fill_(k)
        store.mark_dirty(n)
        store.evict(n).result()
    previous = store.last_commit().generation
    store.commit(pin=True)
    store.release(previous)
    print("committed", k, store.last_commit().generation, flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_kill_9_during_writes_and_commits_leaves_a_whole_pinned_commit(tmp_path, store_dirs, delay):
    """A writer killed with SIGKILL at any moment -- while rewriting records, or inside a commit -- leaves a
    store whose head and every pinned commit hold one step's values in every record."""
    root = store_dirs(tmp_path)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER.format(repo=repo, root=root)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(seen) < 3:
            line = proc.stdout.readline()
            assert line, "the writer ended before its third commit"
            seen.append(int(line.split()[1]))
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    store = open_store(root)
    head = store.last_commit()
    values = {float(store.get(n, "host")[0]) for n in store.names()}
    assert len(values) == 1 and values.pop() >= seen[-1]  # one step's values everywhere, none lost
    for n in store.names():
        got = store.get(n, "host")
        assert torch.equal(got, torch.full_like(got, got[0]))
    kept = store.pinned_generations()
    assert head.generation in kept and set(kept) <= {head.generation - 1, head.generation}
    for commit in map(store.pinned_commit, kept):
        vals = {float(read_extent(store, e, 5000)[0]) for e in commit.extents.values()}
        assert len(vals) == 1


def test_revert_returns_to_a_pinned_commit_and_releases_later_ones(tmp_path, make):
    """What a resume does after a crash between a later pinned commit and the checkpoint naming it."""
    store = make(tmp_path)
    store.put("w", torch.full((1000,), 1.0)).result()
    store.put("gone", torch.full((1000,), 1.0)).result()
    store.commit(pin=True)
    rewrite(store, "w", 2.0)
    store.delete("gone")
    store.put("new", torch.full((1000,), 3.0)).result()
    store.commit(pin=True)
    store.close()
    reopened = make(tmp_path)
    assert reopened.pinned_generations() == [1, 2] and sorted(reopened.names()) == ["new", "w"]
    with pytest.raises(ValueError, match="no longer describes"):
        reopened.revert(1)  # "gone" was deleted: its metadata is lost with it
    reopened.close()

    store = make(tmp_path)
    store.put("gone", torch.full((1000,), 1.0)).result()
    store.revert(2)  # back to commit 2: the record added since is dropped
    assert sorted(store.names()) == ["new", "w"]
    store.get("w", "host")
    with pytest.raises(RuntimeError, match="working copy"):
        store.revert(1)
    store.close()

    other = tmp_path / "other"
    other.mkdir()
    store = open_store(str(other / "s"))
    store.put("w", torch.full((1000,), 1.0)).result()
    store.commit(pin=True)
    rewrite(store, "w", 2.0)
    store.commit(pin=True)
    store.close()
    store = open_store(str(other / "s"))
    store.revert(1)
    assert store.pinned_generations() == [1] and store.last_commit().generation == 1
    assert torch.equal(store.get("w", "host"), torch.full((1000,), 1.0))
    assert store.usage()["ssd"]["held"] == 0  # commit 2's extent is free again
    rewrite(store, "w", 5.0)
    store.commit(pin=True)
    assert store.last_commit().generation == 3  # generations are never handed out twice
    store.close()
    assert torch.equal(open_store(str(other / "s")).get("w", "host"), torch.full((1000,), 5.0))
