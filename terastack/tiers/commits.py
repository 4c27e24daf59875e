"""The commits of a :class:`~terastack.tiers.store.TieredStore`: what makes its tensors durable, atomically, and
keeps or releases earlier states ([Note: versions and commits] in terastack.tiers.versions, [Note: crash
consistency] in terastack.tiers.layout).

:class:`StoreCommits` is the store's persistence, kept apart from its movement of tensors between tiers: it works
on the store's records, layout and versions under the store's lock, and on nothing else.
"""
from __future__ import annotations

from pathlib import Path

from terastack.tiers.record import State, Tier
from terastack.tiers.versions import Commit


class StoreCommits:
    """Commit, revert, pin and release: the persistence half of :class:`~terastack.tiers.store.TieredStore`
    (which provides ``_lock``, ``_records``, ``_layout``, ``_versions``, ``writeback``, ``wait``, ``delete``,
    ``_record`` and ``_persist_resident``)."""

    def commit(self, names=None, *, pin: bool = False) -> Path:
        """Write back everything modified, make it durable and record it in the manifest (atomically); the
        manifest's path. See [Note: crash consistency] in terastack.tiers.layout.

        ``names``: commit these records only (waiting for their writes alone); the others stay as the last commit
        named them (records deleted since leave it). ``pin``: keep this commit's extents until :meth:`release` of
        its generation (:meth:`last_commit`), however many commits follow ([Note: versions and commits])."""
        with self._lock:
            whole, names = names is None, list(self._records) if names is None else list(names)
            for name in names:
                self._record(name)
        for name in names:
            with self._lock:
                rec = self._record(name)
                resident = rec.home is not Tier.SSD and rec.state is State.RESIDENT
                written = self._persist_resident(rec) if resident else self.writeback(name)
            written.result()  # outside the lock: the write's completion takes it
        if whole:
            self.wait()
        with self._lock:
            self._layout.sync()
            head = {n: e for n, e in self._versions.head.items() if n in self._records}
            head.update((name, self._records[name].extent) for name in names)
            # the manifest goes first: until it is in place, a crash leaves the previous commit and its extents
            path = self._layout.save(self._records, head, self._versions.next_manifest(head, pin=pin))
            for ext in self._versions.advance(head, pin=pin):  # extents no kept commit names any more
                self._layout.free(ext)
            return path

    def rehome(self, name: str, home: Tier | str) -> None:
        """Let ``name``, at rest on the SSD (as every record is when a store is opened), rest in ``home`` from now
        on; nothing is copied (a resumed plan placing it in another tier than the run that committed it)."""
        home = Tier(home)
        with self._lock:
            rec = self._record(name)
            if rec.state is not State.ON_SSD or not rec.on_disk:
                raise ValueError(f"rehome {name!r}: only a record at rest on the SSD changes its home (it is "
                                 f"{rec.state.value})")
            rec.home = home

    def last_commit(self) -> Commit:
        """The last commit: the store's identity, its generation and the extent of every record it names."""
        with self._lock:
            return self._versions.commit()

    def pinned_commit(self, generation: int) -> Commit:
        """Pinned commit ``generation`` (KeyError if it is not kept)."""
        with self._lock:
            return self._versions.commit(generation)

    def revert(self, generation: int) -> None:
        """Make pinned commit ``generation`` the store's state again: every record as it names it (records it
        does not name are dropped), later pinned commits released, and the manifest says so. For a store just
        opened (no working copy): a resume from a checkpoint written beside the store, after a crash between a
        later commit and the checkpoint that would have named it."""
        with self._lock:
            commit = self._versions.commit(generation)
            busy = [n for n, r in self._records.items() if r.buffer is not None or r.future is not None]
            if busy:
                raise RuntimeError(f"revert: {busy[0]!r} has a working copy; revert a store just opened")
            missing = sorted(set(commit.extents) - set(self._records))
            if missing:
                raise ValueError(f"revert: commit {generation} names {missing[0]!r}, which the store no longer "
                                 "describes")
            for name in [n for n in self._records if n not in commit.extents]:
                self.delete(name)
            for name, ext in commit.extents.items():
                rec = self._records[name]
                if rec.extent != ext and self._versions.moved_off(rec.extent):
                    self._layout.free(rec.extent)
                rec.extent, rec.on_disk = ext, True
            free = self._versions.revert(generation)
            self._layout.save(self._records, self._versions.head, self._versions.to_manifest())
            for ext in free:
                self._layout.free(ext)

    def pinned_generations(self) -> list[int]:
        """The generations of the pinned commits, oldest first."""
        with self._lock:
            return sorted(self._versions.pinned)

    def release(self, generation: int) -> None:
        """Unpin commit ``generation``: its extents that no kept commit or record uses are freed, and the
        manifest says so (a store reopened after a crash before this keeps them)."""
        with self._lock:
            free = self._versions.release(generation)
            self._layout.save(self._records, self._versions.head, self._versions.to_manifest())
            for ext in free:
                self._layout.free(ext)

    @property
    def store_id(self) -> str:
        """This store's identity, made when it was created and kept in its manifest once a commit is pinned."""
        return self._versions.store_id
