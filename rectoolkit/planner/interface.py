"""TorchRec's planner interface (torchrec.distributed.types.ShardingPlanner): EmbeddingShardingPlanner is one, and a
planner of your own that subclasses it plugs in where TorchRec's would."""

from __future__ import annotations

import abc
from typing import Any, List

from torch import nn


class ShardingPlanner(abc.ABC):
    """Plans sharding (TorchRec's interface): `plan` on this process, `collective_plan` on rank 0, then shared."""

    @abc.abstractmethod
    def plan(self, module: nn.Module, sharders: List[Any]) -> Any:
        """The ShardingPlan for `module` with these sharders."""

    @abc.abstractmethod
    def collective_plan(self, module: nn.Module, sharders: List[Any]) -> Any:
        """plan() on rank 0, broadcast to every rank."""
