"""Sharded EmbeddingCollection (sequence embeddings: one row per id), the twin of sharded_ebc.py.

    >>> import rectoolkit as rtk
    >>> ec = rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                   feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_collection(ec, plan, ShardingEnv.local())
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 3, 3]), torch.tensor([1, 2]))
    >>> torch.equal(sharded(kjt)["f"].values(), ec(kjt)["f"].values())
    True

Every id's row slice goes back to the rank that sent the id (one level, for every sharding type); groups
return flat blocks and their flat positions in the [ids, dim] output, added into one zero tensor.

A KJT with a batch size per feature (VBE) is taken as TorchRec 1.8's sharded EmbeddingCollection takes it: every
feature's lengths travel padded to the largest batch size (empty bags, no ids: `pad_vbe_kjt_lengths`), the rows
come back per id, and each feature's output is then expanded to the full batch with the inverse indices: sample b
of feature f gets the bag (lengths, rows, ids) of f's sample inverse[f, b] (`_compute_sequence_vbe_context`). The
unsharded EmbeddingCollection, like TorchRec's, returns each feature at its own batch size instead.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

from rectoolkit.distributed.awaitable import EmbeddingCollectionAwaitable
from rectoolkit.distributed.comm import ShardingEnv, divide_gradient
from rectoolkit.distributed.fbgemm_qcomm_codec import QuantizedCommCodecs
from rectoolkit.distributed.feature_shards import FeatureBatch, permute_segments
from rectoolkit.distributed.fused_params import with_table_options
from rectoolkit.distributed.sharded_ebc import ShardedCollection, _initial_weights, _optimizers
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
from rectoolkit.modules.embedding_modules import EmbeddingCollection
from rectoolkit.modules.layout import guard_gradient
from rectoolkit.plan.types import ParameterSharding
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor


class ShardedEmbeddingCollection(ShardedCollection):
    """An EmbeddingCollection sharded by a plan: KJT (local batch) -> {feature: JaggedTensor [ids, dim]}; a KJT
    with a batch size per feature (and its inverse indices) gives every feature at the full batch, as TorchRec's."""

    takes_variable_batch = True

    def __init__(self, tables, module_plan, env: ShardingEnv, optimizer: Optional[FusedOptimizerConfig] = None,
                 initial_weights: Optional[Mapping[str, torch.Tensor]] = None, backend: str = "auto",
                 ids_out_of_range: str = "error", need_indices: bool = False,
                 default_optimizer: Optional[FusedOptimizerConfig] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None) -> None:
        if len({t.embedding_dim for t in tables}) > 1:
            raise ValueError("all tables of an EmbeddingCollection need one embedding_dim")
        super().__init__(tables, module_plan, env, False, False, optimizer, initial_weights or {}, backend,
                         ids_out_of_range, default_optimizer, qcomm_codecs_registry)
        self._need_indices = need_indices
        self._dim = tables[0].embedding_dim

    def unsharded_module_type(self) -> type:
        return EmbeddingCollection

    def forward(self, features: KeyedJaggedTensor) -> EmbeddingCollectionAwaitable:
        """{feature: JaggedTensor} of this rank's ids, as TorchRec's awaitable (`.wait()` gives the dict; `[name]`,
        `.items()` work on the awaitable too)."""
        return EmbeddingCollectionAwaitable(self._run(features))

    def _outputs(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        batch, received = self._batch_and_received(features)
        counts = [batch.values[f].numel() for f in self._features]
        out = torch.zeros(sum(counts) * self._dim, device=self.env.device)
        for group, group_received in zip(self.groups.values(), received):
            block, where = group(batch, group_received)
            out = out.index_add(0, where, block)
        if self._optimizer is not None:  # refuse NaN/inf gradients before the fused update (modules.layout)
            out = guard_gradient(out, type(self).__name__)
        rows = divide_gradient(out, self.env).view(-1, self._dim)
        inverse = self._layout.inverse_indices(features) if batch.strides is not None else None
        if inverse is not None:
            return self._expanded(rows, batch, inverse)
        rows = rows.split(counts)
        return {name: JaggedTensor(values=r, lengths=batch.lengths[f],
                                   weights=batch.values[f] if self._need_indices else None)
                for name, f, r in zip(self._embedding_names, self._features, rows)}

    def _expanded(self, rows: torch.Tensor, batch: FeatureBatch, inverse: torch.Tensor) -> Dict[str, JaggedTensor]:
        """Every feature at the full batch: sample b of feature k is the bag inverse[k, b] of the (padded) batch."""
        F, B = len(self._features), batch.batch_size
        lengths = torch.stack([batch.lengths[f] for f in self._features])  # [F, B] (empty bags past each stride)
        inverse = inverse.to(lengths.device)
        bags = (inverse + torch.arange(F, device=lengths.device).unsqueeze(1) * B).reshape(-1)
        new_lengths, positions = permute_segments(lengths.reshape(-1, 1), bags)
        new_lengths = new_lengths.view(F, -1)
        counts = new_lengths.sum(1).tolist()
        values = rows.index_select(0, positions.to(rows.device)).split(counts)
        ids = torch.cat([batch.values[f] for f in self._features])[positions].split(counts) \
            if self._need_indices else [None] * F
        return {name: JaggedTensor(values=v, lengths=n, weights=i)
                for name, v, n, i in zip(self._embedding_names, values, new_lengths, ids)}

    def embedding_dim(self) -> int:
        return self._dim


def shard_embedding_collection(module: EmbeddingCollection, module_plan: Mapping[str, ParameterSharding],
                               env: ShardingEnv, backend: str = "auto", fused_params: Optional[Mapping[str, Any]] = None,
                               torchrec_default_optimizer: bool = False,
                               qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
                               ) -> ShardedEmbeddingCollection:
    """Shard an EmbeddingCollection (see shard_embedding_bag_collection)."""
    optimizer, default = _optimizers(module, fused_params, torchrec_default_optimizer)
    module_plan = with_table_options(module_plan, fused_params)  # its per-table options, where the plan has none
    return ShardedEmbeddingCollection(
        module.embedding_configs(), module_plan, env, optimizer=optimizer,
        initial_weights=_initial_weights(module), backend=backend,
        ids_out_of_range=getattr(module, "_ids_out_of_range", "error"), need_indices=module.need_indices(),
        default_optimizer=default, qcomm_codecs_registry=qcomm_codecs_registry)
