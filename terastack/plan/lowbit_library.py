"""bitsandbytes, the library of terastack's low-bit formats (8-bit AdamW state, the NF4 LoRA base), imported in
one place with one error when it is missing (its Hub-kernel warning: [Note: bitsandbytes' Hub kernel warning] in
terastack/__init__.py)."""
from __future__ import annotations

INSTALL_HINT = "pip install 'terastack[lowbit]'"


def bitsandbytes_functional(needed_by: str):
    """``bitsandbytes.functional``; ImportError naming ``needed_by`` (a setting and its value) when it is absent."""
    try:
        import bitsandbytes.functional as functional
    except ImportError as exc:
        raise ImportError(f"{needed_by}: needs bitsandbytes >= 0.50 ({INSTALL_HINT}): {exc}") from None
    return functional
