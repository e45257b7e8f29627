"""Collections whose tables have different data types (an FP16 table beside FP32 ones), as TorchRec's: each table
is stored and looked up in its own type (FP32 -> float32, any other DataType -> float16, TorchRec's rule), and the
outputs are float32.

A batched kernel holds its tables in one flat storage of one dtype, so such a collection is run as one part per
dtype: a collection of the same class over the tables of that dtype. The parts are not submodules: the
collection's `embedding_bags` / `embeddings` hold the parts' own table modules, in the collection's table order,
so state_dict, parameters, `.to()` and initialization (done once over all tables, in TorchRec's order) are the
collection's, and each part's kernel follows its weights at the next lookup. A forward runs every part on the
whole KJT (each takes its features) and puts the outputs back in the collection's order.

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.modules.embedding_configs import DataType
    >>> ebc = rtk.EmbeddingBagCollection(tables=[
    ...     rtk.EmbeddingBagConfig(name="t0", embedding_dim=2, num_embeddings=5, feature_names=["a"]),
    ...     rtk.EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=5, feature_names=["b"],
    ...                            data_type=DataType.FP16)])
    >>> [p.dtype for p in ebc.parameters()]
    [torch.float32, torch.float16]
    >>> kjt = rtk.KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    >>> ebc(kjt).values().shape, ebc(kjt).values().dtype
    (torch.Size([1, 5]), torch.float32)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch
from torch import nn

from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor


def table_dtype(data_type: Any) -> torch.dtype:
    """TorchRec's float collections: FP32 tables in float32, every other DataType in float16."""
    return torch.float32 if data_type.name == "FP32" else torch.float16


def build_parts(collection: nn.Module, tables: Sequence[Any], dtypes: Sequence[torch.dtype],
                make_part: Callable[[List[Any], str], nn.Module]) -> List[nn.Module]:
    """One collection per dtype (in the order the dtypes first appear), built on the meta device so that they
    draw nothing from the random generator (the collection initializes every table itself, in table order),
    then given uninitialized storage on the collection's device."""
    order: Dict[torch.dtype, List[int]] = {}
    for index, dtype in enumerate(dtypes):
        order.setdefault(dtype, []).append(index)
    parts = []
    for indices in order.values():
        part = make_part([tables[i] for i in indices], "meta")
        if collection._device.type != "meta":
            part.to_empty(device=collection._device)
        parts.append(part)
    collection._part_tables = list(order.values())
    return parts


def table_modules(collection: nn.Module) -> nn.ModuleDict:
    """The parts' table modules, in the collection's table order."""
    by_name = {name: module for part in collection._parts for name, module in getattr(part, part._dict_name).items()}
    return nn.ModuleDict({config.name: by_name[config.name] for config in collection._configs()})


def pooled_columns(collection: nn.Module) -> torch.Tensor:
    """Where each output column of the collection sits in the parts' outputs laid side by side."""
    tables = collection._configs()
    widths = [t.embedding_dim * len(t.feature_names) for t in tables]
    start_of: Dict[int, int] = {}
    cursor = 0
    for indices in collection._part_tables:
        for index in indices:
            start_of[index] = cursor
            cursor += widths[index]
    return torch.tensor([start_of[t] + c for t in range(len(tables)) for c in range(widths[t])], dtype=torch.int64)


def pooled_forward(collection: nn.Module, features: KeyedJaggedTensor) -> KeyedTensor:
    values = torch.cat([part(features).values() for part in collection._parts], dim=1)
    columns = collection._mixed_columns.to(values.device)
    return KeyedTensor(keys=collection._embedding_names, length_per_key=collection._lengths_per_embedding,
                       values=values.index_select(1, columns), key_dim=1)


def sequence_forward(collection: nn.Module, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
    """The parts' outputs under the collection's names (a feature read by tables of two dtypes is
    "feature@table" in the collection, plain "feature" in its part)."""
    names_by_table = collection._embedding_names_by_table
    out: Dict[str, JaggedTensor] = {}
    for part, indices in zip(collection._parts, collection._part_tables):
        outputs = part(features)
        mine = [name for index in indices for name in names_by_table[index]]
        out.update({name: outputs[part_name] for name, part_name in zip(mine, part._output_names())})
    return {name: out[name] for name in collection._output_names()}


def refuse_fused_optimizer(collection: nn.Module, tables: Sequence[Any], what: str) -> None:
    by_type = {t.name: t.data_type.name for t in tables}
    raise NotImplementedError(f"{type(collection).__name__}: {what} needs the tables in one data type, but they "
                              f"have {by_type}; give them one data_type, or train with dense gradients (no "
                              "optimizer)")


__all__ = ["build_parts", "pooled_columns", "pooled_forward", "refuse_fused_optimizer", "sequence_forward",
           "table_dtype", "table_modules"]
