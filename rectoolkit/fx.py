"""TorchRec's torchrec.fx: an fx Tracer that keeps rectoolkit's embedding modules whole.

rectoolkit's collections and sharded collections run Python (per-feature dictionaries, collectives) that fx cannot
trace through, so the Tracer keeps them as leaves: a traced model calls them as modules, and what they return
(KeyedTensor, a dict of JaggedTensors) flows on as traced values. A sharded collection (float or quantized,
bags or sequences) becomes one call of its `_run_groups` child (all its groups; then its awaitable, for the
training modules). Plain `torch.fx.symbolic_trace` works on the unsharded collections too (each becomes one
call_function node, see rectoolkit.modules.fx_call), as it does on TorchRec's; sharded ones need this Tracer.

    >>> import torch, rectoolkit as rtk
    >>> class Model(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=5,
    ...                                                                       embedding_dim=2, feature_names=["f"])])
    ...     def forward(self, kjt):
    ...         return self.ebc(kjt).values() * 2
    >>> model = Model()
    >>> traced = symbolic_trace(model)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    >>> torch.equal(traced(kjt), model(kjt))
    True

`torch.jit.script` of a traced model does not give a runnable program: rectoolkit's KeyedJaggedTensor is a Python
class, not a TorchScript one (TorchRec's is), so a scripted forward cannot take it as an input (scripting a graph
keeping sharded collections compiles, but calling it with a KJT fails); a graph keeping an unsharded collection
does not script at all (its kernels are not TorchScript). TorchRec's TorchScript export is not offered: torch.export
(rectoolkit.quant.export) writes the collections, sharded or not, for serving instead.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import torch
import torch.fx
from torch import nn

from rectoolkit.distributed.steps import RunGroups
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from rectoolkit.quant.one_process import (
    OneProcessShardedQuantEmbeddingBagCollection,
    OneProcessShardedQuantEmbeddingCollection,
)

# a sharded collection is traced into: its forward is one call of its RunGroups child (+ its awaitable); one sharded
# in one process (rectoolkit.quant.one_process, as shard_quant_model makes for several ranks) is kept whole
LEAF_TYPES = (RunGroups, EmbeddingBagCollection, EmbeddingCollection, QuantEmbeddingBagCollection,
              QuantEmbeddingCollection, OneProcessShardedQuantEmbeddingBagCollection,
              OneProcessShardedQuantEmbeddingCollection)


class Tracer(torch.fx.Tracer):
    """torch.fx.Tracer with rectoolkit's embedding modules as leaves.

    Args:
        leaf_modules: more leaves, by class name (TorchRec's argument: e.g. "IntNBitTableBatchedEmbeddingBagsCodegen";
            a name no module of the traced model has is fine, as in TorchRec).
    """

    def __init__(self, leaf_modules: Optional[List[str]] = None) -> None:
        super().__init__()
        self._leaf_modules = list(leaf_modules or [])

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, LEAF_TYPES) or type(m).__name__ in self._leaf_modules:
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def trace(self, root: Union[nn.Module, Callable[..., Any]],
              concrete_args: Optional[Dict[str, Any]] = None) -> torch.fx.Graph:
        graph = super().trace(root, concrete_args)
        for node in graph.nodes:  # our input types are Python classes TorchScript cannot compile: leave them untyped
            if node.op == "placeholder":
                node.type = None
        return graph


def symbolic_trace(root: Union[nn.Module, Callable[..., Any]], concrete_args: Optional[Dict[str, Any]] = None,
                   leaf_modules: Optional[List[str]] = None) -> torch.fx.GraphModule:
    """TorchRec's torchrec.fx.symbolic_trace: trace `root` with the Tracer above; returns a GraphModule."""
    tracer = Tracer(leaf_modules)
    graph = tracer.trace(root, concrete_args)
    name = root.__class__.__name__ if isinstance(root, nn.Module) else root.__name__
    return torch.fx.GraphModule(tracer.root, graph, name)
