"""The checkpoint manager composes Stateful components: each gets back what it saved, tensors checked."""
import json

import pytest
import torch

from terastack.training.checkpoint import (FORMAT, JSONState, StoredTensor, StreamedTensor, open_checkpoint,
                                           save_checkpoint)
from terastack.training.rng_state import RNGState


class Weights:
    """A component with a JSON field, a whole tensor and one streamed in pieces (as an SSD-resident one is)."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.scale = float(seed)
        self.w = torch.randn(3, 5, generator=g)
        self.big = torch.randn(10, generator=g, dtype=torch.float64)
        self.calls = 0

    def state_dict(self):
        def pieces():
            self.calls += 1
            return iter([self.big[:4], self.big[4:]])

        return {"scale": self.scale, "w": self.w, "big": StreamedTensor((10,), pieces)}

    def load_state_dict(self, state):
        assert isinstance(state["w"], StoredTensor) and state["big"].dtype == torch.float64
        self.scale, self.w, self.big = state["scale"], state["w"].read(), state["big"].read()


def test_components_get_back_what_they_saved(tmp_path):
    saved = Weights(1)
    snap_dir = save_checkpoint(tmp_path / "ck", {"weights": saved, "extra": JSONState({"note": [1, 2]})}, step=7)
    assert snap_dir.name == "step-00000007" and saved.calls == 1  # pieces produced while writing, once
    assert json.loads((tmp_path / "ck" / "LATEST").read_text()) == {"checkpoint": "step-00000007", "step": 7}
    into, extra = Weights(2), JSONState()
    snap = open_checkpoint(tmp_path / "ck")
    assert snap.step == 7 and sorted(snap.names) == ["extra", "weights"]
    assert snap.load({"weights": into, "extra": extra}) == ["weights", "extra"]
    assert into.scale == 1.0 and torch.equal(into.w, saved.w) and torch.equal(into.big, saved.big)
    assert extra.value == {"note": [1, 2]}
    with pytest.raises(ValueError, match="has no 'loop'"):
        snap.load({"loop": JSONState()})
    assert snap.load({"loop": JSONState(), "extra": JSONState()}, optional=["loop"]) == ["extra"]


def test_rng_state_round_trips(tmp_path):
    torch.manual_seed(3)
    save_checkpoint(tmp_path / "ck", {"rng": RNGState()}, step=1)
    expected = torch.rand(4)
    torch.manual_seed(99)
    open_checkpoint(tmp_path / "ck").load({"rng": RNGState()})
    assert torch.equal(torch.rand(4), expected)


def test_a_corrupt_tensor_names_its_file_and_key(tmp_path):
    snap_dir = save_checkpoint(tmp_path / "ck", {"weights": Weights(1)}, step=1)
    entry = json.loads((snap_dir / "checkpoint.json").read_text())["tensors"]["weights/w"]
    data = bytearray((snap_dir / "state.bin").read_bytes())
    data[entry["offset"] + 3] ^= 0xFF
    (snap_dir / "state.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"state.bin: weights/w fails its checksum"):
        open_checkpoint(tmp_path / "ck").load({"weights": Weights(2)})


def test_only_the_latest_snapshot_stays_and_pointers_cannot_escape(tmp_path):
    save_checkpoint(tmp_path / "ck", {"x": JSONState({"a": 1})}, step=1)
    (tmp_path / "ck" / ".tmp-step-00000005-1").mkdir()  # a writer killed mid-save
    save_checkpoint(tmp_path / "ck", {"x": JSONState({"a": 2})}, step=2)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["LATEST", "step-00000002"]
    (tmp_path / "ck" / "LATEST").write_text(json.dumps({"checkpoint": "../../etc"}))
    with pytest.raises(ValueError, match="escapes"):
        open_checkpoint(tmp_path / "ck")


def test_what_cannot_be_saved_or_read_is_refused(tmp_path):
    class Bad:
        def state_dict(self):
            return {"nested": {"t": torch.zeros(2)}}

        def load_state_dict(self, state):
            pass

    with pytest.raises(TypeError, match="bad.nested: not JSON"):
        save_checkpoint(tmp_path / "ck", {"bad": Bad()}, step=1)
    assert not (tmp_path / "ck").exists()  # nothing left, not even the directory the failed save made
    short = StreamedTensor((4,), lambda: iter([torch.zeros(3)]))
    with pytest.raises(ValueError, match="s/t: its pieces hold 12 bytes"):
        save_checkpoint(tmp_path / "ck", {"s": _Holder(short)}, step=1)
    snap_dir = save_checkpoint(tmp_path / "ck2", {"x": JSONState()}, step=1)
    manifest = json.loads((snap_dir / "checkpoint.json").read_text())
    (snap_dir / "checkpoint.json").write_text(json.dumps({**manifest, "format": "someone.else"}))
    with pytest.raises(ValueError, match="not a terastack checkpoint"):
        open_checkpoint(tmp_path / "ck2")
    # an engine's older format reads through its upgrade
    upgraded = open_checkpoint(tmp_path / "ck2", upgrades={"someone.else": lambda m, _: {**m, "format": FORMAT}})
    assert upgraded.names == ["x"]


class _Holder:
    def __init__(self, t):
        self.t = t

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        pass


class Referenced:
    """A component whose tensor already lies in a file of its own (as a store's pinned commit does): the snapshot
    refers to it, in two pieces, and the component hears when the snapshot is in place."""

    def __init__(self, path, values: torch.Tensor):
        self.path, self.values, self.saved = path, values, []
        raw = values.numpy().tobytes()
        path.write_bytes(b"\0" * 4096 + raw[:8] + b"\0" * (4096 - 8) + raw[8:])

    def state_dict(self):
        from terastack.training.checkpoint import ReferencedTensor

        n = self.values.numel() * 4
        return {"t": ReferencedTensor(tuple(self.values.shape), torch.float32,
                                      ((str(self.path), 4096, 8), (str(self.path), 8192, n - 8)))}

    def load_state_dict(self, state):
        self.values = state["t"].read()

    def checkpoint_saved(self, snapshot):
        self.saved.append(snapshot.name)


def test_a_referenced_tensor_is_not_copied_and_reads_back_from_its_file(tmp_path):
    values = torch.arange(6, dtype=torch.float32).view(2, 3)
    comp = Referenced(tmp_path / "store.bin", values)
    snap = save_checkpoint(tmp_path / "ckpt", {"c": comp}, step=1)
    assert comp.saved == ["step-00000001"] and (snap / "state.bin").stat().st_size == 0
    back = Referenced(tmp_path / "other.bin", torch.zeros(2, 3))
    open_checkpoint(tmp_path / "ckpt").load({"c": back})
    assert torch.equal(back.values, values)
    (tmp_path / "store.bin").write_bytes(b"\0" * 5000)
    with pytest.raises(ValueError, match="store.bin up to byte 8208, the file has 5000"):
        open_checkpoint(tmp_path / "ckpt")
    (tmp_path / "store.bin").unlink()
    with pytest.raises(FileNotFoundError, match="store.bin, which is missing"):
        open_checkpoint(tmp_path / "ckpt")
