"""``terastack bench io`` and ``terastack bench io-cpu``: the storage engine against fio and the CPU it spends."""
