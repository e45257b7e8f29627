"""The cost model: per-rank memory (HBM and DDR) and per-rank step time of a sharding plan.

Memory of a shard on its rank: weights + optimizer state (+ a dense gradient for the "dense" kernel) +
input buffer (the lengths and ids it receives) + output buffer (the rows it produces). Where it lives:
fused / dense -> HBM; fused_uvm -> DDR; fused_uvm_caching -> DDR plus cache_load_factor of the weights in
HBM; buffers in HBM. On compute_device="cpu" everything is host memory (DDR). Dense replicas (the
model's non-embedding parameters) sit on every rank.

Time comes from the topology's calibration profile (rectoolkit.planner.profile; without one, TorchRec's
bandwidth-only terms). A rank's own time (what the search balances; `PlanCost.time_ms`) = its shards' lookups
(per shard: a fixed cost + the engine's work per id + the profile's LookupTerms: per id, per row byte at the read
speed of a shard that size, per output byte; the backward + fused update has its own LookupTerms per optimizer,
a DATA_PARALLEL replica's backward SGD's (it accumulates rows; the dense optimizer then updates the whole replica);
UVM reads at hbm_to_ddr_mem_bw, cached ones at a cache_load_factor mix) + its communication. Communication is priced
from rectoolkit.plan.traffic's matrices: for every collective M the engine issues, rank r spends sum over j != r of
(M[r, j] + M[j, r]) / bandwidth(r, j), at the speed of the profile's fitted pair that FITTED_COLLECTIVE names for M
(all-to-all for the input and output distributions, all-reduce for data-parallel gradients), within a host (across
hosts the topology's inter-host speed, scaled alike). The search uses closed forms of the same sums (`fill_many`,
batched over options), tested equal to pricing step_traffic's matrices.

The step estimate (`PlanCost.step`, `step_time_ms`; docs/cost_model.md) adds what per-rank sums cannot hold:
a fixed cost per step, and per sharding-type group a fixed cost and its collective calls' latency, with the
slowest rank at each synchronizing phase (the host's total work when local ranks share cores).

Training only: every estimate includes optimizer state, gradients and the backward collectives. An
inference plan for quantized tables (issue 8) is not modelled yet; when it is, weights should be sized by
rectoolkit.quant.sizes.shard_bytes (per-row scale/bias and row alignment) instead of element_bytes.

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.planner.topology import Topology
    >>> from rectoolkit.planner.tables import collect_tables
    >>> topo = Topology(world_size=2, compute_device="cuda", intra_host_bw=1000.0)
    >>> t = collect_tables([EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=8, feature_names=["f"])], 4)[0]
    >>> model = CostModel(topo, optimizer="sgd")
    >>> model.shard_memory(t, 100, 8, "table_wise", "fused", None)["weights"]
    3200.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from rectoolkit.kernels.optimizer_state import EmbOptimType, optimizer_state_bytes
from rectoolkit.modules.configs import EmbeddingBagConfig, EmbeddingConfig
from rectoolkit.plan.traffic import (COLLECTIVES, FORWARD_COLLECTIVES, LENGTH_BYTES, VALUE_BYTES,
                                     expected_id_counter, step_traffic)
from rectoolkit.plan.types import EmbeddingComputeKernel as K
from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.planner.enumerate import DEFAULT_CACHE_LOAD_FACTOR, HostTime, RankTime, ShardingOption
from rectoolkit.planner.link_bytes import ring_link_bytes, xy_link_bytes
from rectoolkit.planner.profile import COLLECTIVE_KINDS, ROW_ROUTED
from rectoolkit.planner.step_time import GroupTime, StepTime, collective_calls, engine_groups, plan_groups
from rectoolkit.planner.tables import PlannerTable, tables_by_module
from rectoolkit.planner.topology import Topology

MEMORY_PARTS = ("weights", "optimizer", "gradients", "input_buffer", "output_buffer", "dense")

# Which fitted alpha-beta pair of the calibration profile (rectoolkit.planner.profile) prices each collective the
# engine issues (rectoolkit.plan.traffic.COLLECTIVES): the distributions are all-to-alls (row-wise's reduce-scatter of
# partial sums too: it runs as an all-to-all), the data-parallel gradients one all-reduce. dp_allreduce's bytes are
# those of a reduce-scatter then an all-gather (traffic.py), which is what a ring all-reduce moves. No collective of
# the engine is priced with the reduce_scatter or all_gather pair today.
FITTED_COLLECTIVE = {
    "input_dist": "all_to_all",
    "output_dist": "all_to_all",
    "output_dist_intra": "all_to_all",
    "output_dist_inter": "all_to_all",
    "output_dist_backward": "all_to_all",
    "output_dist_intra_backward": "all_to_all",
    "output_dist_inter_backward": "all_to_all",
    "dp_allreduce": "all_reduce",
}


@dataclass
class PlanCost:
    """Per-rank memory and time of a plan, with the byte matrices they came from (all arrays length W)."""

    memory: Dict[str, np.ndarray]  # part -> bytes per rank (MEMORY_PARTS)
    hbm_bytes: np.ndarray
    ddr_bytes: np.ndarray
    lookup_fwd_ms: np.ndarray
    lookup_bwd_ms: np.ndarray
    comm_ms: Dict[str, np.ndarray]  # collective -> ms per rank
    traffic: Dict[str, np.ndarray]  # collective -> [W, W] bytes (source, destination)
    step: Optional["StepTime"] = None  # the synchronized step estimate (evaluate(); None from the search's sums)

    @property
    def time_ms(self) -> np.ndarray:
        return self.lookup_fwd_ms + self.lookup_bwd_ms + sum(self.comm_ms.values())

    @property
    def max_time_ms(self) -> float:
        return float(self.time_ms.max())

    @property
    def step_time_ms(self) -> float:
        """The estimated step time: what the planner minimizes and what a run of the plan should measure."""
        return self.step.total_ms if self.step is not None else self.max_time_ms

    @property
    def total_bytes(self) -> float:
        return float(sum(m.sum() - np.trace(m) for m in self.traffic.values()))


@dataclass
class ShardCosts:
    """CostModel.shard_costs: bytes by memory part and where they live, and lookup ms, each an [N, k] array."""

    weights: np.ndarray
    optimizer: np.ndarray
    gradients: np.ndarray
    input_buffer: np.ndarray
    output_buffer: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    forward_ms: np.ndarray
    backward_ms: np.ndarray


class CostModel:
    """Memory and time estimates for shards, options and whole plans on one topology."""

    def __init__(self, topology: Topology, optimizer: Union[str, EmbOptimType] = EmbOptimType.SGD,
                 dense_bytes_per_rank: float = 0.0, tables: Optional[Sequence[PlannerTable]] = None,
                 host_copies: int = 1) -> None:
        """`tables`: the tables being planned. Their weight bytes over the world size are what a rank reads from
        each step in a balanced plan, the working set its reads compete with in cache: a shard reads at the speed
        of max(its own size, that share). Without them, each shard's own size.

        `host_copies`: how many copies of the plan run at once on every host, each on its own local ranks (2D
        parallelism's sharding groups, rectoolkit.planner.two_dimensional): the topology is one copy's, and each
        host's cores (`oversubscription`) and, for ranks computing on the CPU, its memory (`_phase_ms`) are shared
        by all copies' ranks there; a GPU rank's lookups read its own device's memory."""
        if isinstance(host_copies, bool) or not isinstance(host_copies, int) or host_copies < 1:
            raise ValueError(f"CostModel: host_copies must be an int >= 1, got {host_copies!r}")
        self.topology = topology
        self.host_copies = host_copies
        self.optimizer = EmbOptimType.parse(optimizer)
        self.dense_bytes_per_rank = float(dense_bytes_per_rank)
        self.rank_share_bytes = sum(t.weight_bytes for t in tables) / topology.world_size if tables else 0.0
        self.profile = topology.time_profile
        measured = topology.profile is not None
        # link speeds: a profile's all-to-all speed inside a host (it was measured there); across hosts the
        # topology's, never faster than inside
        all_to_all = self.profile.collective("all_to_all")
        self.intra_bw = all_to_all.bytes_per_ms if measured else topology.intra_host_bw
        self.inter_bw = min(topology.inter_host_bw, self.intra_bw) if measured else topology.inter_host_bw
        # every fitted collective's (intra, inter) bytes per ms: its speed relative to all-to-all's, on either link
        self.link_bw = {kind: (self.intra_bw * scale, self.inter_bw * scale) for kind, scale in (
            (kind, self.profile.collective(kind).bytes_per_ms / all_to_all.bytes_per_ms) for kind in COLLECTIVE_KINDS)}
        self.forward_terms = self.profile.forward
        self.backward_terms = self.profile.backward(self.optimizer.value)  # backward + fused update
        # a DATA_PARALLEL replica's backward only accumulates gradient rows per id (no fused update: TorchRec's dense
        # kernel); the nearest measured pass is SGD's (one row add per id). Its update is the dense optimizer's,
        # over the whole replica: the dense gradient's whole-shard term in shard_costs
        self.replica_backward_terms = self.profile.backward("sgd")
        self._state_floats_by_cols: Dict[int, int] = {}

    # ---- shards: one vectorized formula; the scalar calls are its 1 x 1 case -------------------------------------
    def shard_costs(self, tables: Sequence[PlannerTable], sharding_types: Sequence, kernels: Sequence,
                    cache_load_factors: Sequence[Optional[float]], rows: np.ndarray, cols: np.ndarray) -> "ShardCosts":
        """Memory and lookup time of shards: entry i of the lists describes row i of `rows` and `cols` ([N, k]
        arrays: k shards of the same table, sharding type and kernel). Memory of a shard on its rank: weights +
        optimizer state (+ a dense gradient) + input buffer (lengths and ids it receives) + output buffer (rows it
        produces); time: the profile's LookupTerms forward and backward, plus a fixed cost per shard and the
        engine's work per id on the forward."""
        topo = self.topology
        rows, cols = np.asarray(rows, dtype=float), np.asarray(cols, dtype=float)
        column = lambda values, dtype=float: np.array(values, dtype=dtype)[:, None]  # noqa: E731
        sharding_types = [ShardingType.parse(t) for t in sharding_types]
        kernels = [K.parse(k) for k in kernels]
        uvm = column([k in (K.FUSED_UVM, K.QUANT_UVM) for k in kernels], bool)
        caching = column([k in (K.FUSED_UVM_CACHING, K.QUANT_UVM_CACHING) for k in kernels], bool)
        dense = column([k == K.DENSE for k in kernels], bool)
        hbm_fraction = column([_load_factor(f) for f in cache_load_factors])
        # ids and samples a shard receives per step: from every rank, or (data-parallel) from its own batch
        senders = column([id_senders(t, topo.world_size) for t in sharding_types])
        table_rows = column([t.rows for t in tables])
        element_bytes = column([t.element_bytes for t in tables])
        ids = shard_ids(column([t.ids_per_rank for t in tables]), senders, rows, table_rows)
        samples = senders * column([t.samples_per_rank for t in tables])
        # lengths received: a data-parallel replica its own samples, a shard VBE's when its collection sends them
        lengths = np.where(senders == 1, samples, senders * column([t.lengths_per_rank for t in tables]))
        state_floats = column([self._state_floats(int(c)) for c in cols.reshape(len(tables), -1)[:, 0]])
        weights = rows * cols * element_bytes
        optimizer = 4.0 * rows * state_floats
        gradients = np.where(dense, rows * cols * VALUE_BYTES, 0.0)
        input_buffer = LENGTH_BYTES * lengths + column([t.id_bytes for t in tables]) * ids
        output_buffer = VALUE_BYTES * cols * np.where(column([t.pooled for t in tables], bool), samples, ids)
        stored, buffers = weights + optimizer + gradients, input_buffer + output_buffer
        if topo.uses_hbm:
            hbm = np.where(uvm, buffers, np.where(caching, buffers + hbm_fraction * weights, stored + buffers))
            ddr = np.where(uvm | caching, stored, 0.0)
        else:
            hbm, ddr = np.zeros_like(stored), stored + buffers
        # cache-aware reads: at the speed of the shard's size, or of the rank's share of all tables when larger
        local_ms_per_byte = self.profile.read_ms_per_byte(np.maximum(weights, self.rank_share_bytes))
        far_ms_per_byte = 1.0 / topo.hbm_to_ddr_mem_bw
        read_ms_per_byte = np.where(uvm, far_ms_per_byte, np.where(
            caching, hbm_fraction * local_ms_per_byte + (1 - hbm_fraction) * far_ms_per_byte, local_ms_per_byte))
        row_bytes = cols * element_bytes
        rows_read = self.profile.rows_read(ids, rows)
        forward = self.forward_terms.cost_ms(ids, row_bytes, read_ms_per_byte, output_buffer, rows_read)
        backward = self.backward_terms.cost_ms(ids, row_bytes, read_ms_per_byte, output_buffer, rows_read)
        replica = column([t == ShardingType.DATA_PARALLEL for t in sharding_types], bool)
        if replica.any():
            backward = np.where(replica, self.replica_backward_terms.cost_ms(
                ids, row_bytes, read_ms_per_byte, output_buffer, rows_read), backward)
        # a dense gradient: zeroed, accumulated and applied over the whole shard (by the dense optimizer)
        backward = backward + np.where(dense, 3 * rows * cols * VALUE_BYTES / self.profile.write_bytes_per_ms, 0.0)
        # the engine's work per id (in proportion to the row bytes), plus row-block routing in the routed groups
        # routing buckets each id once for the whole row (grid: every column piece of a row block pays its share)
        routed = column([t.value in ROW_ROUTED for t in sharding_types], bool) * cols / column([t.dim for t in tables])
        engine_id_ms = self.profile.id_cost_ms(routed, row_bytes)
        shard_ms = column([self.profile.shard_fixed_ms(t.value) for t in sharding_types])
        forward = forward + np.where(rows > 0, shard_ms + ids * engine_id_ms, 0.0)
        return ShardCosts(weights, optimizer, gradients, input_buffer, output_buffer, hbm, ddr, forward, backward)

    def shard_memory(self, table: PlannerTable, rows: int, cols: int, sharding_type, kernel,
                     cache_load_factor: Optional[float]) -> Dict[str, float]:
        """Bytes by part for one shard on its rank, plus 'hbm' and 'ddr' totals."""
        costs = self.shard_costs([table], [sharding_type], [kernel], [cache_load_factor], [[rows]], [[cols]])
        return {part: float(getattr(costs, part)[0, 0]) for part in MEMORY_PARTS[:-1] + ("hbm", "ddr")}

    def shard_lookup_ms(self, table: PlannerTable, rows: int, cols: int, sharding_type, kernel,
                        cache_load_factor: Optional[float]) -> Tuple[float, float]:
        """(forward, backward) ms of one shard's lookup per step."""
        costs = self.shard_costs([table], [sharding_type], [kernel], [cache_load_factor], [[rows]], [[cols]])
        return float(costs.forward_ms[0, 0]), float(costs.backward_ms[0, 0])

    # ---- closed forms for the search, batched over options ------------------------------------------------
    def fill_many(self, options: Sequence[ShardingOption], tables: Sequence[PlannerTable], chunk: int = 512) -> None:
        """Fill many options at once (numpy over options); tables[i] is the table of options[i].

        Per group of an option: kind "rank" -> time_ms = RankTime(owner, host-mate, other-host ms), hbm/ddr = owner
        bytes; "host" -> time_ms = HostTime(inside[L], other-host), hbm/ddr = inside[L]; "fixed" -> [W] vectors.
        """
        by_kind: Dict[str, list] = {}
        for option, table in zip(options, tables):
            by_kind.setdefault(option.kind, []).append((option, table))
        for kind, pairs in by_kind.items():
            size = chunk if kind == "fixed" else len(pairs)
            for start in range(0, len(pairs), max(size, 1)):
                self._fill_batch(kind, pairs[start:start + size])

    def _fill_batch(self, kind: str, pairs) -> None:
        topo = self.topology
        W, L, H = topo.world_size, topo.local_world_size, topo.num_hosts
        # ms per byte on a link: every collective below but dp_allreduce is an all-to-all (FITTED_COLLECTIVE)
        intra_ms, inter_ms = 1.0 / self.intra_bw, 1.0 / self.inter_bw
        opts = [o for o, _ in pairs]
        col = lambda values, dtype=float: np.array(values, dtype=dtype)[:, None]  # noqa: E731
        samples = col([t.samples_per_rank for _, t in pairs])
        ids = col([t.ids_per_rank for _, t in pairs])
        id_bytes = col([t.id_bytes for _, t in pairs])
        pooled = col([t.pooled for _, t in pairs], bool)
        table_rows = col([t.rows for _, t in pairs], np.int64)
        dims = col([t.dim for _, t in pairs], np.int64)
        block = col([o.block_columns for o in opts])
        lengths_bytes = LENGTH_BYTES * col([t.lengths_per_rank for _, t in pairs])
        id_bytes_full = id_bytes * ids
        # bytes per output value (the mean of the value's and its gradient's: each crosses once), per exchange
        all_to_all_width = col([t.all_to_all_value_bytes for _, t in pairs])
        reduce_scatter_width = col([t.reduce_scatter_value_bytes for _, t in pairs])
        sequence_width = col([t.sequence_value_bytes for _, t in pairs])
        if kind == "rank":
            rows = table_rows.astype(float)
            out = block * np.where(pooled, all_to_all_width * samples, sequence_width * ids)
            unit = lengths_bytes + id_bytes_full + 2 * out  # input + output + its gradient
            lookup, hbm, ddr = self._shard_costs(pairs, rows, block)
            owner = (L - 1) * unit * intra_ms + (W - L) * unit * inter_ms + lookup
            for i, option in enumerate(opts):
                unit_bytes = float(unit[i, 0])
                option.time_ms = RankTime(float(owner[i, 0]), unit_bytes * intra_ms, unit_bytes * inter_ms)
                option.hbm_bytes, option.ddr_bytes = float(hbm[i, 0]), float(ddr[i, 0])
                option.peak_bytes = option.hbm_bytes + option.ddr_bytes
                option.bytes_per_group = (W - 1) * unit_bytes
                option.total_time_ms = option.num_groups * (option.time_ms[0] + (L - 1) * unit_bytes * intra_ms + (W - L) * unit_bytes * inter_ms)
                option.least_time_ms = option.num_groups * min(option.time_ms[0], unit_bytes * intra_ms if L > 1 else np.inf,
                                                               unit_bytes * inter_ms if H > 1 else np.inf)
            return
        if kind == "host":
            sizes = _row_block_sizes(table_rows, L)  # [N, L]
            fractions = sizes / table_rows
            to_shard = lengths_bytes + id_bytes_full * fractions  # input message to each local shard
            to_shards = to_shard.sum(axis=1, keepdims=True)
            intra = to_shard * (L - 1) + (to_shards - to_shard)
            inter = to_shard * (W - L)
            outside = to_shards.copy()
            intra_out = reduce_scatter_width * block * samples  # pooled: two-level output, partial sums
            inter_out = all_to_all_width * block * samples  # and the reduced sums
            rows_out = sequence_width * block * ids * fractions  # sequence: one row per id
            rows_out_sum = rows_out.sum(axis=1, keepdims=True)
            intra = intra + np.where(pooled, 4 * (L - 1) * H * intra_out, 2 * (rows_out * (L - 1) + (rows_out_sum - rows_out)))
            inter = inter + np.where(pooled, 2 * (H - 1) * inter_out, 2 * rows_out * (W - L))
            outside = outside + np.where(pooled, 2 * inter_out, 2 * rows_out_sum)
            lookup, hbm, ddr = self._shard_costs(pairs, sizes, block)
            inside = intra * intra_ms + inter * inter_ms + lookup
            outside_ms = outside[:, 0] * inter_ms
            totals = 0.5 * ((intra + inter).sum(axis=1) + (W - L) * outside[:, 0])
            # VBE count header to the gateways of a host: from each rank of another host to its host-mate there
            count_bytes = col([t.gateway_count_bytes for _, t in pairs])[:, 0]
            count_inside_ms, count_outside_ms = (H - 1) * count_bytes * inter_ms, count_bytes * inter_ms
            for i, option in enumerate(opts):
                option.time_ms = HostTime(inside[i], float(outside_ms[i]))
                option.hbm_bytes, option.ddr_bytes = hbm[i], ddr[i]
                option.peak_bytes = float(hbm[i].max() + ddr[i].max())
                option.bytes_per_group = float(totals[i])
                option.host_count_ms = (float(count_inside_ms[i]), float(count_outside_ms[i]))
                option.host_count_bytes = float((W - L) * count_bytes[i])
                # the counts of one host at least (a lower bound: the search prunes with it)
                option.total_time_ms = option.num_groups * (float(inside[i].sum()) + (W - L) * float(outside_ms[i])) \
                    + L * float(count_inside_ms[i]) + (W - L) * float(count_outside_ms[i])
                option.least_time_ms = option.num_groups * min(float(inside[i].min()),
                                                               float(outside_ms[i]) if H > 1 else np.inf)
            return
        # fixed: ROW_WISE (row blocks on every rank) or DATA_PARALLEL (replicas), [N, W] vectors
        row_wise = col([o.sharding_type == ShardingType.ROW_WISE for o in opts], bool)
        sizes_rw = _row_block_sizes(table_rows, W)
        fractions = sizes_rw / table_rows
        zeros = np.zeros_like(fractions)
        in_intra, in_inter = xy_link_bytes(zeros, lengths_bytes + id_bytes_full * fractions, L)
        out_per_rank = np.where(pooled, reduce_scatter_width * dims * samples, sequence_width * dims * ids * fractions)
        out_intra, out_inter = xy_link_bytes(out_per_rank, zeros, L)
        values = table_rows * dims
        chunks = (values // W + (np.arange(W)[None, :] < values % W)) * float(VALUE_BYTES)
        dp_intra, dp_inter = ring_link_bytes(chunks, L) if W > 2 else xy_link_bytes(chunks, chunks, L)
        dp_intra_bw, dp_inter_bw = self.link_bw[FITTED_COLLECTIVE["dp_allreduce"]]
        intra = np.where(row_wise, in_intra + 2 * out_intra, dp_intra)
        inter = np.where(row_wise, in_inter + 2 * out_inter, dp_inter)
        sizes = np.where(row_wise, sizes_rw, table_rows.astype(float))
        lookup, hbm, ddr = self._shard_costs(pairs, sizes, dims.astype(float))
        comm_ms = np.where(row_wise, in_intra * intra_ms + in_inter * inter_ms + 2 * (out_intra * intra_ms + out_inter * inter_ms),
                           dp_intra / dp_intra_bw + dp_inter / dp_inter_bw)
        time = comm_ms + lookup
        totals = 0.5 * (intra + inter).sum(axis=1)
        for i, option in enumerate(opts):
            option.time_ms, option.fixed_vectors = time[i], None
            option.hbm_bytes, option.ddr_bytes = hbm[i], ddr[i]
            option.peak_bytes = float(hbm[i].max() + ddr[i].max())
            option.bytes_per_group = float(totals[i])
            option.total_time_ms = float(time[i].sum())
            option.least_time_ms = float(time[i].min())

    def _shard_costs(self, pairs, rows: np.ndarray, cols: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lookup forward + backward ms, HBM bytes, DDR bytes) of the options' shards ([N, k] arrays)."""
        options = [o for o, _ in pairs]
        costs = self.shard_costs([t for _, t in pairs], [o.sharding_type for o in options],
                                 [o.compute_kernel for o in options], [o.cache_load_factor for o in options], rows, cols)
        return costs.forward_ms + costs.backward_ms, costs.hbm, costs.ddr

    def _state_floats(self, cols: int) -> int:
        """Optimizer state floats per row of a shard `cols` wide (memoized: the search asks per option)."""
        if cols not in self._state_floats_by_cols:
            self._state_floats_by_cols[cols] = optimizer_state_bytes(self.optimizer, 1, cols) // 4
        return self._state_floats_by_cols[cols]

    # ---- whole plans ---------------------------------------------------------------------------------------
    def evaluate(self, plan: ShardingPlan, tables: Sequence[PlannerTable], batch_sizes: Optional[Sequence[int]] = None,
                 count_ids=None) -> PlanCost:
        """Per-rank memory and time of a plan. Communication comes from step_traffic: expected ids from the
        tables' pooling factors, or exact ones when `count_ids` counts a real batch (then `batch_sizes`
        gives each rank's batch)."""
        topo = self.topology
        W = topo.world_size
        memory = {part: np.zeros(W) for part in MEMORY_PARTS}
        memory["dense"] += self.dense_bytes_per_rank
        hbm = np.zeros(W) + (self.dense_bytes_per_rank if topo.uses_hbm else 0.0)
        ddr = np.zeros(W) + (0.0 if topo.uses_hbm else self.dense_bytes_per_rank)
        ranks, costs = self._plan_shard_costs(list(plan.items()), tables)
        for part in MEMORY_PARTS[:-1]:
            np.add.at(memory[part], ranks, getattr(costs, part))
        np.add.at(hbm, ranks, costs.hbm)
        np.add.at(ddr, ranks, costs.ddr)
        fwd, bwd = np.zeros(W), np.zeros(W)
        np.add.at(fwd, ranks, costs.forward_ms)
        np.add.at(bwd, ranks, costs.backward_ms)
        traffic = self.traffic(plan, tables, batch_sizes, count_ids)
        step = StepTime(self.profile.step_ms, [self._group_time(path, kind, plan, tables, batch_sizes, count_ids)
                                               for path, kind in plan_groups(plan)], topo.load_factor)
        step.oversubscription = self.oversubscription
        step.load_share = self.load_share(fwd + bwd, step.quiet_ms)
        step.load_factor_alone = topo.load_factor_alone
        return PlanCost(memory, hbm, ddr, fwd, bwd, self.comm_ms(traffic), traffic, step)

    def _plan_shard_costs(self, entries, tables: Sequence[PlannerTable]) -> Tuple[np.ndarray, "ShardCosts"]:
        """(rank of every shard, ShardCosts as [shards] arrays) for (module path, table name, ParameterSharding)
        entries, in one vectorized call."""
        by_key = {t.key: t for t in tables}
        columns: Dict[str, list] = {"tables": [], "types": [], "kernels": [], "factors": [], "rows": [], "cols": []}
        ranks = []
        for path, name, ps in entries:
            table = by_key.get((path, name))
            if table is None:
                raise ValueError(f"plan has table {name!r} in module {path!r} that is not among the planner's tables")
            for shard in ps.shards:
                rows, cols = shard.shard_sizes
                for key, value in zip(columns, (table, ps.sharding_type, ps.compute_kernel, ps.cache_load_factor,
                                                [rows], [cols])):
                    columns[key].append(value)
                ranks.append(shard.rank)
        if not ranks:
            empty = np.zeros(0)
            return np.zeros(0, dtype=int), ShardCosts(*([empty] * 9))
        costs = self.shard_costs(columns["tables"], columns["types"], columns["kernels"], columns["factors"],
                                 np.array(columns["rows"]), np.array(columns["cols"]))
        flat = ShardCosts(*(getattr(costs, f.name)[:, 0] for f in dataclasses.fields(ShardCosts)))
        return np.array(ranks, dtype=int), flat

    def comm_ms(self, traffic: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """collective -> ms per rank: every byte a rank sends or receives over a link, at that link's speed for the
        fitted collective that prices it (FITTED_COLLECTIVE)."""
        comm = {}
        for name, matrix in traffic.items():
            bandwidth = self.bandwidth_matrix(FITTED_COLLECTIVE[name])
            per_link = (matrix + matrix.T) / bandwidth
            np.fill_diagonal(per_link, 0.0)
            comm[name] = per_link.sum(axis=1)
        return comm

    def _group_time(self, path: str, sharding_type: str, plan: ShardingPlan, tables: Sequence[PlannerTable],
                    batch_sizes, count_ids) -> GroupTime:
        """One group's share of the step (GroupTime): the slowest rank at each of its synchronizing phases."""
        W = self.topology.world_size
        module_plan = {name: ps for name, ps in plan.plan[path].items() if ps.sharding_type == sharding_type}
        ranks, costs = self._plan_shard_costs([(path, name, ps) for name, ps in module_plan.items()], tables)
        fwd, bwd = np.zeros(W), np.zeros(W)
        np.add.at(fwd, ranks, costs.forward_ms)
        np.add.at(bwd, ranks, costs.backward_ms)
        comm = self.comm_ms(self.traffic(ShardingPlan({path: module_plan}), tables, batch_sizes, count_ids))
        comm_fwd = sum(comm[name] for name in FORWARD_COLLECTIVES)
        comm_bwd = sum(comm[name] for name in comm if name not in FORWARD_COLLECTIVES)
        calls = collective_calls(ShardingType(sharding_type), len(module_plan), W)
        latency = sum(count * self.profile.collective(kind).alpha_ms for kind, count in calls.items())
        # the engine runs one group per kernel and dtype within a sharding type, each with its own collectives
        runs = engine_groups(module_plan, {t.name: t for t in tables if t.module_path == path})
        return GroupTime(path, sharding_type, runs * self.profile.group_fixed_ms(sharding_type), runs * latency,
                         self._phase_ms(fwd), float(comm_fwd.max()), self._phase_ms(bwd), float(comm_bwd.max()))

    @property
    def oversubscription(self) -> float:
        """A host's ranks (of every copy: host_copies) over its cores, at least 1: how much longer the ranks' CPU work
        between lookups takes when they all do it at once (StepTime.shared_cores_ms). 1 without cores_per_host (each
        rank its own core, or a GPU).

            >>> CostModel(Topology(world_size=4, compute_device="cpu", cores_per_host=2)).oversubscription
            2.0
            >>> CostModel(Topology(world_size=2, compute_device="cpu", cores_per_host=2), host_copies=3).oversubscription
            3.0
        """
        cores = self.topology.cores_per_host
        return max(1.0, self.topology.local_world_size * self.host_copies / cores) if cores else 1.0

    def load_share(self, work_ms: np.ndarray, quiet_ms: float) -> float:
        """Of the machine's load factor, the share a plan gets (step_at_load): on the host of the busiest rank, the
        mean busy share of its other local ranks over the quiet step, a rank's busy share being 1 - (the busiest
        rank's lookup work - its own) / quiet_ms. Balanced ranks give 1 (the load probe's own case), a plan that
        leaves the other local ranks mostly waiting gives little. One rank per host: 1.

        >>> model = CostModel(Topology(world_size=2, compute_device="cpu"))
        >>> model.load_share(np.array([6.0, 6.0]), 10.0), model.load_share(np.array([7.5, 0.0]), 10.0)
        (1.0, 0.25)
        """
        L = self.topology.local_world_size
        if L == 1 or quiet_ms <= 0:
            return 1.0
        per_host = np.asarray(work_ms, dtype=float).reshape(-1, L)
        ranks = per_host[int(np.argmax(per_host.max(axis=1)))]
        busy = np.clip(1.0 - (ranks.max() - ranks) / quiet_ms, 0.0, 1.0)
        return float((busy.sum() - busy.max()) / (L - 1))

    def _phase_ms(self, compute_ms: np.ndarray) -> float:
        """A compute phase between two collectives, on the host that takes longest. Its L local ranks share cores
        and memory: alone a rank runs at full speed, all at once they get `parallel` ranks' worth (the profile's
        memory_parallelism, at most the cores). The busiest rank's time is then its own work plus a share of the
        others' that grows as sharing does: max + (L / parallel - 1) / (L - 1) x (sum - max); no sharing gives the
        slowest rank, full sharing the host's total work, and two equal ranks 2 x work / parallel.

        >>> from rectoolkit.planner.profile import CalibrationProfile
        >>> model = CostModel(Topology(world_size=2, compute_device="cpu"))
        >>> model._phase_ms(np.array([3.0, 1.0]))  # no profile: two ranks share nothing
        3.0
        """
        per_host = compute_ms.reshape(-1, self.topology.local_world_size)
        copies = 1 if self.topology.uses_hbm else self.host_copies  # CPU ranks of every copy share the host's memory
        L = per_host.shape[1] * copies  # every copy's ranks on the host work alike at once
        parallel = min(float(L), self.profile.memory_parallelism, float(self.topology.cores_per_host or L))
        busiest, total = per_host.max(axis=1), per_host.sum(axis=1) * copies
        share = (L / parallel - 1.0) / (L - 1) if L > 1 else 0.0
        return float((busiest + share * (total - busiest)).max())

    def traffic(self, plan: ShardingPlan, tables: Sequence[PlannerTable], batch_sizes=None,
                count_ids=None) -> Dict[str, np.ndarray]:
        """collective -> [W, W] bytes for one step, summed over the plan's modules (rectoolkit.plan.traffic)."""
        topo = self.topology
        W, L = topo.world_size, topo.local_world_size
        total = {name: np.zeros((W, W)) for name in COLLECTIVES}
        for path, module_tables in tables_by_module(tables).items():
            module_plan = plan.plan.get(path, {})
            registry = module_tables[0].qcomm_codecs_registry  # (one sharder per collection)
            if count_ids is not None:
                configs = [t.config for t in module_tables if t.name in module_plan]
                weighted = any(t.is_weighted for t in module_tables)
                sizes = list(batch_sizes) if batch_sizes is not None else [topo.batch_size] * W
                _add(total, step_traffic(module_plan, configs, W, L, sizes, count_ids, weighted, registry))
                continue
            # expected ids: one step_traffic call per (collection, batch size, weighted), each with one batch per
            # rank; a collection with a batch size per feature (VBE) in one call, priced as the engine sends its
            # batch: B_i = the largest, each feature its own samples (`feature_batch_sizes`)
            groups: Dict[Tuple[bool, Optional[int], bool], list] = {}
            factors, rows_of, own_batches = {}, {}, {}
            for t in module_tables:
                if t.name not in module_plan:
                    continue
                for feature, batch, factor in zip(t.config.feature_names, t.batch_sizes, t.pooling_factors):
                    key = (t.pooled, batch if t.collection_batch_size is None else None, t.is_weighted)
                    groups.setdefault(key, []).append((t, feature))
                    factors[feature], rows_of[feature] = factor, t.rows
                    if t.collection_batch_size is not None:
                        own_batches.setdefault(t.pooled, {})[feature] = batch
            replicated_done = set()  # a data-parallel table's all-reduce counts once, not once per feature group
            for (pooled, batch, weighted), members in groups.items():
                members = [(t, f) for t, f in members if t.name not in replicated_done]
                replicated_done |= {t.name for t, _ in members
                                    if module_plan[t.name].sharding_type == ShardingType.DATA_PARALLEL.value}
                if not members:
                    continue
                configs = _sub_configs(members)
                if batch is None:
                    sizes = [members[0][0].collection_batch_size] * W
                    counter = expected_id_counter(sizes, factors, rows_of, [own_batches[pooled]] * W)
                else:
                    sizes = [batch] * W
                    counter = expected_id_counter(sizes, factors, rows_of)
                _add(total, step_traffic(module_plan, configs, W, L, sizes, counter, weighted, registry))
        return total

    def bandwidth_matrix(self, kind: str = "all_to_all") -> np.ndarray:
        """[W, W] bytes per ms between ranks for one fitted collective kind (COLLECTIVE_KINDS): its intra-host speed
        between ranks of a host, its inter-host one across."""
        topo = self.topology
        hosts = np.arange(topo.world_size) // topo.local_world_size
        same = hosts[:, None] == hosts[None, :]
        intra, inter = self.link_bw[kind]
        return np.where(same, intra, inter).astype(float)


def id_senders(sharding_type: Union[str, ShardingType], world_size: int) -> int:
    """How many ranks send a shard their ids each step: every rank, or (data-parallel) a replica's own.

    >>> id_senders("table_wise", 4), id_senders("data_parallel", 4)
    (4, 1)
    """
    return 1 if ShardingType.parse(sharding_type) == ShardingType.DATA_PARALLEL else world_size


def shard_ids(ids_per_rank, senders, shard_rows, table_rows):
    """The ids a shard of `shard_rows` of a table's `table_rows` receives per step: `senders` ranks' ids
    (id_senders), spread over the table's rows evenly. Numbers or numpy arrays (broadcast).

    >>> shard_ids(100.0, 2, 250, 1000)
    50.0
    """
    return senders * ids_per_rank * shard_rows / table_rows


def _load_factor(cache_load_factor: Optional[float]) -> float:
    """A caching kernel's HBM fraction; TorchRec's default (0.2) when a plan gives none."""
    return DEFAULT_CACHE_LOAD_FACTOR if cache_load_factor is None else float(cache_load_factor)


def _row_block_sizes(rows, num_blocks: int) -> np.ndarray:
    """Sizes of TorchRec's row blocks (see enumerate.row_blocks), as floats; rows may be an [N, 1] array."""
    rows = np.asarray(rows, dtype=np.int64)
    block = -(-rows // num_blocks)
    return np.clip(rows - block * np.arange(num_blocks), 0, block).astype(float)


def _sub_configs(members) -> list:
    """One config per table holding only the given features (same name, rows, dim, pooling)."""
    features: Dict[str, list] = {}
    table_of = {}
    for t, feature in members:
        features.setdefault(t.name, []).append(feature)
        table_of[t.name] = t
    configs = []
    for name, names in features.items():
        c = table_of[name].config
        if isinstance(c, EmbeddingBagConfig):
            configs.append(EmbeddingBagConfig(name=name, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim,
                                              feature_names=names, pooling=c.pooling, init_fn=c.init_fn))
        else:
            configs.append(EmbeddingConfig(name=name, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim,
                                           feature_names=names, init_fn=c.init_fn))
    return configs


def _add(total: Dict[str, np.ndarray], part: Dict[str, np.ndarray]) -> None:
    for name, matrix in part.items():
        total[name] += matrix
