"""Streaming readers for the files public graph datasets ship: ``.csv.gz`` tables, ``.npy`` arrays and
``.npz`` members, each read in row blocks of bounded size, never unpickled, with errors naming the file.

* :class:`CsvGz` -- a header-less comma-separated table inside gzip (OGB's ``raw/*.csv.gz``). Parsed a
  block of whole lines at a time with ``np.loadtxt``; a bad block is re-read line by line only to say
  which line is wrong (empty, wrong column count, not a number).
* :class:`NpyStream` -- an ``.npy`` array read sequentially from any binary file object: an ``.npz``
  member (a zip entry, stored or deflated) or a plain file. ``np.load(mmap_mode=...)`` cannot map an
  ``.npz`` member, so the header is parsed with ``np.lib.format`` and rows are read in chunks. An
  object dtype (which would need unpickling) is refused.
* :class:`RowCursor` -- turns "blocks from row k onwards" into the ``rows(start, stop)`` calls
  :class:`~terastack.gnn.storage.build.FeatureWriter` makes (sequential, resumable from any row).
"""
from __future__ import annotations

import gzip
import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from terastack.gnn.storage.dataset import DatasetError

#: read errors of a damaged gzip stream (truncated, bad CRC, not gzip at all)
_GZIP_ERRORS = (EOFError, OSError, zlib.error, gzip.BadGzipFile)


def file_record(path: str | os.PathLike) -> dict:
    """What a build records about one source file (resuming with a changed file is refused)."""
    st = Path(path).stat()
    return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def need_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DatasetError(f"{path}: {what} file does not exist")
    return path


class CsvGz:
    """A header-less numeric CSV inside gzip, read in blocks of whole lines (see the module docstring).

    ``columns`` fixes the column count (None: the first line's). ``blank_as_nan`` reads an empty line as
    NaN (OGB writes unlabelled nodes' labels that way); otherwise an empty line is an error.
    """

    def __init__(self, path: str | os.PathLike, what: str, *, dtype=np.float64, columns: int | None = None,
                 blank_as_nan: bool = False, block_bytes: int = 16 << 20):
        self.path = need_file(Path(path), what)
        self.what = what
        self.dtype = np.dtype(dtype)
        self.columns = columns
        self.blank_as_nan = blank_as_nan
        self.block_bytes = int(block_bytes)

    def _text_blocks(self) -> Iterator[tuple[int, str]]:
        """(index of the block's first line, text of whole lines ending in a newline)."""
        line = 0
        tail = b""
        try:
            with gzip.open(self.path, "rb") as f:
                while True:
                    raw = f.read(self.block_bytes)
                    if not raw:
                        break
                    raw = tail + raw
                    cut = raw.rfind(b"\n") + 1
                    tail = raw[cut:]
                    if cut:
                        text = raw[:cut].decode("ascii", errors="replace")
                        yield line, text
                        line += text.count("\n")
        except _GZIP_ERRORS as exc:
            raise DatasetError(f"{self.path}: cannot read {self.what}: damaged or truncated gzip after line "
                               f"{line} ({exc})") from None
        if tail.strip():
            yield line, tail.decode("ascii", errors="replace") + "\n"

    def blocks(self, skip_rows: int = 0) -> Iterator[np.ndarray]:
        """2-D arrays (rows x columns) of consecutive rows, starting at row ``skip_rows``."""
        for first, text in self._text_blocks():
            count = text.count("\n")
            if first + count <= skip_rows:
                continue
            if first < skip_rows:
                text = text.split("\n", skip_rows - first)[-1]
                first = skip_rows
                count = text.count("\n")
            yield self._parse(first, text, count)

    def _parse(self, first: int, text: str, count: int) -> np.ndarray:
        if self.blank_as_nan and ("\n\n" in text or text.startswith("\n") or "\n\r\n" in text):
            text = "".join(line if line.strip() else "nan\n" for line in text.splitlines(keepends=True))
        try:
            rows = np.loadtxt(io.StringIO(text), delimiter=",", dtype=self.dtype, ndmin=2)
        except ValueError:
            rows = None
        if rows is None or len(rows) != count or (self.columns is not None and rows.shape[1] != self.columns):
            self._diagnose(first, text)
        if self.columns is None:
            self.columns = rows.shape[1]
        return rows

    def _diagnose(self, first: int, text: str):
        """Raise a DatasetError naming the file and the first bad line of this block."""
        kind = "an integer" if self.dtype.kind in "iu" else "a number"
        for k, line in enumerate(text.splitlines()):
            where = f"{self.path}: line {first + k + 1}"
            if not line.strip():
                raise DatasetError(f"{where} of {self.what} is empty")
            tokens = line.split(",")
            if self.columns is not None and len(tokens) != self.columns:
                raise DatasetError(f"{where} of {self.what} has {len(tokens)} columns, expected {self.columns}")
            self.columns = len(tokens)
            for tok in tokens:
                try:
                    self.dtype.type(int(tok) if self.dtype.kind in "iu" else float(tok))
                except (ValueError, OverflowError):
                    raise DatasetError(f"{where} of {self.what}: {tok.strip()[:40]!r} is not {kind}") from None
        raise DatasetError(f"{self.path}: {self.what} block at line {first + 1} cannot be parsed")

    def first_row(self) -> np.ndarray:
        """The first line, parsed (fixes the column count for the rest of the file)."""
        try:
            with gzip.open(self.path, "rb") as f:
                line = f.readline().decode("ascii", errors="replace")
        except _GZIP_ERRORS as exc:
            raise DatasetError(f"{self.path}: cannot read {self.what}: damaged gzip ({exc})") from None
        if not line.strip():
            raise DatasetError(f"{self.path}: {self.what} is empty")
        return self._parse(0, line if line.endswith("\n") else line + "\n", 1)[0]

    def read_all(self) -> np.ndarray:
        parts = list(self.blocks())
        if not parts:
            return np.zeros((0, self.columns or 1), self.dtype)
        return np.concatenate(parts)

    def count_rows(self) -> int:
        return sum(text.count("\n") for _, text in self._text_blocks())


class NpyStream:
    """An ``.npy`` array read sequentially from a binary file object (see the module docstring)."""

    def __init__(self, open_file: Callable[[], object], where: str, what: str):
        self.open_file = open_file
        self.where = where
        self.what = what
        with self._open() as f:
            self.shape, self.fortran, self.dtype, self.offset = self._header(f)

    def _open(self):
        try:
            return self.open_file()
        except (OSError, zipfile.BadZipFile, KeyError) as exc:
            raise DatasetError(f"{self.where}: cannot open {self.what} ({exc})") from None

    def _header(self, f):
        from numpy.lib import format as npformat

        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            raise DatasetError(f"{self.where}: {self.what} is not a numpy array ({exc})") from None
        if dtype.hasobject:
            raise DatasetError(f"{self.where}: {self.what} is an object array; reading it would need unpickling, "
                               "which terastack never does")
        return tuple(shape), fortran, dtype, f.tell()

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    def blocks(self, skip_rows: int = 0, block_rows: int = 1 << 16) -> Iterator[np.ndarray]:
        """Row blocks of a C-order array, from row ``skip_rows`` on."""
        if self.fortran and len(self.shape) > 1:
            raise DatasetError(f"{self.where}: {self.what} is stored in Fortran order; only row blocks of a "
                               "C-order array can be streamed")
        row_bytes = (int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1) * self.dtype.itemsize
        with self._open() as f:
            _seek(f, self.offset + skip_rows * row_bytes)
            for start in range(skip_rows, self.rows, block_rows):
                n = min(block_rows, self.rows - start)
                yield np.frombuffer(self._raw(f, n * row_bytes // self.dtype.itemsize, start),
                                    self.dtype).reshape((n,) + tuple(self.shape[1:]))

    def pairs(self, skip: int = 0, block: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row 0, row 1) blocks of a 2 x E array, read through two handles (one per row) in step."""
        if len(self.shape) != 2 or self.shape[0] != 2:
            raise DatasetError(f"{self.where}: {self.what} must be 2 x E (sources, destinations), "
                               f"shape is {self.shape}")
        total = self.shape[1]
        if self.fortran:  # stored as E (src, dst) pairs
            with self._open() as f:
                _seek(f, self.offset + skip * 2 * self.dtype.itemsize)
                for start in range(skip, total, block):
                    n = min(block, total - start)
                    part = np.frombuffer(self._raw(f, 2 * n, start), self.dtype).reshape(n, 2)
                    yield part[:, 0], part[:, 1]
            return
        with self._open() as fs, self._open() as fd:
            _seek(fs, self.offset + skip * self.dtype.itemsize)
            _seek(fd, self.offset + (total + skip) * self.dtype.itemsize)
            for start in range(skip, total, block):
                n = min(block, total - start)
                yield (np.frombuffer(self._raw(fs, n, start), self.dtype),
                       np.frombuffer(self._raw(fd, n, start), self.dtype))

    def _raw(self, f, items: int, start: int) -> bytes:
        want = items * self.dtype.itemsize
        try:
            data = f.read(want)
        except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
            raise DatasetError(f"{self.where}: cannot read {self.what} at row {start} ({exc})") from None
        if len(data) != want:
            raise DatasetError(f"{self.where}: {self.what} is truncated: it ends before row {start} + "
                               f"{items * self.dtype.itemsize} bytes of {self.shape}")
        return data

    def read_all(self) -> np.ndarray:
        parts = list(self.blocks())
        return np.concatenate(parts) if parts else np.zeros(self.shape, self.dtype)


def _seek(f, offset: int) -> None:
    # A deflated zip member seeks forward by decompressing; a stored one (np.savez) seeks directly.
    f.seek(offset)


def npz_member(path: Path, key: str, what: str) -> NpyStream:
    """Member ``key`` of the ``.npz`` file ``path`` as an :class:`NpyStream` (a missing member names the file)."""
    need_file(path, what)
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: not a readable .npz archive ({exc})") from None
    member = key + ".npy"
    if member not in names:
        have = sorted(n[:-4] for n in names if n.endswith(".npy"))
        raise DatasetError(f"{path}: member {key!r} ({what}) is missing; the archive holds {have}")

    def open_member():
        z = zipfile.ZipFile(path)
        return _Closing(z.open(member), z)
    return NpyStream(open_member, f"{path}[{key}]", what)


class _Closing(io.RawIOBase):
    """A zip member whose ``close`` also closes its archive."""

    def __init__(self, member, archive):
        self.member, self.archive = member, archive

    def read(self, n=-1):
        return self.member.read(n)

    def seek(self, offset, whence=0):
        return self.member.seek(offset, whence)

    def tell(self):
        return self.member.tell()

    def readable(self):
        return True

    def seekable(self):
        return True

    def close(self):
        self.member.close()
        self.archive.close()
        super().close()


class RowCursor:
    """``rows(start, stop)`` over a stream of row blocks, for FeatureWriter's sequential, resumable calls.

    ``blocks_from(row)`` must yield consecutive row blocks starting at ``row``; ``total`` rows are
    expected, and a stream that ends early or runs long is an error naming ``where``.
    """

    def __init__(self, blocks_from: Callable[[int], Iterator[np.ndarray]], total: int, where, what: str):
        self.blocks_from, self.total, self.where, self.what = blocks_from, total, where, what
        self.pos, self.it, self.buf = None, None, []

    def rows(self, start: int, stop: int) -> np.ndarray:
        if self.pos != start:
            self.it, self.pos, self.buf = self.blocks_from(start), start, []
        have = sum(len(b) for b in self.buf)
        while have < stop - start:
            block = next(self.it, None)
            if block is None:
                raise DatasetError(f"{self.where}: {self.what} has {self.pos + have} rows, expected {self.total}")
            self.buf.append(block)
            have += len(block)
        joined = np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0]
        out, rest = joined[: stop - start], joined[stop - start:]
        self.buf = [rest] if len(rest) else []
        self.pos = stop
        if stop == self.total and (self.buf or next(self.it, None) is not None):
            raise DatasetError(f"{self.where}: {self.what} has more than the expected {self.total} rows")
        return out
