"""Which fused optimizer a collection's shards get, from the three places TorchRec code may set it.

1. the sharder's `fused_params` (`EmbeddingBagCollectionSharder(fused_params={"optimizer": ..., "learning_rate":
   ...})`);
2. torch's `_apply_optimizer_in_backward(torch.optim.SGD, [param], {"lr": 0.5})` on the unsharded weights (TorchRec's
   `apply_optimizer_in_backward`): it records the class and kwargs on each weight; these override 1 key by key,
   as TorchRec merges them;
3. rectoolkit's own `EmbeddingBagCollection(..., optimizer="adagrad", lr=...)`, set on the module itself.

With none of them, TorchRec's sharded modules fuse SGD with lr 0.01 into their "fused" kernels (`TORCHREC_DEFAULT`:
the sharders and DMP do); rectoolkit's own `shard_embedding_bag_collection` keeps plain gradients then.

    >>> import rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2)])
    >>> fused_optimizer_for(ebc, {"optimizer": "exact_adagrad", "learning_rate": 0.02}).lr
    0.02
    >>> fused_optimizer_for(ebc, {"learning_rate": 0.02, "cache_load_factr": 0.2})
    Traceback (most recent call last):
    ...
    ValueError: fused_params: unsupported keys ['cache_load_factr']; supported: ['beta1', 'beta2', 'bounds_check_mode', 'cache_algorithm', 'cache_load_factor', 'cache_precision', 'cache_reserved_memory', 'enforce_hbm', 'eps', 'gradient_clipping', 'learning_rate', 'lr', 'max_gradient', 'momentum', 'optimizer', 'output_dtype', 'prefetch_pipeline', 'stochastic_rounding', 'weight_decay', 'weight_decay_mode']

TorchRec's per-table options may be given once in fused_params for every table of the collection
(`with_table_options`): a table's own ParameterSharding value wins, as TorchRec merges them, and the sharded
collection honours or refuses them as it does the plan's (sharded_ebc.check_table_options).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from torch import nn

from rectoolkit.kernels.fused_optimizers import TABLE_OPTION_KEYS, FusedOptimizerConfig
from rectoolkit.plan.types import CacheParams, ParameterSharding

TORCHREC_DEFAULT = FusedOptimizerConfig("sgd", lr=0.01)  # TorchRec's fused kernels without optimizer settings


def recorded_optimizer(module: nn.Module) -> Optional[Dict[str, Any]]:
    """What `_apply_optimizer_in_backward` recorded on the collection's table weights, as fused_params
    ({"optimizer": class, **kwargs}), or None. Every table must have the same one (one optimizer per collection)."""
    tables = getattr(module, "embedding_bags", None) or getattr(module, "embeddings")
    recorded = {}
    for name, table in tables.items():
        classes = getattr(table.weight, "_optimizer_classes", None)
        kwargs = getattr(table.weight, "_optimizer_kwargs", None)
        if classes is None:
            recorded[name] = None
            continue
        if len(classes) != 1:
            raise ValueError(f"table {name!r}: {len(classes)} optimizers were applied in backward to its weight; "
                             "a fused embedding optimizer is one optimizer per table")
        recorded[name] = (classes[0], dict(kwargs[0]))
    distinct = {repr(r) for r in recorded.values()}
    if len(distinct) > 1:
        raise ValueError(f"the tables of one collection have different optimizers applied in backward: "
                         f"{ {n: (r[0].__name__, r[1]) if r else None for n, r in recorded.items()} }; rectoolkit "
                         "fuses one optimizer per collection: apply the same to every table, or split the tables "
                         "into collections")
    first = next(iter(recorded.values()), None)
    return None if first is None else {"optimizer": first[0], **first[1]}


def fused_optimizer_for(module: nn.Module, fused_params: Optional[Mapping[str, Any]] = None
                        ) -> Optional[FusedOptimizerConfig]:
    """The fused optimizer set for `module`'s shards: fused_params, overridden key by key by what
    `_apply_optimizer_in_backward` recorded; or the module's own; None when nothing is set. A module's own
    optimizer that differs from the others is refused."""
    own = module.kernel.optimizer
    recorded = recorded_optimizer(module)
    if fused_params is not None and set(fused_params) <= set(TABLE_OPTION_KEYS):
        FusedOptimizerConfig.from_fused_params(fused_params)  # (checks the keys)
        fused_params = None  # table options only: nothing said of the optimizer
    if fused_params is None and recorded is None:
        return dataclasses.replace(own) if own is not None else None
    config = FusedOptimizerConfig.from_fused_params(fused_params or {})
    if recorded is not None:
        config = _merge_recorded(config, recorded)
    if own is not None and own != config:
        where = "the sharder's fused_params" if fused_params is not None else "_apply_optimizer_in_backward"
        raise ValueError(f"{type(module).__name__} fuses {own} (set on the module) but {where} asks for {config}; "
                         "set the optimizer in one place (e.g. build the collection without optimizer=...)")
    return config


def _merge_recorded(base: FusedOptimizerConfig, recorded: Mapping[str, Any]) -> FusedOptimizerConfig:
    """`base` with the keys `_apply_optimizer_in_backward` recorded put over it (TorchRec's merge_fused_params)."""
    kwargs = dict(recorded)
    optimizer = kwargs.pop("optimizer")
    if isinstance(optimizer, type):
        from_recorded = FusedOptimizerConfig.from_torch_optimizer(optimizer, kwargs)
    else:  # TorchRec allows an explicit "optimizer" (an EmbOptimType) among the kwargs
        from_recorded = FusedOptimizerConfig.from_fused_params({"optimizer": optimizer, **kwargs})
    renamed = {"betas": ("beta1", "beta2"), "learning_rate": ("lr",)}
    fields = {"optimizer"} | {f for key in kwargs for f in renamed.get(key, (key,))}
    return dataclasses.replace(base, **{f: getattr(from_recorded, f) for f in fields})


# fused_params' cache keys -> CacheParams' fields (TorchRec's names on each side)
CACHE_KEYS = {"cache_load_factor": "load_factor", "cache_algorithm": "algorithm", "cache_precision": "precision",
              "prefetch_pipeline": "prefetch_pipeline", "cache_reserved_memory": "reserved_memory"}


def with_table_options(module_plan: Mapping[str, ParameterSharding], fused_params: Optional[Mapping[str, Any]]
                       ) -> Dict[str, ParameterSharding]:
    """The plan with fused_params' per-table options (TABLE_OPTION_KEYS) filled in where a table's
    ParameterSharding leaves them None: stochastic_rounding, output_dtype, bounds_check_mode, enforce_hbm, and the
    cache keys as its cache_params. The plan itself is not changed (copies)."""
    given = {key: value for key, value in (fused_params or {}).items() if key in TABLE_OPTION_KEYS and value is not None}
    if not given:
        return dict(module_plan)
    cache = {CACHE_KEYS[key]: value for key, value in given.items() if key in CACHE_KEYS}
    out = {}
    for name, ps in module_plan.items():
        filled = {key: value for key, value in given.items() if key not in CACHE_KEYS and getattr(ps, key) is None}
        if cache and ps.cache_params is None:
            filled["cache_params"] = CacheParams(**cache)
        out[name] = dataclasses.replace(ps, **filled) if filled else ps
    return out
