"""torch.fx.symbolic_trace of rectoolkit's collections: the whole forward as one node of the graph.

torch.fx traces a module by running its forward on Proxy values. A collection's forward branches on its input
(a KJT: its keys, lengths, whether it carries weights), which a Proxy cannot answer, so when the forward gets a
Proxy it calls `trace_as_one_call` instead: the graph gets one node, `run_collection(<its tables>, features)`,
which runs the collection's ordinary forward on the real input when the graph runs. The node's argument is the
collection's table dict (`embedding_bags` / `embeddings`), so the GraphModule keeps the tables and its
state_dict has TorchRec's keys (`embedding_bags.<table>.weight`). TorchRec's collections trace into KJT method
calls instead; the traced graph gives the same output.

    >>> import torch, torch.fx, rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> traced = torch.fx.symbolic_trace(ebc)
    >>> [n.op for n in traced.graph.nodes], list(traced.state_dict())
    (['placeholder', 'get_attr', 'call_function', 'output'], ['embedding_bags.t.weight'])
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2, 4]), torch.tensor([2, 1]))
    >>> torch.equal(traced(kjt).values(), ebc(kjt).values())
    True

rectoolkit.fx (TorchRec's torchrec.fx) keeps the collections as leaf modules instead, and also traces models
holding sharded ones.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch import nn

_OWNER = "_fx_owner"  # the collection, kept in its table dict's __dict__ (an attribute, not a registered child)


@torch.fx.wrap
def run_collection(tables: nn.Module, features: Any) -> Any:
    """A traced graph's call of a collection: the collection that owns `tables`, run on `features`."""
    return tables.__dict__[_OWNER](features)


def trace_as_one_call(collection: nn.Module, tables: nn.Module, features: torch.fx.Proxy) -> Any:
    """Record `collection(features)` as one node while torch.fx traces; `tables` is its table dict."""
    tables.__dict__[_OWNER] = collection
    return run_collection(tables, features)
