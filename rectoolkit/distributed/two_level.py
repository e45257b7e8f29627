"""The two-level output_dist of TABLE_ROW_WISE and GRID_SHARD (L = local_world_size ranks per host).

    output_dist_intra  each rank sends its partial sums for rank i to the *gateway* of i on its own host,
                       g = host * L + local(i); the gateway adds them up                      (all-to-all + sum)
    output_dist_inter  the gateway sends rank i the reduced [B, cols]                          (all-to-all)

Only reduced sums cross hosts (the point of the two types: the fast intra-host links carry the partial sums).
With a batch size per feature (VBE) every block travels at its feature's own batch size at both levels: the owner
knows the bags of its feature shards from their input_dist header, the gateway those of the keys it reduces (the
source's header to its gateways, feature_shards.start_ids_to_owners' `gateway_keys`), and the requesting rank its
own; it expands the result once, at the end (sharded_ebc.py).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from rectoolkit.distributed.comm import ShardingEnv, all_to_all_with_grad, from_ragged, to_ragged
from rectoolkit.distributed.fbgemm_qcomm_codec import CommOp, codecs_for
from rectoolkit.distributed.feature_shards import FeatureShard, ReceivedIds


class TwoLevelRoutes:
    """Who sends what in the two output_dist levels; every rank computes the same routes from the feature shards.

    A *unit* is (output key, column block): what a gateway reduces and sends across hosts. Each column
    block lives on one host, so units are grouped by host. A registry of codecs (fbgemm_qcomm_codec) sets the
    precisions of both levels, as TorchRec's: the intra level is a reduce-scatter, the inter level an all-to-all.
    """

    def __init__(self, env: ShardingEnv, by_owner: Sequence[Sequence[FeatureShard]], key_offsets: Mapping[str, int],
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None):
        L, W = env.local_world_size, env.world_size
        self.intra_codecs = codecs_for(qcomm_codecs_registry, CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER)
        self.inter_codecs = codecs_for(qcomm_codecs_registry, CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL)
        self.env, self.hosts, self.L = env, W // L, L
        units: List[Dict[Tuple[str, int, int], int]] = [dict() for _ in range(self.hosts)]  # per host: unit -> column
        self.unit_cols = [0] * self.hosts
        features: Dict[str, str] = {}  # output key -> its input feature
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
                    features[piece.output_key] = piece.feature
        self.by_owner = by_owner
        # per host, in column order: (output key, cols) of each unit, and the (output key, feature) pairs its
        # gateways hear the batch sizes of (VBE)
        self.units = [[(key, c1 - c0) for key, c0, c1 in host_units] for host_units in units]
        self.gateway_keys = [list(dict.fromkeys((key, features[key]) for key, _, _ in host_units))
                             for host_units in units]
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

    def to_requesters(self, pooled: torch.Tensor, received: ReceivedIds) -> torch.Tensor:
        """output_dist_intra then output_dist_inter, on transposed blocks ([cols, B], see feature_shards.LocalShards.lookup).

        Returns [all unit columns (host by host), B_me]. Each block carries the bags of its source, or with VBE of
        its feature (to_ragged); the bags a block lacks are zero columns at the end.
        """
        env, W, L, H = self.env, self.env.world_size, self.L, self.hosts
        my_host, me_local = env.host, env.local_rank
        pieces = self.by_owner[env.rank]
        same_host = [r // L == my_host for r in range(W)]
        # intra: partial sums for the H ranks a gateway serves, to that gateway (a rank of my host)
        B = pooled.shape[1]
        mine = self.cols_by_owner[env.rank]
        regrouped = pooled.view(W, mine * B).index_select(0, self.source_order).view(W * mine, B)
        served_by = [[h * L + g % L for h in range(H)] for g in range(W)]  # the sources gateway g serves

        def block_numel(cols: Sequence[int], bags: Sequence[int]) -> int:
            return sum(c * n for c, n in zip(cols, bags))

        piece_cols = [p.cols for p in pieces]
        send = to_ragged(regrouped, piece_cols * W, [n for i in self.source_ranks for n in received.bags[i]])
        send_numels = [sum(block_numel(piece_cols, received.bags[i]) for i in served_by[g]) if same_host[g] else 0
                       for g in range(W)]

        # the gateway adds up the partial sums of each rank it serves (rank h * L + me_local on host h)
        def heard(source: int, key: str) -> int:  # the bags of `key` from `source`
            return received.gateway_bags[source][key] if received.gateway_bags[source] else received.batch_sizes[source]

        served = served_by[env.rank]
        from_owner = [[(p.cols, heard(i, p.output_key)) for i in served for p in self.by_owner[o]] if same_host[o]
                      else [] for o in range(W)]
        receive_numels = [sum(c * n for c, n in blocks) for blocks in from_owner]
        received_sums = all_to_all_with_grad(env, send, send_numels, receive_numels, "output_dist_intra",
                                             self.intra_codecs)
        blocks = [block for o in self.my_host_ranks for block in from_owner[o]]
        units = self.units[my_host]
        unit_bags = [[heard(i, key) for key, _ in units] for i in served]
        B_served = max([n for _, n in blocks] + [n for bags in unit_bags for n in bags], default=0)
        rows = from_ragged(received_sums, [c for c, _ in blocks], [n for _, n in blocks], B_served)
        width = self.unit_cols[my_host]
        reduced = rows.new_zeros(H * width, B_served).index_add(0, self.gateway_rows, rows)
        # inter: the reduced sums to the ranks this gateway serves (same local index on every host)
        unit_cols = [c for _, c in units]
        send_numels = [0] * W
        for i, bags in zip(served, unit_bags):
            send_numels[i] = block_numel(unit_cols, bags)
        own_bags = [[received.gateway_bags_sent.get(key, received.batch_size) for key, _ in self.units[h]]
                    for h in range(H)]
        receive_numels = [block_numel([c for _, c in self.units[g // L]], own_bags[g // L])
                          if g % L == me_local else 0 for g in range(W)]
        block = all_to_all_with_grad(env, to_ragged(reduced, unit_cols * H, [n for bags in unit_bags for n in bags]),
                                     send_numels, receive_numels, "output_dist_inter", self.inter_codecs)
        return from_ragged(block, [c for host_units in self.units for _, c in host_units],
                           [n for bags in own_bags for n in bags], received.batch_size)


def _cat_or_empty(parts):
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
