"""The committed versions of a store's records: which extents each kept commit names, and when an old one is freed.

[Note: versions and commits]
A commit (``TieredStore.commit``) names one extent per record: the *head*, the state a reopened store sees.
Every commit has a number, its *generation*, counted from 1 in the store's life, and the store has an identity
(``store_id``, made when it is created) so that whoever refers to one of its commits from outside -- a
checkpoint beside the store -- can tell this store from another at the same path.

A commit may be *pinned* (``commit(pin=True)``): its extents stay allocated after later commits, until
``release(generation)``, and the manifest lists them (``versions.pinned``), so a store reopened after a crash
keeps them too. A write never overwrites an extent a pinned commit names, whatever ``copy_on_write`` says (with
``copy_on_write`` the head's extents are not overwritten either: [Note: crash consistency] in
terastack.tiers.layout). An extent a record moved off (rewritten elsewhere, deleted) is *held* while a commit
names it and freed by the commit or release after which none does.

The bytes held beyond the live records are therefore those rewritten since the oldest commit still kept: a
pinned commit costs nothing until its records are rewritten, and at most one more copy of what is rewritten.

A commit of some records only (``commit(names)``) moves those records' head forward and leaves the others'
where the last commit put them: the old versions of those records are released early, and the caller --
who knows which mixed states it can resume from -- decides what such a commit means.

A store never pinned writes the manifest it always has (no ``versions`` block): nothing outside refers to it.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from terastack.tiers.extents import Extent


@dataclass(frozen=True, slots=True)
class Commit:
    """One commit of a store: its identity, its generation and the extent of every record it names."""

    store_id: str
    generation: int
    extents: Mapping[str, Extent] = field(repr=False)


class Versions:
    """The head commit, the pinned commits and the extents held for them. Not thread-safe: the store calls it
    under its lock."""

    def __init__(self, *, store_id: str | None = None, generation: int = 0,
                 head: Mapping[str, Extent] | None = None, pinned: Mapping[int, Mapping[str, Extent]] | None = None,
                 head_generation: int | None = None):
        self.store_id = store_id or uuid.uuid4().hex
        #: the last generation handed out (never handed out again, also after a revert)
        self.generation = generation
        #: the generation of the head: the last commit's, or the one reverted to
        self.head_generation = generation if head_generation is None else head_generation
        self.head: dict[str, Extent] = dict(head or {})
        self.pinned: dict[int, dict[str, Extent]] = {g: dict(m) for g, m in (pinned or {}).items()}
        #: the manifest carries a versions block once a commit was pinned (or a reopened one had one)
        self.tracked = bool(self.pinned) or store_id is not None
        self._pinned_refs: set[Extent] = set()
        self._refs: set[Extent] = set()
        self._recount()
        # on reopening, the pinned extents no record lives in are held (the live records are the head's)
        self._held: set[Extent] = self._refs - set(self.head.values())

    # -------------------------------------------------------------- queries
    def named(self, extent: Extent) -> bool:
        """Some kept commit (the head or a pinned one) names ``extent``."""
        return extent in self._refs

    def pinned_extent(self, extent: Extent) -> bool:
        """A pinned commit names ``extent``: it must never be overwritten."""
        return extent in self._pinned_refs

    def commit(self, generation: int | None = None) -> Commit:
        """The head (``generation`` None) or a pinned commit."""
        if generation is None or generation == self.head_generation:
            return Commit(self.store_id, self.head_generation, dict(self.head))
        if generation not in self.pinned:
            raise KeyError(f"commit {generation} of store {self.store_id} is not kept (kept: "
                           f"{', '.join(map(str, sorted({self.head_generation, *self.pinned})))})")
        return Commit(self.store_id, generation, dict(self.pinned[generation]))

    def held_bytes(self) -> int:
        """Bytes of extents kept only for a commit (no record lives in them)."""
        return sum(e.capacity for e in self._held)

    # -------------------------------------------------------------- changes
    def moved_off(self, extent: Extent) -> bool:
        """A record left ``extent`` (rewritten elsewhere, or deleted): True when it may be freed now, False when
        a commit names it (it is held, and freed by the commit or release after which none does)."""
        if extent in self._refs:
            self._held.add(extent)
            return False
        return True

    def advance(self, head: Mapping[str, Extent], *, pin: bool) -> list[Extent]:
        """A new head commit (its generation the next); returns the held extents no commit names any more."""
        self.generation += 1
        self.head_generation = self.generation
        self.head = dict(head)
        if pin:
            self.pinned[self.generation] = dict(head)
            self.tracked = True
        return self._sweep()

    def release(self, generation: int) -> list[Extent]:
        """Unpin commit ``generation``; returns the held extents no commit names any more."""
        if self.pinned.pop(generation, None) is None:
            raise KeyError(f"commit {generation} of store {self.store_id} is not pinned")
        return self._sweep()

    def revert(self, generation: int) -> list[Extent]:
        """Pinned commit ``generation`` is the head again; later pinned commits are released. Returns the held
        extents no commit names any more (the records already live in ``generation``'s extents)."""
        self.head = dict(self.commit(generation).extents)
        self.head_generation = generation
        self._held -= set(self.head.values())  # records live in them again
        for g in [g for g in self.pinned if g > generation]:
            del self.pinned[g]
        return self._sweep()

    def _recount(self) -> None:
        self._pinned_refs = {e for m in self.pinned.values() for e in m.values()}
        self._refs = self._pinned_refs | set(self.head.values())

    def _sweep(self) -> list[Extent]:
        self._recount()
        free = self._held - self._refs
        self._held -= free
        return sorted(free, key=lambda e: (e.dir, e.offset))

    # -------------------------------------------------------------- manifest
    def to_manifest(self) -> dict | None:
        """The manifest's ``versions`` block (None for a store never pinned: [Note: versions and commits])."""
        return self._block(self.generation, self.head_generation, self.pinned) if self.tracked else None

    def next_manifest(self, head: Mapping[str, Extent], *, pin: bool) -> dict | None:
        """The ``versions`` block after :meth:`advance` with the same arguments (written before it happens)."""
        if not (self.tracked or pin):
            return None
        g = self.generation + 1
        return self._block(g, g, {**self.pinned, g: head} if pin else self.pinned)

    def _block(self, generation: int, head: int, pinned: Mapping[int, Mapping[str, Extent]]) -> dict:
        return {"store_id": self.store_id, "generation": generation, "head": head,
                "pinned": {str(g): {name: [e.dir, e.offset, e.capacity] for name, e in m.items()}
                           for g, m in sorted(pinned.items())}}

    @classmethod
    def from_manifest(cls, block: dict | None, head: Mapping[str, Extent]) -> "Versions":
        """The versions of a reopened store: ``block`` as :meth:`to_manifest` wrote it (None: a store never
        pinned, whose head is generation 0 of a new identity)."""
        if block is None:
            return cls(head=head)
        try:
            pinned = {int(g): {name: Extent(int(e[1]), int(e[2]), int(e[0])) for name, e in m.items()}
                      for g, m in block.get("pinned", {}).items()}
            return cls(store_id=str(block["store_id"]), generation=int(block["generation"]), head=head,
                       pinned=pinned, head_generation=int(block.get("head", block["generation"])))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"its versions block is malformed ({exc!r})") from None
