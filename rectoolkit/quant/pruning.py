"""Pruned tables of a quantized collection: only the first rows of a table are stored, as in TorchRec.

TorchRec's recipe (torchrec.inference.modules.set_pruning_data) marks the float collections with
{table name: rows kept after pruning}; quantizing then stores only those first rows of each named table
(`num_embeddings_post_pruning` of its config), so the table's memory shrinks by the rows pruned. The ids a
table accepts stay 0 .. num_embeddings - 1: an id of a pruned row (kept rows .. num_embeddings - 1) reads row 0,
which is what TorchRec's lookup (fbgemm's TBE with its default bounds check, BoundsCheckMode.WARNING, on CPU
and CUDA alike) does with it. rectoolkit warns once per batch, naming the table, as fbgemm logs once.

    >>> import rectoolkit as rtk
    >>> table = rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, num_embeddings_post_pruning=3)
    >>> stored_rows(table)
    3
    >>> pruned_ids_read_row_zero(torch.tensor([0, 2, 3, 9, 9]), torch.tensor([3, 2]), torch.tensor([3, 10]))
    tensor([0, 2, 0, 9, 9])
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Mapping, Sequence

import torch

from rectoolkit.modules.configs import BaseEmbeddingConfig

# TorchRec's attribute name (torchrec.quant.embedding_modules), so a float module marked by either library's
# set_pruning_data is pruned by either library's quantization
MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT: str = "__emb_name_to_num_rows_post_pruning"


def stored_rows(table: BaseEmbeddingConfig) -> int:
    """Rows a quantized table stores: `num_embeddings_post_pruning` when set, else `num_embeddings`; checked.

    >>> import rectoolkit as rtk
    >>> stored_rows(rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4))
    10
    """
    rows = getattr(table, "num_embeddings_post_pruning", None)
    if rows is None:
        return table.num_embeddings
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= table.num_embeddings:
        raise ValueError(f"table {table.name!r}: num_embeddings_post_pruning={rows!r} must be an int in "
                         f"1..num_embeddings={table.num_embeddings} (the first rows the pruned table keeps); TorchRec "
                         "fails on it deep in its lookup (0 rows) or its weight copy (more rows than the table)")
    return rows


def pruning_dict_of(module: torch.nn.Module) -> Dict[str, int]:
    """The {table name: rows kept} that set_pruning_data attached to a float collection ({} if none)."""
    return dict(getattr(module, MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT, None) or {})


def apply_pruning_dict(configs: Sequence[BaseEmbeddingConfig], pruning_dict: Mapping[str, int]) -> None:
    """Set `num_embeddings_post_pruning` of the configs the dict names (TorchRec's _update_embedding_configs).

    Names of other tables are skipped, as in TorchRec: one dict is attached to every collection of a model.
    """
    for config in configs:
        if config.name in pruning_dict:
            config.num_embeddings_post_pruning = pruning_dict[config.name]
            stored_rows(config)


def pruned_ids_read_row_zero(ids: torch.Tensor, ids_per_feature: torch.Tensor,
                             stored_rows_per_feature: torch.Tensor) -> torch.Tensor:
    """`ids` (feature after feature, `ids_per_feature` of each) with every id at or past its table's stored rows
    replaced by 0: the row TorchRec's lookup reads for an id of a pruned row. Only aten ops (torch.export)."""
    limit = stored_rows_per_feature.repeat_interleave(ids_per_feature, output_size=ids.shape[0])
    return torch.where(ids < limit, ids, torch.zeros_like(ids))


def warn_pruned_ids(owner: str, ids: torch.Tensor, ids_per_feature: torch.Tensor,
                    stored_rows_per_feature: torch.Tensor, feature_names: List[str], table_names: List[str],
                    num_embeddings_per_feature: List[int]) -> None:
    """Warn (eager calls only) when a batch holds ids of pruned rows: which feature, table, how many."""
    limit = stored_rows_per_feature.repeat_interleave(ids_per_feature, output_size=ids.shape[0])
    pruned = ids >= limit
    if not bool(pruned.any()):
        return
    feature_of_id = torch.arange(len(feature_names), device=ids.device).repeat_interleave(
        ids_per_feature, output_size=ids.shape[0])
    counts = torch.zeros(len(feature_names), dtype=torch.int64, device=ids.device)
    counts.index_add_(0, feature_of_id, pruned.to(torch.int64))
    stored = stored_rows_per_feature.tolist()
    details = "; ".join(f"{count} of feature {feature_names[f]!r} (table {table_names[f]!r} keeps rows "
                        f"0..{stored[f] - 1} of {num_embeddings_per_feature[f]})"
                        for f, count in enumerate(counts.tolist()) if count)
    warnings.warn(f"{owner}: ids of pruned rows read row 0, as TorchRec's lookup does: {details}", stacklevel=3)
