"""bitsandbytes, the library of terastack's low-bit formats (8-bit AdamW state, the NF4 LoRA base), imported in
one place with one error when it is missing.

Importing it on a CPU with AVX-512 BF16 asks the ``kernels`` package for a 4-bit matmul kernel from the Hugging
Face Hub and logs a warning when that is refused (always, here: nothing is downloaded at run time). terastack
never calls that kernel (it dequantizes NF4 weights itself and uses only the blockwise functions), so the
warning would only tell a user about a path their run does not take; it is kept out of their output.
"""
from __future__ import annotations

import logging

#: the logger bitsandbytes' CPU backend warns through when its optional Hub kernel is not loaded
_CPU_BACKEND_LOGGER = "bitsandbytes.backends.cpu.ops"
INSTALL_HINT = "pip install 'terastack[lowbit]'"


def bitsandbytes_functional(needed_by: str):
    """``bitsandbytes.functional``; ImportError naming ``needed_by`` (a setting and its value) when it is absent."""
    backend_log = logging.getLogger(_CPU_BACKEND_LOGGER)
    level = backend_log.level
    backend_log.setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as functional
    except ImportError as exc:
        raise ImportError(f"{needed_by}: needs bitsandbytes >= 0.50 ({INSTALL_HINT}): {exc}") from None
    finally:
        backend_log.setLevel(level)
    return functional
