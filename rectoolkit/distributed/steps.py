"""The three steps of each sharding group as small modules, TorchRec's `_input_dists`, `_lookups`, `_output_dists`.

A sharded collection runs one group per sharding type (group.py); TorchRec code inspects a sharded module
through three lists with one entry per group. These modules are those entries: each calls its group's step, so
running them by hand gives what forward does, step by step:

    received = sharded._input_dists[0](batch)      # ids to the owners of the shards (all-to-all)
    looked_up = sharded._lookups[0](received)      # this rank's shards, one batched kernel call
    block, where = sharded._output_dists[0](looked_up, received)   # results back to the ranks that asked

They hold no parameters of their own (the group does), so state_dict and parameters() are unchanged.
"""

from typing import Any, List

import torch
from torch import nn


class _GroupStep(nn.Module):
    """One step of one sharding group; the group is referenced, not registered (its weights stay in one place)."""

    what = ""

    def __init__(self, group: nn.Module) -> None:
        super().__init__()
        self.__dict__["_group"] = group  # not a submodule: state_dict/parameters() must not see the shards twice

    def extra_repr(self) -> str:
        group = self._group
        tables = [t.name for t in group.tables]
        return f"{group.sharding_type.value}, tables={tables}, rank={group.env.rank}/{group.env.world_size}: {self.what}"


class InputDist(_GroupStep):
    """input_dist of a group: this rank's ids of the group's features to the ranks owning their shards."""

    what = "ids to the shards' owners (all-to-all)"

    def forward(self, batch: Any) -> Any:
        return self._group.input_dist(batch)


class Lookup(_GroupStep):
    """lookup of a group: the owner's shards, looked up (pooled) in one batched kernel call."""

    what = "this rank's shards, one batched kernel call"

    def forward(self, received: Any) -> Any:
        return self._group.lookup(received)


class OutputDist(_GroupStep):
    """output_dist of a group: results back to the ranks that sent the ids, with their output positions."""

    what = "results back to the ranks that asked"

    def forward(self, looked_up: Any, received: Any) -> Any:
        return self._group.output_dist(looked_up, received)


class RunGroups(_GroupStep):
    """All groups of a sharded collection, start to end (the collection's forward without the awaitable).

    A child module so that rectoolkit.fx can keep a sharded collection whole when it is the module being traced.
    """

    what = "every group: input_dist -> lookup -> output_dist"

    def extra_repr(self) -> str:
        return f"{type(self._group).__name__}: {self.what}"

    @torch.jit.ignore  # a Python call inside TorchScript (see rectoolkit.fx)
    def forward(self, features: Any) -> Any:
        return self._group._outputs(features)


def group_steps(groups: nn.ModuleDict) -> "tuple[List[InputDist], List[Lookup], List[OutputDist]]":
    """The three lists, in the order the groups run."""
    groups = list(groups.values())
    return [InputDist(g) for g in groups], [Lookup(g) for g in groups], [OutputDist(g) for g in groups]


def steps_repr(sharded: nn.Module) -> List[str]:
    """TorchRec's layout of a sharded module's printout: (lookups), (_input_dists), (_output_dists)."""
    lines = []
    for key, modules in (("lookups", sharded._lookups), ("_input_dists", sharded._input_dists),
                         ("_output_dists", sharded._output_dists)):
        if modules:
            lines.append(f"({key}): ")
            lines.extend(nn.modules.module._addindent(repr(m), 2) for m in modules)
    return lines
