"""Fanouts: how many in-neighbours each hop samples, parsed one way for both graph kinds.

A homogeneous graph is the one-relation case: ``"15,10"`` there is the list of its single relation. A
fanout is a positive integer, ``-1`` (every neighbour) or ``0`` (the relation samples nothing at that
hop); every hop needs at least one relation that samples, so ``0`` only has a use on a graph with
several relations. Text is read strictly: an empty item (``"5,,5"``), a sign on anything but ``-1``,
or a number that is not an integer is an error naming the item, never silently dropped.
"""
from __future__ import annotations

import argparse
import numbers
import re

from terastack.gnn.storage.manifest import HOMOGENEOUS_RELATION, EdgeType

#: a fanout of -1 ("every neighbour") counts as this many draws wherever a list's saving is estimated
ALL_NEIGHBOURS_DRAWS = 1 << 20

_ALLOWED = "a positive integer, -1 (every neighbour) or 0 (none from this relation)"


def fanout_list(values, name: str = "") -> tuple[int, ...]:
    """``"15,10"`` or ``(15, 10)`` -> ``(15, 10)``; raises ValueError (``fanouts: ...``) naming the bad item."""
    where = f"{name}: " if name else ""
    if isinstance(values, str):
        items = values.split(",")
        if any(not item.strip() for item in items):
            raise ValueError(f"fanouts: {where}an empty hop in {values!r}; expected comma-separated integers "
                             "such as 15,10")
        parsed = []
        for item in items:
            if not re.fullmatch(r"\s*-?\d+\s*", item):
                raise ValueError(f"fanouts: {where}{item.strip()!r} in {values!r} is not an integer; each fanout is "
                                 f"{_ALLOWED}")
            parsed.append(int(item))
        values = parsed
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"fanouts: {where}expected a list of integers such as 15,10; got {values!r}") from None
    if not values:
        raise ValueError(f"fanouts: {where}at least one hop is required")
    for hop, v in enumerate(values, 1):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < -1:
            raise ValueError(f"fanouts: {where}hop {hop} has fanout {v!r}; each fanout is {_ALLOWED}")
    return tuple(int(v) for v in values)


def parse_relation_fanouts(spec, edge_types: list[EdgeType]) -> dict[EdgeType, tuple[int, ...]]:
    """Per-relation fanouts from one list for all (``"15,10"``, ``(15, 10)``) or per relation.

    Per relation: a dict keyed by edge type tuples or names, or text ``"cites=15,10;writes=10,5;*=5,5"``,
    where a name is ``src___rel___dst`` or a relation name that is unique, and ``*`` covers the rest.
    Every list has the same number of hops, and at every hop some relation samples.
    """
    if isinstance(spec, str) and "=" in spec:
        spec = parse_fanout_spec(spec)
    if not isinstance(spec, dict):
        hops = fanout_list(spec)
        out = {et: hops for et in edge_types}
    else:
        out = _by_relation(spec, edge_types)
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        raise ValueError("fanouts: every relation needs the same number of hops; got "
                         + ", ".join(f"{'___'.join(k)}={list(v)}" for k, v in out.items()))
    for hop in range(lengths.pop() if lengths else 0):
        if all(v[hop] == 0 for v in out.values()):
            raise ValueError(f"fanouts: hop {hop + 1} samples no neighbours ({_ALLOWED}, and at each hop at least "
                             f"one relation must sample); got {_show(out)}")
    return out


def _by_relation(spec: dict, edge_types: list[EdgeType]) -> dict[EdgeType, tuple[int, ...]]:
    by_name: dict[str, list[EdgeType]] = {}
    for et in edge_types:
        by_name.setdefault(et[1], []).append(et)
        by_name["___".join(et)] = [et]
    out: dict[EdgeType, tuple[int, ...]] = {}
    for key, values in spec.items():
        if key == "*":
            continue
        matches = [tuple(key)] if isinstance(key, tuple) else by_name.get(key, [])
        if len(matches) != 1 or matches[0] not in edge_types:
            raise ValueError(f"fanouts: {key!r} names no single relation of the dataset (relations: "
                             f"{', '.join('___'.join(et) for et in edge_types)})")
        out[matches[0]] = fanout_list(values, str(key) if not isinstance(key, tuple) else "___".join(key))
    for et in edge_types:
        if et not in out:
            if "*" not in spec:
                raise ValueError(f"fanouts: no fanouts for relation {'___'.join(et)} (give it, or '*' for the rest)")
            out[et] = fanout_list(spec["*"], "*")
    return out


def _show(out: dict) -> str:
    if len(out) == 1:
        return ",".join(map(str, next(iter(out.values()))))
    return "; ".join(f"{'___'.join(k)}={','.join(map(str, v))}" for k, v in out.items())


def parse_fanouts(spec) -> tuple[int, ...]:
    """A homogeneous graph's fanouts (its one relation): ``"15,10"`` -> ``(15, 10)``; ``-1`` takes every
    neighbour. Raises ValueError naming the field on anything else (a per-relation spec included)."""
    if isinstance(spec, dict) or (isinstance(spec, str) and "=" in spec):
        raise ValueError(f"fanouts: per-relation fanouts ({spec!r}) need a heterogeneous dataset; a homogeneous "
                         "graph takes one list such as 15,10")
    return parse_relation_fanouts(spec, [HOMOGENEOUS_RELATION])[HOMOGENEOUS_RELATION]


def largest_draw(fanouts) -> int:
    """The most neighbours one hop draws per node (-1, every neighbour, counts as ALL_NEIGHBOURS_DRAWS)."""
    return max((ALL_NEIGHBOURS_DRAWS if f < 0 else f) for f in fanouts)


def parse_fanout_spec(spec):
    """The fanouts setting read before the dataset is open: one list (``"15,10"`` -> ``(15, 10)``, checked as
    fully as the one-relation case) or per relation (text or dict -> ``{name: (15, 10), ...}``, each list
    checked; which relations exist is checked by :func:`parse_relation_fanouts` once the dataset is open)."""
    if isinstance(spec, str) and "=" in spec:
        items = {}
        for part in spec.split(";"):
            if part.strip():
                name, _, values = part.partition("=")
                items[name.strip()] = fanout_list(values, name.strip())
        if not items:
            raise ValueError(f"fanouts: expected name=list items such as cites=15,10;*=5,5; got {spec!r}")
        return items
    if isinstance(spec, dict):
        return {key: fanout_list(values, key if isinstance(key, str) else "___".join(key))
                for key, values in spec.items()}
    return parse_fanouts(spec)


def accept_negative_lists(parser: argparse.ArgumentParser) -> None:
    """Let ``parser`` read an argument such as ``-1,5`` as a value rather than an unknown option.

    [Note: negative fanout lists on the command line]
    argparse takes any argument that starts with ``-`` and is not a plain negative number (``-1``,
    ``-2.5``) for an option, so ``--fanouts -1,5`` failed with "expected one argument" while
    ``--fanouts=-1,5`` parsed. The parser's negative-number pattern is widened to anything starting with
    ``-`` and a digit; no terastack option starts with a digit, so no option is lost.
    """
    parser._negative_number_matcher = re.compile(r"^-\d")
