"""The low-bit formats' library, imported in one place."""
from __future__ import annotations

import pytest


def test_a_missing_bitsandbytes_is_one_error_naming_the_setting_and_the_install(monkeypatch):
    import sys

    from terastack.plan.lowbit_library import bitsandbytes_functional

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)        # as if it were not installed
    monkeypatch.setitem(sys.modules, "bitsandbytes.functional", None)
    with pytest.raises(ImportError, match=r"optimizer adamw8bit: needs bitsandbytes >= 0.50, which is not "
                                          r"installed: pip install 'terastack\[lowbit\]'"):
        bitsandbytes_functional("optimizer adamw8bit")
