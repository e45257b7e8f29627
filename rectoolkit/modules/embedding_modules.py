"""EmbeddingBagCollection and EmbeddingCollection: TorchRec's modules, backed by one batched kernel.

    >>> import torch, rectoolkit as rtk
    >>> tables = [rtk.EmbeddingBagConfig(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"]),
    ...           rtk.EmbeddingBagConfig(name="t_item", num_embeddings=20, embedding_dim=8, feature_names=["item", "seen"])]
    >>> ebc = rtk.EmbeddingBagCollection(tables, optimizer="row_wise_adagrad", lr=0.02)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["user", "item", "seen"],
    ...     values=torch.tensor([1, 2, 3, 4, 5, 6]), lengths=torch.tensor([1, 1, 2, 0, 1, 1]))
    >>> pooled = ebc(kjt)                       # KeyedTensor [batch 2, 4 + 8 + 8]
    >>> pooled.keys(), tuple(pooled.values().shape)
    (['user', 'item', 'seen'], (2, 20))
    >>> pooled.values().sum().backward()        # the touched rows are updated here (fused row-wise Adagrad)
    >>> sorted(ebc.state_dict())
    ['embedding_bags.t_item.weight', 'embedding_bags.t_user.weight']

The tables live in one flat storage owned by the kernel (fbgemm's TBE or the pure-torch kernel, see
rectoolkit.kernels.batched_embedding); `ebc.embedding_bags[<table>]` is an nn.EmbeddingBag whose `.weight` is
a view of that storage, so reading, writing and load_state_dict work table by table as in TorchRec.
Without an optimizer the collection gives ordinary dense gradients (like TorchRec's unsharded modules).
"""

from __future__ import annotations

import abc
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.fx
from torch import nn

from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.kernels.batched_embedding import BatchedEmbeddingKernel, TableSpec, make_batched_embedding
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
from rectoolkit.kernels.traced_lookup import traced_lookup
from rectoolkit.modules import mixed_dtypes
from rectoolkit.modules.configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.fx_call import trace_as_one_call
from rectoolkit.modules.layout import FeatureLayout, expand_pooled, guard_gradient, rows_per_feature
from rectoolkit.optim.fused import EmbeddingFusedOptimizer
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from rectoolkit.sparse.validation import is_tracing


# What .half() / .bfloat16() / .double() may turn the tables into: the pure-torch kernel looks them up in that type
# (the outputs are float32, as TorchRec's `.float()` of each lookup)
_TABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def get_embedding_names_by_table(tables: Sequence[BaseEmbeddingConfig]) -> List[List[str]]:
    """Output names per table: the feature name, or "feature@table" when a feature feeds several tables."""
    counts = Counter(f for t in tables for f in t.feature_names)
    return [[f if counts[f] == 1 else f"{f}@{t.name}" for f in t.feature_names] for t in tables]


def _meta_weight(table: BaseEmbeddingConfig, dtype: torch.dtype) -> torch.Tensor:
    """The weight a table's torch module is built around, on the meta device (the collection keeps the real one).
    Given as `_weight`: built with device="meta" instead, nn.Embedding(Bag) runs its random init on meta, and that
    imports torch._dynamo (about 3 s in every process that builds a collection: each rank, each notebook kernel)."""
    return torch.empty(table.num_embeddings, table.embedding_dim, device="meta", dtype=dtype)


def _optimizer_config(optimizer: Any, lr: Optional[float], fused_params: Optional[Mapping[str, Any]],
                      optimizer_kwargs: Mapping[str, Any]) -> Optional[FusedOptimizerConfig]:
    if fused_params is not None:
        if optimizer is not None:
            raise ValueError("pass either optimizer=... or fused_params=..., not both")
        return FusedOptimizerConfig.from_fused_params(fused_params)
    if optimizer is None:
        if optimizer_kwargs:  # most often a misspelt argument (is_weigthed=True)
            raise TypeError(f"unexpected keyword argument(s) {sorted(optimizer_kwargs)}: keywords beyond the "
                            "collection's own are fused optimizer settings, which need optimizer=... (e.g. "
                            "optimizer='adagrad', lr=0.01, eps=1e-8)")
        if lr is not None:
            raise ValueError("lr given without optimizer=...; e.g. optimizer='adagrad', lr=0.01")
        return None
    if isinstance(optimizer, FusedOptimizerConfig):
        return optimizer
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return FusedOptimizerConfig.from_torch_optimizer(optimizer, {**({"lr": lr} if lr is not None else {}), **optimizer_kwargs})
    return FusedOptimizerConfig(optimizer, **({"lr": lr} if lr is not None else {}), **optimizer_kwargs)


class EmbeddingBagCollectionInterface(abc.ABC, nn.Module):
    """TorchRec's interface of a pooled collection (isinstance checks; subclassed by custom collections)."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        ...

    @abc.abstractmethod
    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        ...

    @abc.abstractmethod
    def is_weighted(self) -> bool:
        ...


class EmbeddingCollectionInterface(abc.ABC, nn.Module):
    """TorchRec's interface of a sequence collection (isinstance checks; subclassed by custom collections)."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        ...

    @abc.abstractmethod
    def embedding_configs(self) -> List[EmbeddingConfig]:
        ...

    @abc.abstractmethod
    def need_indices(self) -> bool:
        ...

    @abc.abstractmethod
    def embedding_dim(self) -> int:
        ...

    @abc.abstractmethod
    def embedding_names_by_table(self) -> List[List[str]]:
        ...


class _BatchedCollection(nn.Module):
    """What EmbeddingBagCollection and EmbeddingCollection share: tables, kernel, weights, fused optimizer."""

    _dict_name = ""  # "embedding_bags" | "embeddings"

    def __init__(self, tables: Sequence[BaseEmbeddingConfig], device: Union[str, torch.device, None], pooled: bool,
                 optimizer: Any, lr: Optional[float], fused_params: Optional[Mapping[str, Any]], backend: str,
                 ids_out_of_range: str, optimizer_kwargs: Mapping[str, Any]) -> None:
        super().__init__()
        names = [t.name for t in tables]
        duplicates = sorted(n for n, c in Counter(names).items() if c > 1)
        if duplicates:
            raise ValueError(f"Duplicate table name {duplicates[0]!r}: table names must be unique")
        for table in tables:
            if not table.feature_names:
                table.feature_names = [table.name]  # TorchRec's convention
        # no device: torch's default device, so `with torch.device("meta"):` builds a meta collection (as TorchRec)
        self._device = torch.device(device) if device is not None else torch.empty(0).device
        self._backend = backend
        self._ids_out_of_range = ids_out_of_range
        self._feature_names: List[List[str]] = [list(t.feature_names) for t in tables]
        self._embedding_names_by_table = get_embedding_names_by_table(tables)
        self._flat_features = [f for names in self._feature_names for f in names]
        self._feature_table_map = [t for t, names in enumerate(self._feature_names) for _ in names]
        self._layout = FeatureLayout(type(self).__name__, self._flat_features,
                                     [tables[t].name for t in self._feature_table_map],
                                     [tables[t].num_embeddings for t in self._feature_table_map])
        dtypes = [mixed_dtypes.table_dtype(t.data_type) for t in tables]
        self._dtype = dtypes[0] if dtypes else torch.float32
        self._pooling = "sum" if pooled else "none"
        config = _optimizer_config(optimizer, lr, fused_params, optimizer_kwargs)
        if not tables and config is not None:
            raise ValueError(f"{type(self).__name__}(tables=[]): no tables to fuse the optimizer "
                             f"{config.optimizer.value!r} into; add tables or leave the optimizer out")
        # tables of several dtypes: one part per dtype (modules.mixed_dtypes), no kernel of its own
        self._parts: List[_BatchedCollection] = []
        if len(set(dtypes)) > 1:
            if config is not None:
                mixed_dtypes.refuse_fused_optimizer(self, tables, "a fused optimizer")
            self._parts = mixed_dtypes.build_parts(self, tables, dtypes, self._part)
        # tables=[] (TorchRec builds such a collection): no kernel, nothing to look up
        self._kernel: Optional[BatchedEmbeddingKernel] = self._make_kernel(config) if tables and not self._parts else None
        if self._parts:
            modules = mixed_dtypes.table_modules(self)
        else:
            modules = nn.ModuleDict()
            for t, table in enumerate(tables):
                modules[table.name] = self._table_module(table)
                modules[table.name].weight = self._kernel.table_weights[t]
        setattr(self, self._dict_name, modules)
        self.fused_optimizer: Optional[EmbeddingFusedOptimizer] = None
        self._mark_fused_parameters()
        self._initialize_as_torchrec()

    # ------------------------------------------------------------------ construction helpers
    _interleaved_init = False  # EmbeddingCollection: True

    def _initialize_as_torchrec(self) -> None:
        """Draw the initial weights in TorchRec's order, so that one seed gives TorchRec's weights.

        TorchRec builds an nn.EmbeddingBag / nn.Embedding per table, whose constructor draws
        `init.normal_(weight)`, and then applies the config's init_fn: EmbeddingBagCollection builds every
        table first and then calls reset_parameters (every init_fn, in table order); EmbeddingCollection calls
        each table's init_fn right after building it. The normal draws are overwritten by init_fn, but they
        advance the random generator, so they are drawn here too, in the same order.
        """
        params = self._table_parameters()
        if not params or params[0].device.type == "meta":
            return
        with torch.no_grad():
            for table, param in zip(self._configs(), params):
                nn.init.normal_(param)
                if self._interleaved_init:
                    table.init_fn(param)
        if not self._interleaved_init:
            self.reset_parameters()

    def _table_module(self, table: BaseEmbeddingConfig) -> nn.Module:
        raise NotImplementedError

    def _part(self, tables: List[BaseEmbeddingConfig], device: str) -> "_BatchedCollection":
        """A collection of this kind over some of the tables (one dtype of a mixed collection)."""
        raise NotImplementedError

    def _configs(self) -> List[BaseEmbeddingConfig]:
        raise NotImplementedError

    def _make_kernel(self, optimizer: Optional[FusedOptimizerConfig], device: Optional[torch.device] = None) -> BatchedEmbeddingKernel:
        return make_batched_embedding(
            [TableSpec(t.num_embeddings, t.embedding_dim, t.name) for t in self._configs()],
            feature_table_map=self._feature_table_map, pooling=self._pooling, optimizer=optimizer,
            device=device or self._device, backend=self._backend, dtype=self._dtype,
            ids_out_of_range=self._ids_out_of_range, feature_names=self._flat_features,
        )

    def _table_parameters(self) -> List[nn.Parameter]:
        # _parameters directly: this runs every forward, and nn.Module.__getattr__ costs ~1 us per table
        return [module._parameters["weight"] for module in getattr(self, self._dict_name)._modules.values()]

    def _mark_fused_parameters(self) -> None:
        params = self._table_parameters()
        named = {f"{self._dict_name}.{name}.weight": p for name, p in zip(getattr(self, self._dict_name), params)}
        for p in params:
            if hasattr(p, "_in_backward_optimizers") and getattr(p, "_rectoolkit_fused", False):
                del p._in_backward_optimizers
        if self._kernel is None or self._kernel.optimizer is None:
            self.fused_optimizer = None
            return
        self.fused_optimizer = EmbeddingFusedOptimizer(self, named)
        for p in params:
            p._in_backward_optimizers = [self.fused_optimizer]  # so in_backward_optimizer_filter skips them
            p._rectoolkit_fused = True

    def reset_parameters(self) -> None:
        """Initialize every table with its config's init_fn (skipped on the meta device)."""
        params = self._table_parameters()
        if not params or params[0].device.type == "meta":  # the weights' device: `to_empty` moves them, not self._device
            return
        with torch.no_grad():
            for table, param in zip(self._configs(), params):
                table.init_fn(param)

    # ------------------------------------------------------------------ optimizer
    def fuse_optimizer(self, optimizer: Any = None, lr: Optional[float] = None, *,
                       fused_params: Optional[Mapping[str, Any]] = None, backend: Optional[str] = None,
                       **optimizer_kwargs: Any) -> Optional[EmbeddingFusedOptimizer]:
        """Fuse an optimizer into backward (or return to dense gradients with no arguments and no marks).

        `optimizer` is a name ("sgd", "adagrad", "row_wise_adagrad", "adam", fbgemm's EXACT_* spellings), a
        FusedOptimizerConfig or a torch optimizer class; with nothing given, the optimizer that
        torch's `_apply_optimizer_in_backward` recorded on the weights is used, as TorchRec's sharder does.
        Weights are kept; optimizer state starts at zero. Returns `self.fused_optimizer`.
        """
        if optimizer is None and fused_params is None:
            recorded = [getattr(p, "_optimizer_classes", None) for p in self._table_parameters()]
            if recorded[0]:
                kwargs = self._table_parameters()[0]._optimizer_kwargs[0]
                optimizer, optimizer_kwargs = recorded[0][0], {**kwargs, **optimizer_kwargs}
        if backend is not None:
            self._backend = backend
        config = _optimizer_config(optimizer, lr, fused_params, optimizer_kwargs)
        params = self._table_parameters()
        if not params:
            raise ValueError(f"{type(self).__name__}(tables=[]).fuse_optimizer: no tables to fuse an optimizer into")
        if self._parts:
            mixed_dtypes.refuse_fused_optimizer(self, self._configs(), "fuse_optimizer")
        kernel = self._make_kernel(config, device=params[0].device)
        kernel.adopt_parameters(params)
        self._kernel = kernel
        self._mark_fused_parameters()
        return self.fused_optimizer

    @property
    def kernel(self) -> Optional[BatchedEmbeddingKernel]:
        """The batched kernel running the lookups (backend, optimizer and storage); None for tables=[]. Tables of
        several dtypes have a kernel per dtype (`_parts`): the first one's, whose optimizer (none) they all share."""
        return self._parts[0]._kernel if self._parts else self._kernel

    @property
    def device(self) -> torch.device:
        return self._device

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.cuda()`, `to_empty()`... move the tables' Parameters; the kernel follows at once, so that a
        forward traced by torch.compile / torch.export (which cannot rebuild it) finds it on the weights' device."""
        module = super()._apply(fn, recurse)
        if "_kernel" in self.__dict__:
            self._sync_kernel()
        return module

    # ------------------------------------------------------------------ forward helpers
    def _sync_kernel(self) -> None:
        """Keep the kernel's storage and the tables' Parameters the same memory (after deepcopy, .to(), assign);
        after `.half()` / `.float()` (or .to(dtype)) the kernel is rebuilt in the tables' new type."""
        params = self._table_parameters()
        kernel = self._kernel
        if not params:  # tables=[]: nothing to look up
            return
        if self._parts:  # each part follows its own tables (the collection's modules are theirs)
            for part in self._parts:
                part._sync_kernel()
            return
        if params[0].device != kernel.device or params[0].dtype != self._dtype:
            if params[0].dtype not in _TABLE_DTYPES:  # (TorchRec's nn.EmbeddingBag fails in its lookup)
                raise TypeError(f"{type(self).__name__}: its tables can be {', '.join(map(str, _TABLE_DTYPES))} "
                                f"(torch's embedding types), not {params[0].dtype}; convert the other modules alone "
                                "(e.g. model.over_arch.to(...)), or the tables with .float()")
            old_states = kernel.split_optimizer_states() if kernel.optimizer is not None else []
            self._device, self._dtype = params[0].device, params[0].dtype
            self._kernel = self._make_kernel(kernel.optimizer, device=params[0].device)
            self._kernel.adopt_parameters(params)
            if old_states and params[0].device.type != "meta" and kernel.device.type != "meta":
                self._kernel.load_optimizer_states([{k: v.to(self._device) for k, v in s.items()} for s in old_states])
            self._mark_fused_parameters()
        elif any(p is not k for p, k in zip(params, kernel.table_weights)):
            kernel.adopt_parameters(params)
        else:
            kernel.sync_parameters()
        if self.fused_optimizer is not None:
            self.fused_optimizer.sync_hyperparameters()

    def _lookup(self, values: torch.Tensor, offsets: torch.Tensor,
                weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The kernel's lookup; while compiling or exporting, as aten ops on this module's own Parameters
        (torch.export swaps them for traced stand-ins, so the kernel's storage must not be read or synced)."""
        if is_tracing() and (self._kernel.optimizer is None or torch.compiler.is_exporting()):
            return traced_lookup(self._kernel, values, offsets, weights, self._table_parameters())
        if not is_tracing():
            self._sync_kernel()
        return self._kernel(values, offsets, weights)  # (compiling a fused optimizer: runs outside the graph)

    @staticmethod
    def _complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
        """Offsets [0, l0, l0+l1, ...] as int64 (fbgemm's one-pass op when it is loaded)."""
        lengths = lengths.to(torch.int64)
        if lengths.device.type != "meta" and not is_tracing() and fbgemm_available():  # traced: aten ops only
            return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
        return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


class EmbeddingBagCollection(_BatchedCollection, EmbeddingBagCollectionInterface):
    """Pooled embeddings of many features: KeyedJaggedTensor -> KeyedTensor [batch, sum of dims], as in TorchRec.

    Args:
        tables: EmbeddingBagConfig list (several features may share a table; SUM or MEAN pooling).
        is_weighted: use the KJT's weights as per-id weights (weighted sum).
        device: "cpu", "cuda", "meta" (shapes only, nothing allocated).
        optimizer, lr, **optimizer_kwargs: fuse an optimizer into backward ("sgd", "adagrad", "row_wise_adagrad",
            "adam"; eps, beta1, beta2, weight_decay); or fused_params={"optimizer": ..., "learning_rate": ...}.
            None (default): dense .grad, for any torch optimizer.
        backend: "auto" (fbgemm when available), "torch", or "fbgemm".
        ids_out_of_range: "error" (default; names feature, table and id), "hash" (id % num_embeddings) or
            "unchecked".
    """

    _dict_name = "embedding_bags"

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool = False,
                 device: Union[str, torch.device, None] = None, optimizer: Any = None, lr: Optional[float] = None,
                 fused_params: Optional[Mapping[str, Any]] = None, backend: str = "auto",
                 ids_out_of_range: str = "error", **optimizer_kwargs: Any) -> None:
        self._is_weighted = is_weighted
        self._embedding_bag_configs = tables
        super().__init__(tables, device, True, optimizer, lr, fused_params, backend, ids_out_of_range, optimizer_kwargs)
        self._embedding_names: List[str] = [n for names in self._embedding_names_by_table for n in names]
        self._lengths_per_embedding: List[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        mean = [tables[t].pooling == PoolingType.MEAN for t in self._feature_table_map]
        self._has_mean = any(mean)
        self._mean_features = torch.tensor(mean)
        if any(t.pooling == PoolingType.NONE for t in tables):
            raise ValueError("EmbeddingBagCollection tables need SUM or MEAN pooling; use EmbeddingCollection for NONE")
        if self._parts:
            self._mixed_columns = mixed_dtypes.pooled_columns(self)

    def _part(self, tables: List[EmbeddingBagConfig], device: str) -> "EmbeddingBagCollection":
        return EmbeddingBagCollection(tables, is_weighted=self._is_weighted, device=device, backend=self._backend,
                                      ids_out_of_range=self._ids_out_of_range)

    def _table_module(self, table: EmbeddingBagConfig) -> nn.Module:
        return nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode=table.pooling.value.lower(),
                               include_last_offset=True, _weight=_meta_weight(table, self._dtype))

    def _configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool each feature's ids with its table: KJT (B bags per feature) -> KeyedTensor [B, sum of dims].

        A KJT with a batch size per feature (VBE) is pooled per feature, then expanded to the full batch with its
        inverse_indices (B = their width), as TorchRec does."""
        if isinstance(features, torch.fx.Proxy):  # torch.fx.symbolic_trace: one node (modules.fx_call)
            return trace_as_one_call(self, self.embedding_bags, features)
        if not self._embedding_bag_configs:  # TorchRec's fails in torch.cat, with a ValueError too
            raise ValueError("EmbeddingBagCollection(tables=[]) has no tables, so no pooled output to build; give it "
                             "at least one EmbeddingBagConfig, or leave the collection out of the model")
        if self._parts:
            return mixed_dtypes.pooled_forward(self, features)
        values, lengths, weights, batch_size = self._layout.gather(features, self._is_weighted, variable_batch=True)
        inverse_indices = self._layout.inverse_indices(features)
        pooled = self._lookup(values, self._complete_cumsum(lengths), weights)
        if self._kernel.optimizer is not None:  # refuse NaN/inf gradients before the fused update writes them
            pooled = guard_gradient(pooled, type(self).__name__)
        if self._has_mean:
            counts = lengths.to(pooled.device).view(len(self._flat_features), batch_size).t().clamp(min=1).to(pooled.dtype)
            scale = torch.where(self._mean_features.to(counts.device), 1.0 / counts, torch.ones_like(counts))
            pooled = pooled * scale.repeat_interleave(
                torch.tensor(self._lengths_per_embedding, device=counts.device), dim=1,
                output_size=pooled.shape[1])
        if inverse_indices is not None:  # a batch per feature: each sample reads its feature's pooled row
            pooled = expand_pooled(pooled, inverse_indices, self._lengths_per_embedding)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._lengths_per_embedding, values=pooled, key_dim=1)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs


class SequenceCollectionAccessors:
    """TorchRec's accessors of an EmbeddingCollection, shared by the float and quantized ones."""

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_dim(self) -> int:
        return self._embedding_dim

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._embedding_configs

    def embedding_names_by_table(self) -> List[List[str]]:
        return self._embedding_names_by_table

    def _output_names(self) -> List[str]:
        return [name for names in self._embedding_names_by_table for name in names]


class EmbeddingCollection(SequenceCollectionAccessors, _BatchedCollection, EmbeddingCollectionInterface):
    """One embedding per id: KeyedJaggedTensor -> {feature: JaggedTensor of [num ids, dim]}, as in TorchRec.

    All tables need one embedding_dim (TorchRec's rule). Arguments as EmbeddingBagCollection, plus
    need_indices (the output JaggedTensors carry the ids as weights), and TorchRec's use_gather_select /
    use_gather_select_per_sharding, kept and returned by the methods of those names: in TorchRec they pick the
    sharded lookup's output kernel (the same rows either way); rectoolkit's sharded collections have one.
    """

    _dict_name = "embeddings"
    _interleaved_init = True

    def __init__(self, tables: List[EmbeddingConfig], device: Union[str, torch.device, None] = None,
                 need_indices: bool = False, use_gather_select: bool = False,
                 use_gather_select_per_sharding: Optional[Dict[str, bool]] = None, optimizer: Any = None,
                 lr: Optional[float] = None, fused_params: Optional[Mapping[str, Any]] = None, backend: str = "auto",
                 ids_out_of_range: str = "error", **optimizer_kwargs: Any) -> None:
        dims = {t.embedding_dim for t in tables}
        if len(dims) > 1:
            raise ValueError(
                "All tables in a EmbeddingCollection are required to have same embedding dimension; got "
                + ", ".join(f"{t.name}: {t.embedding_dim}" for t in tables))
        self._embedding_configs = tables
        self._need_indices = need_indices
        self._use_gather_select = use_gather_select
        self._use_gather_select_per_sharding = use_gather_select_per_sharding
        self._embedding_dim = tables[0].embedding_dim if tables else -1
        super().__init__(tables, device, False, optimizer, lr, fused_params, backend, ids_out_of_range, optimizer_kwargs)

    def use_gather_select(self) -> bool:
        return self._use_gather_select

    def use_gather_select_per_sharding(self) -> Optional[Dict[str, bool]]:
        return self._use_gather_select_per_sharding

    def _table_module(self, table: EmbeddingConfig) -> nn.Module:
        return nn.Embedding(table.num_embeddings, table.embedding_dim, _weight=_meta_weight(table, self._dtype))

    def _part(self, tables: List[EmbeddingConfig], device: str) -> "EmbeddingCollection":
        return EmbeddingCollection(tables, device=device, need_indices=self._need_indices, backend=self._backend,
                                   ids_out_of_range=self._ids_out_of_range)

    def _configs(self) -> List[EmbeddingConfig]:
        return self._embedding_configs

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Look up every id: {embedding name: JaggedTensor(values=[ids of the feature, dim], lengths=...)}.

        A KJT with a batch size per feature (VBE) gives each feature's JaggedTensor at that feature's own batch
        size, as TorchRec's unsharded EmbeddingCollection does (its inverse indices are not applied)."""
        if isinstance(features, torch.fx.Proxy):  # torch.fx.symbolic_trace: one node (modules.fx_call)
            return trace_as_one_call(self, self.embeddings, features)
        if not self._embedding_configs:  # as TorchRec's: no tables, no outputs
            return {}
        if self._parts:
            return mixed_dtypes.sequence_forward(self, features)
        gathered = self._layout.gather(features, weighted=False, variable_batch=True)
        rows = self._lookup(gathered.values, self._complete_cumsum(gathered.lengths))
        if self._kernel.optimizer is not None:  # refuse NaN/inf gradients before the fused update writes them
            rows = guard_gradient(rows, type(self).__name__)
        strides = None
        if features.variable_stride_per_key():
            stride_of = dict(zip(features.keys(), features.stride_per_key()))
            strides = [stride_of[name] for name in self._layout.feature_names]
        counts = self._layout.length_per_feature(features) if gathered.lengths.device.type == "meta" else None
        return rows_per_feature(self._output_names(), rows, gathered, self._need_indices, strides, counts)
