"""terastack.tiers: named tensors across device, host and SSD, with budgets per tier."""
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.extents import Extent, ExtentAllocator
from terastack.tiers.store import Fetch, Placement, RecordInfo, State, TensorRecord, Tier, TieredStore

__all__ = ["BudgetLedger", "Extent", "ExtentAllocator", "Fetch", "Placement", "RecordInfo", "State", "TensorRecord", "Tier", "TieredStore"]
