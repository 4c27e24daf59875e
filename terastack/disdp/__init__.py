"""terastack.disdp: disaggregated model-sharded data parallelism over torch.distributed.

Workers only compute; a communication agent per worker fetches parameters and
pushes gradients off the compute path; an aggregator reduces the workers'
gradients before they reach the parameter servers; parameter-server shards hold
the fp32 master weights and AdamW moments (in memory or on SSD) and apply the
update. See :mod:`terastack.disdp.run` for how one training step flows.
"""
from terastack.disdp.roles import Role, RoleMap

__all__ = ["Role", "RoleMap"]
