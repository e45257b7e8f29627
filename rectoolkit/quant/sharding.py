"""Sharded inference: a quantized EmbeddingBagCollection or EmbeddingCollection split by a plan over ranks, with
the unsharded module's answer.

    sharded = shard_quant_embedding_bag_collection(qebc, plan, ShardingEnv.from_process_group())
    sharded(local_kjt)          # KeyedTensor of this rank's samples, as rectoolkit.distributed's sharded EBC
    sharded = shard_quant_embedding_collection(qec, plan, env)
    sharded(local_kjt)          # {feature: JaggedTensor [ids, dim]} of this rank's ids

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.distributed import ShardingEnv
    >>> from rectoolkit.quant import QuantEmbeddingCollection
    >>> ec = rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="t", num_embeddings=6, embedding_dim=8,
    ...                                                   feature_names=["f"])])
    >>> qec = QuantEmbeddingCollection.from_float(ec, dtype=torch.int8, backend="torch")
    >>> on = rtk.ShardMetadata.on_rank
    >>> plan = {"t": rtk.ParameterSharding("column_wise", ranks=[0, 0], shards=[on(0, 0, 0, 6, 4), on(0, 0, 4, 6, 4)])}
    >>> sharded = shard_quant_embedding_collection(qec, plan, ShardingEnv.local())
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([5, 0, 3]), torch.tensor([2, 1]))
    >>> torch.equal(sharded(kjt)["f"].values(), qec(kjt)["f"].values())
    True

The communication (input_dist, output_dist) is rectoolkit.distributed's, unchanged; only each rank's local
lookup is swapped for a quantized one (rectoolkit.quant.lookup) holding this rank's shards, so the module reads
like the float one. A shard stores the quantized table's own bytes: table-wise and row-wise shards are its rows,
column-wise shards its codes of those columns with each row's scale and bias (quant.rowwise.slice_columns_rowwise).
Every value read is then the unsharded module's, exactly; pooled outputs may differ only by summation order.

Supported sharding types: quantized bags TABLE_WISE, ROW_WISE, COLUMN_WISE, TABLE_ROW_WISE, GRID_SHARD;
quantized sequences TABLE_WISE, ROW_WISE, COLUMN_WISE (TorchRec's QuantEmbeddingCollectionSharder). DATA_PARALLEL
is not (give every replica the quantized module instead).
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection
from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType
from rectoolkit.plan.types import ParameterSharding, ShardingType, ShardMetadata
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from rectoolkit.quant.fp_embedding_modules import QuantFeatureProcessedEmbeddingBagCollection
from rectoolkit.quant.lookup import QuantBatchedLookup, QuantTableSpec
from rectoolkit.quant.pruning import stored_rows
from rectoolkit.quant.rowwise import _check_dim, slice_columns_rowwise
from rectoolkit.quant.sharded_state import StoredRowsState
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

BAG_SHARDING_TYPES = [ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE,
                      ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD]
SEQUENCE_SHARDING_TYPES = [ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE]


def shard_quant_embedding_bag_collection(qebc: QuantEmbeddingBagCollection,
                                         module_plan: Mapping[str, ParameterSharding], env,
                                         backend: str = "auto") -> nn.Module:
    """Shard a QuantEmbeddingBagCollection by `module_plan` on `env` (a rectoolkit.distributed.ShardingEnv)."""
    configs = qebc.embedding_bag_configs()
    check_quant_plan(type(qebc).__name__, configs, module_plan, BAG_SHARDING_TYPES)
    processor = getattr(qebc, "feature_processor", None)  # a quantized feature-processed collection's
    kind = ShardedQuantEmbeddingBagCollection if processor is None else ShardedQuantFeatureProcessedEmbeddingBagCollection
    # The sharded module built for float tables gives the communication; its float shards are replaced below.
    sharded = kind(_float_configs(configs), module_plan, env, is_weighted=qebc.is_weighted(), backend="torch",
                   ids_out_of_range=qebc._ids_out_of_range)
    if processor is not None:
        sharded.feature_processor = processor
    return _quantize_shards(sharded, configs, _stored_rows(qebc.embedding_bags), qebc.row_alignment, backend,
                            pooled=True)


def shard_quant_embedding_collection(qec: QuantEmbeddingCollection, module_plan: Mapping[str, ParameterSharding],
                                     env, backend: str = "auto") -> nn.Module:
    """Shard a QuantEmbeddingCollection by `module_plan` on `env`: table-, row- or column-wise, per table."""
    configs = qec.embedding_configs()
    check_quant_plan(type(qec).__name__, configs, module_plan, SEQUENCE_SHARDING_TYPES)
    sharded = ShardedQuantEmbeddingCollection(_float_configs(configs), module_plan, env, backend="torch",
                                              ids_out_of_range=qec._ids_out_of_range,
                                              need_indices=qec.need_indices(), output_dtype=qec.output_dtype())
    return _quantize_shards(sharded, configs, _stored_rows(qec.embeddings), qec.row_alignment, backend,
                            pooled=False)


def check_quant_plan(collection: str, configs: Sequence[BaseEmbeddingConfig],
                     module_plan: Mapping[str, ParameterSharding], supported: Sequence[ShardingType]) -> None:
    """Refuse, on every rank alike, what a quantized collection cannot shard: a sharding type it does not support,
    and column blocks whose edges fall inside a byte of packed codes (INT4: 2 columns per byte, INT2: 4)."""
    data_types = {t.name: t.data_type for t in configs}
    pruned = {t.name: (stored_rows(t), t.num_embeddings) for t in configs
              if t.name in module_plan and stored_rows(t) < t.num_embeddings}
    if pruned:
        raise NotImplementedError(
            f"{collection}: tables {sorted(pruned)} are pruned (rows kept of num_embeddings: {pruned}); rectoolkit "
            "does not shard pruned quantized tables (TorchRec 1.8 shards quantized models for CUDA only); serve the "
            "unsharded quantized model, or quantize without set_pruning_data to shard")
    for name, ps in module_plan.items():
        kind = ShardingType.parse(ps.sharding_type)
        if kind not in supported:
            hint = ("for data parallel serving, give every replica the quantized module" if
                    kind == ShardingType.DATA_PARALLEL else f"plan one of {[t.value for t in supported]}")
            raise ValueError(f"table {name!r} is planned {kind.value}, which a sharded {collection} does not support; "
                             f"{hint}")
        if name not in data_types:
            continue  # the plan check of the sharded module names unknown tables
        for shard in ps.shards:
            try:
                _check_dim(shard.shard_sizes[1], data_types[name])
                _check_dim(shard.shard_offsets[1], data_types[name])
            except ValueError:
                raise ValueError(f"table {name!r} ({data_types[name].value}) has a column block at columns "
                                 f"{shard.shard_offsets[1]}..{shard.shard_offsets[1] + shard.shard_sizes[1]}, whose "
                                 "edges fall inside a byte of packed codes; plan column blocks whose start and "
                                 "width are multiples of the codes per byte") from None


class QuantizedShards(StoredRowsState):
    """What both sharded quantized collections say about their shards: stored bytes, no optimizer state; their
    state_dict is the stored rows (rectoolkit.quant.sharded_state)."""

    own_table_view = False  # their state is the stored rows of their groups (not the float table view)
    inference_only = True  # nothing trains: per-id weights that require grad are read as data

    def memory_bytes(self) -> Dict[str, int]:
        """Bytes of the quantized shards on this rank, and where they live (as ShardedCollection.memory_bytes)."""
        held = self.quantized_bytes
        on_gpu = self.env.device.type == "cuda"
        return {"weights": held, "optimizer": 0, "device": held if on_gpu else 0, "host": 0 if on_gpu else held}

    def local_shards(self) -> List[Tuple[str, ShardMetadata, torch.Tensor, Dict[str, torch.Tensor]]]:
        """(table, shard, stored rows uint8 [rows, row bytes], {}) of every shard this rank holds."""
        return [(table, shard, rows, {}) for group in self.groups.values() if group.local.kernel is not None
                for (table, _), shard, rows in zip(group.local.shard_keys, group.local.shards,
                                                   group.local.kernel.table_weights())]


class ShardedQuantEmbeddingBagCollection(QuantizedShards, ShardedEmbeddingBagCollection):
    """A QuantEmbeddingBagCollection sharded for inference: forward gives the KeyedTensor itself (TorchRec's
    inference modules return no awaitable)."""

    def unsharded_module_type(self) -> type:
        return QuantEmbeddingBagCollection

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self._run_groups(features)


class ShardedQuantFeatureProcessedEmbeddingBagCollection(ShardedQuantEmbeddingBagCollection):
    """A quantized FeatureProcessedEmbeddingBagCollection sharded for inference: its `feature_processor` (whole on
    every rank, as TorchRec's) weights each rank's ids before they are distributed."""

    def unsharded_module_type(self) -> type:
        return QuantFeatureProcessedEmbeddingBagCollection

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self._run_groups(self.feature_processor(features))


class ShardedQuantEmbeddingCollection(QuantizedShards, ShardedEmbeddingCollection):
    """A QuantEmbeddingCollection sharded for inference: forward gives {feature: JaggedTensor} itself (as
    TorchRec's ShardedQuantEmbeddingCollection), in the quantized module's output dtype. A batch size per feature
    (VBE) is refused, as by the unsharded QuantEmbeddingCollection."""

    takes_variable_batch = False

    def unsharded_module_type(self) -> type:
        return QuantEmbeddingCollection

    def __init__(self, tables, module_plan, env: ShardingEnv, backend: str = "auto", ids_out_of_range: str = "error",
                 need_indices: bool = False, output_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(tables, module_plan, env, backend=backend, ids_out_of_range=ids_out_of_range,
                         need_indices=need_indices)
        self._output_dtype = output_dtype

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        return self._run_groups(features)

    def _outputs(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        outputs = super()._outputs(features)
        if self._output_dtype == torch.float32:
            return outputs
        # the shards look up in float32 and the cast comes last, as the unsharded lookup casts its float32 rows
        return {name: JaggedTensor(values=jt.values().to(self._output_dtype), lengths=jt.lengths(),
                                   weights=jt.weights_or_none()) for name, jt in outputs.items()}

    def output_dtype(self) -> torch.dtype:
        return self._output_dtype


class QuantEmbeddingBagCollectionSharder(ModuleSharder):
    """TorchRec's sharder for the quantized EmbeddingBagCollection: `shard()` gives the sharded inference module.

    Sharding types: table-, row- and column-wise, TABLE_ROW_WISE, GRID_SHARD (not DATA_PARALLEL).
    """

    module_type = QuantEmbeddingBagCollection
    _types = BAG_SHARDING_TYPES
    _shard: Callable[..., nn.Module] = staticmethod(shard_quant_embedding_bag_collection)

    def __init__(self, fused_params=None, shardable_params=None, qcomm_codecs_registry=None) -> None:
        # (TorchRec's order: fused_params, shardable_params)
        given = {k: v for k, v in (("fused_params", fused_params), ("shardable_params", shardable_params),
                                   ("qcomm_codecs_registry", qcomm_codecs_registry)) if v is not None}
        if given:
            raise NotImplementedError(f"{type(self).__name__}({', '.join(given)}=...): not implemented "
                                      "for rectoolkit's quantized sharding; leave them None")
        super().__init__()

    def shardable_parameters(self, module):
        """Table name -> its stored (quantized) weight, as TorchRec names them: every state_dict "*.weight"."""
        return {name.split(".")[-2]: weight for name, weight in module.state_dict().items() if name.endswith(".weight")}

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [t.value for t in self._types]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return ["quant"]

    def shard(self, module, params, env, device=None, module_fqn=None):
        """Shard `module` by its plan entry `params` (table -> ParameterSharding) on `env`."""
        if not isinstance(module, self.module_type):
            raise TypeError(f"{type(self).__name__}.shard: got a {type(module).__name__}, this sharder shards "
                            f"{self.module_type.__name__}")
        if device is not None and torch.device(device) != env.device:
            env = ShardingEnv(env.world_size, env.rank, env.pg, local_world_size=env.local_world_size,
                              device=torch.device(device))
        on_meta = sorted(name for name, tensor in module.state_dict().items() if tensor.is_meta)
        if on_meta:
            raise ValueError(f"{type(self).__name__}.shard: the {type(module).__name__}'s stored rows {on_meta} are on "
                             "the meta device; rectoolkit shards the quantized weights themselves: quantize the model "
                             "with its weights (e.g. load the trained state_dict before quantize_embeddings / "
                             "quantize_inference_model), or with any weights and then load the quantized module's "
                             "state_dict into the sharded model")
        if env.world_size > 1 and env.pg is None and not torch.distributed.is_initialized():
            # TorchRec's ShardingEnv(W, 0) in a process without a process group: the W ranks are held here
            from rectoolkit.quant.one_process import shard_quant_in_one_process  # (it builds on this module)

            sharded = shard_quant_in_one_process(module.to(env.device), dict(params), env.world_size)
        else:
            sharded = self._shard(module, dict(params), env)
        sharded.module_fqn = module_fqn
        return sharded


class QuantEmbeddingCollectionSharder(QuantEmbeddingBagCollectionSharder):
    """TorchRec's sharder for the quantized EmbeddingCollection: table-, row- and column-wise.

    >>> QuantEmbeddingCollectionSharder().sharding_types("cpu")
    ['table_wise', 'row_wise', 'column_wise']
    """

    module_type = QuantEmbeddingCollection
    _types = SEQUENCE_SHARDING_TYPES
    _shard = staticmethod(shard_quant_embedding_collection)


class QuantFeatureProcessedEmbeddingBagCollectionSharder(QuantEmbeddingBagCollectionSharder):
    """TorchRec's sharder for the quantized FeatureProcessedEmbeddingBagCollection: the bag collection's sharding
    types; the feature processors go whole with every rank's sharded module."""

    module_type = QuantFeatureProcessedEmbeddingBagCollection


def _float_configs(configs: Sequence[BaseEmbeddingConfig]) -> List[BaseEmbeddingConfig]:
    float_configs = copy.deepcopy(list(configs))
    for config in float_configs:
        config.data_type = DataType.FP32
    return float_configs


def _stored_rows(tables: nn.ModuleDict) -> Dict[str, torch.Tensor]:
    return {name: module.weight for name, module in tables.items()}


def _quantize_shards(sharded, configs: Sequence[BaseEmbeddingConfig], stored: Mapping[str, torch.Tensor],
                     row_alignment: int, backend: str, pooled: bool) -> nn.Module:
    """Replace each group's float lookup by a quantized one holding the stored bytes of this rank's shards."""
    data_types = {t.name: t.data_type for t in configs}
    dims = {t.name: t.embedding_dim for t in configs}
    quantized_bytes = 0
    for group in sharded.groups.values():
        local = group.local
        if local.kernel is None:
            continue
        specs = [QuantTableSpec(s.shard_sizes[0], s.shard_sizes[1], data_types[t], f"{t}__{k}")
                 for (t, k), s in zip(local.shard_keys, local.shards)]
        lookup = QuantBatchedLookup(specs, feature_table_map=local.kernel.feature_table_map, pooled=pooled,
                                    row_alignment=row_alignment, backend=backend, device=sharded.env.device)
        copy_shard_rows(lookup, [t for t, _ in local.shard_keys], local.shards, stored, data_types, dims,
                        row_alignment)
        local.kernel = lookup
        local.weights = nn.ParameterDict()  # drop the float shards
        quantized_bytes += lookup.storage_bytes()
    sharded.quantized_bytes = quantized_bytes  # bytes of the quantized shards on this rank
    sharded.stored_layout = (data_types, row_alignment)  # how its rows are stored (quant.sharded_state slices them)
    return sharded


def copy_shard_rows(lookup: QuantBatchedLookup, tables: Sequence[str], shards: Sequence[ShardMetadata],
                    stored: Mapping[str, torch.Tensor], data_types: Mapping[str, DataType], dims: Mapping[str, int],
                    row_alignment: int) -> None:
    """Fill the lookup's tables (one per shard, in order) with the stored bytes of each shard's rows (and, for a
    column block, the codes of its columns with each row's scale and bias)."""
    with torch.no_grad():
        for table, shard, view in zip(tables, shards, lookup.table_weights()):
            (r0, r1), (c0, c1) = shard.rows, shard.columns
            rows = stored[table][r0:r1]
            if (c0, c1) != (0, dims[table]):
                rows = slice_columns_rowwise(rows, data_types[table], dims[table], c0, c1, row_alignment)
            view.copy_(rows)
