"""How much pinned host memory a store stages transfers through, decided with the plan (the planner reserves it in
the host budget on an accelerator; the store's pinned staging is cut from it: [Note: pinned staging] in
terastack.io.cuda)."""
from __future__ import annotations


def staging_cap(largest_record: int, host_budget: int, *, in_flight: int = 2, share: float = 0.125) -> int:
    """The pinned staging cap of a store whose largest record is ``largest_record`` bytes, within ``host_budget``.

    Staging goes chunk by chunk ([Note: pinned staging] in terastack.io.cuda), so any cap of one chunk or more
    moves any record; the cap sets how many bytes are in flight at once. It is enough for ``in_flight`` of the
    largest records, at most ``share`` of the host budget (pinned pages are host memory and counted in its
    ledger) and at most 1 GiB, and at least two 4 KiB chunks; a power of two, like the chunks it is cut into."""
    if largest_record < 0 or host_budget < 0:
        raise ValueError(f"largest_record, host_budget: must be >= 0; got {largest_record}, {host_budget}")
    want = min(in_flight * largest_record, int(host_budget * share), 1 << 30)
    want = max(want, 8192)
    return 1 << (int(want).bit_length() - 1)
