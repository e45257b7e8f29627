"""Quantized EmbeddingBagCollection / EmbeddingCollection for inference, as in torchrec.quant.

Two ways to get one from a trained (float) collection, as in TorchRec's tutorial (seed 001):

    >>> import torch, rectoolkit as rtk
    >>> from torch.ao import quantization as quant
    >>> from rectoolkit.quant import QuantConfig, QuantEmbeddingBagCollection
    >>> tables = [rtk.EmbeddingBagConfig(name="t_user", num_embeddings=100, embedding_dim=64, feature_names=["user"])]
    >>> ebc = rtk.EmbeddingBagCollection(tables)
    >>> qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8)           # direct
    >>> qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
    ...                       weight=quant.PlaceholderObserver.with_args(dtype=torch.int8))
    >>> model = quant.quantize_dynamic(torch.nn.Sequential(ebc), qconfig_spec={rtk.EmbeddingBagCollection: qconfig},
    ...     mapping={rtk.EmbeddingBagCollection: QuantEmbeddingBagCollection}, inplace=False)  # seed 001
    >>> {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    {'0.embedding_bags.t_user.weight': ((100, 80), torch.uint8)}
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["user"], values=torch.tensor([1, 2, 3]),
    ...                                               lengths=torch.tensor([2, 1]))
    >>> model(kjt).values().shape
    torch.Size([2, 64])

Tables may differ in data type (FP32, FP16, INT8, INT4, INT2): `per_table_weight_dtype` (of `from_float` or of
QuantConfig) picks a table's type; each table is stored and looked up in its own, as in TorchRec. A bag table with
`num_embeddings_post_pruning` (set_pruning_data) stores only its first rows (rectoolkit.quant.pruning).

Weights are buffers (uint8 rows in fbgemm's layout, see rectoolkit.quant.rowwise), one [rows, row bytes]
view per table of one flat storage. Lookups run fbgemm's int-n-bit TBE op when fbgemm is available and a
pure-torch dequantizing lookup otherwise (rectoolkit.quant.lookup); both give the same results.
Differences from TorchRec: INT4/INT2 weights are plain uint8 buffers [rows, bytes] (TorchRec wraps them
in UInt4Tensor/UInt2Tensor, whose shape counts nibbles); output keys stay in table order for mixed
SUM/MEAN collections (TorchRec groups them by pooling).
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
from torch import nn

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
    SequenceCollectionAccessors,
    get_embedding_names_by_table,
)
from rectoolkit.modules.fx_call import trace_as_one_call
from rectoolkit.modules.layout import FeatureLayout, GatheredFeatures, rows_per_feature
from rectoolkit.quant.config import QuantConfig, weight_data_type
from rectoolkit.quant.lookup import QuantBatchedLookup, QuantTableSpec
from rectoolkit.quant import prep
from rectoolkit.quant.prep import (MODULE_ATTR_CACHE_FEATURES_ORDER, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS,
                                   MODULE_ATTR_REGISTER_TBES_BOOL, MODULE_ATTR_ROW_ALIGNMENT_INT)
from rectoolkit.quant.pruning import (MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT,  # noqa: F401
                                      apply_pruning_dict, pruned_ids_read_row_zero, pruning_dict_of, stored_rows,
                                      warn_pruned_ids)
from rectoolkit.quant.rowwise import (
    DEFAULT_ROW_ALIGNMENT,
    INTEGER_DATA_TYPES,
    SCALE_BIAS_BYTES,
    data_bytes_per_row,
    quantize_rowwise,
)
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from rectoolkit.sparse.validation import is_tracing

_ID_MODES = ("error", "unchecked")


class _QuantCollection(nn.Module):
    """What both quantized collections share: tables, one flat storage with per-table views, feature order."""

    _dict_name = ""  # "embedding_bags" | "embeddings"

    def __init__(self, tables: Sequence[BaseEmbeddingConfig], device: Union[str, torch.device, None], pooled: bool,
                 output_dtype: torch.dtype,
                 table_name_to_quantized_weights: Optional[Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]],
                 row_alignment: int, backend: str, ids_out_of_range: str) -> None:
        super().__init__()
        if not tables:
            raise ValueError(f"{type(self).__name__} needs at least one table config")
        names = [t.name for t in tables]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Duplicate table name {duplicates[0]!r}: table names must be unique")
        if ids_out_of_range not in _ID_MODES:
            raise ValueError(f"ids_out_of_range must be one of {_ID_MODES}, got {ids_out_of_range!r}")
        for table in tables:
            if not table.feature_names:
                table.feature_names = [table.name]
            _table_data_type(table.name, table.data_type)  # raises for data types that cannot be stored
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._output_dtype = output_dtype
        self.row_alignment = row_alignment
        self._ids_out_of_range = ids_out_of_range
        self._embedding_names_by_table = get_embedding_names_by_table(tables)
        self._feature_names: List[str] = [f for t in tables for f in t.feature_names]
        feature_table_map = [i for i, t in enumerate(tables) for _ in t.feature_names]
        self._feature_table_names = [tables[i].name for i in feature_table_map]
        self._layout = FeatureLayout(type(self).__name__, self._feature_names, self._feature_table_names,
                                     [tables[i].num_embeddings for i in feature_table_map], hash_allowed=False)
        rows = [stored_rows(t) for t in tables]  # fewer than num_embeddings for a pruned table (quant.pruning)
        self._pruned = any(r < t.num_embeddings for r, t in zip(rows, tables))
        self.register_buffer("_stored_rows_per_feature", torch.tensor([rows[i] for i in feature_table_map],
                                                                      device=self._device), persistent=False)
        self._lookup = QuantBatchedLookup(
            [QuantTableSpec(r, t.embedding_dim, t.data_type, t.name) for r, t in zip(rows, tables)],
            feature_table_map=feature_table_map, pooled=pooled, row_alignment=row_alignment, backend=backend,
            output_dtype=output_dtype, device=self._device)
        self._table_names = names
        self._state_order = self._tables_in_state_order(tables)
        modules = nn.ModuleDict({tables[i].name: nn.Module() for i in self._state_order})
        setattr(self, self._dict_name, modules)
        self._link_tables()
        if table_name_to_quantized_weights:
            self._load_torchrec_weights(tables, table_name_to_quantized_weights)

    # ------------------------------------------------------------------ storage
    @staticmethod
    def _tables_in_state_order(tables: Sequence[BaseEmbeddingConfig]) -> List[int]:
        """The order of the tables in the state_dict: as given (see QuantEmbeddingCollection for the other)."""
        return list(range(len(tables)))

    def _table_modules(self) -> List[nn.Module]:
        """The per-table modules, in table order (the lookup's order; the state_dict's may differ)."""
        modules = getattr(self, self._dict_name)
        return [modules[name] for name in self._table_names]

    def _link_tables(self) -> None:
        """Make every table's `weight` buffer a view of the lookup's flat storage."""
        for module, view in zip(self._table_modules(), self._lookup.table_weights()):
            module._buffers["weight"] = view
        self._linked = [module._buffers["weight"] for module in self._table_modules()]

    def _sync_storage(self) -> None:
        """Re-link after something replaced a table buffer (load_state_dict(assign=True), manual assignment)."""
        if all(module._buffers["weight"] is view for module, view in zip(self._table_modules(), self._linked)):
            return
        for module, view in zip(self._table_modules(), self._lookup.table_weights()):
            weight = module._buffers["weight"]
            if weight.data_ptr() != view.data_ptr() or weight.shape != view.shape:
                if weight.shape != view.shape or weight.dtype != torch.uint8:
                    raise ValueError(f"a table weight was replaced by {weight.dtype} {tuple(weight.shape)}; "
                                     f"expected uint8 {tuple(view.shape)}")
                with torch.no_grad():
                    view.copy_(weight)
                module._buffers["weight"] = view
        self._linked = [module._buffers["weight"] for module in self._table_modules()]

    def _apply(self, fn, recurse=True):  # .to(), .cpu(), ...: move the flat storage, then re-make the views
        super()._apply(fn, recurse)
        self._link_tables()
        self._device = self._lookup.weights.device
        return self

    def _load_torchrec_weights(self, tables: Sequence[BaseEmbeddingConfig],
                               weights: Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]) -> None:
        """TorchRec's table_name_to_quantized_weights: {table: (codes [R, bytes], scale_bias [R, 4] or None)}."""
        for table, view in zip(tables, self._lookup.table_weights()):
            if table.name not in weights:
                raise ValueError(f"table_name_to_quantized_weights has no entry for table {table.name!r}")
            codes, scale_bias = weights[table.name]
            nbytes = data_bytes_per_row(table.embedding_dim, table.data_type)
            with torch.no_grad():
                start = 0
                if table.data_type in INTEGER_DATA_TYPES:
                    view[:, :SCALE_BIAS_BYTES].copy_(scale_bias)
                    start = SCALE_BIAS_BYTES
                view[:, start:start + nbytes].copy_(codes[:, :nbytes])

    def load_float_weights(self, weights: Dict[str, torch.Tensor], backend: str = "auto") -> None:
        """Quantize float tables {table name: [rows, dim]} into this collection's storage (a pruned table: its
        kept rows, or the whole table of which the first rows are kept, as TorchRec's quantization does)."""
        for table, view in zip(self._configs(), self._lookup.table_weights()):
            if table.name not in weights:
                continue
            weight = weights[table.name]
            shapes = {(table.num_embeddings, table.embedding_dim), tuple(view.shape[:1]) + (table.embedding_dim,)}
            if tuple(weight.shape) not in shapes:
                raise ValueError(f"table {table.name!r}: float weight has shape {tuple(weight.shape)}, expected "
                                 f"one of {sorted(shapes)}")
            weight = weight[:view.shape[0]]
            with torch.no_grad():
                view.copy_(quantize_rowwise(weight, table.data_type, self.row_alignment, backend=backend))

    def _configs(self) -> List[BaseEmbeddingConfig]:
        raise NotImplementedError

    def storage_bytes(self) -> int:
        """Bytes the quantized tables occupy (all rows, padding included)."""
        return self._lookup.storage_bytes()

    # ------------------------------------------------------------------ inputs
    def _check_ids(self, values: torch.Tensor, lengths: torch.Tensor, batch_size: int) -> None:
        """Raise naming the feature, sample, id and table when an id is outside its table (modules.layout)."""
        if not is_tracing():
            self._layout.check_ids(GatheredFeatures(values, lengths, None, batch_size), self._ids_out_of_range,
                                   subject=f"{type(self).__name__}: ")

    def _read_pruned_ids(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Ids of pruned rows replaced by 0, the row TorchRec reads for them (quant.pruning); others as given."""
        if not self._pruned:
            return values
        num_features = len(self._feature_names)
        ids_per_feature = lengths.view(num_features, lengths.shape[0] // num_features).sum(1)  # (not -1: no bags)
        if not is_tracing():
            warn_pruned_ids(type(self).__name__, values, ids_per_feature, self._stored_rows_per_feature,
                            self._feature_names, self._feature_table_names, self._layout.id_ranges.rows_list)
        return pruned_ids_read_row_zero(values, ids_per_feature, self._stored_rows_per_feature)

    @staticmethod
    def _complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
        return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int64)

    # ------------------------------------------------------------------ TorchRec-style accessors
    def output_dtype(self) -> torch.dtype:
        return self._output_dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def backend(self) -> str:
        """The lookup that runs: "fbgemm" or "torch"."""
        return self._lookup.backend


class QuantEmbeddingBagCollection(_QuantCollection, EmbeddingBagCollectionInterface):
    """Pooled lookups from quantized tables: KeyedJaggedTensor -> KeyedTensor [batch, sum of dims].

    Args (TorchRec's, in TorchRec's order):
        tables: EmbeddingBagConfig list; each table's `data_type` (INT8, INT4, INT2, FP16, FP32) is its storage.
        is_weighted: weight each id by the KJT's weights.
        device: "cpu" or "cuda" (the pure-torch lookup runs on either; fbgemm's needs its CUDA build for "cuda").
        output_dtype: dtype of the pooled output (torch.float or torch.float16).
        table_name_to_quantized_weights: {table: (codes, scale_bias)} as fbgemm's quantizer splits them;
            usually left out: use `from_float` or `load_float_weights`.
        register_tbes, quant_state_dict_split_scale_bias, cache_features_order: accepted for TorchRec
            compatibility; split scale/bias state dicts are not supported.
        row_alignment: bytes each stored row is padded to (16, as fbgemm/TorchRec).
        backend: "auto" (fbgemm when available), "torch" or "fbgemm".
        ids_out_of_range: "error" (names feature, table and id) or "unchecked".
    """

    _dict_name = "embedding_bags"

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool = False,
                 device: Union[str, torch.device, None] = None, output_dtype: torch.dtype = torch.float,
                 table_name_to_quantized_weights: Optional[Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]] = None,
                 register_tbes: bool = False, quant_state_dict_split_scale_bias: bool = False,
                 row_alignment: int = DEFAULT_ROW_ALIGNMENT, cache_features_order: bool = False, *,
                 backend: str = "auto", ids_out_of_range: str = "error") -> None:
        if quant_state_dict_split_scale_bias:
            raise NotImplementedError("quant_state_dict_split_scale_bias=True is not supported: scale and bias stay "
                                      "inside each row (TorchRec's default layout)")
        if any(t.pooling == PoolingType.NONE for t in tables):
            raise ValueError("QuantEmbeddingBagCollection tables need SUM or MEAN pooling; "
                             "use QuantEmbeddingCollection for NONE")
        self._is_weighted = is_weighted
        self._embedding_bag_configs = tables
        super().__init__(tables, device, True, output_dtype, table_name_to_quantized_weights, row_alignment,
                         backend, ids_out_of_range)
        self._embedding_names: List[str] = [n for names in self._embedding_names_by_table for n in names]
        self._length_per_key: List[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        mean = [t.pooling == PoolingType.MEAN for t in tables for _ in t.feature_names]
        self._has_mean = any(mean)
        self.register_buffer("_mean_features", torch.tensor(mean, device=self._device), persistent=False)
        self.register_buffer("_dims_per_feature", torch.tensor(self._length_per_key, device=self._device),
                             persistent=False)

    def _configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool each feature's ids with its quantized table: KJT -> KeyedTensor [B, sum of dims]."""
        if isinstance(features, torch.fx.Proxy):  # torch.fx.symbolic_trace: one node (modules.fx_call)
            return trace_as_one_call(self, self.embedding_bags, features)
        values, lengths, weights, batch_size = self._layout.gather(features, self._is_weighted)
        pooled = self.pooled_from_tensors(values, lengths, weights, batch_size)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._length_per_key, values=pooled, key_dim=1)

    def pooled_from_tensors(self, values: torch.Tensor, lengths: torch.Tensor,
                            weights: Optional[torch.Tensor] = None, batch_size: Optional[int] = None) -> torch.Tensor:
        """The pooled values [B, sum of dims] from plain tensors: ids and lengths of the features in table order.

        This is what `forward` runs after ordering the KJT; it takes only tensors, so torch.export can
        capture it (see rectoolkit.quant.export).
        """
        num_features = len(self._feature_names)
        if batch_size is None:
            batch_size = lengths.shape[0] // num_features
        if not is_tracing():
            self._sync_storage()
            if lengths.numel() != num_features * batch_size:
                raise ValueError(f"{type(self).__name__}: {lengths.numel()} lengths for {num_features} features "
                                 f"x batch {batch_size}; variable batch sizes per feature are not supported")
            if self._is_weighted and weights is None:
                raise ValueError(f"{type(self).__name__}(is_weighted=True) needs a KeyedJaggedTensor with weights")
        self._check_ids(values, lengths, batch_size)
        values = self._read_pruned_ids(values, lengths)
        pooled = self._lookup(values, self._complete_cumsum(lengths), weights if self._is_weighted else None)
        if self._has_mean:
            pooled = mean_pooled(pooled, lengths, self._mean_features, self._dims_per_feature)
        return pooled

    @classmethod
    def from_float(cls, module: nn.Module, use_precomputed_fake_quant: bool = False, *,
                   dtype: Union[torch.dtype, DataType, str, None] = None,
                   per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None,
                   output_dtype: Optional[torch.dtype] = None, backend: str = "auto",
                   row_alignment: Optional[int] = None) -> "QuantEmbeddingBagCollection":
        """Quantize a float EmbeddingBagCollection (rectoolkit's or TorchRec's).

        The storage dtype comes from `dtype` (and `per_table_weight_dtype`), or else from `module.qconfig`
        (a QuantConfig, as set by torch.ao.quantization.quantize_dynamic). Tables named by set_pruning_data keep
        only their first rows (rectoolkit.quant.pruning). `row_alignment` None: the module's
        quant_prep_customize_row_alignment mark, else 16; the other quant_prep marks as rectoolkit.quant.prep says.
        """
        return quantized_bag_collection(cls, module, module, dtype=dtype, per_table_weight_dtype=per_table_weight_dtype,
                                        output_dtype=output_dtype, backend=backend, row_alignment=row_alignment)

    def _get_name(self) -> str:
        return "QuantizedEmbeddingBagCollection"

    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs


def quantized_bag_collection(cls: type, ebc: nn.Module, marked: nn.Module, *, dtype, per_table_weight_dtype,
                             output_dtype, backend: str, row_alignment: int, **extra) -> QuantEmbeddingBagCollection:
    """`cls` (a QuantEmbeddingBagCollection class) holding float `ebc`'s tables quantized; `marked` is the module that
    carries the qconfig and the pruning data (the collection itself, or the feature-processed one around it);
    `extra` goes to `cls`."""
    configs, _, out_dtype = _quantized_configs(marked, ebc.embedding_bag_configs(), dtype, per_table_weight_dtype,
                                               output_dtype)
    apply_pruning_dict(configs, pruning_dict_of(marked) or pruning_dict_of(ebc))
    quantized = cls(configs, ebc.is_weighted(), device=_module_device(ebc), output_dtype=out_dtype,
                    backend=backend, **_prep_marks(ebc, marked, row_alignment), **extra)
    quantized.load_float_weights(_float_weights(ebc, "embedding_bags", configs))
    return quantized


def _prep_marks(collection: nn.Module, marked: nn.Module, row_alignment: Optional[int]) -> Dict[str, object]:
    """The quantized module's arguments the quant_prep functions mark (rectoolkit.quant.prep): row alignment and the
    split scale / bias layout on the collection, register_tbes and cache_features_order on `marked` (TorchRec's
    reading); an explicit `row_alignment` wins."""
    return dict(
        row_alignment=row_alignment if row_alignment is not None else getattr(
            collection, MODULE_ATTR_ROW_ALIGNMENT_INT, DEFAULT_ROW_ALIGNMENT),
        quant_state_dict_split_scale_bias=getattr(collection, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, False),
        register_tbes=getattr(marked, MODULE_ATTR_REGISTER_TBES_BOOL, False),
        cache_features_order=getattr(marked, MODULE_ATTR_CACHE_FEATURES_ORDER, False))


def mean_pooled(pooled: torch.Tensor, lengths: torch.Tensor, mean_features: torch.Tensor,
                dims_per_feature: torch.Tensor) -> torch.Tensor:
    """The pooled sums [B, sum of dims] with the MEAN features' columns divided by their bag sizes (empty bags: 0).

    `lengths` [F * B] feature-major; `mean_features` [F] bool; `dims_per_feature` [F] int64.

    >>> mean_pooled(torch.tensor([[6., 4.]]), torch.tensor([3, 2]), torch.tensor([True, False]), torch.tensor([1, 1]))
    tensor([[2., 4.]])
    """
    num_features = mean_features.shape[0]
    counts = lengths.view(num_features, lengths.shape[0] // num_features).t().clamp(min=1).to(pooled.dtype)
    scale = torch.where(mean_features, 1.0 / counts, torch.ones_like(counts))
    return pooled * scale.repeat_interleave(dims_per_feature, dim=1, output_size=pooled.shape[1])


class QuantEmbeddingCollection(SequenceCollectionAccessors, _QuantCollection, EmbeddingCollectionInterface):
    """Per-id lookups from quantized tables: KeyedJaggedTensor -> {feature: JaggedTensor [ids, dim]}.

    Arguments as QuantEmbeddingBagCollection (no is_weighted), plus need_indices. All tables share one dim.
    cache_features_order: accepted as TorchRec's (there it caches the features' permutation: a speed switch,
    outputs alike either way).
    """

    _dict_name = "embeddings"

    def __init__(self, tables: List[EmbeddingConfig], device: Union[str, torch.device, None] = None,
                 need_indices: bool = False, output_dtype: torch.dtype = torch.float,
                 table_name_to_quantized_weights: Optional[Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]] = None,
                 register_tbes: bool = False, quant_state_dict_split_scale_bias: bool = False,
                 row_alignment: int = DEFAULT_ROW_ALIGNMENT, cache_features_order: bool = False, *,
                 backend: str = "auto", ids_out_of_range: str = "error") -> None:
        if quant_state_dict_split_scale_bias:
            raise NotImplementedError("quant_state_dict_split_scale_bias=True is not supported")
        pruned = [t.name for t in tables if getattr(t, "num_embeddings_post_pruning", None) is not None]
        if pruned:  # TorchRec's quantized EC stores every row whatever the config says; refused, not ignored
            raise ValueError(f"{type(self).__name__}: tables {pruned} set num_embeddings_post_pruning, but a quantized "
                             "EmbeddingCollection keeps every row (TorchRec's ignores the field); leave it None, or "
                             "prune EmbeddingBagCollections (set_pruning_data's default module_types)")
        dims = {t.embedding_dim for t in tables}
        if len(dims) > 1:
            raise ValueError("All tables in a EmbeddingCollection are required to have same embedding dimension; got "
                             + ", ".join(f"{t.name}: {t.embedding_dim}" for t in tables))
        self._embedding_configs = tables
        self._need_indices = need_indices
        self._embedding_dim = tables[0].embedding_dim if tables else -1
        super().__init__(tables, device, False, output_dtype, table_name_to_quantized_weights, row_alignment,
                         backend, ids_out_of_range)

    def _configs(self) -> List[EmbeddingConfig]:
        return self._embedding_configs

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Look up every id: {embedding name: JaggedTensor(values=[ids of the feature, dim], lengths=...)}."""
        if isinstance(features, torch.fx.Proxy):  # torch.fx.symbolic_trace: one node (modules.fx_call)
            return trace_as_one_call(self, self.embeddings, features)
        if not is_tracing():  # reads data pointers, which a traced (fake) tensor has not
            self._sync_storage()
        gathered = self._layout.gather(features, weighted=False)
        self._check_ids(gathered.values, gathered.lengths, gathered.batch_size)
        rows = self._lookup(gathered.values, self._complete_cumsum(gathered.lengths))
        outputs = rows_per_feature(self._output_names(), rows, gathered, self._need_indices)
        if self._state_order != sorted(self._state_order):
            outputs = {name: outputs[name] for i in self._state_order for name in self._embedding_names_by_table[i]}
        return outputs

    @staticmethod
    def _tables_in_state_order(tables: Sequence[BaseEmbeddingConfig]) -> List[int]:
        """TorchRec's order of a quantized EC's state_dict and outputs: tables grouped by data type (one TBE per
        type), types in the order they first appear. One data type: the tables' own order."""
        data_types = list(dict.fromkeys(t.data_type for t in tables))
        return [i for data_type in data_types for i, t in enumerate(tables) if t.data_type == data_type]

    @classmethod
    def from_float(cls, module: nn.Module, use_precomputed_fake_quant: bool = False, *,
                   dtype: Union[torch.dtype, DataType, str, None] = None,
                   per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None,
                   output_dtype: Optional[torch.dtype] = None, backend: str = "auto",
                   row_alignment: Optional[int] = None) -> "QuantEmbeddingCollection":
        """Quantize a float EmbeddingCollection (see QuantEmbeddingBagCollection.from_float); pruning data
        naming its tables is refused (TorchRec's quantized EC ignores it and keeps every row)."""
        pruned = sorted(set(pruning_dict_of(module)) & {t.name for t in module.embedding_configs()})
        if pruned:
            raise ValueError(f"QuantEmbeddingCollection.from_float: set_pruning_data names tables {pruned} of an "
                             "EmbeddingCollection, which TorchRec's quantization ignores (it keeps every row); "
                             "prune EmbeddingBagCollections only (set_pruning_data's default module_types)")
        configs, _, out_dtype = _quantized_configs(module, module.embedding_configs(), dtype,
                                                   per_table_weight_dtype, output_dtype)
        quantized = cls(configs, device=_module_device(module), need_indices=module.need_indices(),
                        output_dtype=out_dtype, backend=backend, **_prep_marks(module, module, row_alignment))
        quantized.load_float_weights(_float_weights(module, "embeddings", configs))
        return quantized

    def _get_name(self) -> str:
        return "QuantizedEmbeddingCollection"


# ---------------------------------------------------------------------------------------------- from_float
def _quantized_configs(module: nn.Module, configs: Sequence[BaseEmbeddingConfig], dtype, per_table_weight_dtype,
                       output_dtype):
    qconfig = getattr(module, "qconfig", None)
    if dtype is None and qconfig is None:
        raise ValueError(f"from_float({type(module).__name__}): pass dtype=torch.int8 (or another weight dtype), or "
                         "set module.qconfig = QuantConfig(...) as torch.ao.quantization.quantize_dynamic does")
    default = weight_data_type(dtype if dtype is not None else qconfig.weight().dtype)
    per_table: Dict[str, torch.dtype] = {}
    if isinstance(qconfig, QuantConfig) and qconfig.per_table_weight_dtype:
        per_table.update(qconfig.per_table_weight_dtype)
    per_table.update(per_table_weight_dtype or {})
    unknown = sorted(set(per_table) - {c.name for c in configs})
    if unknown:
        raise ValueError(f"per_table_weight_dtype names tables {unknown} that the module does not have; "
                         f"its tables are {[c.name for c in configs]}")
    new_configs = copy.deepcopy(list(configs))
    for config in new_configs:
        config.data_type = _table_data_type(config.name, per_table[config.name]) if config.name in per_table else default
    if output_dtype is None:
        output_dtype = qconfig.activation().dtype if qconfig is not None else torch.float
    return new_configs, [c.data_type for c in new_configs], output_dtype


def _table_data_type(table: str, dtype: Union[torch.dtype, DataType, str]) -> DataType:
    """weight_data_type, with the table named in the error (in a collection mixing types, which one is at fault)."""
    try:
        return weight_data_type(dtype)
    except ValueError as err:
        raise ValueError(f"table {table!r}: {err}") from None


def _module_device(module: nn.Module) -> torch.device:
    for tensor in module.state_dict().values():
        return tensor.device
    return torch.device("cpu")


def _float_weights(module: nn.Module, dict_name: str, configs: Sequence[BaseEmbeddingConfig]) -> Dict[str, torch.Tensor]:
    tables = getattr(module, dict_name)
    return {c.name: tables[c.name].weight.detach() for c in configs}


# TorchRec's quantization preparation at its path (rectoolkit.quant.prep)
for_each_module_of_type_do = prep.for_each_module_of_type_do
quant_prep_enable_quant_state_dict_split_scale_bias = prep.quant_prep_enable_quant_state_dict_split_scale_bias
quant_prep_enable_quant_state_dict_split_scale_bias_for_types = prep.quant_prep_enable_quant_state_dict_split_scale_bias_for_types
quant_prep_enable_register_tbes = prep.quant_prep_enable_register_tbes
quant_prep_customize_row_alignment = prep.quant_prep_customize_row_alignment
quant_prep_enable_cache_features_order = prep.quant_prep_enable_cache_features_order
quantize_state_dict = prep.quantize_state_dict

# TorchRec's spelling: `from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection`
EmbeddingBagCollection = QuantEmbeddingBagCollection
EmbeddingCollection = QuantEmbeddingCollection


def __getattr__(name: str):
    """TorchRec's FeatureProcessedEmbeddingBagCollection at this path: the quantized one, which lives in
    rectoolkit.quant.fp_embedding_modules (it builds on this module, so it is looked up when first asked for)."""
    if name == "FeatureProcessedEmbeddingBagCollection":
        from rectoolkit.quant.fp_embedding_modules import QuantFeatureProcessedEmbeddingBagCollection

        return QuantFeatureProcessedEmbeddingBagCollection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def quantize_embeddings(module: nn.Module, dtype: Union[torch.dtype, DataType, str] = torch.int8, inplace: bool = False,
                        output_dtype: torch.dtype = torch.float,
                        per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None,
                        backend: str = "auto", row_alignment: Optional[int] = None) -> nn.Module:
    """Replace every EmbeddingBagCollection / EmbeddingCollection inside `module` by its quantized version
    (`row_alignment` None: each collection's quant_prep_customize_row_alignment mark, else 16).

    TorchRec's `torchrec.inference.modules.quantize_embeddings`: what the seed-001 quantize_dynamic call
    does, without torch.ao's (deprecated) machinery. A collection given directly is returned quantized.

        >>> import torch, rectoolkit as rtk
        >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=16)])
        >>> type(quantize_embeddings(torch.nn.Sequential(ebc), dtype=torch.quint4x2)[0]).__name__
        'QuantEmbeddingBagCollection'
    """
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection as FloatEBC
    from rectoolkit.modules.embedding_modules import EmbeddingCollection as FloatEC

    def convert(child: nn.Module) -> Optional[nn.Module]:
        kind = {FloatEBC: QuantEmbeddingBagCollection, FloatEC: QuantEmbeddingCollection}.get(type(child))
        if kind is None:
            return None
        return kind.from_float(child, dtype=dtype, per_table_weight_dtype=per_table_weight_dtype,
                               output_dtype=output_dtype, backend=backend, row_alignment=row_alignment)

    if not inplace:
        module = copy.deepcopy(module)
    converted = convert(module)
    if converted is not None:
        return converted
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            replacement = convert(child)
            if replacement is not None:
                setattr(parent, name, replacement)
    return module
