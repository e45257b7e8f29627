"""TorchRec's containers of what an input dist hands its lookups (torchrec.distributed.embedding_types): `KJTList`
(one KJT per device, what KJTOneToAll returns), `ListOfKJTList` (one KJTList per sharding group) and
`InputDistOutputs` (a KJTList, and the row-wise unbucketize tensors). rectoolkit's sharded collections pass their own
batches (rectoolkit.distributed.sharded_ebc); these are for code written against TorchRec's types.

    >>> len(ListOfKJTList([KJTList([]), KJTList([])]))
    2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

import torch

from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.streamable import Multistreamable

__all__ = ["InputDistOutputs", "KJTList", "ListOfKJTList"]


class _ListOf(Multistreamable):
    """A list kept in the attribute `_items` names (TorchRec's attribute names differ by class): len, [], []=,
    iteration, and record_stream on every item."""

    _items = ""

    def __len__(self) -> int:
        return len(getattr(self, self._items))

    def __setitem__(self, key: int, item: Any) -> None:
        getattr(self, self._items)[key] = item

    def __getitem__(self, key: int) -> Any:
        return getattr(self, self._items)[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(getattr(self, self._items))

    def record_stream(self, stream: Any) -> None:
        for item in self:
            item.record_stream(stream)


class KJTList(_ListOf):
    """A list of KJTs (`features`), one per device."""

    _items = "features"

    def __init__(self, features: List[KeyedJaggedTensor]) -> None:
        self.features = features


class ListOfKJTList(_ListOf):
    """A list of KJTLists (`features_list`), one per sharding group."""

    _items = "features_list"

    def __init__(self, features: List[KJTList]) -> None:
        self.features_list = features


@dataclass
class InputDistOutputs(Multistreamable):
    """An input dist's result: the KJTs per device and, for row-wise sharding, the tensors that undo bucketizing."""

    features: KJTList
    unbucketize_permute_tensor: Optional[torch.Tensor] = None
    bucket_mapping_tensor: Optional[torch.Tensor] = None
    bucketized_length: Optional[torch.Tensor] = None

    def record_stream(self, stream: Any) -> None:
        for features in self.features:
            features.record_stream(stream)
        for tensor in (self.unbucketize_permute_tensor, self.bucket_mapping_tensor, self.bucketized_length):
            if tensor is not None:
                tensor.record_stream(stream)
