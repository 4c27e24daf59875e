"""A checkpoint that does not fit: refused before writing with the directory, the bytes needed and free; a
write that runs out of space midway says the same and leaves the previous checkpoint as the only one."""
import errno
import json
import os
from types import SimpleNamespace

import pytest
import torch

from terastack.training import checkpoint as manager
from terastack.training.checkpoint import JSONState, StreamedTensor, open_checkpoint, save_checkpoint


class Weights:
    def __init__(self, value: float):
        self.w = torch.full((256, 256), value)  # 256 KiB
        self.big = torch.full((1024,), value, dtype=torch.float64)

    def state_dict(self):
        return {"w": self.w, "big": StreamedTensor((1024,), lambda: iter([self.big[:512], self.big[512:]]),
                                                   dtype=torch.float64)}

    def load_state_dict(self, state):
        self.w, self.big = state["w"].read(), state["big"].read()


def _fake_statvfs(free: int):
    real = os.statvfs

    def statvfs(path):
        st = real(path)
        return SimpleNamespace(f_bavail=free // 4096, f_frsize=4096, f_bsize=4096, f_blocks=st.f_blocks,
                               f_bfree=free // 4096)
    return statvfs


def test_snapshot_bytes_counts_every_tensor_aligned():
    need = manager.snapshot_bytes({"a": Weights(1.0).state_dict(), "j": {"x": 1}})
    assert need == 256 * 256 * 4 + 8192 + manager.MANIFEST_ROOM  # 256 KiB, then 8 KiB aligned to 4 KiB


def test_a_checkpoint_that_does_not_fit_is_refused_before_writing(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    save_checkpoint(ck, {"weights": Weights(1.0)}, step=1)
    before = sorted(p.name for p in ck.iterdir())
    monkeypatch.setattr(os, "statvfs", _fake_statvfs(64 << 10))
    with pytest.raises(OSError) as info:
        save_checkpoint(ck, {"weights": Weights(2.0)}, step=2)
    msg = str(info.value)
    need = manager.snapshot_bytes({"weights": Weights(2.0).state_dict()})
    assert info.value.errno == errno.ENOSPC and len(msg.splitlines()) == 1
    assert str(ck) in msg and f"{need} bytes" in msg and f"{64 << 10} bytes" in msg and "free" in msg
    assert sorted(p.name for p in ck.iterdir()) == before  # nothing written, step 1 intact
    into = Weights(0.0)
    open_checkpoint(ck).load({"weights": into})
    assert torch.equal(into.w, Weights(1.0).w)
    # a fresh checkpoint directory that cannot hold its first snapshot is not left behind
    with pytest.raises(OSError, match="does not fit"):
        save_checkpoint(tmp_path / "fresh", {"weights": Weights(2.0)}, step=1)
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("where", ["data", "pointer"])
def test_running_out_of_space_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch, where):
    ck = tmp_path / "ck"
    save_checkpoint(ck, {"weights": Weights(1.0), "extra": JSONState({"a": 1})}, step=1)
    before = sorted(p.name for p in ck.iterdir())
    if where == "data":  # the second piece of the streamed tensor finds the disk full
        real = manager._write_tensor

        def write_tensor(f, offset, value, key):
            if key.endswith("/big"):
                f.write(b"x" * 100)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(f, offset, value, key)
        monkeypatch.setattr(manager, "_write_tensor", write_tensor)
    else:  # the snapshot is in place, the pointer cannot be written
        real = manager.atomic_write_json

        def atomic_write_json(path, obj):
            if path.name == manager.LATEST:
                path.with_name(f".{path.name}.tmp-{os.getpid()}").write_text("{")
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, obj)
        monkeypatch.setattr(manager, "atomic_write_json", atomic_write_json)
    with pytest.raises(OSError) as info:
        save_checkpoint(ck, {"weights": Weights(2.0), "extra": JSONState({"a": 2})}, step=2)
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and "No space left" not in msg
    assert str(ck) in msg and "bytes" in msg and "free" in msg and len(msg.splitlines()) == 1
    assert sorted(p.name for p in ck.iterdir()) == before  # no partial snapshot, no temporary files
    assert json.loads((ck / "LATEST").read_text())["step"] == 1
    into = Weights(0.0)
    open_checkpoint(ck).load({"weights": into, "extra": JSONState()})
    assert torch.equal(into.w, Weights(1.0).w) and torch.equal(into.big, Weights(1.0).big)
