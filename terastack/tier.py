"""The memory tiers every layer names, below all of them: the store keeps records in them, the planners place
state in them, the engines move tensors between them. This module imports nothing, so the cost models in
:mod:`terastack.plan` can type their homes with it without importing the store (``terastack.tiers`` re-exports
it)."""
from __future__ import annotations

import enum


class Tier(str, enum.Enum):
    DEVICE = "device"
    HOST = "host"
    SSD = "ssd"
