"""What a failed child process left behind: the last lines of its log, for the reason a report gives."""
from __future__ import annotations


def last_lines(text: str, count: int, *, skip: str = "") -> str:
    """The last ``count`` lines of a child's output, without those containing ``skip`` (its warnings' noise)."""
    return "".join(line for line in text.splitlines(True)[-count:] if not skip or skip not in line)
