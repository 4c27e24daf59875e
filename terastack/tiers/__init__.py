"""terastack.tiers: named tensors across device, host and SSD, with budgets per tier."""
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.extents import Extent, ExtentAllocator
from terastack.tiers.store import Placement, State, TensorRecord, Tier, TieredStore

__all__ = ["BudgetLedger", "Extent", "ExtentAllocator", "Placement", "State", "TensorRecord", "Tier", "TieredStore"]
