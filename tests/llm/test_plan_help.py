"""``terastack plan llm --help`` describes every option."""
from __future__ import annotations

import argparse

import pytest

from terastack.cli import main
from terastack.llm.plan_cmd import add_arguments


def test_every_plan_option_has_help_text():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert bare == []


def test_help_describes_seq_len_and_batch_size(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "llm", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--seq-len SEQ_LEN tokens per row of a micro-batch" in out
    assert "--batch-size BATCH_SIZE rows per micro-batch" in out
