"""The two-level output_dist of TABLE_ROW_WISE and GRID_SHARD (L = local_world_size ranks per host).

    output_dist_intra  each rank sends its partial sums for rank i to the *gateway* of i on its own host,
                       g = host * L + local(i); the gateway adds them up                      (all-to-all + sum)
    output_dist_inter  the gateway sends rank i the reduced [B, cols]                          (all-to-all)

Only reduced sums cross hosts (the point of the two types: the fast intra-host links carry the partial sums).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import torch

from rectoolkit.distributed.comm import ShardingEnv, all_to_all_with_grad, from_ragged, to_ragged
from rectoolkit.distributed.feature_shards import FeatureShard


class TwoLevelRoutes:
    """Who sends what in the two output_dist levels; every rank computes the same routes from the feature shards.

    A *unit* is (output key, column block): what a gateway reduces and sends across hosts. Each column
    block lives on one host, so units are grouped by host.
    """

    def __init__(self, env: ShardingEnv, by_owner: Sequence[Sequence[FeatureShard]], key_offsets: Mapping[str, int]):
        L, W = env.local_world_size, env.world_size
        self.env, self.hosts, self.L = env, W // L, L
        units: List[Dict[Tuple[str, int, int], int]] = [dict() for _ in range(self.hosts)]  # per host: unit -> column
        self.unit_cols = [0] * self.hosts
        for owner, pieces in enumerate(by_owner):
            host = owner // L
            for piece in pieces:
                unit = (piece.output_key, piece.col_start, piece.col_end)
                if any(unit in units[h] for h in range(self.hosts) if h != host):
                    raise ValueError(f"table {piece.table!r}: columns {piece.col_start}..{piece.col_end} have row blocks on "
                                     "two hosts; each column block of a two-level table must stay inside one host")
                if unit not in units[host]:
                    units[host][unit] = self.unit_cols[host]
                    self.unit_cols[host] += piece.cols
        self.cols_by_owner = [sum(p.cols for p in pieces) for pieces in by_owner]
        my_host = env.host
        self.my_host_ranks = [r for r in range(W) if r // L == my_host]
        # gateway side: received rows arrive as (owner of my host, served rank by host h, shard column); each
        # goes to row h * unit_cols + (its unit's column) of the reduced [H * unit_cols, B] block
        width = self.unit_cols[my_host]
        gateway_rows = [h * width + torch.arange(units[my_host][(b.output_key, b.col_start, b.col_end)],
                                                 units[my_host][(b.output_key, b.col_start, b.col_end)] + b.cols)
                        for owner in self.my_host_ranks for h in range(self.hosts) for b in by_owner[owner]]
        self.gateway_rows = _cat_or_empty(gateway_rows).to(env.device)
        # receiver side: where each unit column goes in the collection's output, host by host
        final_cols = [torch.arange(key_offsets[key] + c0, key_offsets[key] + c1)
                      for host in range(self.hosts) for (key, c0, c1) in units[host]]
        self.final_columns = _cat_or_empty(final_cols).to(env.device)
        # the owner's rows for source i, regrouped by the gateway serving i: local index first, then host
        self.source_ranks = [l + h * L for l in range(L) for h in range(self.hosts)]
        self.source_order = torch.tensor(self.source_ranks, device=env.device)

    def to_requesters(self, pooled: torch.Tensor, batch_sizes: Sequence[int]) -> torch.Tensor:
        """output_dist_intra then output_dist_inter, on transposed blocks ([cols, B], see feature_shards.LocalShards.lookup).

        Returns [all unit columns (host by host), B_me]. Blocks for rank i carry its B_i columns (to_ragged).
        """
        env, W, L, H = self.env, self.env.world_size, self.L, self.hosts
        my_host, me_local = env.host, env.local_rank
        mine = self.cols_by_owner[env.rank]
        same_host = [r // L == my_host for r in range(W)]
        # intra: partial sums for the H ranks a gateway serves, to that gateway (a rank of my host)
        B = pooled.shape[1]
        regrouped = pooled.view(W, mine * B).index_select(0, self.source_order).view(W * mine, B)
        served = [batch_sizes[i] for i in self.source_ranks]  # batch size of each regrouped block
        per_gateway = [sum(batch_sizes[h * L + g % L] for h in range(H)) for g in range(W)]
        received = all_to_all_with_grad(
            env, to_ragged(regrouped, [mine] * W, served), [mine * per_gateway[g] if same_host[g] else 0 for g in range(W)],
            [self.cols_by_owner[o] * per_gateway[env.rank] if same_host[o] else 0 for o in range(W)],
            "output_dist_intra")
        # the gateway adds up the partial sums of each rank it serves (rank h * L + me_local on host h)
        mine_served = [batch_sizes[h * L + me_local] for h in range(H)]
        B_served = max(mine_served)
        rows = from_ragged(received, [self.cols_by_owner[o] for o in self.my_host_ranks for _ in range(H)],
                           mine_served * len(self.my_host_ranks), B_served)
        width = self.unit_cols[my_host]
        reduced = rows.new_zeros(H * width, B_served).index_add(0, self.gateway_rows, rows)
        # inter: the reduced sums to the ranks this gateway serves (same local index on every host)
        same_local = [r % L == me_local for r in range(W)]
        received = all_to_all_with_grad(
            env, to_ragged(reduced, [width] * H, mine_served),
            [width * batch_sizes[i] if same_local[i] else 0 for i in range(W)],
            [self.unit_cols[g // L] * batch_sizes[env.rank] if same_local[g] else 0 for g in range(W)],
            "output_dist_inter")
        return received.view(-1, batch_sizes[env.rank])


def _cat_or_empty(parts):
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _cat_or_empty(parts):
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
