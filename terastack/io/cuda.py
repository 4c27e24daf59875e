"""Device tensors: staged through reusable pinned host buffers, copied on a side stream.

Only used when CUDA is present. A read lands chunk by chunk in pinned bounce
buffers, and each chunk's non-blocking host-to-device copy runs on a side
stream so the compute stream is not serialized behind it; the future completes
once every chunk's copy event has fired. A write copies device-to-host on the
side stream, chunk by chunk, and writes each bounce buffer.

[Note: stream order of staged transfers]
PyTorch's caching allocator hands a block back out as soon as the CPU frees it,
to the next allocation *on the same stream*: the kernels that used it may still
be queued. Work on that stream is ordered after them; work on our side stream is
not. So:

- a read records an event on the submitting thread's current stream (the
  stream its destination was allocated on) at submission, and the side stream
  waits on that event before copying into the destination: the copy cannot
  overwrite weights or activations that queued kernels still read;
- a write makes the side stream wait for the current stream before copying out
  (the tensor's values are those the queued kernels produce);
- the destination/source records the side stream (``record_stream``), so when
  its owner frees it before our copy ran, the allocator does not reuse the block
  until the side stream has passed that point.

[Note: pinned staging]
Pinned memory is page-locked host memory, and PyTorch's pinned allocator rounds
each request up to a power of two and caches the block: pinning per request
would hold up to twice the bytes, for as long as the process lives. Staging uses
a fixed number of power-of-two chunks (:class:`PinnedStaging`), allocated once
and reused, their bytes reserved in the host ledger when one is given; a record
larger than the cap is staged chunk by chunk, so any record can move through
any cap of at least one chunk, and concurrent transfers wait for a free chunk
instead of failing.

The completion of a chunk is waited on by a waiter thread per direction (reads
never queue behind writes that wait on compute), and an error there fails the
transfer's future instead of leaving its caller waiting.

[Note: copies between the host and device tiers]
A copy between pageable host memory and the device is synchronous whatever
``non_blocking`` says (the driver stages it through its own pinned buffer), and
at a fraction of pinned bandwidth. So a store on a GPU page-locks its host-tier
buffers (:func:`pinned_host_empty`: registered with ``cudaHostRegister``, page
for page, so the pinned bytes are the host tier's own bytes, not a rounded-up
copy beside them), and moves working copies between the tiers on two side
streams per device, one per direction, so uploads never queue behind downloads
that wait on compute:

- host to device (:func:`to_device`): the destination is allocated *on the
  upload stream*, so the caching allocator only hands it a block whose earlier
  uses are ordered before the copy on that stream, or whose recorded streams
  have passed the point where it was freed; the copy runs ``non_blocking`` and
  records an event; the consumer (the calling thread's current stream) waits
  on that event (``wait_event``: a GPU-side wait, the CPU goes on), and the
  destination records the consumer stream (``record_stream``), so the block is
  not reused for another upload before the kernels reading it have run. The
  source must not be written or reused until the event has fired: the event is
  the source's fence (the store's pool holds it and waits on it before the
  buffer is handed out again);
- device to host (:func:`to_host`): the download stream waits for the
  consumer (the values are those its queued kernels produce), copies into a
  pinned buffer and records an event; the source records the download stream
  (its owner may free it at once). Nothing may read the host copy before the
  event has fired: the caller gets the event (or a future completed once it
  has, :func:`event_future`) and whoever reads the host copy on the CPU -- the
  optimizer thread, the write to the SSD -- waits on it first.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from terastack.errors import BudgetError
from terastack.io.buffers import anonymous_map
from terastack.io.futures import Future

#: the largest staging chunk: big enough for full PCIe bandwidth, small enough that several are in flight
MAX_CHUNK = 64 << 20
#: the smallest: whole O_DIRECT blocks
MIN_CHUNK = 4096
#: the cap of the staging shared by transfers that bring none of their own
DEFAULT_CAP = 256 << 20

_streams: dict = {}
_lock = threading.Lock()
_default_staging: "PinnedStaging | None" = None
# copies between the tiers (to_host's events): never queued behind a staged transfer's chunks
_copy_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-copy-events")
#: the side streams' directions: host to device, device to host
UP, DOWN = "up", "down"


def floor_pow2(n: int) -> int:
    """The largest power of two <= ``n`` (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


def staging_chunk(cap: int) -> int:
    """The chunk a staging cap of ``cap`` bytes is cut into: a power of two, at most :data:`MAX_CHUNK`, and at
    least two chunks when the cap allows (a chunk's copy overlaps the next chunk's read)."""
    if cap < MIN_CHUNK:
        raise ValueError(f"pinned_budget: at least {MIN_CHUNK} bytes (one staging chunk); got {cap}")
    return max(MIN_CHUNK, min(MAX_CHUNK, floor_pow2(cap // 2 if cap >= 2 * MIN_CHUNK else cap)))


class PinnedStaging:
    """At most ``cap`` bytes of reusable bounce buffers of ``chunk`` bytes each ([Note: pinned staging]).

    ``pin``: page-locked (CUDA) or plain aligned host memory (tests). ``ledger``: a BudgetLedger (the host
    tier's) that each buffer's bytes are reserved in when it is first allocated and released by :meth:`close`.
    """

    def __init__(self, cap: int, *, chunk: int | None = None, pin: bool = True, ledger=None):
        chunk = staging_chunk(cap) if chunk is None else int(chunk)
        if chunk < MIN_CHUNK or chunk & (chunk - 1) or chunk > cap:
            raise ValueError(f"chunk: a power of two in [{MIN_CHUNK}, cap={cap}]; got {chunk}")
        self.cap, self.chunk, self.count = int(cap), chunk, int(cap) // chunk
        self.pin = pin
        self.ledger = ledger
        self._cond = threading.Condition()
        self._idle: list = []
        self._allocated = 0
        self.used = 0
        self.peak = 0

    def acquire(self, timeout: float | None = None):
        """A free chunk buffer (uint8 tensor of ``chunk`` bytes); waits for one when all are in use."""
        with self._cond:
            while True:
                if self._idle:
                    buf = self._idle.pop()
                    break
                if self._allocated < self.count:
                    buf = self._allocate()
                    if buf is not None:
                        break
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"pinned staging: no chunk free within {timeout} s "
                                       f"(all {self._allocated} chunks of {self.chunk} bytes in use)")
            self.used += self.chunk
            self.peak = max(self.peak, self.used)
            return buf

    def _allocate(self):
        """A new chunk buffer (lock held), or None when the ledger has no room but a buffer will come back."""
        if self.ledger is not None:
            try:
                self.ledger.reserve(self.chunk, what="pinned staging chunk")
            except BudgetError:
                if self._allocated:
                    return None  # wait for one of ours
                raise
        try:
            if self.pin:
                import torch

                buf = torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True)
            else:
                import torch

                from terastack.io.buffers import aligned_empty

                buf = aligned_empty(self.chunk, torch.uint8, as_tensor=True)
        except BaseException:
            if self.ledger is not None:
                self.ledger.release(self.chunk)
            raise
        self._allocated += 1
        return buf

    def release(self, buf) -> None:
        with self._cond:
            self.used -= self.chunk
            self._idle.append(buf)
            self._cond.notify()

    @property
    def allocated_bytes(self) -> int:
        with self._cond:
            return self._allocated * self.chunk

    def snapshot(self) -> dict:
        with self._cond:
            return {"limit": self.cap, "used": self.used, "peak": self.peak, "chunk": self.chunk,
                    "allocated": self._allocated * self.chunk}

    def reset_peak(self) -> None:
        with self._cond:
            self.peak = self.used

    def close(self) -> None:
        """Drop the idle buffers and give their bytes back to the ledger (buffers in use are dropped as they
        come back: call once no transfer is in flight)."""
        with self._cond:
            n = len(self._idle)
            self._idle.clear()
            self._allocated -= n
            if self.ledger is not None and n:
                self.ledger.release(n * self.chunk)


def default_staging() -> PinnedStaging:
    """The staging of transfers that bring none of their own (:data:`DEFAULT_CAP`, no ledger)."""
    global _default_staging
    with _lock:
        if _default_staging is None:
            _default_staging = PinnedStaging(DEFAULT_CAP)
        return _default_staging


def side_stream(device, direction: str = UP):
    """The side stream of ``device`` for copies in ``direction`` (:data:`UP` or :data:`DOWN`): one per direction,
    so an upload never waits in stream order behind a download that waits on compute."""
    import torch

    key = (torch.device(device), direction)
    with _lock:
        stream = _streams.get(key)
        if stream is None:
            stream = _streams[key] = torch.cuda.Stream(device=key[0])
        return stream


# ------------------------------------------------------------------ pinned host buffers
def host_register(address: int, nbytes: int) -> bool:
    """Page-lock ``nbytes`` of host memory at ``address`` for every device (``cudaHostRegisterPortable``)."""
    import torch

    return int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 1)) == 0


def host_unregister(address: int) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(address)


class _PinnedRegion:
    """One anonymous mapping, page-locked while any view of it lives: numpy arrays over it name it as their
    base (``__array_interface__``), so it is unregistered, then unmapped, only once the last view is gone."""

    __slots__ = ("_map", "address", "__array_interface__", "__weakref__")

    def __init__(self, nbytes: int):
        import numpy as np

        self.address = 0  # registered memory's address (0: not registered, nothing to undo)
        self._map = anonymous_map(nbytes)
        probe = np.frombuffer(self._map, dtype=np.uint8, count=1)
        address = int(probe.ctypes.data)
        del probe  # no export of the mapping is kept: close() may unmap it
        if not host_register(address, len(self._map)):
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes of host memory failed (too much page-locked "
                               "memory for this machine or container?)")
        self.address = address
        self.__array_interface__ = {"data": (self.address, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self):
        if getattr(self, "address", 0):
            try:
                host_unregister(self.address)  # before the pages go back to the system
            except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone: the process's pages go too
                pass
        if getattr(self, "_map", None) is not None:
            self._map.close()


def pinned_host_empty(nbytes: int):
    """A page-aligned uint8 CPU tensor of ``nbytes`` bytes, page-locked until its last view is gone ([Note:
    copies between the host and device tiers]): exactly its own pages, where PyTorch's pinned allocator would
    round the request up to a power of two and keep the block for the process's life."""
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(_PinnedRegion(nbytes)))


# ------------------------------------------------------------------ copies between the tiers
def to_device(src, alloc: Callable, device):
    """Upload host tensor ``src`` (pinned: see [Note: copies between the host and device tiers]) into
    ``alloc()``, a device buffer allocated here on ``device``'s upload stream. Returns ``(dst, event)``: the
    calling thread's current stream already waits on ``event`` (compute it queues after this reads the copy);
    ``src`` must not be written or reused before ``event`` has fired."""
    import torch

    stream = side_stream(device, UP)
    with torch.cuda.device(device):
        consumer = torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            dst = alloc()  # on the upload stream: see the Note for why this needs no wait on the consumer
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        consumer.wait_event(event)
        dst.record_stream(consumer)  # the consumer's kernels read it: no reuse before they ran
    return dst, event


def to_host(dst, src):
    """Download device tensor ``src`` into host tensor ``dst`` (pinned; another dtype is converted on the
    device) on ``src``'s download stream, after the work queued so far on the calling thread's current stream.
    Returns the event to wait on before reading ``dst`` ([Note: copies between the host and device tiers])."""
    import torch

    device = src.device
    stream = side_stream(device, DOWN)
    with torch.cuda.device(device):
        stream.wait_stream(torch.cuda.current_stream(device))  # the values its queued kernels produce
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        src.record_stream(stream)  # its owner may free it now: the allocator waits for our copy first
    return event


def event_future(event, result=None) -> Future:
    """A future completed with ``result`` once ``event`` (anything with ``synchronize()``) has fired, or failed
    with what its ``synchronize`` raised; waited on by a waiter thread, not the caller."""
    out = Future()

    def wait() -> None:
        try:
            event.synchronize()
        except BaseException as exc:  # noqa: BLE001 - the caller sees it through the future
            out.set_exception(exc)
            return
        out.set_result(result)
    _copy_waiter.submit(wait)
    return out


def prefer_expandable_segments() -> bool:
    """Ask PyTorch's caching allocator for expandable segments, unless the user configured the allocator or CUDA
    is initialised already (the setting is read once, when CUDA initialises); True when it was set here.

    Without them a request of 10 MiB or more takes a segment of its own rounded up to 2 MiB, and freed blocks of
    one size cannot serve another: reserved memory drifts above the bytes the device ledger counts. Expandable
    segments map 2 MiB pages into one growing segment per stream instead (PyTorch's CUDA memory notes)."""
    import torch

    if torch.version.cuda is None or torch.cuda.is_initialized():
        return False  # no CUDA allocator in this build, or too late to configure it
    if any(os.environ.get(v) for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")):
        return False  # the user's settings stand
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return True
