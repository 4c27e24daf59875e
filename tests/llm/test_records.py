"""Record names: every kind built by terastack.llm.engine.records parses back to what built it."""
import pytest

from terastack.llm.engine import records


def test_every_kind_round_trips():
    name = "model.layers.0.self_attn.q_proj.weight"
    cases = {records.master(name): ("p", name, None), records.master(name, 2): ("p", name, 2),
             records.moment(name, 1, 0): ("m", name, 0), records.moment(name, 2, 5): ("v", name, 5),
             records.compute(name): ("w", name, None), records.spilled_grad(name, 1): ("g", name, 1),
             records.activation(3, 17): ("a", "3:17", None)}
    for record, expected in cases.items():
        assert records.parse(record) == expected
        assert records.kind(record) == expected[0]


@pytest.mark.parametrize("bad", ["", "x", "q:name", "p:"])
def test_foreign_names_are_refused(bad):
    with pytest.raises(ValueError, match="record name"):
        records.parse(bad)


def test_moment_which_is_checked():
    with pytest.raises(ValueError, match="which"):
        records.moment("w", 3, 0)
