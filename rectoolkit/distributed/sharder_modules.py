"""Modules that DistributedModelParallel shards with their own sharders, as TorchRec's DMP shards whatever its
sharders shard: the quantized collections with the Quant...Sharders, for inference (TorchRec's inference example
builds `DistributedModelParallel(quantized_model, env, plan, sharders=[QuantEmbeddingBagCollectionSharder()],
init_data_parallel=False)`). The float collections and the modules around them (feature-processed,
managed-collision) are sharded by model_parallel's own path; this one only finds the others and calls
`sharder.shard(module, plan entry, env, device, path)`, so it needs no import of the quantized modules.
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Tuple

from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.plan.types import ShardingPlan


def sharded_by_their_sharders(module: nn.Module, sharders: Optional[List[Any]]) -> List[Tuple[str, nn.Module, Any]]:
    """(path, module, sharder) of every module of `module` (itself included) that holds no float collection but
    whose exact type one of `sharders` shards (TorchRec's DMP shards whatever its sharders shard: the quantized
    collections, with the Quant...Sharders, for inference); outermost first, none inside another. Modules that hold
    float collections (the collections, feature-processed and managed-collision ones) are sharded as below."""
    floats = (EmbeddingBagCollection, EmbeddingCollection)
    by_type = {s.module_type: s for s in sharders or [] if isinstance(getattr(s, "module_type", None), type)}
    found: List[Tuple[str, nn.Module, Any]] = []
    for path, child in module.named_modules():
        if type(child) not in by_type or any(isinstance(m, floats) for m in child.modules()):
            continue
        if not any(path.startswith(p + ".") or not p for p, _, _ in found):
            found.append((path, child, by_type[type(child)]))
    return found


def shard_by_their_sharders(module: nn.Module, found: List[Tuple[str, nn.Module, Any]], plan: ShardingPlan,
                            env: ShardingEnv) -> nn.Module:
    """Replace each of `found` (sharded_by_their_sharders) that `plan` names by `sharder.shard(...)`, in place;
    returns `module` (the sharded module when `module` is one of them). One the plan does not name stays as it is,
    with a warning."""
    for path, child, sharder in found:
        module_plan = plan.get_plan_for_module(path)
        if module_plan is None:
            warnings.warn(f"DistributedModelParallel: the {type(child).__name__} at {path!r} has a sharder but no "
                          "plan entry; it stays unsharded", stacklevel=3)
            continue
        replacement = sharder.shard(child, module_plan, env, env.device, path)
        if not path:
            return replacement
        parent_path, _, name = path.rpartition(".")
        setattr(module.get_submodule(parent_path) if parent_path else module, name, replacement)
    return module
