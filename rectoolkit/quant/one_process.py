"""Sharded inference in one process: a quantized collection split by a plan over W ranks that are shard holders
inside this process (TorchRec's single-process sharded inference model, its "devices" being CPU ranks here),
with the routing of ids to shards written as tensor ops of static shape, so torch.export gives one program.

    model = shard_quant_in_one_process(qebc, plan, world_size=2)   # or a QuantEmbeddingCollection
    model(kjt)                          # KeyedTensor (bags) or {feature: JaggedTensor} (sequences), as qebc(kjt)
    program = export_with_jagged_inputs(model, (kjt,))      # one program: routing, every rank's lookup, assembly
    rank_program = model.export_rank(1, kjt)                # rank 1 alone: (values, lengths[, weights]) -> blocks

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.quant import QuantEmbeddingBagCollection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=6, embedding_dim=8,
    ...                                                           feature_names=["f"])])
    >>> qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, backend="torch")
    >>> on = rtk.ShardMetadata.on_rank
    >>> plan = {"t": rtk.ParameterSharding("column_wise", ranks=[0, 1], shards=[on(0, 0, 0, 6, 4), on(1, 0, 4, 6, 4)])}
    >>> model = shard_quant_in_one_process(qebc, plan, world_size=2)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([5, 0, 3]), torch.tensor([2, 1]))
    >>> torch.equal(model(kjt).values(), qebc(kjt).values())
    True

Routing. A *feature shard* is one (feature, shard) pair (rectoolkit.distributed.feature_shards); its ids are those of
the feature inside the shard's rows. The multi-process modules bucket ids by owner (sizes read from the data, sent
in a "metadata" all-to-all); here every feature shard sees all N ids of the batch, with a mask instead:

    mask[p, i]   = feature_of_id[i] == feature(p)  and  row_start(p) <= id[i] < row_end(p)      [pieces, N]
    local ids    = where(mask, id - row_start(p), 0)       (row 0 exists in every shard)
    bags         per-id weight mask (times the KJT's weights): each piece pools every bag of the batch, the ids
                 of other features and rows weigh 0; piece p's answer is its feature's B bags
    sequences    each piece's rows where(mask, row, 0): every id gets its row from exactly one row block

So the shapes are static in the number of ids and the batch size: no `.tolist()`, no byte counting, no branch on
data. The answer of every piece lands at its columns (the feature's output columns + the shard's column block);
row blocks of one column block add up. Every value read is the quantized table's own (the shards store its bytes),
so sequences and table- or column-wise bags equal the unsharded module exactly; row-wise bags differ only by the
order of float sums (partial sums per row block). Sharding types: as rectoolkit.quant.sharding (bags: table-,
row-, column-wise, TABLE_ROW_WISE, GRID_SHARD; sequences: table-, row-, column-wise). The lookup is the pure-torch
one (aten ops only, so the exported program runs without fbgemm). The cost: each rank reads every id once per
feature shard it holds, instead of only its own.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rectoolkit.distributed.feature_shards import FeatureShard, make_feature_shards
from rectoolkit.modules.layout import GatheredFeatures, rows_per_feature
from rectoolkit.plan.types import ParameterSharding
from rectoolkit.plan.validation import validate_module_plan
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection, mean_pooled
from rectoolkit.quant.export import export_flat
from rectoolkit.quant.lookup import QuantBatchedLookup, QuantTableSpec
from rectoolkit.quant.sharded_state import StoredRowsState
from rectoolkit.quant.sharding import BAG_SHARDING_TYPES, SEQUENCE_SHARDING_TYPES, check_quant_plan, copy_shard_rows
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from rectoolkit.sparse.validation import is_tracing


def shard_quant_in_one_process(module: nn.Module, module_plan: Mapping[str, ParameterSharding],
                               world_size: int) -> nn.Module:
    """A QuantEmbeddingBagCollection or QuantEmbeddingCollection sharded by `module_plan` over `world_size` ranks
    held in this process (see the module docstring); its forward takes and returns what `module`'s does."""
    if isinstance(module, QuantEmbeddingBagCollection):
        sharded = OneProcessShardedQuantEmbeddingBagCollection(module, module_plan, world_size)
        processor = getattr(module, "feature_processor", None)  # a quantized feature-processed collection's
        return sharded if processor is None else FeatureProcessedInOneProcess(processor, sharded)
    if isinstance(module, QuantEmbeddingCollection):
        return OneProcessShardedQuantEmbeddingCollection(module, module_plan, world_size)
    raise TypeError(f"shard_quant_in_one_process takes a QuantEmbeddingBagCollection or QuantEmbeddingCollection, got "
                    f"a {type(module).__name__}; quantize it first (from_float or quantize_embeddings)")


class FeatureProcessedInOneProcess(nn.Module):
    """A quantized FeatureProcessedEmbeddingBagCollection sharded in one process: its feature processors (whole,
    as the unsharded one's) in front of the sharded lookup."""

    def __init__(self, feature_processor: nn.Module, sharded: nn.Module) -> None:
        super().__init__()
        self.feature_processor = feature_processor
        self.sharded = sharded

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self.sharded(self.feature_processor(features))


class RankShards(nn.Module):
    """The shards one rank holds, with its routing and lookup: (values, lengths[, weights]) of the whole batch, the
    collection's features in order -> this rank's answers. Bags: [F * B, sum of piece columns] (piece p's bags
    are rows feature(p) * B ... of its columns); sequences: [pieces, N, columns] (zero where an id is not its)."""

    def __init__(self, rank: int, pieces: Sequence[FeatureShard], feature_names: Sequence[str],
                 quantized: nn.Module, module_plan: Mapping[str, ParameterSharding], pooled: bool) -> None:
        super().__init__()
        self.rank = rank
        self.pieces: List[FeatureShard] = list(pieces)
        self.pooled = pooled
        self.num_features = len(feature_names)
        self.piece_feature = [list(feature_names).index(p.feature) for p in self.pieces]
        if not pooled and len({p.cols for p in self.pieces}) > 1:
            raise ValueError(f"rank {rank} holds column shards of widths {sorted({p.cols for p in self.pieces})} of "
                             "an EmbeddingCollection; give the column shards one width (or place them on other ranks)")
        self._columns = self.pieces[0].cols if self.pieces else 0  # sequences: one width per rank (checked above)
        configs = {t.name: t for t in (quantized.embedding_bag_configs() if pooled else quantized.embedding_configs())}
        shard_keys = list(dict.fromkeys((p.table, p.shard_index) for p in self.pieces))
        shards = [module_plan[table].shards[k] for table, k in shard_keys]
        self.held = [(table, shard) for (table, _), shard in zip(shard_keys, shards)]  # (the lookup's tables' order)
        specs = [QuantTableSpec(s.shard_sizes[0], s.shard_sizes[1], configs[t].data_type, f"{t}__{k}")
                 for (t, k), s in zip(shard_keys, shards)]
        self.lookup = QuantBatchedLookup(specs, feature_table_map=[shard_keys.index((p.table, p.shard_index))
                                                                   for p in self.pieces],
                                         pooled=pooled, row_alignment=quantized.row_alignment, backend="torch",
                                         device=quantized.device)
        tables = getattr(quantized, quantized._dict_name)
        copy_shard_rows(self.lookup, [t for t, _ in shard_keys], shards, {n: m.weight for n, m in tables.items()},
                        {n: c.data_type for n, c in configs.items()}, {n: c.embedding_dim for n, c in configs.items()},
                        quantized.row_alignment)
        device = quantized.device
        self.register_buffer("_piece_feature", torch.tensor(self.piece_feature, device=device)[:, None],
                             persistent=False)
        self.register_buffer("_row_start", torch.tensor([p.row_start for p in self.pieces], device=device)[:, None],
                             persistent=False)
        self.register_buffer("_row_end", torch.tensor([p.row_end for p in self.pieces], device=device)[:, None],
                             persistent=False)
        self.register_buffer("_features", torch.arange(self.num_features, device=device), persistent=False)

    def forward(self, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        ids = values.to(torch.int64)
        num_ids, pieces = ids.shape[0], len(self.pieces)
        lengths = lengths.to(torch.int64)
        ids_per_feature = lengths.view(self.num_features, lengths.shape[0] // self.num_features).sum(1)
        feature_of_id = self._features.repeat_interleave(ids_per_feature, output_size=num_ids)
        mask = (feature_of_id[None, :] == self._piece_feature) & (ids >= self._row_start) & (ids < self._row_end)
        local_ids = torch.where(mask, ids - self._row_start, torch.zeros_like(ids)).reshape(-1)
        # every piece reads the batch's bags (its own feature's hold its ids; the others hold ids that weigh 0)
        bag_ends = torch.cumsum(lengths, 0)
        piece_starts = torch.arange(pieces, device=ids.device)[:, None] * num_ids
        offsets = torch.cat([lengths.new_zeros(1), (bag_ends[None, :] + piece_starts).reshape(-1)])
        if not self.pooled:
            rows = self.lookup(local_ids, offsets).view(pieces, num_ids, self._columns)  # not -1: no ids
            return torch.where(mask[:, :, None], rows, torch.zeros_like(rows))
        per_id = mask.to(torch.float32)
        if weights is not None:  # where, not a product: a weight of another piece (even inf or NaN) weighs 0 here
            per_id = torch.where(mask, weights.to(torch.float32)[None, :], torch.zeros_like(per_id))
        return self.lookup(local_ids, offsets, per_id.reshape(-1))

    def extra_repr(self) -> str:
        return f"rank={self.rank}, pieces={[(p.feature, p.table, p.shard_index) for p in self.pieces]}"


class _OneProcessSharded(StoredRowsState, nn.Module):
    """What the bag and sequence forms share: the plan check, one RankShards per rank, the front door; the state_dict
    of every rank's stored rows (rectoolkit.quant.sharded_state)."""

    def __init__(self, quantized: nn.Module, module_plan: Mapping[str, ParameterSharding], world_size: int,
                 supported, pooled: bool) -> None:
        super().__init__()
        configs = quantized.embedding_bag_configs() if pooled else quantized.embedding_configs()
        check_quant_plan(type(quantized).__name__, configs, module_plan, supported)
        validate_module_plan(module_plan, configs, world_size, type(self).__name__)
        self.world_size = world_size
        self._is_weighted = pooled and quantized.is_weighted()
        self._layout = quantized._layout
        self._ids_out_of_range = quantized._ids_out_of_range
        self._feature_names: List[str] = list(quantized._feature_names)
        output_keys = quantized._embedding_names_by_table
        by_owner = make_feature_shards(configs, output_keys, {t.name: module_plan[t.name] for t in configs},
                                       world_size)
        self.ranks = nn.ModuleDict({str(rank): RankShards(rank, pieces, self._feature_names, quantized, module_plan,
                                                          pooled)
                                    for rank, pieces in enumerate(by_owner) if pieces})
        self._configs = list(configs)
        self.stored_layout = ({c.name: c.data_type for c in configs}, quantized.row_alignment)  # (sharded_state)

    def embedding_configs(self) -> list:
        return list(self._configs)

    def local_shards(self) -> list:
        """(table, shard, stored rows uint8 [rows, row bytes], {}) of every rank's shards (all held here)."""
        return [(table, shard, rows, {}) for shards in self.ranks.values()
                for (table, shard), rows in zip(shards.held, shards.lookup.table_weights())]

    def _gather(self, features: KeyedJaggedTensor, weighted: bool) -> GatheredFeatures:
        gathered = self._layout.gather(features, weighted)
        if not is_tracing():
            self._layout.check_ids(gathered, self._ids_out_of_range, subject=f"{type(self).__name__}: ")
        return gathered

    def export_rank(self, rank: int, example: KeyedJaggedTensor, dynamic: bool = True) -> torch.export.ExportedProgram:
        """torch.export of one rank's program: (values, lengths[, weights]) of the whole batch, features in the
        collection's order (as `export_for_serving`'s boundary) -> that rank's answers (RankShards)."""
        if str(rank) not in self.ranks:
            raise ValueError(f"rank {rank} holds no shard of this collection; ranks with shards: {list(self.ranks)}")
        gathered = self._layout.gather(example, self._is_weighted)
        args = (gathered.values, gathered.lengths) + ((gathered.weights,) if self._is_weighted else ())
        return export_flat(self.ranks[str(rank)], args, len(self._feature_names), dynamic)


class OneProcessShardedQuantEmbeddingBagCollection(_OneProcessSharded):
    """A QuantEmbeddingBagCollection sharded over ranks held in one process: KJT -> KeyedTensor [B, sum of dims]."""

    def embedding_bag_configs(self) -> list:
        """The bag collection's configs (TorchRec's name; its state_dict keys are "embedding_bags.<table>...")."""
        return self.embedding_configs()

    def __init__(self, qebc: QuantEmbeddingBagCollection, module_plan: Mapping[str, ParameterSharding],
                 world_size: int) -> None:
        super().__init__(qebc, module_plan, world_size, BAG_SHARDING_TYPES, pooled=True)
        self._embedding_names = list(qebc._embedding_names)
        self._length_per_key = list(qebc._length_per_key)
        self._has_mean = qebc._has_mean
        self._output_dtype = qebc.output_dtype()
        self.register_buffer("_mean_features", qebc._mean_features.clone(), persistent=False)
        self.register_buffer("_dims_per_feature", qebc._dims_per_feature.clone(), persistent=False)
        starts = [0]
        for dim in self._length_per_key:
            starts.append(starts[-1] + dim)
        self._feature_columns = starts

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        gathered = self._gather(features, self._is_weighted)
        num_features, width = len(self._feature_names), self._feature_columns[-1]
        batch_size = gathered.lengths.shape[0] // num_features
        pooled = gathered.lengths.new_zeros(batch_size, width, dtype=torch.float32)
        for shards in self.ranks.values():
            answers = shards(gathered.values, gathered.lengths, gathered.weights if self._is_weighted else None)
            answers = answers.view(num_features, batch_size, answers.shape[1])
            column = 0
            for piece, f in zip(shards.pieces, shards.piece_feature):
                start = self._feature_columns[f] + piece.col_start
                block = answers[f, :, column:column + piece.cols]
                pooled = pooled + F.pad(block, (start, width - start - piece.cols))
                column += piece.cols
        pooled = pooled.to(self._output_dtype)  # cast, then divide: as the unsharded collection
        if self._has_mean:
            pooled = mean_pooled(pooled, gathered.lengths, self._mean_features, self._dims_per_feature)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._length_per_key, values=pooled, key_dim=1)


class OneProcessShardedQuantEmbeddingCollection(_OneProcessSharded):
    """A QuantEmbeddingCollection sharded over ranks held in one process: KJT -> {feature: JaggedTensor [ids, dim]}."""

    def __init__(self, qec: QuantEmbeddingCollection, module_plan: Mapping[str, ParameterSharding],
                 world_size: int) -> None:
        super().__init__(qec, module_plan, world_size, SEQUENCE_SHARDING_TYPES, pooled=False)
        self._dim = qec.embedding_dim()
        self._need_indices = qec.need_indices()
        self._output_dtype = qec.output_dtype()
        self._output_names = qec._output_names()
        self._output_order = [name for i in qec._state_order for name in qec._embedding_names_by_table[i]]

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        gathered = self._gather(features, self._is_weighted)
        rows = torch.zeros(gathered.values.shape[0], self._dim, device=gathered.values.device)
        for shards in self.ranks.values():
            answers = shards(gathered.values, gathered.lengths)
            for p, piece in enumerate(shards.pieces):
                rows = rows + F.pad(answers[p], (piece.col_start, self._dim - piece.col_end))
        outputs = rows_per_feature(self._output_names, rows.to(self._output_dtype), gathered, self._need_indices)
        return {name: outputs[name] for name in self._output_order}
