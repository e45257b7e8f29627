"""Export an embedding collection for serving with torch.export, and run it without rectoolkit.

The serving boundary is flat: the exported program takes the KJT's `values` and `lengths` (features in the
collection's order, batch-major inside each feature, exactly `kjt.values()` / `kjt.lengths()`), and
`weights` for weighted collections, and returns the pooled values [B, sum of dims] of the KeyedTensor.
The batch size and the number of ids are dynamic. A server (Python, or C++ through AOTInductor) needs only
torch: the program holds aten ops and the quantized rows, no rectoolkit class.

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.quant import QuantEmbeddingBagCollection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4)])
    >>> qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["t"], values=torch.tensor([1, 2, 3]),
    ...                                               lengths=torch.tensor([2, 1]))
    >>> program = export_for_serving(qebc, kjt)
    >>> torch.equal(program.module()(kjt.values(), kjt.lengths()), qebc(kjt).values())
    True

`save_for_serving(program, path)` writes it with torch.export.save; `torch.export.load(path).module()` runs
it in any process. The pure-torch lookup is exported (fbgemm's op would make the program need fbgemm_gpu).

For models whose forward takes a KeyedJaggedTensor, torch.export flattens JaggedTensor / KeyedJaggedTensor /
KeyedTensor arguments and results (they are pytree nodes, as in TorchRec); loading such a program needs
rectoolkit.sparse imported (the pytree nodes are named by class), so the flat boundary above is the one
to serve.
"""

from __future__ import annotations

import copy
import os
from typing import Any, List, Optional, Tuple, Union

import torch
from torch import nn
from torch.export import Dim

from rectoolkit.modules.configs import DataType
from rectoolkit.sparse import KeyedJaggedTensor


class ServingModule(nn.Module):
    """forward(values, lengths[, weights]) -> pooled [B, sum of dims]: a collection behind a flat boundary.

    The features are those of `collection.embedding_bag_configs()`, in order (see `feature_names`).
    """

    def __init__(self, collection: nn.Module) -> None:
        super().__init__()
        from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection

        if not isinstance(collection, QuantEmbeddingBagCollection):
            collection = _as_fp32_quant(collection)
        self.collection = copy.deepcopy(collection)
        self.collection._lookup.backend = "torch"  # aten ops only: the program runs where torch runs
        for table in self.collection._table_modules():
            del table._buffers["weight"]  # views of the flat storage: saved once, as the lookup's buffer
        self.feature_names: List[str] = list(collection._feature_names)
        self.is_weighted = collection.is_weighted()

    def forward(self, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.collection.pooled_from_tensors(values, lengths, weights)


def _as_fp32_quant(collection: nn.Module) -> nn.Module:
    """A float EmbeddingBagCollection as a QuantEmbeddingBagCollection storing FP32 rows: the same numbers."""
    from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection

    if not hasattr(collection, "embedding_bag_configs"):
        raise TypeError(f"export_for_serving takes an (Quant)EmbeddingBagCollection, got {type(collection).__name__}")
    return QuantEmbeddingBagCollection.from_float(collection, dtype=DataType.FP32, backend="torch")


def serving_inputs(kjt: KeyedJaggedTensor, feature_names: List[str],
                   weighted: bool = False) -> Tuple[torch.Tensor, ...]:
    """(values, lengths[, weights]) of a KJT in the serving module's feature order."""
    if list(kjt.keys()) != feature_names:
        kjt = kjt.permute(feature_names)
    inputs: Tuple[torch.Tensor, ...] = (kjt.values(), kjt.lengths())
    if weighted:
        inputs += (kjt.weights(),)
    return inputs


def export_for_serving(collection: nn.Module, example: KeyedJaggedTensor,
                       dynamic: bool = True) -> torch.export.ExportedProgram:
    """torch.export a (quantized or float) EmbeddingBagCollection behind the flat serving boundary.

    `example` is a KJT with every feature; with `dynamic` the batch size and number of ids may change.
    A float collection is exported as FP32 rows (same numbers, same program).
    """
    module = ServingModule(collection).eval()
    args = serving_inputs(example, module.feature_names, module.is_weighted)
    return export_flat(module, args, len(module.feature_names), dynamic)


def export_flat(module: nn.Module, args: Tuple[torch.Tensor, ...], num_features: int,
                dynamic: bool = True) -> torch.export.ExportedProgram:
    """torch.export a module whose forward takes (values, lengths[, weights]) of `num_features` features: the
    flat boundary. With `dynamic`, the number of ids and the batch size (lengths = num_features x batch) may change."""
    dynamic_shapes = None
    if dynamic:
        batch = Dim("batch", min=1)
        num_ids = Dim("num_ids", min=0)
        dynamic_shapes = tuple([{0: num_ids}, {0: num_features * batch}] + [{0: num_ids}] * (len(args) - 2))
    # size-oblivious shapes: a batch of 1 must not be special-cased (or excluded) by broadcasting checks
    from torch.fx.experimental import _config as shape_config

    with torch.no_grad(), shape_config.patch(backed_size_oblivious=True):
        return torch.export.export(module, tuple(args), dynamic_shapes=dynamic_shapes, strict=False)


def export_with_jagged_inputs(module: nn.Module, args: Tuple[Any, ...],
                              dynamic: bool = True) -> torch.export.ExportedProgram:
    """torch.export a module whose forward takes KeyedJaggedTensors (and dense tensors [B, ...]) as they are.

    Float or quantized collections, or a whole model (a DLRM: `args = (dense, kjt)`). With `dynamic`, the batch
    size (dim 0 of the dense tensors, lengths = num keys x batch) and each KJT's number of ids may change; the
    KJT's keys (and their order) are fixed by the example. The program takes and returns rectoolkit's types,
    so the process that loads it imports rectoolkit first (the jagged types are pytree nodes from then on):

        >>> import torch, rectoolkit as rtk
        >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4)])
        >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["t"], torch.tensor([1, 2, 3]), torch.tensor([2, 1]))
        >>> program = export_with_jagged_inputs(ebc, (kjt,))
        >>> bigger = rtk.KeyedJaggedTensor.from_lengths_sync(["t"], torch.tensor([4, 5, 6, 7]), torch.tensor([1, 0, 3]))
        >>> torch.equal(program.module()(bigger).values(), ebc(bigger).values())
        True
    """
    args = tuple(_lengths_only(arg) for arg in args)
    dynamic_shapes = _jagged_dynamic_shapes(args) if dynamic else None
    from torch.fx.experimental import _config as shape_config

    with shape_config.patch(backed_size_oblivious=True):  # a batch of 1 is not special-cased (as above)
        return torch.export.export(module, tuple(args), dynamic_shapes=dynamic_shapes, strict=False)


def _lengths_only(arg: Any) -> Any:
    """A KJT example without its cached offsets, so the program's inputs are values, weights and lengths."""
    if not isinstance(arg, KeyedJaggedTensor):
        return arg
    return KeyedJaggedTensor(arg.keys(), arg.values(), arg.weights_or_none(), arg.lengths(),
                             stride_per_key_per_rank=arg._stride_per_key_per_rank,
                             inverse_indices=arg.inverse_indices_or_none(), validate=False)


def _jagged_dynamic_shapes(args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    batch = Dim("batch", min=1)
    shapes: List[Any] = []
    for position, arg in enumerate(args):
        if isinstance(arg, KeyedJaggedTensor):
            if arg.variable_stride_per_key() or arg.inverse_indices_or_none() is not None:
                raise NotImplementedError(f"argument {position}: a KeyedJaggedTensor with a batch size per feature "
                                          "(VBE) cannot be exported; pass one with a single stride")
            num_ids = Dim(f"num_ids_{position}", min=0)
            weights = {0: num_ids} if arg.weights_or_none() is not None else None
            # the KJT's pytree leaves (TorchRec's): values, weights, lengths, offsets, strides, inverse indices
            shapes.append([{0: num_ids}, weights, {0: len(arg.keys()) * batch}, None, None, None])
        elif isinstance(arg, torch.Tensor):
            shapes.append({0: batch} if arg.dim() else None)
        else:
            raise TypeError(f"argument {position}: export_with_jagged_inputs takes tensors and KeyedJaggedTensors, "
                            f"got {type(arg).__name__}")
    return tuple(shapes)


def save_for_serving(program: torch.export.ExportedProgram, path: Union[str, os.PathLike]) -> None:
    """torch.export.save; load anywhere with `torch.export.load(path).module()`."""
    torch.export.save(program, path)


# ---------------------------------------------------------------------------------------------- pytree nodes
def register_jagged_pytree_nodes() -> None:
    """Kept for code written before the jagged types registered themselves: JaggedTensor, KeyedJaggedTensor and
    KeyedTensor are torch.utils._pytree nodes as soon as rectoolkit.sparse is imported (flattened as TorchRec
    flattens them, rectoolkit/sparse/pytree_nodes.py), so this has nothing left to do.

        >>> import torch.utils._pytree as pytree
        >>> register_jagged_pytree_nodes()
        >>> KeyedJaggedTensor in pytree.SUPPORTED_NODES
        True
    """
