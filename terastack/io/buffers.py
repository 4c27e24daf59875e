"""Buffers the engine reads into and writes from.

Any C-contiguous CPU buffer works: numpy arrays, CPU torch tensors, bytearrays,
memoryviews, mmaps. O_DIRECT additionally wants page-aligned addresses, which
``torch.empty`` (64-byte aligned) does not give; :class:`AlignedArena` hands out
page-aligned views of one anonymous mmap, and :func:`aligned_empty` makes a
single aligned array.
"""
from __future__ import annotations

import mmap
import sys
import threading
from dataclasses import dataclass

import numpy as np

# DIRECT_ALIGN: O_DIRECT alignment; HUGE_PAGE: from this size up, buffers ask for transparent huge pages
# (see [Note: huge pages for I/O buffers]). Both live in the one constants module; re-exported here.
from terastack.constants import DIRECT_ALIGN, HUGE_PAGE, round_up  # noqa: F401
from terastack.errors import BudgetError
from terastack.io.free_list import FreeList

PAGE = mmap.PAGESIZE


def anonymous_map(nbytes: int, *, huge_pages: bool = True) -> mmap.mmap:
    """Private anonymous memory for transfer buffers; from :data:`HUGE_PAGE` up, backed by huge pages if it can
    (``huge_pages=False``: asks for 4 KiB pages instead, even where huge pages are the system default).

    [Note: huge pages for I/O buffers]
    An O_DIRECT transfer is DMA'd from the pages of the user buffer, one
    scatter-gather segment per physically contiguous run. From 4 KiB pages a
    1 MiB request is up to 256 segments, beyond some devices' limit (the
    development machine's virtio disk takes 254), so the block layer splits it,
    and every page must be pinned on submission. From 2 MiB pages it is one
    segment and one pin. Measured in one process on that machine, 1 MiB at
    queue depth 16, same file: writes 4.9-5.1 GB/s from a huge-page buffer vs
    2.2-2.5 GB/s from a 4 KiB-page one; reads 2.5-2.8 vs 1.0-1.1 GB/s. The
    advice is only a request: where transparent huge pages are off, or memory
    is too fragmented to compact, the buffer has 4 KiB pages and still works.
    """
    region = mmap.mmap(-1, max(PAGE, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            region.madvise(mmap.MADV_HUGEPAGE if huge_pages else mmap.MADV_NOHUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages
            pass
    return region


def mapping_fields(address: int) -> dict[str, str]:
    """The ``/proc/self/smaps`` fields of the mapping holding ``address`` ({} where unknown or not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head, _, rest = line.partition(" ")
                if not head.endswith(":"):  # a mapping's header line: "start-end perms ..."
                    if inside:
                        break
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start <= address < end
                elif inside:
                    fields[head[:-1]] = rest.strip()
    except (OSError, ValueError):
        return {}
    return fields


def huge_page_bytes(buf) -> int:
    """Bytes of the mapping holding ``buf`` (an array, tensor or buffer) backed by huge pages now (0: unknown)."""
    if hasattr(buf, "data_ptr"):
        address = buf.data_ptr()
    else:
        address = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8, count=1).ctypes.data
    value = mapping_fields(address).get("AnonHugePages", "0 kB").split()
    return int(value[0]) * 1024 if value and value[0].isdigit() else 0


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


@dataclass(frozen=True, slots=True)
class BufferView:
    """Where a buffer's bytes are: ``address`` and ``nbytes``, plus the object keeping them alive."""

    address: int
    nbytes: int
    owner: object
    capacity: int  # bytes that may be touched from `address` (>= nbytes for arena buffers)


def view_buffer(buf, *, writable: bool) -> BufferView:
    """Address and size of a contiguous CPU buffer. Raises TypeError/ValueError on anything else."""
    if isinstance(buf, ArenaBuffer):
        return BufferView(buf.address, buf.nbytes, buf, buf.capacity)
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(buf, tensor_type):
        if buf.device.type != "cpu":
            raise TypeError(f"buffer is a {buf.device.type} tensor; the CPU path needs a CPU tensor "
                            "(File.pread/pwrite stage device tensors through pinned memory)")
        if not buf.is_contiguous():
            raise ValueError("buffer tensor is not contiguous; call .contiguous() first")
        nbytes = buf.numel() * buf.element_size()
        return BufferView(buf.data_ptr(), nbytes, buf, nbytes)
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("buffer array is not C-contiguous; use np.ascontiguousarray first")
        if writable and not buf.flags.writeable:
            raise ValueError("buffer array is read-only but the request writes into it")
        return BufferView(buf.ctypes.data, buf.nbytes, buf, buf.nbytes)
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"unsupported buffer type {type(buf).__name__}: use a numpy array, a CPU torch "
                        "tensor, a bytearray, a memoryview or an ArenaBuffer") from None
    if not mv.c_contiguous:
        raise ValueError("buffer is not C-contiguous")
    if writable and mv.readonly:
        raise ValueError(f"buffer of type {type(buf).__name__} is read-only but the request writes into it")
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    return BufferView(arr.ctypes.data if arr.size else 0, mv.nbytes, (buf, arr), mv.nbytes)


class ArenaBuffer:
    """A page-aligned extent of an :class:`AlignedArena`. Release it (or use ``with``) to give it back."""

    __slots__ = ("arena", "offset", "nbytes", "capacity", "_released")

    def __init__(self, arena: "AlignedArena", offset: int, nbytes: int, capacity: int):
        self.arena = arena
        self.offset = offset
        self.nbytes = nbytes
        self.capacity = capacity
        self._released = False

    @property
    def address(self) -> int:
        return self.arena.address + self.offset

    def numpy(self, dtype=np.uint8, shape=None) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize if shape is None else int(np.prod(shape))
        if count * dtype.itemsize > self.capacity:
            raise ValueError(f"view of {count * dtype.itemsize} bytes exceeds the buffer's {self.capacity}")
        arr = np.frombuffer(self.arena._map, dtype=dtype, count=count, offset=self.offset)
        return arr.reshape(shape) if shape is not None else arr

    def tensor(self, dtype=None, shape=None):
        import torch

        dtype = dtype or torch.uint8
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = self.nbytes // itemsize if shape is None else int(np.prod(shape))
        if count * itemsize > self.capacity:
            raise ValueError(f"view of {count * itemsize} bytes exceeds the buffer's {self.capacity}")
        t = torch.frombuffer(self.arena._map, dtype=dtype, count=count, offset=self.offset)
        return t.view(*shape) if shape is not None else t

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.arena.give_back(self.offset, self.capacity)

    def __enter__(self) -> "ArenaBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ArenaBuffer(offset={self.offset}, nbytes={self.nbytes}, capacity={self.capacity})"


class AlignedArena:
    """Page-aligned host memory carved from one anonymous mmap, for O_DIRECT transfers.

    ``capacity`` is a budget: an allocation that does not fit raises
    :class:`BudgetError` naming the shortfall instead of growing. With
    ``pin=True`` and CUDA present, the region is registered as pinned memory so
    that device copies from it are asynchronous.
    """

    def __init__(self, capacity: int, *, name: str = "pinned", pin: bool = False):
        if capacity <= 0:
            raise ValueError(f"capacity: must be > 0, got {capacity}")
        self.name = name
        self.capacity = round_up(capacity, PAGE)
        self._map = anonymous_map(self.capacity)
        self.address = np.frombuffer(self._map, dtype=np.uint8, count=1).ctypes.data
        self._lock = threading.Lock()
        self._free = FreeList(0, self.capacity)
        self.used = 0
        self.peak = 0
        self.pinned = False
        if pin:
            self.pinned = _cuda_host_register(self.address, self.capacity)

    def alloc(self, nbytes: int, *, what: str = "") -> ArenaBuffer:
        if nbytes < 0:
            raise ValueError(f"nbytes: must be >= 0, got {nbytes}")
        size = max(PAGE, round_up(nbytes, PAGE))
        with self._lock:
            start = self._free.take(size)
            if start is not None:
                self.used += size
                self.peak = max(self.peak, self.used)
                return ArenaBuffer(self, start, nbytes, size)
            largest = self._free.largest()
        raise BudgetError(self.name, needed=size, available=largest, limit=self.capacity,
                          what=what or f"a {nbytes}-byte aligned buffer")

    def give_back(self, offset: int, capacity: int) -> None:
        """Return a buffer's extent (what :meth:`ArenaBuffer.release` calls)."""
        with self._lock:
            self._free.give(offset, capacity)
            self.used -= capacity

    def close(self) -> None:
        if self.pinned:
            _cuda_host_unregister(self.address)
            self.pinned = False
        try:
            self._map.close()
        except BufferError:
            pass  # views still exported: the mapping goes away with its last view

    def __enter__(self) -> "AlignedArena":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def aligned_empty(shape, dtype=np.uint8, *, as_tensor: bool = False):
    """A page-aligned, zero-filled numpy array (or CPU tensor) backed by its own anonymous mmap."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if as_tensor:
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        count = int(np.prod(shape))
        region = anonymous_map(count * itemsize)
        return torch.frombuffer(region, dtype=dtype, count=count).view(*shape)
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    region = anonymous_map(count * dtype.itemsize)
    return np.frombuffer(region, dtype=dtype, count=count).reshape(shape)


def _cuda_host_register(address: int, nbytes: int) -> bool:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return False
    err = torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)
    return int(err) == 0


def _cuda_host_unregister(address: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.cudart().cudaHostUnregister(address)
