"""Fixtures of the terastack.hf tests (helpers live in hf_helpers.py)."""
import pytest

from ..chat_tokenizer import save_chat_tokenizer
from ..described_machine import write_machine


@pytest.fixture
def hardware_file(tmp_path):
    """A fixed machine description: the engine plans for it, without probing this machine."""
    return write_machine(tmp_path / "hw.json")


#: the tests' chat template with generation markers around the assistant's turns (what assistant_only_loss reads)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|> {% generation %}"
            "{{ m['content'] }} <|end|> {% endgeneration %}{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The word-level chat tokenizer (tests/chat_tokenizer.py) with that template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_chat_tokenizer(tmp_path_factory.mktemp("tok")))
    tok.chat_template = TEMPLATE
    return tok
