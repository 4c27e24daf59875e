"""Records of a local dataset file (JSON Lines, a JSON array, Parquet), each with the line it came from.

Nothing is downloaded and nothing is unpickled: JSON is read with the standard library (JSON Lines one line at
a time, so a file larger than memory streams), Parquet with ``pyarrow`` (installed by the ``llm-data`` extra,
with ``datasets``). A record that cannot be used raises :class:`DatasetError`, whose one-line message names the
file, the line (a row for Parquet) and the field.
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Iterator

#: file suffixes read as records (anything else given to ``--data`` is plain text)
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")


class DatasetError(ValueError):
    """A dataset record that cannot be used; the message names where it is and what is wrong."""

    def __init__(self, where: str, field: str | None, problem: str):
        self.where, self.field, self.problem = where, field, problem
        super().__init__(f"{where}: field {field!r}: {problem}" if field else f"{where}: {problem}")


def is_record_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in RECORD_SUFFIXES


def not_text_error(path: str | Path, data: bytes, offset: int, problem: str, *, base: int = 0,
                   line: int | None = None) -> DatasetError:
    """The one-line error for bytes of ``path`` that are not UTF-8 text: the byte offset (from the start of the
    file) and the line of the first bad byte. ``data`` holds the file's bytes from offset ``base``, on line
    ``line`` (None: ``data`` starts the file, line 1)."""
    at = base + offset
    lineno = (line or 1) + data.count(b"\n", 0, offset)
    return DatasetError(f"{path}:{lineno}", None, f"not UTF-8 text: {problem} at byte offset {at} "
                        "(give a text file, or JSON Lines / JSON / Parquet records)")


def decode_text(path: str | Path, data: bytes, *, base: int = 0, line: int | None = None,
                final: bool = True) -> str:
    """``data`` (bytes of ``path`` from offset ``base``, on line ``line``) as text, or :class:`DatasetError`
    naming the file, the byte offset and the line of the first byte that is not UTF-8 text: a byte sequence
    that does not decode, or a NUL byte (UTF-8 text never holds one; binary files almost always do).
    ``final=False``: ``data`` was cut from a longer file, so a character cut in two at its end is dropped."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise not_text_error(path, data, nul, "a NUL byte", base=base, line=line)
    try:
        if final:
            return data.decode("utf-8")
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError as exc:
        raise not_text_error(path, data, exc.start, f"byte 0x{data[exc.start]:02x} does not decode",
                             base=base, line=line) from None


def read_records(path: str | Path) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` for each record of ``path``; ``where`` is ``"file:line"`` (``"file row N"`` for
    Parquet), for messages about that record."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_records(path)
        return
    with open(path, "rb") as f:   # only to tell a JSON array from JSON Lines; the records are checked as read
        head = f.read(4096).decode("utf-8", errors="replace").lstrip()
    if suffix == ".json" and head.startswith("["):
        yield from _json_array_records(path)
    else:  # .jsonl, or a .json file holding one object per line
        yield from _json_lines_records(path)


def _record(where: str, obj) -> tuple[str, dict]:
    if not isinstance(obj, dict):
        raise DatasetError(where, None, f"a record must be a JSON object, got {type(obj).__name__}")
    return where, obj


def _json_lines_records(path: Path) -> Iterator[tuple[str, dict]]:
    offset = 0
    with open(path, "rb") as f:  # bytes: a line that is not text is named with its byte offset
        for lineno, raw in enumerate(f, 1):
            line = decode_text(path, raw, base=offset, line=lineno)
            offset += len(raw)
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                # without its line break: an unterminated string is reported where it starts, not as a control
                # character one column past the end of the line
                obj = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                layout = "one JSON object per line" + (" or a JSON array of them" if path.suffix == ".json" else "")
                raise DatasetError(where, None, f"not valid JSON ({_json_problem(exc)}); the file "
                                   f"should hold {layout}") from None
            yield _record(where, obj)


def _json_problem(exc: json.JSONDecodeError) -> str:
    """"Expecting ',' delimiter at column 7": the decoder's message (some end in "at", some in "at: line 1
    column 7"; only the message part is kept) and the column, counted from 1 in characters, as editors count."""
    msg = exc.msg.split(": line ")[0].removesuffix(":").removesuffix(" at")
    return f"{msg} at column {exc.colno}"


def _json_array_records(path: Path) -> Iterator[tuple[str, dict]]:
    """The elements of a top-level JSON array, decoded one at a time so each knows its line."""
    text = decode_text(path, path.read_bytes())
    decoder = json.JSONDecoder()
    pos, line, counted = text.index("[") + 1, 1, 0

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def line_of(i: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, i)
        counted = i
        return line

    pos = skip(pos)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        where = f"{path}:{line_of(pos)}"
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{exc.lineno}", None, f"not valid JSON ({_json_problem(exc)})") from None
        yield _record(where, obj)
        pos = skip(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip(pos + 1)
        elif pos < len(text) and text[pos] == "]":
            return
        else:
            raise DatasetError(f"{path}:{line_of(min(pos, len(text)))}", None,
                               "not valid JSON (expected ',' or ']' after a record)")


def _parquet_records(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow: pip install 'terastack[llm-data]'") from None
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise DatasetError(str(path), None, f"not a readable Parquet file ({exc})") from None
    row = 0
    for batch in table.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            yield f"{path} row {row}", obj
            row += 1
