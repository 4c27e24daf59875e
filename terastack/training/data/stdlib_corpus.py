"""Training data without a download: the running Python's own standard-library sources, as text (byte tokens)
and as the ``builtin:docstrings`` instruction set (:func:`docstring_pairs`).

[Note: the built-in corpus]
Every machine that runs terastack has a Python, and every Python ships its
standard library as source. The default corpus is those ``.py`` files (the
top-level modules of ``sysconfig``'s ``stdlib`` path, in name order, so the
corpus is the same on every run of the same Python), read up to a size limit.
Nothing is copied into the repository or downloaded. Tokens are bytes (0-255)
plus BOS/EOS/PAD, unless the model directory brings its own tokenizer.
"""
from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

from terastack.training.data.record_files import decode_text

BOS, EOS, PAD = 256, 257, 258
BYTE_VOCAB = 259


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}; give a text file with --data")
    return files


def stdlib_corpus(max_bytes: int = 4 << 20) -> tuple[bytes, str]:
    """(text, description) of the built-in corpus. See [Note: the built-in corpus]."""
    parts, total = [], 0
    files = stdlib_files()
    for p in files:
        data = p.read_bytes()
        parts.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    text = b"".join(parts)[:max_bytes]
    return text, f"{len(parts)} standard-library modules of Python {sysconfig.get_python_version()} ({files[0].parent})"


def docstring_pairs(max_files: int | None = None) -> list[tuple[str, str]]:
    """``(prompt, completion)`` pairs from this Python's standard library: a public function's or method's
    signature (``module.Class.name(args) -> ret``, then a newline) and the first paragraph of its docstring. In
    file order, then source order: the same on every run of the same Python. No download."""
    pairs = []
    for path in stdlib_files()[:max_files]:
        if path.name.startswith("_"):
            continue  # private modules (_pydecimal, _aix_support): implementation details
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue  # a test fixture for bad syntax, not a module
        module = path.stem
        todo = [(node, "") for node in tree.body]
        while todo:
            node, owner = todo.pop(0)
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not owner:
                todo += [(child, node.name + ".") for child in node.body]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
                prompt = f"{module}.{owner}{node.name}({ast.unparse(node.args)}){ret}\n"
                pairs.append((prompt, doc.split("\n\n")[0].strip()))  # get_docstring cleans indentation
    return pairs


class ByteTokenizer:
    vocab_size = BYTE_VOCAB
    bos_token_id, eos_token_id, pad_token_id = BOS, EOS, PAD

    def encode(self, text: bytes | str) -> np.ndarray:
        data = text.encode() if isinstance(text, str) else text
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


def load_tokenizer(model_dir: str | None):
    """The model directory's own tokenizer (``transformers.AutoTokenizer``), or None: byte tokens."""
    if model_dir is None or not any(os.path.exists(os.path.join(model_dir, f))
                                    for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load_tokens(data: str | None, model_dir: str | None, *, max_bytes: int = 16 << 20) -> tuple[np.ndarray, dict]:
    """Token ids of the training text and a description of where they came from (for checkpoints and --json)."""
    if data is None:
        text, what = stdlib_corpus(min(max_bytes, 4 << 20))
    else:
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"data file {path} does not exist")
        with open(path, "rb") as f:
            text = f.read(max_bytes)
        if not text:
            raise ValueError(f"data file {path} is empty")
        # a file of binary bytes would train on them without a word: refused, naming the first bad byte
        decode_text(path, text, final=len(text) < max_bytes)
        what = f"{path} ({len(text)} bytes{', truncated' if path.stat().st_size > max_bytes else ''})"
    tokenizer = "bytes"
    tok = load_tokenizer(model_dir)
    if tok is not None:
        ids = np.asarray(tok(text.decode("utf-8", errors="replace"))["input_ids"], dtype=np.int64)
        tokenizer = type(tok).__name__
    else:
        ids = ByteTokenizer().encode(text)
    info = {"source": what, "tokenizer": tokenizer, "tokens": int(ids.size),
            "sha256": hashlib.sha256(text).hexdigest()[:16]}
    return ids, info


class TokenBatches:
    """Batch ``step`` is a pure function of (seed, step): a resumed run sees the batches an uninterrupted one
    would."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, batch_size: int, seed: int = 0):
        if tokens.size < seq_len + 1:
            raise ValueError(f"the training text has {tokens.size} tokens; at least seq_len + 1 = {seq_len + 1} "
                             "are needed")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed

    def batch(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.tokens.size - self.seq_len, self.batch_size)
        return torch.from_numpy(np.stack([self.tokens[s:s + self.seq_len] for s in starts]))

    def step_inputs(self, step: int) -> dict:
        """Keyword arguments of ``Trainer.step`` for batch ``step`` (labels are the inputs)."""
        return {"input_ids": self.batch(step)}
