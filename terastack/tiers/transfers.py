"""The transfers of a :class:`~terastack.tiers.store.TieredStore` record: a working copy written out, copied
between the host and device tiers, dropped; each transfer's completion updating the record's state before its
caller is told ([Note: record states] in terastack.tiers.record).

:class:`StoreTransfers` is the half of the store that starts and completes one record's transfer; the store's
public operations decide which transfer a record needs. Every method runs under the store's lock (completions
take it themselves).
"""
from __future__ import annotations

import contextvars

from terastack.io import completed
from terastack.io.cuda import event_future
from terastack.io.staged import staged_transfer
from terastack.io.futures import Future
from terastack.io.requests import OP_WRITE
from terastack.tiers.record import State, TensorRecord, Tier


class StoreTransfers:
    """One record's transfers and their completions, for :class:`~terastack.tiers.store.TieredStore` (which
    provides ``_lock``, ``_records``, ``_layout``, ``_versions``, ``pool``, ``pinned``, ``device``, ``config``
    and ``traffic``)."""

    def _write_out(self, rec: TensorRecord, *, drop: bool = False) -> Future:
        """Write the working copy to SSD (a fresh extent if the current one is committed); with ``drop``, the
        working copy is freed as the write completes ([Note: a write-back drops its copy as it lands])."""
        self._claim_extent(rec)
        source = rec.buffer
        file = self._layout.file(rec.extent)
        if source.device.type == "cuda":
            # staged through pinned chunks on a side stream ([Note: stream order of staged transfers])
            fut = staged_transfer(file, OP_WRITE, source, rec.extent.offset, rec.padded, staging=self.pinned)
        else:
            fut = file.pwrite(source, rec.extent.offset, rec.padded)
        self._count(rec, "write", rec.padded)
        rec.state, rec.dirty = State.INFLIGHT_OUT, False
        return self._track(fut, self._written(rec, drop=drop), rec)

    def _count(self, rec: TensorRecord, op: str, nbytes: int) -> None:
        if self.traffic is not None:
            self.traffic(rec.name, op, nbytes)

    def _claim_extent(self, rec: TensorRecord) -> None:
        """Give ``rec`` an extent to write to: its own, or a fresh one (placed anew) if a pinned commit names the
        current one, or with ``copy_on_write`` the last commit ([Note: versions and commits])."""
        ext = rec.extent
        if ext is None or self._versions.pinned_extent(ext) or (self.config.copy_on_write
                                                                and self._versions.named(ext)):
            if ext is not None and self._versions.moved_off(ext):
                self._layout.free(ext)
            rec.extent = self._layout.alloc(rec.padded)

    def _written(self, rec: TensorRecord, *, drop: bool = False):
        """The completion of a write of ``rec``: on disk (with ``drop``, its working copy freed), or resident and
        still dirty if the write failed.

        [Note: a write-back drops its copy as it lands]
        An eviction's write and the freeing of the working copy are one transition, under the lock: a record goes
        from INFLIGHT_OUT to ON_SSD, never through RESIDENT. Were the copy freed by a callback after the write's,
        a prefetch between the two would find the record resident and be served from memory -- whether it was
        depended on the disk's pace, and so did the bytes a step reads, which the planner predicts."""
        def written(done: Future) -> None:
            with self._lock:
                rec.future = None
                if done.exception() is not None:
                    rec.state, rec.dirty = State.RESIDENT, True
                    return
                rec.on_disk = True
                if drop:
                    if rec.buffer is not None:
                        self.pool.free(rec.tier, rec.buffer)
                    rec.rest_on_ssd()
                else:
                    rec.state = State.RESIDENT
        return written

    def _persist_resident(self, rec: TensorRecord) -> Future:
        """Host- and device-home tensors get an SSD copy at commit so the manifest covers them. Call under the
        lock; wait for the future outside it."""
        if rec.home is Tier.HOST and rec.tier is Tier.DEVICE and rec.dirty:
            rec.home_buffer.copy_(rec.buffer)
        if not (rec.dirty or not rec.on_disk):
            return completed(None)
        saved_buffer = rec.buffer
        if rec.home is Tier.HOST:
            rec.buffer = rec.home_buffer  # the write reads the resting copy; the working copy stays
        try:
            return self._write_out(rec)
        finally:
            rec.buffer = saved_buffer

    def _drop_working_copy(self, name: str) -> None:
        with self._lock:
            rec = self._records[name]
            if rec.buffer is not None:
                self.pool.free(rec.tier, rec.buffer)
            rec.rest_on_ssd()

    def _move_resident(self, rec: TensorRecord, tier: Tier) -> Future:
        """Copy a resident working copy between host and device (the old one freed unless home): its future."""
        what, src = f"move of {rec.name!r} to {tier.value}", rec.buffer
        if self.device.type != "cuda" and rec.home_buffer is None:
            # [Note: tiers without an accelerator] both tiers are host memory: the working copy changes
            # ledgers, not places (no copy, no second buffer).
            self.pool.move(src, rec.tier, tier, what=what)
            rec.tier = tier
            return completed(rec.view())
        # on a GPU: [Note: copies between the host and device tiers] in terastack.io.cuda (host buffers pinned,
        # copies on side streams, no buffer read or reused before the copy's event has fired)
        done = None
        if self.device.type != "cuda":
            raw = self.pool.alloc(tier, rec.padded, what=what)
            raw.copy_(src)
        elif tier is Tier.DEVICE:
            raw = self.pool.upload(src, rec.padded, what=what)  # the caller's stream waits on the upload
        else:
            raw, done = self.pool.download(src, rec.padded, what=what)
        if src is not rec.home_buffer:
            self.pool.free(rec.tier, src)
        if done is None:
            rec.switch_buffer(raw, tier)
            return completed(rec.view())
        dirty = rec.dirty
        rec.start_read(raw, tier)
        rec.dirty = dirty  # the bytes move, their state does not

        def moved(_done: Future) -> None:
            with self._lock:
                rec.future, rec.state = None, State.RESIDENT  # a failed copy is reported through the future
        # the caller (the optimizer thread, a write to the SSD) gets the host copy once the download has landed
        return self._track(event_future(done), moved, rec, result=lambda: rec.view(raw))

    def _after(self, rec: TensorRecord, then) -> Future:
        """Run ``then()`` once the record's in-flight transfer finishes; forward its future's outcome. ``then``
        runs in the caller's context (its context variables), though on the thread that completes the transfer:
        what the caller's context says of a request (the ``traffic`` callback's labels) holds for the request
        chained."""
        out = Future()
        context = contextvars.copy_context()

        def chain(_) -> None:
            try:
                inner = context.run(then)
                inner.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception()
                                        else out.set_result(f.result()))
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(exc)
        rec.future.add_done_callback(chain)
        return out

    def _track(self, fut: Future, on_done, rec: TensorRecord, result=None) -> Future:
        """The record's public future: state updated by ``on_done`` first, then the caller is told."""
        out = Future()
        rec.future = out

        def finish(done: Future) -> None:
            on_done(done)
            exc = done.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(result() if result else None)
        fut.add_done_callback(finish)
        return out
