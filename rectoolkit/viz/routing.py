"""Trace one batch through a sharded embedding collection: which ids go to which rank, what comes back.

Computed from the plan and the wire protocol of `rectoolkit.plan.traffic` alone (no processes): for every
source rank, feature and shard, the ids of that rank's batch that fall in the shard's rows travel to the
shard's owner (input_dist), and the owner sends back one pooled row per sample of the shard's columns
(partial sums for row-wise types; two hops through a gateway for table-row-wise and grid), or one row per
id for sequence tables.

    >>> import torch
    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> plan = {"t": ParameterSharding("row_wise", ranks=[0, 1], shards=[
    ...     ShardMetadata.on_rank(0, 0, 0, 5, 4), ShardMetadata.on_rank(1, 5, 0, 5, 4)])}
    >>> batch = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 7, 8]), lengths=torch.tensor([2, 1]))
    >>> routes = routing_frame(plan, [t], [batch, batch])
    >>> routes[routes.source_rank == 0][["owner_rank", "ids", "input_bytes", "output_bytes"]].values.tolist()
    [[0, [1], 16, 32], [1, [7, 8], 24, 32]]
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from rectoolkit.plan.traffic import ID_BYTES, LENGTH_BYTES, TWO_LEVEL, VALUE_BYTES, WEIGHT_BYTES, is_pooled
from rectoolkit.plan.types import ShardingType
from rectoolkit.viz.frames import PlanLike, TablesLike, table_configs, table_shardings
from rectoolkit.viz.style import rank_color

ROUTE_COLUMNS = ["source_rank", "feature", "table", "sharding_type", "shard", "owner_rank", "rows", "columns",
                 "ids", "num_ids", "input_bytes", "returns", "return_rank", "output_bytes"]


def _ids_by_feature(batch) -> dict:
    return {key: jt for key, jt in batch.to_dict().items()}


def routing_frame(plan: PlanLike, tables: TablesLike, batches: Sequence, local_world_size: Optional[int] = None,
                  is_weighted: bool = False) -> pd.DataFrame:
    """One row per (source rank, feature, shard): the ids sent to the shard's owner and what comes back.

    `batches` holds one KeyedJaggedTensor per rank (its local batch). `return_rank` is where the pooled rows
    go first: the source rank itself, or for two-level types the gateway in the owner's host.
    """
    configs = table_configs(tables)
    shardings = table_shardings(plan)
    world_size = len(batches)
    local = local_world_size or world_size
    id_bytes = ID_BYTES + (WEIGHT_BYTES if is_weighted else 0)
    records = []
    for source, batch in enumerate(batches):
        features = _ids_by_feature(batch)
        batch_size = int(batch.stride())
        for name, ps in shardings.items():
            table = configs.get(name)
            if table is None:
                raise KeyError(f"routing_frame: no config for table {name!r}; pass its EmbeddingBagConfig in tables")
            kind = ShardingType(ps.sharding_type)
            for feature in table.feature_names:
                if feature not in features:
                    raise KeyError(f"rank {source}'s batch has no feature {feature!r} (table {name!r}); "
                                   f"it has {list(features)}")
                ids = features[feature].values()
                if kind == ShardingType.DATA_PARALLEL:
                    records.append((source, feature, name, ps.sharding_type, -1, source, (0, table.num_embeddings),
                                    (0, table.embedding_dim), ids.tolist(), int(ids.numel()), 0,
                                    "local lookup on the replica", source, 0))
                    continue
                for index, shard in enumerate(ps.shards):
                    row_start, row_end = shard.rows
                    mask = (ids >= row_start) & (ids < row_end)
                    shard_ids = ids[mask].tolist()
                    cols = shard.shard_sizes[1]
                    input_bytes = LENGTH_BYTES * batch_size + id_bytes * len(shard_ids)
                    if not is_pooled(table):
                        returns, back_to, out = f"{len(shard_ids)} rows x {cols} cols", source, VALUE_BYTES * cols * len(shard_ids)
                    elif kind in TWO_LEVEL:
                        back_to = (shard.rank // local) * local + source % local
                        returns = f"[{batch_size} x {cols}] partial sums to gateway rank {back_to}"
                        out = VALUE_BYTES * batch_size * cols
                    else:
                        partial = "partial sums" if kind == ShardingType.ROW_WISE else "pooled rows"
                        returns, back_to, out = f"[{batch_size} x {cols}] {partial}", source, VALUE_BYTES * batch_size * cols
                    records.append((source, feature, name, ps.sharding_type, index, shard.rank, shard.rows,
                                    shard.columns, shard_ids, len(shard_ids), input_bytes, returns, back_to, out))
    return pd.DataFrame.from_records(records, columns=ROUTE_COLUMNS)


def route_matrices(routes: pd.DataFrame, world_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """[W, W] bytes: input ids (source -> owner) and first-hop outputs (owner -> return rank)."""
    inputs = np.zeros((world_size, world_size), dtype=np.int64)
    outputs = np.zeros((world_size, world_size), dtype=np.int64)
    moved = routes[routes.shard >= 0]
    np.add.at(inputs, (moved.source_rank.to_numpy(dtype=int), moved.owner_rank.to_numpy(dtype=int)),
              moved.input_bytes.to_numpy(dtype=np.int64))
    np.add.at(outputs, (moved.owner_rank.to_numpy(dtype=int), moved.return_rank.to_numpy(dtype=int)),
              moved.output_bytes.to_numpy(dtype=np.int64))
    return inputs, outputs


def routing_traces(routes: pd.DataFrame, world_size: int, feature: Optional[str] = None,
                   source_rank: Optional[int] = None, measure: str = "bytes") -> Tuple[List[dict], dict]:
    """A Sankey diagram: rank i's batch -> shard owners -> pooled rows back (filtered by feature/source)."""
    chosen = routes[routes.shard >= 0]
    if feature is not None:
        chosen = chosen[chosen.feature == feature]
    if source_rank is not None:
        chosen = chosen[chosen.source_rank == source_rank]
    labels = ([f"rank {r} batch" for r in range(world_size)] + [f"rank {r} shards" for r in range(world_size)]
              + [f"rank {r} gets rows" for r in range(world_size)])
    colors = [rank_color(r) for r in range(world_size)] * 3
    source, target, value, link_color, link_label = [], [], [], [], []
    for row in chosen.itertuples(index=False):
        amount_in = row.num_ids if measure == "ids" else row.input_bytes
        source.append(row.source_rank)
        target.append(world_size + row.owner_rank)
        value.append(amount_in)
        link_color.append(_fade(rank_color(row.source_rank)))
        link_label.append(f"{row.feature}: {row.num_ids} ids {row.ids[:8]}{'...' if row.num_ids > 8 else ''}")
        if measure == "bytes":
            source.append(world_size + row.owner_rank)
            target.append(2 * world_size + row.return_rank)
            value.append(row.output_bytes)
            link_color.append(_fade(rank_color(row.owner_rank)))
            link_label.append(f"{row.table}: {row.returns}")
    trace = dict(
        type="sankey", arrangement="fixed",
        node=dict(label=labels, color=colors, pad=12, thickness=14,
                  x=[0.01] * world_size + [0.5] * world_size + [0.99] * world_size,
                  y=[(r + 0.5) / world_size for r in range(world_size)] * 3),
        link=dict(source=source, target=target, value=value, color=link_color, label=link_label),
    )
    what = f"feature {feature}" if feature else "all features"
    who = f"rank {source_rank}'s batch" if source_rank is not None else "every rank's batch"
    layout = dict(title=dict(text=f"Trace a batch: {what}, {who} ({measure})"), height=380,
                  margin=dict(l=10, r=10, t=50, b=10))
    return [trace], layout


def routing_figure(routes: pd.DataFrame, world_size: int, feature: Optional[str] = None,
                   source_rank: Optional[int] = None, measure: str = "bytes"):
    """Sankey of one batch's ids going to shard owners and pooled rows coming back."""
    import plotly.graph_objects as go

    traces, layout = routing_traces(routes, world_size, feature, source_rank, measure)
    return go.Figure(data=traces, layout=layout)


def _fade(color: str, alpha: float = 0.45) -> str:
    red, green, blue = int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)
    return f"rgba({red},{green},{blue},{alpha})"
