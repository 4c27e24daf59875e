"""Data files that are not UTF-8 text are refused in one line naming the file, the line and the byte offset."""
from __future__ import annotations

import json

import pytest

from terastack.training.data.examples import SupervisedData
from terastack.training.data.record_files import DatasetError, read_records
from terastack.training.data.stdlib_corpus import load_tokens

BINARY = bytes(range(256)) * 4   # NUL first, then 0x80.. that never decode alone


def _records(path):
    return list(read_records(path))


def test_jsonl_with_binary_line_names_file_line_and_offset(tmp_path):
    good = json.dumps({"prompt": "a", "completion": "b"}).encode() + b"\n"
    path = tmp_path / "x.jsonl"
    path.write_bytes(good + good + b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(DatasetError) as info:
        _records(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: not UTF-8 text")
    assert f"byte 0xff does not decode at byte offset {2 * len(good) + 12}" in msg
    assert "\n" not in msg


def test_jsonl_of_binary_bytes_is_refused_not_a_bare_decode_error(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + BINARY)
    with pytest.raises(DatasetError, match=rf"^{path}:1: not UTF-8 text: byte 0x89 does not decode at byte "
                                           r"offset 0 "):
        SupervisedData.load(str(path), None, SupervisedData.Config(seq_len=16))


def test_json_array_with_bad_byte_names_its_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'[\n{"text": "a"},\n{"text": "\xc3("}\n]')
    with pytest.raises(DatasetError, match=rf"^{path}:3: not UTF-8 text: byte 0xc3 does not decode at byte "
                                           r"offset 27 "):
        _records(path)


def test_text_file_of_binary_bytes_is_refused(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"some text\nmore\n" + BINARY)
    with pytest.raises(DatasetError, match=rf"^{path}:3: not UTF-8 text: a NUL byte at byte offset 15 "):
        load_tokens(str(path), None)


def test_text_file_that_does_not_decode_is_refused(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=rf"^{path}:1: not UTF-8 text: byte 0xe9 does not decode at byte offset 3"):
        load_tokens(str(path), None)


def test_utf8_text_still_trains_and_a_character_cut_at_the_size_limit_is_kept_out(tmp_path):
    path = tmp_path / "x.txt"
    text = "h\u00e9llo w\u00f6rld\n" * 4
    path.write_text(text, encoding="utf-8")
    ids, info = load_tokens(str(path), None)
    assert bytes(ids.astype("uint8")) == text.encode()
    cut = len("h\u00e9".encode()) - 1   # the limit falls inside the two bytes of 'é'
    ids, info = load_tokens(str(path), None, max_bytes=cut)
    assert info["source"].endswith("truncated)")
