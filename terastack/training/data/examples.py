"""Instruction and chat data: records -> token ids with a loss mask -> padded batches, and a built-in set.

[Note: record formats]
A record file (``--data x.jsonl | x.json | x.parquet``, read by :mod:`terastack.training.data.record_files`) holds one
format, detected from the fields of its first record; every record must then have that format's fields:

    text                     {"text": ...}                                   the loss covers every token
    prompt/completion        {"prompt": ..., "completion": ...}              the loss covers the completion
    alpaca                   {"instruction", "input" (optional), "output"}   the prompt is ALPACA_PROMPT
    openai messages          {"messages": [{"role", "content"}, ...]}        the loss covers assistant turns
    sharegpt                 {"conversations": [{"from", "value"}, ...]}     roles mapped by SHAREGPT_ROLES

Conversations go through the tokenizer's chat template (``apply_chat_template``). Without one (the byte
tokenizer of the built-in models) each message is the text ``<|role|>\\n`` followed by its content and the EOS
token; a generation prompt is ``<|assistant|>\\n`` (see :data:`PLAIN_CHAT_HEADER`). With the byte tokenizer an
example starts with BOS; an HF tokenizer adds what its own ``add_special_tokens`` adds. The loss (labels other
than -100) covers the completion, or the assistant turns with the template's end-of-turn text, unless
``train_on_prompt``. Every example ends with the tokenizer's EOS (appended when the template does not end
with it). An example longer than ``seq_len`` keeps its first ``seq_len`` tokens and is counted as truncated; one
left with no token in the loss is dropped and counted.

[Note: padding and packing]
By default a batch is its examples padded on the right to the longest of them with the pad token (labels
-100). No attention mask is needed: attention is causal and every pad comes after every real token of its
row, so no real token attends to a pad, and pads are outside the loss -- the loss and the gradients are those
of the examples alone, and ``Trainer.loss`` gives the validation loss the same way.

With ``Config.pack`` short examples share rows instead: in the epoch's shuffled order each example goes into
the current row while it fits in ``seq_len`` tokens, else it starts the next row (next-fit: the order stays
random, a row wastes at most the room the next example did not fit in). A row is exact only if no token
attends across an example's boundary and no token is predicted from the example before it: its
``position_ids`` restart at 0 with every example, from which transformers (>= 5, sdpa or eager attention,
no 2D attention mask given) builds a block-diagonal causal mask, and the label of each example's first token
is -100 (in a row of its own nothing predicts it either). Pads after a row's last example continue its
positions and are outside the loss, as in padded batches. Families whose model code does not derive that mask
from the position ids (OPT, for one) are refused by the trainer
(:func:`terastack.llm.model.check_packing`), since their rows would attend across examples. The loss of a
packed row is then the token-weighted loss of its examples run one by one; the validation set is not packed.
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from terastack.training.data.stdlib_corpus import BOS, ByteTokenizer, docstring_pairs
from terastack.training.data.record_files import DatasetError, read_records

IGNORE = -100  # the label transformers' loss ignores
BUILTIN_SETS = ("docstrings",)
ALPACA_PROMPT = ("Below is an instruction that describes a task{with_input}. Write a response that appropriately "
                 "completes the request.\n\n### Instruction:\n{instruction}\n\n{input_block}### Response:\n")
PLAIN_CHAT_HEADER = "<|{role}|>\n"
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "model": "assistant", "tool": "tool", "function": "tool"}
#: format name -> the fields that identify it (first match wins, in this order)
FORMATS = {"openai messages": ("messages",), "sharegpt": ("conversations",),
           "alpaca": ("instruction", "output"), "prompt/completion": ("prompt", "completion"), "text": ("text",)}


@dataclass(slots=True)
class Example:
    ids: np.ndarray      # int64 token ids
    labels: np.ndarray   # ids where the loss counts, IGNORE elsewhere


# ------------------------------------------------------------------ records -> messages or segments
def detect_format(where: str, record: dict) -> str:
    for name, keys in FORMATS.items():
        if all(k in record for k in keys):
            return name
    raise DatasetError(where, None, f"no known record format in fields {sorted(record)}; expected one of "
                       + "; ".join(" + ".join(keys) for keys in FORMATS.values()))


def _string(where: str, record: dict, key: str, label: str | None = None) -> str:
    if key not in record:
        raise DatasetError(where, label or key, "missing")
    value = record[key]
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        value = "".join(str(p.get("text", "")) for p in value)  # OpenAI content parts (text only)
    if not isinstance(value, str):
        raise DatasetError(where, label or key, f"must be a string, got {type(value).__name__}")
    return value


def _messages(where: str, record: dict, fmt: str) -> list[dict]:
    key, role_key, content_key = (("messages", "role", "content") if fmt == "openai messages"
                                  else ("conversations", "from", "value"))
    turns = record.get(key)
    if not isinstance(turns, list) or not turns:
        raise DatasetError(where, key, "must be a non-empty list of messages")
    out = []
    for i, turn in enumerate(turns):
        label = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise DatasetError(where, label, f"a message must be an object, got {type(turn).__name__}")
        role = _string(where, turn, role_key, f"{label}.{role_key}")
        if fmt == "sharegpt":
            if role not in SHAREGPT_ROLES:
                raise DatasetError(where, f"{label}.from", f"unknown speaker {role!r} (known: "
                                   f"{', '.join(SHAREGPT_ROLES)})")
            role = SHAREGPT_ROLES[role]
        out.append({"role": role, "content": _string(where, turn, content_key, f"{label}.{content_key}")})
    if not any(m["role"] == "assistant" for m in out):
        raise DatasetError(where, key, "no assistant message: nothing to train on")
    return out


def _prompt_completion(where: str, record: dict, fmt: str) -> tuple[str, str]:
    if fmt == "prompt/completion":
        return _string(where, record, "prompt"), _string(where, record, "completion")
    instruction, output = _string(where, record, "instruction"), _string(where, record, "output")
    extra = _string(where, record, "input") if record.get("input") is not None else ""
    prompt = ALPACA_PROMPT.format(with_input=", paired with an input that provides further context" if extra else "",
                                  instruction=instruction, input_block=f"### Input:\n{extra}\n\n" if extra else "")
    return prompt, output


# ------------------------------------------------------------------ tokenizing with a loss mask
class ExampleTokenizer:
    """Turns prompt/completion pairs, conversations and texts into :class:`Example` s for one tokenizer: the
    byte tokenizer (``tokenizer`` None) or a Hugging Face tokenizer. See [Note: record formats]."""

    def __init__(self, tokenizer=None, *, train_on_prompt: bool = False):
        self.hf = tokenizer
        self.train_on_prompt = train_on_prompt
        if tokenizer is None:
            self.eos_id, self.pad_id = ByteTokenizer.eos_token_id, ByteTokenizer.pad_token_id
        else:
            if tokenizer.eos_token_id is None:
                raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no EOS token; examples must end "
                                 "with one")
            self.eos_id = int(tokenizer.eos_token_id)
            pad = tokenizer.pad_token_id
            self.pad_id = int(self.eos_id if pad is None else pad)

    @property
    def has_chat_template(self) -> bool:
        return self.hf is not None and bool(getattr(self.hf, "chat_template", None))

    def _encode(self, text: str, first: bool) -> list[int]:
        if self.hf is None:
            return ([BOS] if first else []) + list(text.encode("utf-8"))
        return list(self.hf(text, add_special_tokens=first)["input_ids"])

    def _finish(self, ids: list[int], trained: list[bool], *, end_marked: bool = False) -> Example:
        """``end_marked``: the text already ends its last trained turn with EOS (a chat template's own end
        marker), so none is appended after it (the model would learn to emit a second one after every answer)."""
        if not end_marked and (not ids or ids[-1] != self.eos_id):
            ids, trained = ids + [self.eos_id], trained + [True]
        ids_a = np.asarray(ids, dtype=np.int64)
        keep = np.asarray(trained, dtype=bool) | self.train_on_prompt
        return Example(ids=ids_a, labels=np.where(keep, ids_a, IGNORE))

    def segments(self, parts: list[tuple[str | int, bool]]) -> Example:
        """An example from ``(text or token id, in the loss)`` parts, each text tokenized on its own."""
        ids: list[int] = []
        trained: list[bool] = []
        for part, in_loss in parts:
            new = [part] if isinstance(part, int) else self._encode(part, first=not ids)
            ids += new
            trained += [in_loss] * len(new)
        return self._finish(ids, trained)

    def text(self, text: str) -> Example:
        return self.segments([(text, True)])

    def prompt_completion(self, prompt: str, completion: str) -> Example:
        return self.segments([(prompt, False), (completion, True)])

    def chat(self, messages: list[dict], where: str = "conversation") -> Example:
        if not self.has_chat_template:
            parts: list[tuple[str | int, bool]] = []
            for m in messages:
                mine = m["role"] == "assistant"
                parts += [(PLAIN_CHAT_HEADER.format(role=m["role"]), False), (m["content"], mine), (self.eos_id, mine)]
            return self.segments(parts)
        return self._templated_chat(messages, where)

    def _templated_chat(self, messages: list[dict], where: str) -> Example:
        """The chat template renders the conversation; an assistant turn is the text between the rendering of the
        messages before it (with the generation prompt) and the rendering through it. Tokens whose text starts
        in such a span are in the loss."""
        tok = self.hf

        def render(msgs, gen=False) -> str:
            try:
                return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            except Exception as exc:  # jinja2 raises its own errors (e.g. a template's raise_exception)
                raise DatasetError(where, "messages", f"the chat template refused the conversation ({exc})") from None

        full = render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start, end = render(messages[:i], gen=True) if i else "", render(messages[:i + 1])
            if not (full.startswith(end) and end.startswith(start)):
                raise DatasetError(where, f"messages[{i}]", "the chat template does not render this "
                                   "conversation's turns as prefixes of one another; cannot find the assistant text")
            spans.append((len(start), len(end)))
        if getattr(tok, "is_fast", True):
            enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(enc["input_ids"])
            trained = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
        else:  # a Python tokenizer has no offsets: count the tokens of the rendered prefixes instead
            def count(text: str) -> int:
                return len(tok(text, add_special_tokens=False)["input_ids"])

            ids = list(tok(full, add_special_tokens=False)["input_ids"])
            bounds = [(count(full[:a]), count(full[:b])) for a, b in spans]
            trained = [any(a <= i < b for a, b in bounds) for i in range(len(ids))]
        return self._finish(ids, trained, end_marked=self._last_turn_ends_with_eos(ids, trained))

    def _last_turn_ends_with_eos(self, ids: list[int], trained: list[bool]) -> bool:
        """Whether the template closed the last assistant turn with EOS itself (ChatML's ``<|im_end|>`` when it is
        the EOS token): an EOS among that turn's trained tokens. Conversations are left to their template, as the
        common fine-tuners do; EOS is appended only where the template emits none."""
        end = max((i for i, t in enumerate(trained) if t), default=-1)
        start = end
        while start > 0 and trained[start - 1]:
            start -= 1
        return end >= 0 and self.eos_id in ids[start:end + 1]

    def record(self, where: str, record: dict, fmt: str) -> Example:
        if fmt in ("openai messages", "sharegpt"):
            return self.chat(_messages(where, record, fmt), where)
        if fmt == "text":
            return self.text(_string(where, record, "text"))
        return self.prompt_completion(*_prompt_completion(where, record, fmt))


# ------------------------------------------------------------------ the data set
class SupervisedData:
    """Examples with a loss mask from a record file or a built-in set, split into train and held-out validation.

    ``SupervisedData.load("train.jsonl", tokenizer, SupervisedData.Config(seq_len=512))``; ``tokenizer`` None
    means bytes. See [Note: record formats] and [Note: padding and packing]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        seq_len: int
        #: put the prompt (user turns, templates) in the loss too
        train_on_prompt: bool = False
        #: the share of examples held out for the validation loss (by a hash of the example: a fixed split)
        val_fraction: float = 0.05
        #: at most this many held-out examples are evaluated (the validation loss runs twice per job)
        val_max_examples: int = 64
        #: pack several short examples into each row of ``seq_len`` tokens (training batches only); see
        #: [Note: padding and packing]
        pack: bool = False

        def __post_init__(self) -> None:
            if self.seq_len < 2:
                raise ValueError(f"seq_len: must be >= 2, got {self.seq_len}")
            if not 0 <= self.val_fraction < 1:
                raise ValueError(f"val_fraction: must be in [0, 1), got {self.val_fraction}")
            if self.val_max_examples < 0:
                raise ValueError(f"val_max_examples: must be >= 0, got {self.val_max_examples}")

    def __init__(self, examples: list[Example], config: Config, *, source: str, fmt: str, records: int,
                 tokenizer: str, pad_id: int):
        self.config = config
        self.source, self.format, self.records, self.tokenizer, self.pad_id = source, fmt, records, tokenizer, pad_id
        self.truncated = self.dropped = 0
        kept = []
        for ex in examples:
            if ex.ids.size > config.seq_len:
                self.truncated += 1
                ex = Example(ids=ex.ids[:config.seq_len], labels=ex.labels[:config.seq_len])
            if not (ex.labels[1:] != IGNORE).any():  # the model predicts labels[1:] from ids[:-1]
                self.dropped += 1
                continue
            kept.append(ex)
        if not kept:
            raise ValueError(f"{source}: no example has a token in the loss within seq_len {config.seq_len} "
                             f"({self.dropped} of {len(examples)} dropped)")
        held = self._held_out(kept, config)
        self.train = [ex for i, ex in enumerate(kept) if i not in held]
        self.val = [kept[i] for i in sorted(held)]
        digest = hashlib.sha256()
        for ex in kept:
            digest.update(ex.ids.tobytes())
            digest.update(ex.labels.tobytes())
        self.sha256 = digest.hexdigest()[:16]

    @staticmethod
    def _held_out(kept: list[Example], config: Config) -> set[int]:
        """Indices of the examples held out for validation: those whose hash falls under ``val_fraction`` (a split
        that does not depend on the order or the other examples), at most ``val_max_examples`` of them (the lowest
        hashes; the rest train, so every kept example is used), and at least one when ``val_fraction`` > 0 and
        there are two or more examples -- a small file must not lose its validation without a word."""
        if config.val_fraction <= 0 or len(kept) < 2:
            return set()
        hashes = sorted((zlib.crc32(ex.ids.tobytes()) / 2**32, i) for i, ex in enumerate(kept))
        n = sum(h < config.val_fraction for h, _ in hashes)
        n = min(max(n, 1), config.val_max_examples, len(kept) - 1)
        return {i for _, i in hashes[:n]}

    @classmethod
    def load(cls, source: str, tokenizer, config: Config) -> "SupervisedData":
        """From ``builtin:docstrings`` or a record file (a format of [Note: record formats])."""
        tok = ExampleTokenizer(tokenizer, train_on_prompt=config.train_on_prompt)
        common = dict(tokenizer="bytes" if tokenizer is None else type(tokenizer).__name__, pad_id=tok.pad_id)
        if source.startswith("builtin:"):
            name = source.split(":", 1)[1]
            if name not in BUILTIN_SETS:
                raise ValueError(f"--data {source}: no such built-in data set (known: "
                                 f"{', '.join('builtin:' + n for n in BUILTIN_SETS)})")
            pairs = docstring_pairs()
            examples = [tok.prompt_completion(p, c) for p, c in pairs]
            import sysconfig

            what = (f"builtin:docstrings ({len(pairs)} signature -> docstring pairs from the standard library of "
                    f"Python {sysconfig.get_python_version()})")
            return cls(examples, config, source=what, fmt="prompt/completion", records=len(pairs), **common)
        examples, fmt, first = [], None, None
        for where, record in read_records(source):
            if fmt is None:
                fmt, first = detect_format(where, record), where
            else:
                missing = [k for k in FORMATS[fmt] if k not in record]
                if missing:
                    raise DatasetError(where, missing[0], f"missing (the file's records are {fmt}, detected "
                                       f"from {first})")
            examples.append(tok.record(where, record, fmt))
        if not examples:
            raise ValueError(f"data file {source} holds no records")
        return cls(examples, config, source=f"{source} ({len(examples)} {fmt} records)", fmt=fmt,
                   records=len(examples), **common)

    @property
    def max_token_id(self) -> int:
        return max(int(ex.ids.max()) for ex in self.train + self.val)

    def info(self) -> dict:
        """Where the data came from, for checkpoints (resume refuses other data) and ``--json``."""
        return {"source": self.source, "format": self.format, "tokenizer": self.tokenizer, "records": self.records,
                "train_examples": len(self.train), "val_examples": len(self.val), "truncated": self.truncated,
                "dropped": self.dropped, "seq_len": self.config.seq_len, "pack": self.config.pack,
                "tokens": int(sum(ex.ids.size for ex in self.train)),
                "loss_tokens": int(sum((ex.labels[1:] != IGNORE).sum() for ex in self.train)), "sha256": self.sha256}

    def summary(self) -> str:
        return (f"data: {self.records} records ({self.format}), {len(self.train)} for training, {len(self.val)} held "
                f"out for validation; {self.truncated} truncated to {self.config.seq_len} tokens, {self.dropped} "
                f"dropped (nothing left to learn)")

    def batches(self, batch_size: int, seed: int = 0) -> "ExampleBatches":
        return ExampleBatches(self.train, batch_size=batch_size, pad_id=self.pad_id, seed=seed,
                              pack_len=self.config.seq_len if self.config.pack else None)

    def val_batches(self, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [pad_batch(self.val[i:i + batch_size], self.pad_id) for i in range(0, len(self.val), batch_size)]


def pad_batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)``, right-padded to the longest example. See [Note: padding and packing]."""
    width = max(ex.ids.size for ex in examples)
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    labels = np.full((len(examples), width), IGNORE, dtype=np.int64)
    for row, ex in enumerate(examples):
        ids[row, :ex.ids.size] = ex.ids
        labels[row, :ex.labels.size] = ex.labels
    return torch.from_numpy(ids), torch.from_numpy(labels)


def pack_rows(examples: list[Example], seq_len: int) -> list[list[Example]]:
    """``examples`` in order, next-fit into rows of at most ``seq_len`` tokens. See [Note: padding and packing]."""
    rows: list[list[Example]] = []
    used = seq_len + 1
    for ex in examples:
        if ex.ids.size > seq_len:
            raise ValueError(f"pack: an example of {ex.ids.size} tokens does not fit a row of seq_len {seq_len}")
        if used + ex.ids.size > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(ex)
        used += ex.ids.size
    return rows


def packed_batch(rows: list[list[Example]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, labels, position_ids)`` of packed rows, right-padded to the longest row: positions restart at
    every example, its first token is outside the loss, pads continue the row's last positions. See [Note:
    padding and packing]."""
    width = max(sum(ex.ids.size for ex in row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for ex in row:
            n = ex.ids.size
            ids[r, at:at + n] = ex.ids
            labels[r, at:at + n] = ex.labels
            labels[r, at] = IGNORE  # nothing in this example predicts its first token
            positions[r, at:at + n] = np.arange(n)
            at += n
        if at < width:
            start = positions[r, at - 1] + 1 if at else 0
            positions[r, at:] = np.arange(start, start + width - at)
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(positions)


class ExampleBatches:
    """Batch ``step`` is a pure function of (seed, step): epochs in a seeded order, so a resumed run sees the
    batches an uninterrupted one would. ``pack_len``: rows of examples packed up to that many tokens (an epoch
    is then its packed rows, in order) instead of one example per row; see [Note: padding and packing]."""

    def __init__(self, examples: list[Example], *, batch_size: int, pad_id: int, seed: int = 0,
                 pack_len: int | None = None):
        if not examples:
            raise ValueError("no training examples")
        if pack_len is not None and pack_len < 2:
            raise ValueError(f"pack_len: must be >= 2 tokens, got {pack_len}")
        self.examples, self.batch_size, self.pad_id, self.seed = examples, batch_size, pad_id, seed
        self.pack_len = pack_len
        self._orders: dict[int, np.ndarray] = {}
        self._rows: dict[int, list[list[Example]]] = {}   # the packed rows of the epoch in use
        self._row_counts: list[int] = []                  # packed rows of epochs 0, 1, ... (as far as seen)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))}
        return self._orders[epoch]

    def _epoch_rows(self, epoch: int) -> list[list[Example]]:
        if epoch not in self._rows:
            self._rows = {epoch: pack_rows([self.examples[i] for i in self._order(epoch)], self.pack_len)}
        return self._rows[epoch]

    def _row(self, index: int) -> list[Example]:
        """Packed row ``index`` counted over epochs (each epoch's rows from its own order)."""
        epoch = 0
        while True:
            if epoch == len(self._row_counts):
                self._row_counts.append(len(self._epoch_rows(epoch)))
            if index < self._row_counts[epoch]:
                return self._epoch_rows(epoch)[index]
            index -= self._row_counts[epoch]
            epoch += 1

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        """``(input_ids, labels)``; packed: ``(input_ids, labels, position_ids)``."""
        picks = [step * self.batch_size + j for j in range(self.batch_size)]
        if self.pack_len is not None:
            return packed_batch([self._row(i) for i in picks], self.pad_id)
        n = len(self.examples)
        return pad_batch([self.examples[self._order(i // n)[i % n]] for i in picks], self.pad_id)

    def step_inputs(self, step: int) -> dict:
        """The keyword arguments of ``Trainer.step`` for batch ``step`` (a micro-batch of
        ``Trainer.step_accumulated``)."""
        if self.pack_len is not None:
            ids, labels, positions = self.batch(step)
            return {"input_ids": ids, "labels": labels, "position_ids": positions}
        ids, labels = self.batch(step)
        return {"input_ids": ids, "labels": labels}


def validation_loss(trainer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean loss per predicted token over held-out batches (``trainer.loss`` is a mean per batch, so each
    batch is weighted by its tokens in the loss)."""
    total = count = 0.0
    for ids, labels in batches:
        n = float((labels[:, 1:] != IGNORE).sum())
        total += trainer.loss(ids, labels) * n
        count += n
    return total / count if count else float("nan")

