"""Exceptions of the storage engine.

Every failure of a request names the errno, the path, the offset and the length
involved, so that a user reading a traceback knows which file and which extent
went wrong without a debugger.
"""
from __future__ import annotations

import errno as _errno
import os


class StorageError(OSError):
    """An I/O request failed. Carries ``errno``, ``filename`` (the path), ``offset`` and ``length``."""

    def __init__(self, err: int, what: str, *, path: str, offset: int | None = None,
                 length: int | None = None, detail: str | None = None):
        strerror = detail or (os.strerror(err) if err else what)
        super().__init__(err, strerror, path)
        self.what = what
        self.offset = offset
        self.length = length

    @property
    def path(self) -> str:
        return self.filename

    def __str__(self) -> str:
        where = []
        if self.length is not None:
            where.append(f"{self.length} bytes")
        if self.offset is not None:
            where.append(f"at offset {self.offset}")
        extent = (" " + " ".join(where)) if where else ""
        code = _errno.errorcode.get(self.errno, str(self.errno)) if self.errno else "no errno"
        return f"[{code}] {self.what}{extent} of {self.filename!r}: {self.strerror}"

    def __reduce__(self):
        return (_rebuild, (type(self), self.errno, self.what, self.filename, self.offset,
                           self.length, self.strerror))


def _rebuild(cls, err, what, path, offset, length, detail):
    obj = cls.__new__(cls)
    StorageError.__init__(obj, err, what, path=path, offset=offset, length=length, detail=detail)
    return obj


class EndOfFileError(StorageError, EOFError):
    """A read asked for bytes past the end of the file. ``got`` says how many it could read."""

    def __init__(self, *, path: str, offset: int, length: int, got: int):
        super().__init__(_errno.ENODATA, "read", path=path, offset=offset, length=length,
                         detail=f"read past end of file (got {got} of {length} bytes)")
        self.got = got


class InvalidRequestError(StorageError, ValueError):
    """The request itself is wrong (negative offset, buffer too small, read-only buffer...)."""

    def __init__(self, what: str, *, path: str, offset: int | None, length: int | None, detail: str):
        super().__init__(_errno.EINVAL, what, path=path, offset=offset, length=length, detail=detail)


class ClosedFileError(StorageError, ValueError):
    """The file (or its engine) was closed before the request was made."""

    def __init__(self, what: str, *, path: str, offset: int | None = None, length: int | None = None):
        super().__init__(_errno.EBADF, what, path=path, offset=offset, length=length,
                         detail="file is closed")


class BatchError(StorageError):
    """Some requests of a batch failed. ``errors`` lists them; ``results`` holds every request's outcome
    (bytes moved, or -errno)."""

    def __init__(self, errors: list[StorageError], results):
        first = errors[0]
        more = f" (and {len(errors) - 1} more failed requests)" if len(errors) > 1 else ""
        super().__init__(first.errno, first.what, path=first.filename, offset=first.offset,
                         length=first.length, detail=f"{first.strerror}{more}")
        self.errors = errors
        self.results = results

