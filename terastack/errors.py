"""Errors every layer shares, below all of them: the storage engine, the store, the planners and the engines
raise and catch these, so they live where each of those may import them (this module imports only the bottom
:mod:`terastack.units`).
"""
from __future__ import annotations

from terastack.units import format_bytes


class BudgetError(MemoryError):
    """A placement or allocation does not fit its budget. Names the budget and the shortfall."""

    def __init__(self, budget: str, *, needed: int, available: int, limit: int, what: str = ""):
        self.budget = budget
        self.needed = needed
        self.available = available
        self.limit = limit
        self.shortfall = needed - available
        subject = f" for {what}" if what else ""
        super().__init__(
            f"{budget} budget exceeded{subject}: needs {format_bytes(needed)}, "
            f"{format_bytes(available)} free of {format_bytes(limit)} "
            f"(short by {format_bytes(self.shortfall)})")


class Notice(UserWarning):
    """Something the user should know that is not an error (a model family the tests do not verify): a warning to
    a library's caller, one line on the command line (``terastack.cli`` shows it without a source line)."""
