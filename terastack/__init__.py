"""terastack: train models and data larger than memory on hardware people can afford."""
import logging as _logging

__version__ = "0.1.0"

# [Note: bitsandbytes' Hub kernel warning]
# Importing bitsandbytes (transformers and peft import it whenever it is installed) on a CPU with AVX-512 BF16
# asks for a 4-bit matmul kernel from the Hugging Face Hub and logs a warning when that is refused, as it always
# is here: terastack downloads nothing at run time. terastack never calls that kernel (it dequantizes NF4 itself
# and uses only bitsandbytes' blockwise functions), so the line would tell a user about a path their run does
# not take. Only that logger is quieted, and only below ERROR.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
