"""Sharded EmbeddingBagCollection: one group per sharding type, assembled from a plan (sharded_ec.py: the
sequence twin).

    >>> import rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("table_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 3]), torch.tensor([1, 1]))
    >>> torch.equal(sharded(kjt).values(), ebc(kjt).values())
    True

Forward: the KJT is split per feature once; each group runs input_dist -> lookup -> output_dist and adds its
block into the output at its columns (group.py explains the `index_add`); MEAN pooling divides by the local
bag sizes at the end. Ranks may call forward with different local batch sizes (each owner learns them in
input_dist, as TorchRec's variable batch per rank).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from rectoolkit.distributed.awaitable import EmbeddingBagCollectionAwaitable
from rectoolkit.distributed.feature_shards import FeatureBatch, PooledBlocks, ShardingGroupSpec
from rectoolkit.distributed.fused_optimizer import collection_fused_optimizer
from rectoolkit.distributed.fused_params import TORCHREC_DEFAULT, fused_optimizer_for, with_table_options
from rectoolkit.distributed.steps import RunGroups, group_steps, steps_repr
from rectoolkit.distributed.column_wise import ColumnWiseSharding
from rectoolkit.distributed.comm import ShardingEnv, divide_gradient
from rectoolkit.distributed.data_parallel import DataParallelSharding
from rectoolkit.distributed.fbgemm_qcomm_codec import QuantizedCommCodecs, check_qcomm_codecs_registry
from rectoolkit.distributed.grid import GridSharding
from rectoolkit.distributed.interfaces import ShardedModule
from rectoolkit.distributed.row_wise import RowWiseSharding
from rectoolkit.distributed.state import collection_state_prefix
from rectoolkit.distributed.table_column_wise import TableColumnWiseSharding
from rectoolkit.distributed.table_row_wise import TableRowWiseSharding
from rectoolkit.distributed.table_view import table_view
from rectoolkit.distributed.table_wise import TableWiseSharding
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, PoolingType
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, get_embedding_names_by_table
from rectoolkit.optim.fused import FusedOptimizerModule
from rectoolkit.optim.keyed import CombinedOptimizer
from rectoolkit.modules.layout import FeatureLayout, expand_blocks, expand_pooled, guard_gradient
from rectoolkit.modules.mixed_dtypes import table_dtype
from rectoolkit.plan.types import (
    EmbeddingComputeKernel, ParameterSharding, ShardingType, ShardMetadata, check_data_parallel_kernel)
from rectoolkit.plan.validation import validate_module_plan
from rectoolkit.sparse import KeyedJaggedTensor, KeyedTensor

GROUP_CLASSES = {
    ShardingType.DATA_PARALLEL: DataParallelSharding,
    ShardingType.TABLE_WISE: TableWiseSharding,
    ShardingType.COLUMN_WISE: ColumnWiseSharding,
    ShardingType.ROW_WISE: RowWiseSharding,
    ShardingType.TABLE_ROW_WISE: TableRowWiseSharding,
    ShardingType.TABLE_COLUMN_WISE: TableColumnWiseSharding,
    ShardingType.GRID_SHARD: GridSharding,
}


def uses_dense_kernel(table: str, ps: ParameterSharding, env: ShardingEnv,
                      optimizer: Optional[FusedOptimizerConfig]) -> bool:
    """What the plan's compute_kernel means for one table's shards: True for plain autograd weights (.grad,
    updated by your dense optimizer), False for the batched kernel with the collection's optimizer fused into
    backward. Raises for kernels that cannot run here.

    - "dense": plain weights, even if the collection has a fused optimizer (TorchRec's DENSE).
    - "fused": the fused optimizer; a collection without one has nothing to fuse, so its shards get plain
      gradients like "dense" (TorchRec's planner proposes fused kernels only for tables with an optimizer).
    - "fused_uvm", "fused_uvm_caching": on CPU the same as "fused" (the tables are in host memory anyway:
      memory_bytes() counts them as host bytes). On GPU they would need fbgemm's managed (UVM) memory,
      which rectoolkit.kernels does not allocate yet: refused rather than silently placed in GPU memory.
    - "quant*": inference kernels (rectoolkit.quant.sharding); refused for a collection that trains.
    DATA_PARALLEL tables have the "dense" kernel only (TorchRec's only kernel for them; another is refused): a
    plain replica whose gradient is averaged over the ranks into .grad for your dense optimizer, whatever fused
    optimizer the collection has (data_parallel.py).
    """
    kernel = EmbeddingComputeKernel.parse(ps.compute_kernel)
    check_data_parallel_kernel(ps.sharding_type, kernel, f"table {table!r}")  # (a plan edited after it was built)
    if kernel in (EmbeddingComputeKernel.QUANT, EmbeddingComputeKernel.QUANT_UVM,
                  EmbeddingComputeKernel.QUANT_UVM_CACHING) and optimizer is not None:
        raise ValueError(f"table {table!r} is planned with compute_kernel {kernel.value!r}, a quantized inference "
                         "kernel, but its collection trains (it has a fused optimizer); plan 'fused' or 'dense' "
                         "for training, or shard a QuantEmbeddingBagCollection (rectoolkit.quant.sharding)")
    if kernel in (EmbeddingComputeKernel.FUSED_UVM, EmbeddingComputeKernel.FUSED_UVM_CACHING) \
            and env.device.type == "cuda":
        raise ValueError(f"table {table!r} is planned with compute_kernel {kernel.value!r} on rank {env.rank} "
                         f"({env.device}): tables in host memory read by the GPU (UVM) are not supported by "
                         "rectoolkit's kernels yet; plan compute_kernel 'fused' (GPU memory) or add ranks")
    if ShardingType(ps.sharding_type) == ShardingType.DATA_PARALLEL:
        return True
    return kernel == EmbeddingComputeKernel.DENSE or optimizer is None


def check_table_options(table: BaseEmbeddingConfig, ps: ParameterSharding, ids_out_of_range: str) -> None:
    """Refuse the TorchRec options a plan carries (ParameterSharding's, from ParameterConstraints) that these shards
    cannot honour. Honoured: enforce_hbm (weights always live in the compute device's memory), cache_params
    (no cache runs here, see CacheParams), bounds_check_mode FATAL with ids_out_of_range="error" (the id check
    raises), output_dtype FP32, stochastic_rounding on FP32 tables (no rounding happens in an fp32 update)."""
    where = f"table {table.name!r}: the plan's ParameterSharding has"
    mode = getattr(ps.bounds_check_mode, "name", ps.bounds_check_mode)
    if mode is not None and (str(mode).upper() not in ("FATAL", "V2_FATAL") or ids_out_of_range != "error"):
        raise NotImplementedError(f"{where} bounds_check_mode={mode} but the collection handles out-of-range ids "
                                  f"with ids_out_of_range={ids_out_of_range!r}; plan BoundsCheckMode.FATAL with "
                                  "ids_out_of_range='error', or leave bounds_check_mode None")
    if ps.output_dtype is not None and str(getattr(ps.output_dtype, "name", ps.output_dtype)).upper() != "FP32":
        raise NotImplementedError(f"{where} output_dtype={ps.output_dtype}: rectoolkit's sharded collections "
                                  "output fp32; leave output_dtype None or FP32")
    if ps.stochastic_rounding is not None and table.data_type != DataType.FP32:
        raise NotImplementedError(f"{where} stochastic_rounding={ps.stochastic_rounding} for a "
                                  f"{table.data_type.name} table: rectoolkit's fused update does not choose how it "
                                  "rounds to FP16; leave stochastic_rounding None, or use an FP32 table")


def plan_for_tables(tables: Sequence[BaseEmbeddingConfig],
                    module_plan: Mapping[str, ParameterSharding]) -> Dict[str, ParameterSharding]:
    """The plan cut down to `tables` (a collection's, or one group's), raising for tables it does not plan."""
    missing = [t.name for t in tables if t.name not in module_plan]
    if missing:
        raise ValueError(f"the sharding plan has no entry for table(s) {missing}; plan every table of the "
                         f"collection (planned: {sorted(module_plan)})")
    return {t.name: module_plan[t.name] for t in tables}


class ShardedCollection(ShardedModule):
    """Shared by the bag (pooled) and sequence collections: groups, local shards, memory, optimizer."""

    takes_variable_batch = False  # a batch size per feature (VBE): taken by the bag and sequence collections
    own_table_view = True  # TorchRec's module view, "embedding_bags.<table>.weight" (table_view.py)

    def __init__(self, tables: Sequence[BaseEmbeddingConfig], module_plan: Mapping[str, ParameterSharding],
                 env: ShardingEnv, pooled: bool, is_weighted: bool, optimizer: Optional[FusedOptimizerConfig],
                 initial_weights: Mapping[str, torch.Tensor], backend: str, ids_out_of_range: str,
                 default_optimizer: Optional[FusedOptimizerConfig] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None) -> None:
        super().__init__()
        self.env = env
        # the output exchanges' wire precisions (fbgemm_qcomm_codec); None: float32
        self.qcomm_codecs_registry = check_qcomm_codecs_registry(qcomm_codecs_registry, type(self).__name__)
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self._ids_out_of_range = ids_out_of_range
        self._optimizer = optimizer
        validate_module_plan(module_plan, tables, env.world_size, type(self).__name__)
        self.module_plan: Dict[str, ParameterSharding] = plan_for_tables(tables, module_plan)
        self._embedding_names_by_table = get_embedding_names_by_table(tables)
        self._features = [f for t in tables for f in t.feature_names]
        self._layout = FeatureLayout(type(self).__name__, self._features,
                                     [t.name for t in tables for _ in t.feature_names],
                                     [t.num_embeddings for t in tables for _ in t.feature_names])
        self._embedding_names = [n for names in self._embedding_names_by_table for n in names]
        self._dims = [t.embedding_dim for t in tables for _ in t.feature_names]
        offsets, running = {}, 0
        for name, dim in zip(self._embedding_names, self._dims):
            offsets[name], running = running, running + (dim if pooled else 0)
        self._key_offsets = offsets
        self._output_width = running
        embedding_dim = tables[0].embedding_dim if tables else 0
        # TorchRec's default (`default_optimizer`, fused SGD) fuses into the "fused" kernels only; DATA_PARALLEL
        # replicas are always dense (uses_dense_kernel)
        dense = {t.name: uses_dense_kernel(t.name, self.module_plan[t.name], env, optimizer or default_optimizer)
                 for t in tables}
        for t in tables:
            check_table_options(t, self.module_plan[t.name], ids_out_of_range)
        if optimizer is None and default_optimizer is not None and not all(dense.values()):
            self._optimizer = optimizer = default_optimizer
        self.groups = nn.ModuleDict()
        # one group per (sharding type, kernel, dtype), in a fixed order: every rank runs the groups alike. A batched
        # kernel stores its tables in one dtype, so each table keeps its own (FP32 -> float32, other DataTypes ->
        # float16, as the unsharded collection, modules.mixed_dtypes) in a group of its dtype
        for (kind, group_class), dense_kernel, dtype in itertools.product(
                GROUP_CLASSES.items(), (False, True), (torch.float32, torch.float16)):
            chosen = [(t, keys) for t, keys in zip(tables, self._embedding_names_by_table)
                      if ShardingType.parse(self.module_plan[t.name].sharding_type) == kind
                      and dense[t.name] == dense_kernel and table_dtype(t.data_type) == dtype]
            if not chosen:
                continue
            group_tables = [t for t, _ in chosen]
            spec = ShardingGroupSpec(
                env=env, tables=group_tables, output_keys=[keys for _, keys in chosen],
                module_plan=plan_for_tables(group_tables, self.module_plan), key_offsets=offsets, pooled=pooled,
                weighted=is_weighted,
                # a config of its own: each group's lr can be set apart (TorchRec: one optimizer per lookup)
                optimizer=None if dense_kernel or optimizer is None else dataclasses.replace(optimizer),
                initial_weights={t.name: initial_weights[t.name] for t in group_tables if t.name in initial_weights},
                backend=backend, dtype=dtype, embedding_dim=embedding_dim,
                qcomm_codecs_registry=self.qcomm_codecs_registry)
            dense_suffix = "_dense" if dense_kernel and kind != ShardingType.DATA_PARALLEL else ""  # (DP: always)
            name = kind.value + dense_suffix + ("" if dtype == torch.float32 else "_fp16")
            self.groups[name] = group_class(spec)
        # the groups are not submodules (TorchRec's lookups are a plain list): the module's own view is one module per
        # table under TorchRec's names, "embedding_bags.<table>.weight" (table_view.py)
        if self.own_table_view:
            self.__dict__["groups"] = self._modules.pop("groups")
            fused = [t.name for t in tables if not dense[t.name]]
            setattr(self, collection_state_prefix(self)[:-1], table_view(self, fused))
        # TorchRec's view of the groups, one entry per group (plain lists, as in TorchRec: nothing registered twice)
        self._input_dists, self._lookups, self._output_dists = group_steps(self.groups)
        self._run_groups = RunGroups(self)

    def _feature_batch(self, features: KeyedJaggedTensor) -> FeatureBatch:
        return FeatureBatch.from_kjt(features, self._layout, self._is_weighted, self._ids_out_of_range, self.env.rank,
                                     self.env.device, self.takes_variable_batch)

    # ------------------------------------------------------------------ input_dist ahead (the train pipeline)
    def start_input_dist(self, features: KeyedJaggedTensor, env: Optional[ShardingEnv] = None) -> "InputDistAhead":
        """Start every group's input_dist of `features` now, on `env` (default: this collection's; the train
        pipeline passes one on a process group of its own). Hand the result to `use_input_dist`: the next
        forward of these very `features` then skips its input_dist."""
        batch = self._feature_batch(features)
        return InputDistAhead(features, batch, [group.start_input_dist(batch, env) for group in self.groups.values()])

    def use_input_dist(self, ahead: "InputDistAhead") -> None:
        """The next forward whose features are `ahead.features` (the same object) uses this input_dist."""
        self.__dict__["_input_dist_ahead"] = ahead

    def use_output(self, features: KeyedJaggedTensor, output: Any) -> None:
        """The next forward whose features are `features` (the same object) returns `output`, computed ahead (the
        embeddings TrainPipelineSemiSync looked up one step early), instead of running the groups."""
        self.__dict__["_output_ahead"] = (features, output)

    def _run(self, features: KeyedJaggedTensor) -> Any:
        """The output for `features`: the one given to `use_output` for them, else every group's, now."""
        ahead = self.__dict__.pop("_output_ahead", None)
        if ahead is not None and ahead[0] is features:
            self.__dict__.pop("_input_dist_ahead", None)  # its ids were used by the lookup ahead
            return ahead[1]
        return self._run_groups(features)

    def _batch_and_received(self, features: KeyedJaggedTensor) -> Tuple[FeatureBatch, List[Any]]:
        """The split batch and each group's input_dist result: sent ahead when it was, else None (sent now)."""
        ahead = self.__dict__.pop("_input_dist_ahead", None)
        if ahead is not None and ahead.features is features:
            return ahead.batch, ahead.wait()
        return self._feature_batch(features), [None] * len(self.groups)

    # ------------------------------------------------------------------ shards and state
    def local_shards(self) -> List[Tuple[str, ShardMetadata, torch.Tensor, Dict[str, torch.Tensor]]]:
        """(table, shard, weight, optimizer state) of every shard this rank holds (DATA_PARALLEL: its replica)."""
        return [entry for group in self.groups.values() for entry in group.local_shards()]

    def torchrec_named_parameters(self, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor]]:
        """named_parameters() with `prefix` put before each name as it is: this rank's shards under TorchRec's names,
        "<prefix>embedding_bags.<table>.weight" (sequence collections: "embeddings."), in the collection's table
        order, with TorchRec's empty placeholder of shape (0,) for a table with no shard here; a table with several
        shards here lists the others as "weight_1", ... (table_view.py). Without that view (the quantized
        collections): one entry per local shard, tables with no shard here left out."""
        if self.own_table_view:
            for name, weight in self.named_parameters():
                yield prefix + name, weight
            return
        shards = self.local_shards()
        for config in self._tables:
            for table, _, weight, _ in shards:
                if table == config.name:
                    yield f"{prefix}{collection_state_prefix(self)}{table}.weight", weight

    def memory_bytes(self) -> Dict[str, int]:
        """Bytes this rank holds: shard weights and fused optimizer state, and where they live ("device": GPU
        memory; "host": CPU memory, all of it on CPU, where the fused_uvm kernels' tables live anyway)."""
        total = {"weights": 0, "optimizer": 0}
        for group in self.groups.values():
            for key, value in group.shard_memory_bytes().items():
                total[key] += value
        held = total["weights"] + total["optimizer"]
        on_gpu = self.env.device.type == "cuda"
        total.update(device=held if on_gpu else 0, host=0 if on_gpu else held)
        return total

    def embedding_configs(self) -> List[BaseEmbeddingConfig]:
        return self._tables

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's no_sync for the DATA_PARALLEL replicas: the backward of a forward run inside sends no all-reduce
        and leaves this rank's gradient in .grad; the next backward of a forward outside all-reduces it with its own
        (data_parallel.py). The other tables' gradients travel in every backward, as in TorchRec.
        GradientAccumulationWrapper enters it on its no-sync micro-batches; DistributedModelParallel.no_sync too."""
        replicas = [group for group in self.groups.values() if isinstance(group, DataParallelSharding)]
        before = [group.sync_gradients for group in replicas]
        for group in replicas:
            group.sync_gradients = False
        try:
            yield
        finally:
            for group, sync in zip(replicas, before):
                group.sync_gradients = sync

    def reduce_accumulated_gradients(self) -> None:
        """All-reduce now (averaged) what backwards under no_sync() left in the replicas' .grad: before an optimizer
        step that no synced backward came before (GradientAccumulationWrapper's partial last group), so that the
        replicas stay equal. Collective: every rank calls it."""
        for group in self.groups.values():
            if isinstance(group, DataParallelSharding):
                group.reduce_accumulated()

    @property
    def fused_optimizer_config(self) -> Optional[FusedOptimizerConfig]:
        return self._optimizer

    def set_learning_rate(self, lr: float) -> None:
        """Change the fused optimizer's lr in every shard (the shards share one config)."""
        if self._optimizer is None:
            raise ValueError("this sharded collection has no fused optimizer; set the lr of your dense optimizer")
        self._optimizer.lr = float(lr)
        for group in self.groups.values():
            group.set_learning_rate(float(lr))

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """TorchRec's `sharded_module.fused_optimizer`: a CombinedOptimizer of one keyed optimizer per sharding group
        with fused shards on this rank (keys "embedding_bags.<table>.weight"; empty when no shard has a fused
        optimizer), rectoolkit.distributed.fused_optimizer."""
        if "_fused_optimizer" not in self.__dict__:
            self.__dict__["_fused_optimizer"] = collection_fused_optimizer(self)
        return self.__dict__["_fused_optimizer"]

    def extra_repr(self) -> str:
        kinds = {k: [t.name for t in g.tables] for k, g in self.groups.items()}
        return "\n ".join([f"rank={self.env.rank}/{self.env.world_size}, groups={kinds}", *steps_repr(self)])


FusedOptimizerModule.register(ShardedCollection)  # TorchRec's sharded collections are FusedOptimizerModules


class ShardedEmbeddingBagCollection(ShardedCollection):
    """An EmbeddingBagCollection sharded by a plan: KJT (local batch) -> KeyedTensor [B, sum of dims].

    A KJT with a batch size per feature (VBE) travels with each feature's own bags: its ids, lengths and pooled
    rows cross the all-to-alls at the feature's batch size (every type; TABLE_ROW_WISE and GRID_SHARD at both
    output levels); the one-level types' owners look each feature up at its own batch size and send its pooled
    rows back as they are, and the rank that asked expands them with the inverse indices straight into the
    output, once (the two-level groups' output is expanded as the unsharded collection does); the gradient flows
    back to the small batches only."""

    takes_variable_batch = True

    def __init__(self, tables, module_plan, env: ShardingEnv, is_weighted: bool = False,
                 optimizer: Optional[FusedOptimizerConfig] = None,
                 initial_weights: Optional[Mapping[str, torch.Tensor]] = None, backend: str = "auto",
                 ids_out_of_range: str = "error", default_optimizer: Optional[FusedOptimizerConfig] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None) -> None:
        if any(t.pooling == PoolingType.NONE for t in tables):
            raise ValueError("EmbeddingBagCollection tables need SUM or MEAN pooling")
        super().__init__(tables, module_plan, env, True, is_weighted, optimizer, initial_weights or {}, backend,
                         ids_out_of_range, default_optimizer, qcomm_codecs_registry)
        mean = [t.pooling == PoolingType.MEAN for t in tables for _ in t.feature_names]
        self._mean_features = mean if any(mean) else None

    inference_only = False  # (the quantized sharded collections: True, nothing of theirs trains)

    def unsharded_module_type(self) -> type:
        return EmbeddingBagCollection

    def forward(self, features: KeyedJaggedTensor) -> EmbeddingBagCollectionAwaitable:
        """The pooled embeddings of this rank's samples, as TorchRec's awaitable: `.wait()` gives the KeyedTensor
        (already computed; using the awaitable as the KeyedTensor, e.g. `.values()`, works too)."""
        return EmbeddingBagCollectionAwaitable(self._run(features))

    def _outputs(self, features: KeyedJaggedTensor) -> KeyedTensor:
        weights = features.weights_or_none()
        if weights is not None and weights.requires_grad and torch.is_grad_enabled() and not self.inference_only:
            raise ValueError(f"{type(self).__name__} (rank {self.env.rank}): the per-id weights require grad (e.g. "
                             "the position weights of a FeatureProcessedEmbeddingBagCollection), but the sharded "
                             "input_dist sends them as data, so they would get no gradient; freeze them "
                             "(requires_grad_(False)) to shard this collection, or keep it unsharded")
        batch, received = self._batch_and_received(features)
        inverse_indices = self._layout.inverse_indices(features)
        B = batch.batch_size
        # groups return transposed blocks [columns, B]: placing whole rows is cheap, and so is its gradient; a VBE
        # output_dist returns each feature's own pooled rows, flat, and where they go (PooledBlocks)
        placed = [group(batch, group_received) for group, group_received in zip(self.groups.values(), received)]
        flat_blocks = [(flat, where) for flat, where in placed if isinstance(where, PooledBlocks)]
        out = None
        if len(flat_blocks) < len(placed):
            out_t = torch.zeros(self._output_width, B, device=self.env.device)
            for block_t, columns in placed:
                if not isinstance(columns, PooledBlocks):
                    out_t = out_t.index_add(0, columns, block_t)
            out = self._guard(out_t.t().contiguous())
            if self._mean_features is not None:
                scale = [(1.0 / batch.lengths[f].clamp(min=1).to(out.dtype)) if mean else torch.ones(B, device=out.device)
                         for f, mean in zip(self._features, self._mean_features)]
                out = out * torch.stack(scale, 1).repeat_interleave(torch.tensor(self._dims, device=out.device), dim=1)
            if inverse_indices is not None:
                out = expand_pooled(out, inverse_indices, self._dims)
        if flat_blocks:
            out = self._expand_flat_blocks(out, flat_blocks, batch, inverse_indices)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._dims, values=divide_gradient(out, self.env),
                           key_dim=1)

    def _guard(self, pooled: torch.Tensor) -> torch.Tensor:
        if self._optimizer is not None:  # refuse NaN/inf gradients before the fused update (modules.layout)
            pooled = guard_gradient(pooled, type(self).__name__)
        return pooled

    def _expand_flat_blocks(self, out: Optional[torch.Tensor], flat_blocks, batch: FeatureBatch,
                            inverse_indices: Optional[torch.Tensor]) -> torch.Tensor:
        """Each feature's own pooled rows (VBE output_dists), expanded with the inverse indices straight into
        the output's columns, once (added to `out`, the padded groups' output, if any)."""
        flats = [flat for flat, _ in flat_blocks]
        flat = torch.cat(flats) if len(flats) > 1 else flats[0]
        row_of = {key: k for k, key in enumerate(self._embedding_names)}
        spans = [(self._key_offsets[key] + col_start, cols, bags, row_of[key]) for _, where in flat_blocks
                 for key, col_start, cols, bags in zip(where.keys, where.col_starts, where.cols, where.bags)]
        flat = self._guard(flat)
        if self._mean_features is not None:
            scale = [(1.0 / batch.lengths[self._features[f]][:bags].clamp(min=1).to(flat.dtype)).repeat_interleave(cols)
                     if self._mean_features[f] else torch.ones(bags * cols, device=flat.device)
                     for _, cols, bags, f in spans]
            flat = flat * torch.cat(scale)
        return expand_blocks(flat, spans, inverse_indices, self._output_width, out)

    def embedding_bag_configs(self):
        return self._tables

    def is_weighted(self) -> bool:
        return self._is_weighted


class InputDistAhead:
    """The input_dist of one KJT, started ahead of its forward, in two stages: the sizes ("metadata") are on their
    way; `send()` waits for them and starts the ids; `wait()` (sending first if needed) gives each group's
    received ids."""

    def __init__(self, features: KeyedJaggedTensor, batch: FeatureBatch, pending: List[Any]) -> None:
        self.features, self.batch = features, batch
        self._sizes, self._ids, self._received = pending, None, None

    def send(self) -> None:
        """Wait for the sizes and start the ids' all-to-all (once)."""
        if self._ids is None:
            self._ids = [sizes.wait() for sizes in self._sizes]

    def wait(self) -> List[Any]:
        """Each group's received ids (what its input_dist returns)."""
        self.send()
        if self._received is None:
            self._received = [ids.wait() for ids in self._ids]
        return self._received


def _initial_weights(module: nn.Module) -> Dict[str, torch.Tensor]:
    """The module's table weights, unless it lives on the meta device (then shards are initialized fresh)."""
    tables = getattr(module, "embedding_bags", None) or getattr(module, "embeddings")
    return {name: m.weight.detach() for name, m in tables.items() if m.weight.device.type != "meta"}


def shard_embedding_bag_collection(module: EmbeddingBagCollection, module_plan: Mapping[str, ParameterSharding],
                                   env: ShardingEnv, backend: str = "auto",
                                   fused_params: Optional[Mapping[str, Any]] = None,
                                   torchrec_default_optimizer: bool = False,
                                   qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
                                   ) -> ShardedEmbeddingBagCollection:
    """Shard an EmbeddingBagCollection: each rank keeps the slices of `module`'s weights that the plan gives it.

    The shards' fused optimizer: the module's own, or `fused_params` and what torch's `_apply_optimizer_in_backward`
    recorded on its weights (rectoolkit.distributed.fused_params). Without any, the "fused" kernels get plain
    gradients, or TorchRec's fused SGD (lr 0.01) with `torchrec_default_optimizer` (the sharders and DMP). A module
    on the meta device gives freshly initialized shards (each shard with its table's init_fn).
    `qcomm_codecs_registry` (get_qcomm_codecs_registry's) sets the output exchanges' wire precisions.
    """
    optimizer, default = _optimizers(module, fused_params, torchrec_default_optimizer)
    module_plan = with_table_options(module_plan, fused_params)  # its per-table options, where the plan has none
    return ShardedEmbeddingBagCollection(
        module.embedding_bag_configs(), module_plan, env, is_weighted=module.is_weighted(),
        optimizer=optimizer, initial_weights=_initial_weights(module), backend=backend,
        ids_out_of_range=getattr(module, "_ids_out_of_range", "error"), default_optimizer=default,
        qcomm_codecs_registry=qcomm_codecs_registry)


def _optimizers(module: nn.Module, fused_params: Optional[Mapping[str, Any]], torchrec_default: bool
                ) -> Tuple[Optional[FusedOptimizerConfig], Optional[FusedOptimizerConfig]]:
    """(the optimizer set for the module, TorchRec's default when none is and `torchrec_default`)."""
    optimizer = fused_optimizer_for(module, fused_params)
    default = dataclasses.replace(TORCHREC_DEFAULT) if optimizer is None and torchrec_default else None
    return optimizer, default
