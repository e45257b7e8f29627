"""Sharded inference: a quantized EmbeddingBagCollection split by a plan over ranks, same answer as unsharded.

    sharded = shard_quant_embedding_bag_collection(qebc, plan, ShardingEnv.from_process_group())
    sharded(local_kjt)          # KeyedTensor of this rank's samples, as rectoolkit.distributed's sharded EBC

The communication (input_dist, output_dist) is rectoolkit.distributed's, unchanged; only each rank's local
lookup is swapped for a quantized one (rectoolkit.quant.lookup) holding this rank's shards:
- table-wise and row-wise shards are slices of the stored rows (the same bytes, so the same numbers);
- column-wise shards are re-quantized per column block (each block gets its own per-row scale and bias,
  as a table of that width would), so they differ from the unsharded rows by at most one quantization step
  of the block.

Supported: TABLE_WISE, ROW_WISE, COLUMN_WISE, TABLE_ROW_WISE, GRID_SHARD; DATA_PARALLEL is not (replicate
the quantized module instead).
"""

from __future__ import annotations

import copy
from typing import Mapping

import torch
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.configs import DataType
from rectoolkit.plan.types import ParameterSharding, ShardingType
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection
from rectoolkit.quant.lookup import QuantBatchedLookup, QuantTableSpec
from rectoolkit.quant.rowwise import dequantize_rowwise, quantize_rowwise
from rectoolkit.sparse import KeyedJaggedTensor, KeyedTensor


def shard_quant_embedding_bag_collection(qebc: QuantEmbeddingBagCollection,
                                         module_plan: Mapping[str, ParameterSharding], env,
                                         backend: str = "auto") -> nn.Module:
    """Shard a QuantEmbeddingBagCollection by `module_plan` on `env` (a rectoolkit.distributed.ShardingEnv)."""
    for name, ps in module_plan.items():
        if ShardingType.parse(ps.sharding_type) == ShardingType.DATA_PARALLEL:
            raise ValueError(f"table {name!r} is planned DATA_PARALLEL; quantized tables shard table-, row- or "
                             "column-wise (for data parallel serving, give every replica the QuantEmbeddingBagCollection)")
    data_types = {t.name: t.data_type for t in qebc.embedding_bag_configs()}
    float_configs = copy.deepcopy(qebc.embedding_bag_configs())
    for config in float_configs:
        config.data_type = DataType.FP32
    # The sharded module built for float tables gives the communication; its float shards are replaced below.
    sharded = ShardedQuantEmbeddingBagCollection(float_configs, module_plan, env, is_weighted=qebc.is_weighted(),
                                            backend="torch", ids_out_of_range=qebc._ids_out_of_range)
    stored = {name: module.weight for name, module in qebc.embedding_bags.items()}
    dims = {t.name: t.embedding_dim for t in qebc.embedding_bag_configs()}
    quantized_bytes = 0
    for group in sharded.groups.values():
        local = group.local
        if local.kernel is None:
            continue
        specs = [QuantTableSpec(s.shard_sizes[0], s.shard_sizes[1], data_types[t], f"{t}__{k}")
                 for (t, k), s in zip(local.shard_keys, local.shards)]
        lookup = QuantBatchedLookup(specs, feature_table_map=local.kernel.feature_table_map, pooled=True,
                                    row_alignment=qebc.row_alignment, backend=backend, device=env.device)
        with torch.no_grad():
            for (table, _), shard, view in zip(local.shard_keys, local.shards, lookup.table_weights()):
                view.copy_(_shard_rows(stored[table], data_types[table], dims[table], shard, qebc.row_alignment))
        local.kernel = lookup
        local.weights = nn.ParameterDict()  # drop the float shards
        quantized_bytes += lookup.storage_bytes()
    sharded.quantized_bytes = quantized_bytes  # bytes of the quantized shards on this rank
    return sharded


class ShardedQuantEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """A QuantEmbeddingBagCollection sharded for inference: forward gives the KeyedTensor itself (TorchRec's
    inference modules return no awaitable)."""

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self._run_groups(features)


class QuantEmbeddingBagCollectionSharder(ModuleSharder):
    """TorchRec's sharder for the quantized EmbeddingBagCollection: `shard()` gives the sharded inference module.

    Sharding types: table-, row- and column-wise, TABLE_ROW_WISE, GRID_SHARD (not DATA_PARALLEL).
    """

    module_type = QuantEmbeddingBagCollection
    _types = [ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE,
              ShardingType.GRID_SHARD]

    def __init__(self, fused_params=None, qcomm_codecs_registry=None, shardable_params=None) -> None:
        given = {k: v for k, v in (("fused_params", fused_params), ("qcomm_codecs_registry", qcomm_codecs_registry),
                                   ("shardable_params", shardable_params)) if v is not None}
        if given:
            raise NotImplementedError(f"QuantEmbeddingBagCollectionSharder({', '.join(given)}=...): not implemented "
                                      "for rectoolkit's quantized sharding; leave them None")
        super().__init__()

    def shardable_parameters(self, module):
        """Table name -> its stored (quantized) weight, as TorchRec names them: every state_dict "*.weight"."""
        return {name.split(".")[-2]: weight for name, weight in module.state_dict().items() if name.endswith(".weight")}

    def sharding_types(self, compute_device_type: str):
        return [t.value for t in self._types]

    def compute_kernels(self, sharding_type: str, compute_device_type: str):
        return ["quant"]

    def shard(self, module, params, env, device=None, module_fqn=None):
        """Shard `module` by its plan entry `params` (table -> ParameterSharding) on `env`."""
        if device is not None and torch.device(device) != env.device:
            env = ShardingEnv(env.rank, env.world_size, env.local_world_size, env.pg, torch.device(device))
        sharded = shard_quant_embedding_bag_collection(module, dict(params), env)
        sharded.module_fqn = module_fqn
        return sharded


def _shard_rows(rows: torch.Tensor, data_type: DataType, dim: int, shard, row_alignment: int) -> torch.Tensor:
    (r0, r1), (c0, c1) = shard.rows, shard.columns
    if (c0, c1) == (0, dim):
        return rows[r0:r1]  # whole rows: the stored bytes as they are
    block = dequantize_rowwise(rows[r0:r1], data_type, dim)[:, c0:c1]
    return quantize_rowwise(block, data_type, row_alignment)

