"""terastack.repro: the reproduction harness (``terastack repro``) and the DaCe data-centric Python suite.

Nothing here imports torch or the engines at module level: the DaCe runner
imports :mod:`terastack.repro.dace` from a separate environment that has
neither (see :mod:`terastack.repro.dace.env`).
"""
