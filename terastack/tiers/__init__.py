"""terastack.tiers: named tensors across device, host and SSD, with budgets per tier.

The store (:class:`TieredStore`) composes the record state machine (``record``), the buffer pool
(``pool``), the on-disk layout and manifest over one or more directories (``layout``) and the policy
that places extents on those directories (``placement``). See docs/tiers.md.
"""
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.extents import Extent, ExtentAllocator
from terastack.tiers.layout import StoreLayout
from terastack.tiers.placement import PlacementPolicy, StripeBySize
from terastack.tiers.pool import BufferPool
from terastack.tiers.record import Fetch, RecordInfo, State, TensorRecord, Tier
from terastack.tiers.store import TieredStore
from terastack.tiers.versions import Commit

__all__ = ["BudgetLedger", "BufferPool", "Commit", "Extent", "ExtentAllocator", "Fetch", "PlacementPolicy", "RecordInfo",
           "State", "StoreLayout", "StripeBySize", "TensorRecord", "Tier", "TieredStore"]
