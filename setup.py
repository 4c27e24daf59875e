"""Builds the native I/O core. It is a plain C library loaded with ctypes (no Python or
PyTorch headers); ``optional=True`` lets the install succeed without a compiler, in
which case terastack runs on its pure-Python backend and says so."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "terastack.io._tsio",
            sources=["terastack/io/csrc/tsio.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
            libraries=["pthread"],
            optional=True,
        )
    ]
)
