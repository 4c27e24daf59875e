"""bitsandbytes, the library of terastack's low-bit formats (8-bit AdamW state, the NF4 LoRA base), imported in
one place with one error when it is missing (its Hub-kernel warning: [Note: bitsandbytes' Hub kernel warning] in
terastack/__init__.py)."""
from __future__ import annotations

INSTALL_HINT = "pip install 'terastack[lowbit]'"


def bitsandbytes_functional(needed_by: str):
    """``bitsandbytes.functional``; ImportError naming ``needed_by`` (a setting and its value) when it is absent."""
    try:
        import bitsandbytes.functional as functional
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "bitsandbytes":
            raise ImportError(f"{needed_by}: importing bitsandbytes failed ({exc})") from None
        raise ImportError(f"{needed_by}: needs bitsandbytes >= 0.50, which is not installed: {INSTALL_HINT}") \
            from None
    except ImportError as exc:  # installed but broken (a version without what terastack calls)
        raise ImportError(f"{needed_by}: needs bitsandbytes >= 0.50 ({INSTALL_HINT}): {exc}") from None
    return functional
