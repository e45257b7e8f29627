"""TorchRec's torchrec.inference.modules: a trained model -> quantized -> sharded for inference -> traced.

    quant_model = quantize_inference_model(model)                 # collections swapped for quantized ones
    sharded, plan = shard_quant_model(quant_model, world_size=2, compute_device="cpu", sharding_device="cpu")
    traced = rectoolkit.fx.symbolic_trace(sharded)                # serve it, or torch.export its collections

    >>> import torch, rectoolkit as rtk
    >>> model = torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(
    ...     name="t", num_embeddings=8, embedding_dim=4, feature_names=["f"])]))
    >>> quant_model = quantize_inference_model(model)
    >>> sharded, plan = shard_quant_model(quant_model, compute_device="cpu", sharding_device="cpu")
    >>> type(sharded[0]).__name__, plan.get_plan_for_module("0")["t"].sharding_type
    ('ShardedQuantEmbeddingBagCollection', 'table_wise')

The planner, sharders and sharded modules are rectoolkit's (rectoolkit.planner, rectoolkit.quant.sharding). One
rank is sharded as TorchRec's world size 1; more ranks are shard holders inside this process
(rectoolkit.quant.one_process), as TorchRec's single-process inference model puts them on cuda:0, cuda:1, ...

Where rectoolkit differs (an error says so, nothing is dropped silently):
- sharding_device="meta" (TorchRec's default): TorchRec builds a weightless model to fill later; rectoolkit shards
  the quantized weights themselves, so pass sharding_device="cpu" (or "cuda").
- compute_device="cuda" (TorchRec's default) needs a GPU here; TorchRec plans for cuda anyway on a CPU-only
  machine, but its result then runs only on meta tensors. Pass compute_device="cpu".
- A FeatureProcessedEmbeddingBagCollection is quantized as TorchRec's (its tables as `fp_weight_dtype`, its feature
  processors kept) anywhere in the model, the model itself included (TorchRec's fails on one not nested two deep).
- A quantization_mapping value must be a class with `from_float` (rectoolkit's quantized collections, or yours).
- PredictModule, PredictFactory, BatchingMetadata, QualNameMetadata (rectoolkit.inference.predict) are TorchRec's
  serving interfaces; PredictModule(device=None) runs on the CPU where there is no CUDA (TorchRec's fails).
- set_pruning_data: quantized bag tables keep their first rows, an id of a pruned row reads row 0 (as TorchRec);
  refused where TorchRec would prune nothing silently or fail later (rectoolkit.quant.pruning). assign_weights_to_tbe
  writes into the quantized collections' lookups, rectoolkit's counterpart of fbgemm's IntNBit TBE modules.
- TorchRec's next step, torch.jit.script of the traced model, does not work: rectoolkit's KeyedJaggedTensor is a
  Python class, not a TorchScript one. Serve the traced module, or torch.export (rectoolkit.quant.export).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Dict, List, Optional, Tuple, Type

import torch
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.inference.predict import BatchingMetadata, PredictFactory, PredictModule, QualNameMetadata  # noqa: F401
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from rectoolkit.plan.types import ShardingPlan
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectoolkit.quant.config import make_qconfig
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from rectoolkit.quant.fp_embedding_modules import QuantFeatureProcessedEmbeddingBagCollection
from rectoolkit.quant.lookup import QuantBatchedLookup
from rectoolkit.quant.one_process import shard_quant_in_one_process
from rectoolkit.quant.pruning import MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT
from rectoolkit.quant.shard_modules import shard_modules
from rectoolkit.quant.sharding import (QuantEmbeddingBagCollectionSharder, QuantEmbeddingCollectionSharder,
                                      QuantFeatureProcessedEmbeddingBagCollectionSharder)

logger = logging.getLogger(__name__)

DEFAULT_QUANTIZATION_DTYPE: torch.dtype = torch.int8


def trim_torch_package_prefix_from_typename(typename: str) -> str:
    """`torch.typename` of a class loaded by torch.package, without its "<torch_package_N>." prefix.

    >>> trim_torch_package_prefix_from_typename("<torch_package_0>.rectoolkit.EmbeddingBagCollection")
    'rectoolkit.EmbeddingBagCollection'
    """
    if typename.startswith("<torch_package_"):
        typename = ".".join(typename.split(".")[1:])
    return typename


def _typename(cls: type) -> str:
    return trim_torch_package_prefix_from_typename(torch.typename(cls))


DEFAULT_QUANT_MAPPING: Dict[str, Type[nn.Module]] = {
    _typename(EmbeddingBagCollection): QuantEmbeddingBagCollection,
    _typename(EmbeddingCollection): QuantEmbeddingCollection,
}
# TorchRec's spelling of the same keys, as a mapping written for TorchRec names them
_TORCHREC_TYPENAMES = {"torchrec.modules.embedding_modules.EmbeddingBagCollection": _typename(EmbeddingBagCollection),
                       "torchrec.modules.embedding_modules.EmbeddingCollection": _typename(EmbeddingCollection)}
FEATURE_PROCESSED_EBC_TYPE: str = _typename(FeatureProcessedEmbeddingBagCollection)
_COLLECTION_TYPES = (EmbeddingBagCollection, EmbeddingCollection, QuantEmbeddingBagCollection,
                     QuantEmbeddingCollection)


def default_quant_sharders() -> List[Any]:
    """TorchRec's DEFAULT_SHARDERS: one sharder per quantized collection (bags, sequences, feature-processed bags)."""
    return [QuantEmbeddingBagCollectionSharder(), QuantEmbeddingCollectionSharder(),
            QuantFeatureProcessedEmbeddingBagCollectionSharder()]


def quantize_feature(module: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """A forward pre-hook: float32 / float64 tensor inputs become float16 (quantize_dense's dense modules).

    >>> quantize_feature(None, (torch.ones(1), torch.ones(1, dtype=torch.int64)))[0].dtype
    torch.float16
    """
    return tuple(x.half() if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64) else x
                 for x in inputs)


def quantize_embeddings(module: nn.Module, dtype: torch.dtype, inplace: bool,
                        additional_qconfig_spec_keys: Optional[List[Type[nn.Module]]] = None,
                        additional_mapping: Optional[Dict[Type[nn.Module], Type[nn.Module]]] = None,
                        output_dtype: torch.dtype = torch.float,
                        per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None) -> nn.Module:
    """TorchRec's inference quantize_embeddings: swap the children of `module` (at any depth, not `module` itself)
    whose type is EmbeddingBagCollection or in `additional_qconfig_spec_keys` for their quantized class
    (EmbeddingBagCollection -> QuantEmbeddingBagCollection, plus `additional_mapping`), as torch.ao's
    quantize_dynamic does with TorchRec's QuantConfig. An EmbeddingCollection is swapped only when named in both
    additional arguments, as in TorchRec (quantize_inference_model names it).

    >>> import rectoolkit as rtk
    >>> holder = torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=8,
    ...                                                                                  embedding_dim=4)]))
    >>> type(quantize_embeddings(holder, torch.int8, inplace=False)[0]).__name__
    'QuantEmbeddingBagCollection'
    """
    spec = {EmbeddingBagCollection, *(additional_qconfig_spec_keys or [])}
    mapping: Dict[type, type] = {EmbeddingBagCollection: QuantEmbeddingBagCollection, **(additional_mapping or {})}
    for source, target in mapping.items():
        if source in spec and not callable(getattr(target, "from_float", None)):
            raise TypeError(f"quantize_embeddings: the mapping {source.__name__} -> {target.__name__}: "
                            f"{target.__name__} has no from_float(module) classmethod; map to "
                            "QuantEmbeddingBagCollection / QuantEmbeddingCollection or a class with from_float")
    if not inplace:
        module = copy.deepcopy(module)
    per_table = dict(per_table_weight_dtype or {})
    unmatched = set(per_table)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in spec and type(child) in mapping:
                tables = {t.name for t in _table_configs(child)}
                unmatched -= tables
                # from_float reads the qconfig, as quantize_dynamic's swap does; each collection gets its own tables
                child.qconfig = make_qconfig(dtype, output_dtype,
                                             {t: d for t, d in per_table.items() if t in tables} or None)
                setattr(parent, name, mapping[type(child)].from_float(child))
    if unmatched:
        raise ValueError(f"quantize_embeddings: per_table_weight_dtype names tables {sorted(unmatched)} that no "
                         "quantized collection of the model has; name only tables of its collections")
    return module


def _table_configs(collection: nn.Module) -> List[Any]:
    for method in ("embedding_bag_configs", "embedding_configs"):
        if callable(getattr(collection, method, None)):
            return list(getattr(collection, method)())
    return []


def quantize_dense(predict_module: Any, dtype: torch.dtype,
                   additional_embedding_module_type: Optional[List[Type[nn.Module]]] = None) -> Any:
    """TorchRec's quantize_dense: every direct child of `predict_module.predict_module` that is not an embedding
    collection becomes float16, with quantize_feature casting its float inputs. Returns `predict_module`."""
    if dtype != torch.half:
        raise NotImplementedError(f"quantize_dense(dtype={dtype}): only torch.half is supported for dense modules "
                                  "(as in TorchRec)")
    if not isinstance(getattr(predict_module, "predict_module", None), nn.Module):
        raise TypeError(f"quantize_dense: takes a PredictModule-like object with a `predict_module` nn.Module "
                        f"attribute, got a {type(predict_module).__name__}")
    module = predict_module.predict_module
    extra = tuple(additional_embedding_module_type or ())
    for name, child in list(module.named_children()):
        if isinstance(child, _COLLECTION_TYPES) or type(child) in extra:
            continue
        child = child.half()
        child.register_forward_pre_hook(quantize_feature)
        module._modules[name] = child
    return predict_module


def _resolve_mapping(quantization_mapping: Dict[str, Type[nn.Module]]) -> Dict[str, Type[nn.Module]]:
    resolved = {}
    for key, target in quantization_mapping.items():
        if not callable(getattr(target, "from_float", None)):
            raise TypeError(f"quantize_inference_model: quantization_mapping[{key!r}] = {target!r} has no "
                            "from_float(module) classmethod, so rectoolkit cannot build it from the float module; map "
                            "to QuantEmbeddingBagCollection / QuantEmbeddingCollection or a class with from_float")
        if target in (QuantEmbeddingBagCollection, QuantEmbeddingCollection) and \
                _TORCHREC_TYPENAMES.get(key, key) not in DEFAULT_QUANT_MAPPING:
            raise ValueError(f"quantize_inference_model: quantization_mapping[{key!r}] = {target.__name__}: "
                             f"{target.__name__}.from_float takes a rectoolkit float collection; use the key "
                             f"{[k for k, v in DEFAULT_QUANT_MAPPING.items() if v is target][0]!r}")
        resolved[_TORCHREC_TYPENAMES.get(key, key)] = target
    return resolved


def quantize_inference_model(model: nn.Module, quantization_mapping: Optional[Dict[str, Type[nn.Module]]] = None,
                             per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None,
                             fp_weight_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
                             quantization_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
                             output_dtype: torch.dtype = torch.float) -> nn.Module:
    """Swap, in place, every embedding collection of `model` for its quantized form; returns `model`.

    `quantization_mapping`: typename (torch.typename of the float class; TorchRec's
    "torchrec.modules.embedding_modules.EmbeddingBagCollection" spelling is accepted too) -> quantized class
    (default: EmbeddingBagCollection -> QuantEmbeddingBagCollection, EmbeddingCollection -> QuantEmbeddingCollection).
    Weights are stored as `quantization_dtype` (or `per_table_weight_dtype[table]`), outputs are `output_dtype`.
    A FeatureProcessedEmbeddingBagCollection becomes a QuantFeatureProcessedEmbeddingBagCollection
    (rectoolkit.quant.fp_embedding_modules), its tables stored as `fp_weight_dtype` (or `per_table_weight_dtype`),
    its feature processors kept; one given as `model` itself is returned quantized.

    >>> import rectoolkit as rtk
    >>> model = torch.nn.Sequential(rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="t", num_embeddings=8,
    ...                                                                          embedding_dim=4)]))
    >>> type(quantize_inference_model(model)[0]).__name__
    'QuantEmbeddingCollection'
    """
    mapping = DEFAULT_QUANT_MAPPING if quantization_mapping is None else _resolve_mapping(quantization_mapping)
    per_table = dict(per_table_weight_dtype or {})
    # the feature-processed collections first, by a direct swap as TorchRec's (their tables leave per_table: the
    # collections inside them are quantized with them, not again below)
    for path in [path for path, module in model.named_modules() if _typename(type(module)) == FEATURE_PROCESSED_EBC_TYPE]:
        float_fp = model.get_submodule(path)
        tables = {t.name for t in _table_configs(float_fp.split()[1])}
        float_fp.qconfig = make_qconfig(fp_weight_dtype, output_dtype,
                                        {t: d for t, d in per_table.items() if t in tables} or None)
        quantized = QuantFeatureProcessedEmbeddingBagCollection.from_float(float_fp)
        per_table = {t: d for t, d in per_table.items() if t not in tables}
        if not path:
            return quantized
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, name, quantized)
    additional_keys, additional_mapping = [], {}
    for module in model.modules():
        typename = _typename(type(module))
        if typename in mapping:
            additional_keys.append(type(module))
            additional_mapping[type(module)] = mapping[typename]
    quantize_embeddings(model, dtype=quantization_dtype, inplace=True, additional_qconfig_spec_keys=additional_keys,
                        additional_mapping=additional_mapping, output_dtype=output_dtype,
                        per_table_weight_dtype=per_table or None)
    logger.info("Default quantization dtype is %s, per_table_weight_dtype=%s.", quantization_dtype,
                per_table_weight_dtype)
    return model


def set_pruning_data(model: nn.Module, tables_to_rows_post_pruning: Dict[str, int],
                     module_types: Optional[List[Type[nn.Module]]] = None) -> nn.Module:
    """Mark the float collections of `model` (of exactly one of `module_types`; default EmbeddingBagCollection and
    FeatureProcessedEmbeddingBagCollection) with {table name: rows kept after pruning}; returns `model`.

    quantize_inference_model then stores only the first `rows` rows of each named table, so its memory shrinks by
    the rows pruned; an id of a pruned row reads row 0, as in TorchRec (rectoolkit.quant.pruning). Call it before
    quantizing. A name that is no table of a marked collection is refused (TorchRec ignores it: a typo would
    prune nothing); a quantized EmbeddingCollection refuses pruning (TorchRec's keeps every row).

    >>> import rectoolkit as rtk
    >>> model = torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(
    ...     name="t", num_embeddings=100, embedding_dim=8, feature_names=["f"])]))
    >>> quant_model = quantize_inference_model(set_pruning_data(model, {"t": 10}))
    >>> quant_model[0].embedding_bags["t"].weight.shape       # 10 rows of 4 + 8 bytes, padded to 16
    torch.Size([10, 16])
    """
    if module_types is None:
        module_types = [EmbeddingBagCollection, FeatureProcessedEmbeddingBagCollection]
    for table, rows in tables_to_rows_post_pruning.items():
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"set_pruning_data: tables_to_rows_post_pruning[{table!r}] = {rows!r}; give the number "
                             "of rows the table keeps, an int >= 1")
    marked = [module for module in model.modules() if type(module) in module_types]
    tables = {t.name: t.num_embeddings for module in marked for t in _table_configs(module)}
    unknown = sorted(set(tables_to_rows_post_pruning) - set(tables))
    if unknown:
        raise ValueError(f"set_pruning_data: tables {unknown} are no tables of the model's "
                         f"{[t.__name__ for t in module_types]} (their tables: {sorted(tables)}); name only those, "
                         "pass the module_types that hold them, and call it before quantize_inference_model")
    too_many = {t: r for t, r in tables_to_rows_post_pruning.items() if r > tables[t]}
    if too_many:
        raise ValueError(f"set_pruning_data: {too_many} keep more rows than the tables have "
                         f"({ {t: tables[t] for t in too_many} }); keep at most num_embeddings rows")
    for module in marked:
        setattr(module, MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT, tables_to_rows_post_pruning)
    return model


def _quantized_lookups(model: nn.Module) -> List[QuantBatchedLookup]:
    return [module for module in model.modules() if isinstance(module, QuantBatchedLookup)]


def get_table_to_weights_from_tbe(model: nn.Module) -> Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """{table name: (weight, scale_bias or None)} of every quantized lookup of `model` (rectoolkit's counterpart of
    TorchRec's IntNBit TBE modules): views of the stored rows, shaped as fbgemm's split_embedding_weights gives
    them (INT8 [rows, dim] codes with [rows, 4] fp16 scale and bias bytes; FP16 / FP32 [rows, bytes], None).

    >>> import rectoolkit as rtk
    >>> model = quantize_inference_model(torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(
    ...     name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])])))
    >>> {name: (tuple(w.shape), tuple(sb.shape)) for name, (w, sb) in get_table_to_weights_from_tbe(model).items()}
    {'t': ((10, 8), (10, 4))}
    """
    return {table.name: weights for lookup in _quantized_lookups(model)
            for table, weights in zip(lookup.tables, lookup.split_embedding_weights())}


def assign_weights_to_tbe(model: nn.Module,
                          table_to_weight: Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]) -> None:
    """Write `table_to_weight` {table name: (weight, scale_bias or None)} into the storage of every quantized lookup
    of `model`, shaped as get_table_to_weights_from_tbe gives them (uint8; a pruned table: its kept rows).

    Every table of every lookup must be named (TorchRec asserts the same). TorchRec finds its TBEs only where they
    are registered modules (quantize_inference_model registers them); rectoolkit's lookups always are, so a
    collection quantized any other way is assigned too. A sharded model's lookups hold shards ('<table>__<k>'):
    assign before sharding.

    >>> import rectoolkit as rtk
    >>> model = quantize_inference_model(torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(
    ...     name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])])))
    >>> weights = {name: (torch.zeros_like(w), sb) for name, (w, sb) in get_table_to_weights_from_tbe(model).items()}
    >>> assign_weights_to_tbe(model, weights)
    >>> int(model[0].embedding_bags["t"].weight[:, 4:12].sum())    # the codes are now 0
    0
    """
    for lookup in _quantized_lookups(model):
        missing = [table.name for table in lookup.tables if table.name not in table_to_weight]
        if missing:
            raise AssertionError(f"assign_weights_to_tbe: tables {missing} not in table_to_weight (it names "
                                 f"{sorted(table_to_weight)}); give (weight, scale_bias) for every table of the "
                                 "model, as get_table_to_weights_from_tbe returns them")
        lookup.assign_embedding_weights([table_to_weight[table.name] for table in lookup.tables])


def _check_devices(compute_device: str, sharding_device: str) -> None:
    if compute_device not in ("cpu", "cuda"):
        raise ValueError(f"shard_quant_model(compute_device={compute_device!r}): rectoolkit plans for 'cpu' or 'cuda'")
    if compute_device == "cuda" and not torch.cuda.is_available():
        raise ValueError("shard_quant_model(compute_device='cuda'): no CUDA device is available here. TorchRec plans "
                         "for cuda anyway on a CPU-only machine, but its sharded model then holds meta tensors and "
                         "cannot run; pass compute_device='cpu' (and sharding_device='cpu')")
    device = torch.device(sharding_device)
    if device.type == "meta":
        raise ValueError("shard_quant_model(sharding_device='meta'): TorchRec shards onto meta to fill the weights "
                         "later; rectoolkit shards the quantized weights themselves. Pass sharding_device='cpu' "
                         "(or 'cuda' with a GPU)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"shard_quant_model(sharding_device={sharding_device!r}): no CUDA device is available; "
                         "pass sharding_device='cpu'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"shard_quant_model(sharding_device={sharding_device!r}): use 'cpu' or 'cuda'")


def _default_constraints(model: nn.Module, sharders: List[Any]) -> Dict[str, ParameterConstraints]:
    """TorchRec's default: every table of a quantized bag collection table-wise (sequences are left to the
    planner)."""
    types = tuple(sharder.module_type for sharder in sharders)
    return {table: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["quant"])
            for module in model.modules() if type(module) in types and hasattr(module, "embedding_bags")
            for table in module.embedding_bags}


def _shard_in_one_process(model: nn.Module, plan: ShardingPlan, world_size: int, device: torch.device,
                          sharders: List[Any]) -> nn.Module:
    """Every quantized collection of `model` that `plan` names, sharded over `world_size` ranks held in this
    process (rectoolkit.quant.one_process)."""
    types = tuple(sharder.module_type for sharder in sharders)
    if isinstance(model, types):
        return shard_quant_in_one_process(model.to(device), plan.get_plan_for_module(""), world_size)
    for path, child in list(model.named_modules()):
        module_plan = plan.get_plan_for_module(path) if path else None
        if module_plan is None or type(child) not in types:
            continue  # TorchRec leaves a collection the plan does not name as it is
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, shard_quant_in_one_process(child.to(device), module_plan, world_size))
    return model


def shard_quant_model(model: nn.Module, world_size: int = 1, compute_device: str = "cuda",
                      sharding_device: str = "meta", sharders: Optional[List[Any]] = None,
                      device_memory_size: Optional[int] = None,
                      constraints: Optional[Dict[str, ParameterConstraints]] = None, ddr_cap: Optional[int] = None,
                      sharding_plan: Optional[ShardingPlan] = None) -> Tuple[nn.Module, ShardingPlan]:
    """Shard the quantized collections of `model` (from quantize_inference_model) for inference; returns
    (the sharded model, the plan). The model is changed in place, as in TorchRec.

    Planned as TorchRec does unless `sharding_plan` is given: rectoolkit's EmbeddingShardingPlanner on a
    Topology(world_size, compute_device, hbm_cap=device_memory_size (or the GPU's memory), ddr_cap), batch size 1,
    `constraints` (default: bag tables table-wise). world_size 1: TorchRec's ShardedQuantEmbeddingBagCollection /
    ShardedQuantEmbeddingCollection; more: the ranks are shard holders in this process (rectoolkit.quant.one_process),
    equal to the unsharded quantized model (bags pooled across row shards may differ by float summation order).
    See the module docstring for compute_device / sharding_device.
    """
    _check_devices(compute_device, sharding_device)
    if world_size < 1:
        raise ValueError(f"shard_quant_model(world_size={world_size}): give at least 1 rank")
    sharders = list(sharders) if sharders else default_quant_sharders()
    supported = (QuantEmbeddingBagCollection, QuantEmbeddingCollection, QuantFeatureProcessedEmbeddingBagCollection)
    for sharder in sharders:
        if world_size > 1 and sharder.module_type not in supported:
            raise NotImplementedError(
                f"shard_quant_model(world_size={world_size}, sharders=[..., {type(sharder).__name__}]): with more "
                f"than one rank rectoolkit shards only {[c.__name__ for c in supported]} (in one process); pass "
                "their sharders only, or world_size=1")
    if sharding_plan is None:
        if constraints is None:
            constraints = _default_constraints(model, sharders)
        hbm_cap = device_memory_size
        if hbm_cap is None and compute_device == "cuda":
            hbm_cap = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        topology = Topology(world_size=world_size, compute_device=compute_device, local_world_size=world_size,
                            hbm_cap=hbm_cap, ddr_cap=ddr_cap)
        sharding_plan = EmbeddingShardingPlanner(topology=topology, batch_size=1, constraints=constraints).plan(
            model, sharders)
    device = torch.device(sharding_device)
    if world_size == 1:
        model = shard_modules(model, env=ShardingEnv.local(str(device)), plan=sharding_plan, sharders=sharders)
    else:
        model = _shard_in_one_process(model, sharding_plan, world_size, device, sharders)
    return model, sharding_plan
