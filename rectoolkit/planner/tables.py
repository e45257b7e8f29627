"""The planner's view of its input: every table with its module path, features, pooling factors and batch.

Accepts a list of configs, a pandas DataFrame, or an nn.Module holding collections (any submodule with
TorchRec's `embedding_bag_configs()` or `embedding_configs()` method).

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> [(x.module_path, x.name, x.pooling_factors) for x in collect_tables([t], batch_size=8)]
    [('', 't', [1.0])]
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rectoolkit.modules.configs import (
    DATA_TYPE_NUM_BITS,
    BaseEmbeddingConfig,
    EmbeddingBagConfig,
    PoolingType,
)
from rectoolkit.modules.table_sources import find_table_configs as _find_configs
from rectoolkit.modules.table_sources import wrapped_collections
from rectoolkit.modules.table_sources import read_table_frame  # noqa: F401  (rectoolkit.widgets.inputs reads it here)
from rectoolkit.plan.traffic import ID_BYTES, LENGTH_BYTES, WEIGHT_BYTES, output_value_bytes
from rectoolkit.plan.types import QUANT_KERNELS, ShardingType
from rectoolkit.planner.constraints import ParameterConstraints, check_per_feature
from rectoolkit.planner.stats import WorkloadStats


@dataclass
class PlannerTable:
    """One table as the planner sees it. `key` = (module path, table name) is unique."""

    module_path: str
    config: BaseEmbeddingConfig
    pooling_factors: List[float]  # mean ids per sample, one per feature
    batch_sizes: List[int]  # samples per rank, one per feature
    is_weighted: bool
    constraints: Optional[ParameterConstraints] = None
    quantized: bool = False  # of a quantized (inference) collection: kernel "quant", as TorchRec's planner plans it
    # VBE: the features of this table's collection have different batch sizes, so the collection takes a batch with
    # a batch size per feature, padded to this one (the largest); None when they all have one batch size
    collection_batch_size: Optional[int] = None
    # the class name of the module at module_path when it wraps the collection (a FeatureProcessedEmbeddingBagCollection,
    # a managed-collision collection: at_wrapper_paths); its sharder plans the table. None: the collection's own path
    wrapper: Optional[str] = None
    # the wire precisions of the collection's output exchanges: its sharder's registry (get_qcomm_codecs_registry's,
    # CommOp name -> codecs); None: float32
    qcomm_codecs_registry: Optional[Dict[str, Any]] = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def key(self) -> Tuple[str, str]:
        return self.module_path, self.config.name

    @property
    def label(self) -> str:
        return f"{self.module_path}.{self.name}" if self.module_path else self.name

    # set in __post_init__ (plain attributes: the search reads them often)
    rows: int = field(init=False)
    dim: int = field(init=False)
    pooled: bool = field(init=False)
    samples_per_rank: float = field(init=False)  # sum over features of the batch size
    ids_per_rank: float = field(init=False)  # sum over features of batch size x pooling factor
    lengths_per_rank: float = field(init=False)  # int32 lengths a rank sends each shard (rectoolkit.plan.traffic)
    gateway_count_bytes: float = field(init=False)  # VBE two-level: the counts a rank sends each gateway host
    id_bytes: int = field(init=False)  # bytes per id on the wire (id, and its weight if weighted)
    # mean of the forward and backward bytes per output value (a value and its gradient cross once each), of the
    # output exchanges that are all-to-alls of pooled rows, reduce-scatters of partial sums, and sequence rows
    all_to_all_value_bytes: float = field(init=False)
    reduce_scatter_value_bytes: float = field(init=False)
    sequence_value_bytes: float = field(init=False)

    @property
    def element_bytes(self) -> float:
        return DATA_TYPE_NUM_BITS[self.config.data_type] / 8

    def __post_init__(self) -> None:
        self.rows, self.dim = self.config.num_embeddings, self.config.embedding_dim
        self.pooled = isinstance(self.config, EmbeddingBagConfig) and self.config.pooling != PoolingType.NONE
        self.samples_per_rank = float(sum(self.batch_sizes))
        self.ids_per_rank = float(sum(b * p for b, p in zip(self.batch_sizes, self.pooling_factors)))
        self.id_bytes = ID_BYTES + (WEIGHT_BYTES if self.is_weighted else 0)
        # VBE (rectoolkit.plan.traffic): a pooled feature sends its own bags after a count, a sequence feature its
        # lengths padded to the collection's batch size; a gateway hears one count per feature
        num_features = len(self.batch_sizes)
        vbe_pooled = self.collection_batch_size is not None and self.pooled
        self.lengths_per_rank = self.samples_per_rank + num_features if vbe_pooled else \
            float(num_features * self.collection_batch_size) if self.collection_batch_size is not None \
            else self.samples_per_rank
        self.gateway_count_bytes = float(LENGTH_BYTES * num_features) if vbe_pooled else 0.0
        self.all_to_all_value_bytes, self.reduce_scatter_value_bytes, self.sequence_value_bytes = (
            sum(output_value_bytes(self.qcomm_codecs_registry, op)) / 2 for op in (
                "POOLED_EMBEDDINGS_ALL_TO_ALL", "POOLED_EMBEDDINGS_REDUCE_SCATTER", "SEQUENCE_EMBEDDINGS_ALL_TO_ALL"))

    @property
    def weight_bytes(self) -> float:
        return self.rows * self.dim * self.element_bytes


def collect_tables(
    source: Any,
    batch_size: int,
    constraints: Optional[Mapping[str, ParameterConstraints]] = None,
    stats: Optional[WorkloadStats] = None,
) -> List[PlannerTable]:
    """Normalize configs / DataFrame / module into PlannerTables, applying constraints and stats.

    Pooling factor precedence: constraints.pooling_factors > stats > the DataFrame's pooling_factor > 1.0.
    """
    if stats is not None and stats.batch_size and int(stats.batch_size) != int(batch_size):
        raise ValueError(f"planner input: batch_size={batch_size} but stats.batch_size={stats.batch_size}; the planner "
                         "plans for one batch size (rectoolkit.planner.planner.resolve_batch_size)")
    constraints = dict(constraints or {})
    found = _find_configs(source)
    quantized = {path for path, sub in source.named_modules() if is_quantized(sub)} \
        if hasattr(source, "named_modules") else set()
    tables: List[PlannerTable] = []
    seen = set()
    for module_path, config, pooling_factor, weighted in found:
        if (module_path, config.name) in seen:
            raise ValueError(f"planner input: table {config.name!r} appears twice in module {module_path!r}")
        seen.add((module_path, config.name))
        c = constraints.get(config.name) or constraints.get(f"{module_path}.{config.name}")
        num_features = len(config.feature_names)
        if num_features == 0:
            raise ValueError(f"planner input: table {config.name!r} has no feature_names; give it at least one")
        if c is not None:
            check_per_feature("pooling_factors", c.given_pooling_factors(), num_features, config.name)
            check_per_feature("batch_sizes", c.batch_sizes, num_features, config.name)
            check_per_feature("num_poolings", c.num_poolings, num_features, config.name)
            if c.feature_names is not None and list(c.feature_names) != list(config.feature_names):
                raise ValueError(f"ParameterConstraints for table {config.name!r}: feature_names={c.feature_names} "
                                 f"but the table's features are {config.feature_names}; give the table's own "
                                 "feature names in its order, or leave feature_names None")
        factors = []
        for index, feature in enumerate(config.feature_names):
            if c is not None and c.given_pooling_factors():
                factors.append(c.given_pooling_factors()[index])
            elif stats is not None and feature in stats.pooling_factors:
                factors.append(float(stats.pooling_factors[feature]))
            elif pooling_factor is not None:
                factors.append(float(pooling_factor))
            else:
                factors.append(1.0)
        batches = list(c.batch_sizes) if c is not None and c.batch_sizes else [int(batch_size)] * num_features
        is_weighted = bool(weighted or (c is not None and c.is_weighted) or (stats is not None and stats.is_weighted))
        tables.append(PlannerTable(module_path, config, factors, batches, is_weighted, c, module_path in quantized))
    tables = _with_collection_batch_sizes(tables)
    if not tables:
        raise ValueError("planner input has no embedding tables: pass configs, a DataFrame or a module with collections")
    unknown = set(constraints) - {t.name for t in tables} - {f"{t.module_path}.{t.name}" for t in tables}
    if unknown:  # TorchRec ignores them (one constraints dict is often shared by several models): said, not raised
        warnings.warn(f"planner: constraints name tables that are not in the input, so they constrain nothing: "
                      f"{sorted(unknown)} (the input's tables: {sorted(t.label for t in tables)})", stacklevel=4)
    return tables


def _with_collection_batch_sizes(tables: List[PlannerTable]) -> List[PlannerTable]:
    """Mark the tables of collections whose features have different batch sizes (VBE) with the largest. A
    collection: the bag (or the sequence) tables of one module path."""
    batches: Dict[Tuple[str, bool], set] = {}
    for t in tables:
        batches.setdefault((t.module_path, t.pooled), set()).update(t.batch_sizes)
    return [dataclasses.replace(t, collection_batch_size=max(batches[t.module_path, t.pooled]))
            if len(batches[t.module_path, t.pooled]) > 1 else t for t in tables]


def at_wrapper_paths(tables: List[PlannerTable], source: Any, sharders: Optional[Sequence[Any]]) -> List[PlannerTable]:
    """The tables of a collection inside a wrapper (a FeatureProcessedEmbeddingBagCollection, a managed-collision
    collection: rectoolkit.modules.table_sources.wrapped_collections) planned at the wrapper's path, as TorchRec
    plans them when the wrapper's sharder is in `sharders` (TorchRec's default sharders, and sharders=None here,
    have it); with only the inner collection's sharder they stay at the collection's path ("fp._embedding_bag_collection"),
    as in TorchRec. DistributedModelParallel reads either (rectoolkit.distributed.model_parallel.plan_at_collections)."""
    wrappers = wrapped_collections(source)
    if not wrappers:
        return tables
    sharded_kinds = None if sharders is None else {_sharder_key(s)[0] for s in sharders}
    out = []
    for table in tables:
        wrapper_path, wrapper = wrappers.get(table.module_path, (None, None))
        if wrapper is not None and (sharded_kinds is None or wrapper in sharded_kinds):
            table = dataclasses.replace(table, module_path=wrapper_path, wrapper=wrapper)
        out.append(table)
    return out


def tables_by_module(tables: Sequence[PlannerTable]) -> Dict[str, List[PlannerTable]]:
    out: Dict[str, List[PlannerTable]] = {}
    for table in tables:
        out.setdefault(table.module_path, []).append(table)
    return out


QUANT_KERNEL_VALUES = {k.value for k in QUANT_KERNELS}


def is_quantized(module: Any) -> bool:
    """A quantized collection: rectoolkit.quant's Quant* classes, or TorchRec's torchrec.quant modules."""
    cls = type(module)
    return cls.__name__.startswith("Quant") or ".quant." in f".{cls.__module__}."


def _collection_kind(class_name: str) -> str:
    """EmbeddingBagCollection or EmbeddingCollection for a collection class name, quantized ones included."""
    return class_name[len("Quant"):] if class_name.startswith("Quant") else class_name


def _sharder_key(sharder: Any) -> Tuple[str, bool]:
    """(collection kind, quantized) of the collections a sharder shards, from its module_type."""
    module_type = getattr(sharder, "module_type", None)
    name = getattr(module_type, "__name__", "")
    quantized = name.startswith("Quant") or ".quant." in f".{getattr(module_type, '__module__', '')}."
    return _collection_kind(name), quantized


def apply_sharders(tables: List[PlannerTable], sharders: Sequence[Any], compute_device: str) -> List[PlannerTable]:
    """Restrict each table to the sharding types its collection's sharder supports (TorchRec's planner does the
    same). A sharder is matched by its `module_type`'s class name, so TorchRec's sharders work too: passing
    TorchRec's EmbeddingBagCollectionSharder on CPU gives a plan TorchRec can run there. A quantized collection's
    sharder (module_type QuantEmbeddingBagCollection here, torchrec.quant's EmbeddingBagCollection in TorchRec)
    shards bags or sequences like the float one.

    The table's own constraints still apply (the intersection). A table whose collection has no sharder in the
    list is left out, as TorchRec leaves it: the plan has no entry for it, and DistributedModelParallel keeps that
    collection unsharded (a replica on every rank).
    """
    by_module = {_sharder_key(s): s for s in sharders}
    out = []
    for table in tables:
        module = table.wrapper or ("EmbeddingBagCollection" if isinstance(table.config, EmbeddingBagConfig)
                                   else "EmbeddingCollection")
        # the sharder of the collection's own kind (float or quantized: get_default_sharders() has both), else the
        # other kind's
        sharder = by_module.get((module, table.quantized)) or by_module.get((module, not table.quantized))
        if sharder is None:
            continue
        known = {t.value for t in ShardingType}  # TorchRec's list may name types rectoolkit has not got
        allowed = [ShardingType(t) for t in sharder.sharding_types(compute_device) if t in known]
        c = table.constraints
        if c is not None and c.sharding_types is not None:
            wanted = c.allowed_sharding_types()
            allowed = [t for t in wanted if t in allowed]
            if not allowed:
                raise ValueError(f"planner: table {table.label!r} allows sharding types {[t.value for t in wanted]}, "
                                 f"but {type(sharder).__name__} supports only "
                                 f"{sharder.sharding_types(compute_device)} on {compute_device}")
        merged = dataclasses.replace(c, sharding_types=allowed) if c is not None \
            else ParameterConstraints(sharding_types=allowed)
        fused_load_factor = (getattr(sharder, "fused_params", None) or {}).get("cache_load_factor")
        if merged.cache_load_factor is None and fused_load_factor is not None:  # TorchRec's planner reads it too
            merged = dataclasses.replace(merged, cache_load_factor=float(fused_load_factor))
        # a sharder that offers only quantized kernels (TorchRec's and rectoolkit's quantized sharders) plans them
        kernels = {k for t in allowed for k in sharder.compute_kernels(t.value, compute_device)}
        quantized = table.quantized or bool(kernels) and kernels <= QUANT_KERNEL_VALUES
        out.append(dataclasses.replace(table, constraints=merged, quantized=quantized,
                                       qcomm_codecs_registry=getattr(sharder, "qcomm_codecs_registry", None)))
    return out
