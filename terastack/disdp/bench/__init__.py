"""``terastack bench dist`` and ``terastack bench dist-interference``: the disaggregated engine against FSDP2 and
serial ZeRO-3, its parameter server as workers grow, and a collective's cost to the compute beside it."""
