"""Instruction and chat data: record formats, the loss mask, truncation, refusals, builtin:docstrings, the CLI."""
import json

import numpy as np
import pytest

from terastack.training.data.stdlib_corpus import BOS, EOS, PAD
from terastack.training.data.record_files import DatasetError, read_records
from terastack.training.data.examples import (IGNORE, ExampleTokenizer, SupervisedData, docstring_pairs, pad_batch,
                                      validation_loss)

from ..chat_tokenizer import WORDS, save_chat_tokenizer

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "fine"}, {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "fine fine"}]


def byte_ids(text: str) -> list[int]:
    return list(text.encode())


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def hf_tokenizer(tmp_path):
    """A word-level tokenizer with a chat template, built locally (no download) and loaded back from disk."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_chat_tokenizer(tmp_path / "tok"))


# ---------------------------------------------------------------- formats, masks, EOS
def test_byte_tokenizer_masks_by_hand():
    tok = ExampleTokenizer()
    ex = tok.prompt_completion("f(x)\n", "Return x.")
    expect_ids = [BOS] + byte_ids("f(x)\n") + byte_ids("Return x.") + [EOS]
    assert ex.ids.tolist() == expect_ids
    assert ex.labels.tolist() == [IGNORE] * 6 + byte_ids("Return x.") + [EOS]
    # conversations: "<|role|>\n" + content + EOS per message; assistant content and its EOS in the loss
    ex = tok.chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    head_u, head_a = byte_ids("<|user|>\n"), byte_ids("<|assistant|>\n")
    assert ex.ids.tolist() == [BOS] + head_u + byte_ids("hi") + [EOS] + head_a + byte_ids("yo") + [EOS]
    assert ex.labels.tolist() == [IGNORE] * (1 + len(head_u) + 3 + len(head_a)) + byte_ids("yo") + [EOS]
    assert ExampleTokenizer(train_on_prompt=True).chat(CHAT[1:3]).labels.tolist() == \
        ExampleTokenizer().chat(CHAT[1:3]).ids.tolist()
    ex = tok.text("abc")
    assert ex.ids.tolist() == ex.labels.tolist() == [BOS, 97, 98, 99, EOS]


def test_chat_template_mask_by_hand(hf_tokenizer, monkeypatch):
    tok = ExampleTokenizer(hf_tokenizer)
    ex = tok.chat(CHAT)
    w = {word: i for i, word in enumerate(WORDS)}
    seq = ("<s> <|system|> be brief <|end|> <|user|> hi there <|end|> <|assistant|> fine <|end|> "
           "<|user|> how are you <|end|> <|assistant|> fine fine <|end|> </s>").split()
    assert ex.ids.tolist() == [w[s] for s in seq]
    # in the loss: each assistant turn's content and its end-of-turn marker, and the final EOS
    trained = {10, 11, 18, 19, 20, 21}
    assert ex.labels.tolist() == [w[s] if i in trained else IGNORE for i, s in enumerate(seq)]
    assert ex.ids[-1] == hf_tokenizer.eos_token_id
    monkeypatch.setattr(type(hf_tokenizer), "is_fast", False)  # no offsets: the token-count path
    slow = tok.chat(CHAT)
    assert slow.ids.tolist() == ex.ids.tolist() and slow.labels.tolist() == ex.labels.tolist()
    monkeypatch.undo()
    ex = tok.prompt_completion("tell me", "fine")
    assert ex.ids.tolist() == [w["tell"], w["me"], w["fine"], w["</s>"]]
    assert ex.labels.tolist() == [IGNORE, IGNORE, w["fine"], w["</s>"]]


@pytest.mark.parametrize("record, fmt", [
    ({"text": "hello"}, "text"),
    ({"prompt": "p", "completion": "c"}, "prompt/completion"),
    ({"messages": CHAT}, "openai messages"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}, "sharegpt"),
    ({"instruction": "add", "input": "1 2", "output": "3"}, "alpaca"),
])
def test_each_format_is_detected_and_tokenized(tmp_path, record, fmt):
    path = write_jsonl(tmp_path / "d.jsonl", [record] * 3)
    data = SupervisedData.load(path, None, SupervisedData.Config(seq_len=4096, val_fraction=0))
    assert data.format == fmt and data.records == 3 and len(data.train) == 3 and not data.val
    ex = data.train[0]
    assert ex.ids[-1] == EOS and ex.labels[-1] == EOS
    text = bytes(int(i) for i in ex.ids if i < 256).decode()
    trained = bytes(int(i) for i in ex.labels if 0 <= i < 256).decode()
    if fmt == "sharegpt":
        assert text == "<|user|>\nhi<|assistant|>\nyo" and trained == "yo"
    elif fmt == "alpaca":
        assert "### Instruction:\nadd" in text and "### Input:\n1 2" in text and trained == "3"
    elif fmt == "openai messages":
        assert trained == "finefine fine" and "<|system|>\nbe brief" in text
    else:
        assert trained == record.get("completion", record.get("text"))


def test_json_array_and_parquet_files(tmp_path):
    recs = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(4)]
    (tmp_path / "d.json").write_text(json.dumps(recs, indent=1))
    got = list(read_records(tmp_path / "d.json"))
    assert [r for _, r in got] == recs and got[1][0].endswith("d.json:6")  # "[", then 4 lines a record
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(recs), str(tmp_path / "d.parquet"))
    data = SupervisedData.load(str(tmp_path / "d.parquet"), None, SupervisedData.Config(seq_len=64, val_fraction=0))
    assert data.format == "prompt/completion" and data.records == 4


def test_truncation_and_dropping_are_counted(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p" * 5, "completion": "c" * 50},   # truncated
                                              {"prompt": "p" * 40, "completion": "c"},        # no loss left
                                              {"prompt": "p", "completion": "c"}])
    data = SupervisedData.load(path, None, SupervisedData.Config(seq_len=16, val_fraction=0))
    assert data.truncated == 2 and data.dropped == 1 and len(data.train) == 2
    assert all(ex.ids.size <= 16 for ex in data.train)
    assert "2 truncated to 16 tokens, 1 dropped" in data.summary()
    ids, labels = pad_batch(data.train, data.pad_id)
    assert ids.shape == (2, 16) and ids[1, 4:].eq(PAD).all() and labels[1, 4:].eq(IGNORE).all()


@pytest.mark.parametrize("lines, where, match", [
    (['{"prompt": "a", "completion": "b"}', '{"prompt": "a", "completion": 3}'], ":2", "'completion': must be a string"),
    (['{"prompt": "a", "completion": "b"}', '', '{"prompt": "a"'], ":3", "not valid JSON"),
    (['{"messages": [{"role": "user", "content": "x"}]}'], ":1", "'messages': no assistant message"),
    (['{"messages": [{"role": "user"}]}'], ":1", r"'messages\[0\].content': missing"),
    (['{"conversations": [{"from": "robot", "value": "x"}]}'], ":1", "'conversations\\[0\\].from': unknown speaker"),
    (['{"text": "a"}', '{"prompt": "a", "completion": "b"}'], ":2", "'text': missing .*text, detected from .*:1"),
    (['{"question": "a"}'], ":1", "no known record format"),
    (['[1, 2]'], ":1", "must be a JSON object"),
])
def test_malformed_records_name_file_line_and_field(tmp_path, lines, where, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=match) as info:
        SupervisedData.load(str(path), None, SupervisedData.Config(seq_len=64))
    assert str(info.value).startswith(f"{path}{where}:") and "\n" not in str(info.value)


@pytest.mark.parametrize("line, at", [
    ('{"prompt": "a",}', "}"),                   # a trailing comma: the brace where a name was expected
    ('{"prompt": "unterminated', '"unt'),        # an unterminated string: where it starts, not past the line's end
    ('{"prompt": "ünï", x}', "x"),               # columns count characters, not bytes
    ('\t{"prompt" "a"}', '"a"'),                 # a missing colon after leading whitespace
    ('{"prompt": "a"} {"completion": "b"}', '{"c'),  # two records on one line
])
def test_malformed_json_names_the_line_and_column(tmp_path, line, at):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        list(read_records(path))
    message = str(info.value)
    assert message.startswith(f"{path}:3:") and f" at column {line.index(at) + 1})" in message, message
    assert " at at " not in message


def test_malformed_json_array_names_the_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n {"text": "a"},\n {"text": "a" "b"}\n]\n')
    with pytest.raises(DatasetError, match=r"bad.json:3: not valid JSON \(Expecting ',' delimiter at column 15\)"):
        list(read_records(path))


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import sys

    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"needs pyarrow: pip install 'terastack\[llm-data\]'"):
        list(read_records(tmp_path / "d.parquet"))


# ---------------------------------------------------------------- batches, validation, the built-in set
def test_batches_are_deterministic_and_cover_an_epoch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}:", "completion": "x" * i} for i in range(1, 11)])
    data = SupervisedData.load(path, None, SupervisedData.Config(seq_len=64, val_fraction=0))
    b = data.batches(2, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(b.batch(4), data.batches(2, seed=3).batch(4)))
    seen = sorted(bytes(int(t) for t in ids if t < 256).decode() for s in range(5) for ids in b.batch(s)[0])
    assert seen == sorted(f"{i}:" + "x" * i for i in range(1, 11))


def test_validation_loss_weights_batches_by_tokens():
    class FakeTrainer:
        def loss(self, ids, labels):
            return float(ids.shape[1])

    tok = ExampleTokenizer()
    a, b = pad_batch([tok.text("ab")], PAD), pad_batch([tok.text("abcdef")], PAD)
    # batch a: 3 predicted tokens, loss 4; batch b: 7 predicted tokens, loss 8
    assert validation_loss(FakeTrainer(), [a, b]) == pytest.approx((3 * 4 + 7 * 8) / 10)


def test_builtin_docstrings_are_real_pairs():
    pairs = docstring_pairs()
    assert len(pairs) > 500
    # the same pairs on every parse, in file order: a fresh parse of the first files gives the first pairs
    first = docstring_pairs(max_files=40)
    assert 0 < len(first) < len(pairs) and first == pairs[:len(first)]
    prompts = dict(pairs)
    assert prompts["textwrap.dedent(text)\n"].startswith("Remove any common leading whitespace")
    data = SupervisedData.load("builtin:docstrings", None, SupervisedData.Config(seq_len=128))
    assert 0 < len(data.val) <= 64 and len(data.train) > 10 * len(data.val) and data.format == "prompt/completion"
    with pytest.raises(ValueError, match="no such built-in data set"):
        SupervisedData.load("builtin:nothing", None, SupervisedData.Config(seq_len=128))


# ---------------------------------------------------------------- the CLI
def test_finetune_on_chat_jsonl_through_the_cli(tmp_path, capsys, hardware_file, hf_tokenizer):
    from terastack.cli import main

    from .llm_helpers import make_model

    model_dir = tmp_path / "model"
    make_model("llama", model_dir, layers=2)
    hf_tokenizer.save_pretrained(str(model_dir))
    capsys.readouterr()  # what importing transformers' integrations printed (deepspeed, where installed)
    (tmp_path / "t.toml").write_text(f"[offload]\ncalibrate = false\nhardware = {json.dumps(hardware_file)}\n"
                                     "[store]\ndevice_budget = \"64MiB\"\nhost_budget = \"64MiB\"\n")
    words = ["hi", "there", "how", "are", "you", "fine"]
    chats = [{"messages": [{"role": "user", "content": f"{a} {b}"}, {"role": "assistant", "content": f"{b} {c}"}]}
             for a in words for b in words[:2] for c in words[:2]]
    path = write_jsonl(tmp_path / "chat.jsonl", chats)
    args = ["finetune", "--model", str(model_dir), "--config", str(tmp_path / "t.toml"), "--seq-len", "32",
            "--batch-size", "2", "--store", str(tmp_path / "store"), "--val-fraction", "0.3"]
    assert main(args + ["--data", path, "--steps", "2", "--json", "--save", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["steps"] == 2 and len(r["losses"]) == 2 and r["data"]["format"] == "openai messages"
    assert r["data"]["tokenizer"] != "bytes" and r["data"]["records"] == 24
    assert r["val_loss_first"] > 0 and r["val_loss_last"] > 0 and "validation loss before" in captured.err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tuned = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert AutoTokenizer.from_pretrained(str(tmp_path / "out")).apply_chat_template(CHAT[1:3], tokenize=False) == \
        hf_tokenizer.apply_chat_template(CHAT[1:3], tokenize=False)
    assert tuned.config.vocab_size == 96
    capsys.readouterr()  # transformers' loading progress
    # a malformed record: one line naming file, line and field; nothing trained or exported
    bad = write_jsonl(tmp_path / "bad.jsonl", chats[:3] + [{"messages": [{"role": "user", "content": 1}]}])
    assert main(args + ["--data", bad, "--steps", "2", "--save", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4: field 'messages[0].content'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()


def test_a_chatml_conversation_ends_with_one_end_marker(tmp_path):
    """ChatML (each turn ends ``<|im_end|>`` then a newline, ``NL`` here) with ``<|im_end|>`` as EOS: the template closes every
    assistant turn itself, so nothing is appended after the trailing newline -- one end marker, in the loss."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<|im_start|>", "<|im_end|>", "<pad>", "<unk>", "user", "assistant", "hi", "there", "fine", "NL"]
    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} NL {{ m['content'] }} <|im_end|> NL "
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant NL {% endif %}")
    tok.save_pretrained(str(tmp_path / "tok"))
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    ex = ExampleTokenizer(hf).chat([{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "fine"}])
    w = {word: i for i, word in enumerate(words)}
    seq = "<|im_start|> user NL hi there <|im_end|> NL <|im_start|> assistant NL fine <|im_end|> NL".split()
    assert ex.ids.tolist() == [w[s] for s in seq]
    assert ex.ids.tolist().count(w["<|im_end|>"]) == 2            # one per turn, none appended
    assert [i for i in ex.labels.tolist() if i != IGNORE] == [w["fine"], w["<|im_end|>"], w["NL"]]


def test_held_out_counts_add_up_and_a_small_file_keeps_its_validation(tmp_path):
    """Every record is accounted for (training + held out + dropped); a file too small for ``val_fraction`` to
    pick an example by hash still holds one out; a cap on the held-out set returns the rest to training."""
    records = [{"prompt": f"p{i}", "completion": f"answer {i}"} for i in range(30)]
    records.append({"prompt": "x" * 300, "completion": "late"})   # dropped: no token in the loss within seq_len
    path = write_jsonl(tmp_path / "d.jsonl", records)
    data = SupervisedData.load(path, None, SupervisedData.Config(seq_len=256))
    assert len(data.val) >= 1
    assert len(data.train) + len(data.val) + data.dropped == data.records == 31 and data.dropped == 1
    many = write_jsonl(tmp_path / "m.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(400)])
    capped = SupervisedData.load(many, None, SupervisedData.Config(seq_len=256, val_fraction=0.5, val_max_examples=7))
    assert len(capped.val) == 7 and len(capped.train) == 393
    off = SupervisedData.load(many, None, SupervisedData.Config(seq_len=256, val_fraction=0))
    assert not off.val and len(off.train) == 400
