"""KeyedJaggedTensor (KJT): several sparse features over one batch, stored as one flat jagged tensor.

    keys    = ["product", "user"]
    lengths = [3, 1,   2, 2]            key-major: all samples of "product", then all of "user"
    values  = [1, 2, 1, 5,   2, 3, 4, 1]
    stride  = 2                          samples per key (the batch size)

Same constructor arguments, methods, results and printed layout as ``torchrec.KeyedJaggedTensor``,
including a variable batch size per key (``stride_per_key_per_rank``, ``inverse_indices``; see
rectoolkit.sparse.variable_batch).

This module holds the class: construction, accessors and per-key caches, per-key views, printing. The longer
operations live in one module each, which the methods call: the constructor's checks (kjt_validation), regrouping
by keys - to_dict, from_jt_dict, split, permute, concat (kjt_keys), copies to a device or pinned memory
(kjt_devices) and the all-to-all (kjt_dist).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.sparse import kjt_devices, kjt_dist, kjt_keys, kjt_validation, pytree_nodes, validation, variable_batch
from rectoolkit.sparse.fx_construct import traced_call, traced_construction
from rectoolkit.sparse.jagged_ops import (
    cumsum_list,
    jagged_values_string,
    lengths_to_offsets,
    offsets_to_lengths,
)
from rectoolkit.sparse.jagged_tensor import JaggedTensor

_OWNER = "KeyedJaggedTensor"


@traced_construction
class KeyedJaggedTensor:
    """Sparse features keyed by name: ``lengths`` is key-major, ``len(keys) * stride`` entries.

    Args:
        keys: feature names.
        values: all values, key by key, sample by sample.
        weights: one weight per value, or None.
        lengths: values per (key, sample), key-major; or
        offsets: start of each (key, sample) in values, plus the end.
        stride: samples per key (inferred from lengths/offsets if None).
        stride_per_key_per_rank: samples of each key on each rank ([keys][ranks]); makes the KJT variable
            batch per key (VBE): key k has ``sum(stride_per_key_per_rank[k])`` samples.
        stride_per_key, length_per_key, lengths_offset_per_key, offset_per_key, index_per_key,
        jt_dict: precomputed caches (as in TorchRec).
        inverse_indices: (keys, [len(keys), B] tensor): sample b of the full batch reads the key's sample
            ``inverse_indices[1][k, b]``; the collections expand their output with it. Then stride() is B.
        validate: check the inputs (default: on, unless inside ``validation_disabled()``).

    >>> kjt = KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
    ...                         lengths=torch.tensor([3, 1, 2, 2]))
    >>> kjt.stride(), kjt.length_per_key(), kjt.offset_per_key()
    (2, [4, 4], [0, 4, 8])
    >>> kjt["user"].to_dense()
    [tensor([2, 3]), tensor([4, 1])]
    """

    def __init__(
        self,
        keys: List[str],
        values: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        lengths: Optional[torch.Tensor] = None,
        offsets: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Union[torch.Tensor, List[List[int]], None] = None,
        stride_per_key: Optional[List[int]] = None,
        length_per_key: Optional[List[int]] = None,
        lengths_offset_per_key: Optional[List[int]] = None,
        offset_per_key: Optional[List[int]] = None,
        index_per_key: Optional[Dict[str, int]] = None,
        jt_dict: Optional[Dict[str, JaggedTensor]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
        *,
        validate: Optional[bool] = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise validation.JaggedAssertionError(f"{_OWNER}: pass lengths or offsets (or both)")
        check = validation.should_validate(validate) and values.device.type != "meta"  # meta: no data to check
        lengths, offsets = validation.key_major_1d(lengths, offsets, _OWNER, check)
        self._keys = keys
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        self._stride = stride
        self._stride_per_key_per_rank = variable_batch.as_lists(stride_per_key_per_rank)
        self._stride_per_key = stride_per_key
        self._lengths_offset_per_key = lengths_offset_per_key
        self._length_per_key = length_per_key
        self._offset_per_key = offset_per_key
        self._index_per_key = index_per_key
        self._jt_dict = jt_dict
        self._inverse_indices = inverse_indices
        # The lengths summed per key (by validation, or by concat); kept aside so that length_per_key_or_none() stays None until
        # length_per_key() is asked for, as TorchRec's.
        self._computed_length_per_key: Optional[List[int]] = None
        if check:
            self._validate()

    def _validate(self) -> None:  # the checks: sparse/kjt_validation.py
        self._stride, self._computed_length_per_key = kjt_validation.check_arguments(
            self._keys, self._values, self._weights, self._lengths, self._offsets, self._stride,
            self._stride_per_key_per_rank, self._stride_per_key, self._length_per_key, self._inverse_indices)

    # ----------------------------------------------------------------------------------- builders
    @staticmethod
    def from_offsets_sync(
        keys: List[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Optional[List[List[int]]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
    ) -> "KeyedJaggedTensor":
        """Build from offsets and compute length_per_key / offset_per_key now."""
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            offsets=offsets,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
        ).sync()

    @staticmethod
    def from_lengths_sync(
        keys: List[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        stride: Optional[int] = None,
        stride_per_key_per_rank: Optional[List[List[int]]] = None,
        inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
    ) -> "KeyedJaggedTensor":
        """Build from lengths and compute length_per_key / offset_per_key now."""
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=stride,
            stride_per_key_per_rank=stride_per_key_per_rank,
            inverse_indices=inverse_indices,
        ).sync()

    @staticmethod
    def from_jt_dict(jt_dict: Dict[str, JaggedTensor]) -> "KeyedJaggedTensor":
        """One key per JaggedTensor, in the dict's order; all must have the same batch size.

        >>> jts = {"a": JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2, 0])),
        ...        "b": JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([0, 1]))}
        >>> KeyedJaggedTensor.from_jt_dict(jts).lengths()
        tensor([2, 0, 0, 1])
        """
        return KeyedJaggedTensor(**kjt_keys.from_jt_dict_arguments(jt_dict)).sync()

    @staticmethod
    @traced_call
    def concat(kjt_list: List["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Keys of all KJTs side by side; they must share the batch size and all (or none) be weighted."""
        arguments, length_per_key = kjt_keys.concat_arguments(kjt_list)
        result = KeyedJaggedTensor(**arguments)
        result._computed_length_per_key = length_per_key
        return result

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        values_dtype: Optional[torch.dtype] = None,
        weights_dtype: Optional[torch.dtype] = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "KeyedJaggedTensor":
        """A KJT with no keys."""
        return KeyedJaggedTensor(
            keys=[],
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            stride=0,
            validate=False,
        )

    @staticmethod
    def empty_like(kjt: "KeyedJaggedTensor", device: Optional[torch.device] = None) -> "KeyedJaggedTensor":
        """No keys, same stride and dtypes (device=None); or same shapes, uninitialized, on ``device``."""
        return KeyedJaggedTensor(**kjt_devices.empty_like_arguments(kjt, device))

    def copy_(self, kjt: "KeyedJaggedTensor", non_blocking: bool = False) -> "KeyedJaggedTensor":
        """Copy ``kjt`` into this one in place (TorchRec's copy_, e.g. into pinned or device buffers made by
        empty_like): its per-key metadata, then its values, and its weights, lengths, offsets and inverse indices
        where both hold them. Keys and stride are taken as already equal; returns self."""
        self._stride_per_key_per_rank = kjt._stride_per_key_per_rank if kjt.variable_stride_per_key() else None
        self._length_per_key = kjt._length_per_key
        self._computed_length_per_key = kjt._computed_length_per_key
        self._lengths_offset_per_key = kjt._lengths_offset_per_key
        self._offset_per_key = kjt._offset_per_key
        self._index_per_key = kjt._index_per_key
        self._stride_per_key = kjt._stride_per_key
        self._jt_dict = kjt._jt_dict
        for mine, theirs in ((self._values, kjt._values), (self._weights, kjt._weights),
                             (self._lengths, kjt._lengths), (self._offsets, kjt._offsets)):
            if mine is not None and theirs is not None:
                mine.copy_(theirs, non_blocking=non_blocking)
        if self._inverse_indices is not None and kjt._inverse_indices is not None:
            self._inverse_indices = (kjt._inverse_indices[0],
                                     self._inverse_indices[1].copy_(kjt._inverse_indices[1], non_blocking=non_blocking))
        return self

    def sync(self) -> "KeyedJaggedTensor":
        """Compute (and cache) length_per_key and offset_per_key; returns self."""
        self.length_per_key()
        self.offset_per_key()
        return self

    def unsync(self) -> "KeyedJaggedTensor":
        self._length_per_key = None
        self._offset_per_key = None
        return self

    # ----------------------------------------------------------------- all-to-all (sparse/kjt_dist.py)
    def dist_labels(self) -> List[str]:
        """Names of the tensors ``dist_tensors`` returns: lengths, values, [strides], [weights]."""
        return kjt_dist.dist_labels(self)

    def dist_splits(self, key_splits: List[int]) -> List[List[int]]:
        """Entries of each ``dist_tensors`` tensor per destination, ``key_splits[d]`` keys going to d."""
        return kjt_dist.dist_splits(self, key_splits)

    def dist_tensors(self) -> List[torch.Tensor]:
        """The tensors an input all-to-all sends (named by ``dist_labels``)."""
        return kjt_dist.dist_tensors(self)

    @staticmethod
    def dist_init(
        keys: List[str],
        tensors: List[torch.Tensor],
        variable_stride_per_key: bool,
        num_workers: int,
        recat: Optional[torch.Tensor],
        stride_per_rank: Optional[List[int]],
        stagger: int = 1,
    ) -> "KeyedJaggedTensor":
        """The KJT rebuilt from the received ``dist_tensors`` of ``num_workers`` source ranks (synced)."""
        arguments = kjt_dist.dist_init_arguments(
            keys, tensors, variable_stride_per_key, num_workers, recat, stride_per_rank, stagger)
        return KeyedJaggedTensor(**arguments).sync()

    def clear_storage(self) -> int:
        """Free the storage of values, lengths, offsets and weights (the object stays); returns the bytes freed."""
        freed = 0
        for tensor in (self._values, self._lengths, self._offsets, self._weights):
            if tensor is not None:
                freed += tensor.element_size() * tensor.numel()
                tensor.untyped_storage().resize_(0)
        return freed

    # ---------------------------------------------------------------------------------- accessors
    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise validation.JaggedAssertionError("This (Keyed)JaggedTensor doesn't have weights.")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            self._lengths = offsets_to_lengths(self._offsets)
        return self._lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = lengths_to_offsets(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def stride(self) -> int:
        """Samples per key (the batch size); with a variable batch per key: the inverse indices' batch size if
        given, else the largest key's."""
        if self._stride is None:
            num_keys = len(self._keys)
            if num_keys == 0:
                self._stride = 0
            elif self._stride_per_key_per_rank:
                if self._inverse_indices is not None and self._inverse_indices[1].numel() > 0:
                    self._stride = self._inverse_indices[1].shape[-1]
                else:
                    self._stride = max(sum(row) for row in self._stride_per_key_per_rank)
            elif self._offsets is not None and self._offsets.numel() > 0:
                self._stride = (self._offsets.numel() - 1) // num_keys
            elif self._lengths is not None:
                self._stride = self._lengths.numel() // num_keys
            else:
                self._stride = 0
        return self._stride

    def stride_per_key(self) -> List[int]:
        """Samples of each key: all equal to stride() unless the batch varies per key."""
        if self._stride_per_key is None:
            if self._stride_per_key_per_rank is not None:
                self._stride_per_key = [sum(row) for row in self._stride_per_key_per_rank]
            else:
                self._stride_per_key = [self.stride()] * len(self._keys)
        return self._stride_per_key

    def stride_per_key_per_rank(self) -> List[List[int]]:
        """Samples of each key on each rank; empty unless the batch varies per key."""
        return [] if self._stride_per_key_per_rank is None else [list(row) for row in self._stride_per_key_per_rank]

    def variable_stride_per_key(self) -> bool:
        """True when built with stride_per_key_per_rank (even if every key has the same count, as TorchRec)."""
        return self._stride_per_key_per_rank is not None

    def inverse_indices(self) -> Tuple[List[str], torch.Tensor]:
        if self._inverse_indices is None:
            raise validation.JaggedAssertionError("This KJT doesn't have inverse indices.")
        return self._inverse_indices

    def inverse_indices_or_none(self) -> Optional[Tuple[List[str], torch.Tensor]]:
        return self._inverse_indices

    def _key_indices(self) -> Dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def index_per_key(self) -> Dict[str, int]:
        return self._key_indices()

    def length_per_key(self) -> List[int]:
        """Number of values of each key (one segment sum, cached).

        On the meta device, where the lengths hold no values, TorchRec's stand-in: the values split evenly among
        the keys, the remainder to the first (shapes only)."""
        if self._length_per_key is None:
            self._length_per_key = self._known_length_per_key()
        return self._length_per_key

    def _known_length_per_key(self) -> List[int]:
        """length_per_key() without caching it where length_per_key_or_none() reads (TorchRec's concat leaves
        its inputs' caches alone)."""
        if self._length_per_key is not None:
            return self._length_per_key
        if self._computed_length_per_key is None:
            num_keys = len(self._keys)
            lengths = self.lengths()
            if num_keys == 0:
                computed = []
            elif self._values.device.type == "meta":
                total = self._values.numel()
                computed = [total // num_keys + (total % num_keys if k == 0 else 0) for k in range(num_keys)]
            elif lengths.numel() == 0:
                computed = [0] * num_keys
            elif self.variable_stride_per_key():
                computed = variable_batch.sum_per_key(lengths, self.stride_per_key())
            else:
                computed = lengths.view(num_keys, self.stride()).sum(1).tolist()
            self._computed_length_per_key = computed
        return self._computed_length_per_key

    def length_per_key_or_none(self) -> Optional[List[int]]:
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        """Where each key's values start, plus the end: [0, len(key0), len(key0) + len(key1), ...]."""
        if self._offset_per_key is None:
            self._offset_per_key = cumsum_list(self.length_per_key())
        return self._offset_per_key

    def offset_per_key_or_none(self) -> Optional[List[int]]:
        return self._offset_per_key

    def lengths_offset_per_key(self) -> List[int]:
        """Where each key's lengths start in ``lengths()``, plus the end."""
        if self._lengths_offset_per_key is None:
            self._lengths_offset_per_key = cumsum_list(self.stride_per_key())
        return self._lengths_offset_per_key

    def size_in_bytes(self) -> int:
        tensors = [self._values, self._weights, self._lengths, self._offsets]
        size = sum(t.element_size() * t.numel() for t in tensors if t is not None)
        if self._stride_per_key_per_rank is not None:  # TorchRec holds it as an int32 tensor
            size += 4 * sum(len(row) for row in self._stride_per_key_per_rank)
        return size

    # ------------------------------------------------------------------------------- per-key views
    def _key_index(self, key: str) -> int:
        index = self._key_indices().get(key)
        if index is None:
            raise validation.unknown_key_error(key, self._keys, _OWNER)
        return index

    def __getitem__(self, key: str) -> JaggedTensor:
        """The JaggedTensor of one key (views into this KJT's tensors)."""
        index = self._key_index(key)
        offset_per_key = self.offset_per_key()
        start, end = offset_per_key[index], offset_per_key[index + 1]
        lengths_offset_per_key = self.lengths_offset_per_key()
        return JaggedTensor(
            values=self._values[start:end],
            weights=self._weights[start:end] if self._weights is not None else None,
            lengths=self.lengths()[lengths_offset_per_key[index] : lengths_offset_per_key[index + 1]],
            validate=False,
        )

    def to_dict(self, compute_offsets: bool = True) -> Dict[str, JaggedTensor]:
        """{key: JaggedTensor}, in key order (cached)."""
        if self._jt_dict is None:
            jts = kjt_keys.jt_dict(self, compute_offsets)
            if not jts:  # no keys: nothing to cache
                return jts
            self._jt_dict = jts
        return self._jt_dict

    # ------------------------------------------------------------- reshaping by keys (sparse/kjt_keys.py)
    def split(self, segments: List[int]) -> List["KeyedJaggedTensor"]:
        """Consecutive groups of keys: segments=[1, 2] -> a KJT of key 0, a KJT of keys 1 and 2.

        >>> kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(3), lengths=torch.tensor([1, 1, 1]))
        >>> [part.keys() for part in kjt.split([1, 2])]
        [['a'], ['b', 'c']]
        """
        return [self if arguments is None else KeyedJaggedTensor(**arguments)
                for arguments in kjt_keys.split_arguments(self, segments)]

    def permute(
        self, indices: Sequence[Union[int, str]], indices_tensor: Optional[torch.Tensor] = None
    ) -> "KeyedJaggedTensor":
        """A KJT whose key i is this KJT's key ``indices[i]`` (an index or a key name).

        Keys may be repeated or left out.

        >>> kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
        >>> p = kjt.permute([1, 0, 1])
        >>> p.keys(), p.values()
        (['b', 'a', 'b'], tensor([2, 3, 1, 2, 3]))
        """
        return KeyedJaggedTensor(**kjt_keys.permute_arguments(self, indices, indices_tensor))

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """The same KJT with 1-D lengths; like TorchRec it drops the inverse indices and keeps the stride as far as
        it is known (a variable batch per key: the inverse indices' batch size once stride() has been asked for,
        else the largest key's)."""
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values,
            weights=self._weights,
            lengths=self.lengths().view(-1),
            stride=self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self.length_per_key(),
            validate=False,
        )

    # ---------------------------------------------------------------- devices (sparse/kjt_devices.py)
    def to(
        self, device: torch.device, non_blocking: bool = False, dtype: Optional[torch.dtype] = None
    ) -> "KeyedJaggedTensor":
        """A copy on ``device``; ``dtype`` converts the weights only (as in TorchRec)."""

        arguments, computed_length_per_key = kjt_devices.to_arguments(self, device, non_blocking, dtype)
        moved = KeyedJaggedTensor(**arguments)
        moved._computed_length_per_key = computed_length_per_key
        return moved

    def pin_memory(self) -> "KeyedJaggedTensor":
        """A copy in pinned host memory, lengths and offsets both (the missing one is computed first), so that a
        following `.to(device, non_blocking=True)` carries everything and the device never has to derive them."""
        arguments, computed_length_per_key = kjt_devices.pin_memory_arguments(self)
        pinned = KeyedJaggedTensor(**arguments)
        pinned._computed_length_per_key = computed_length_per_key
        return pinned

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    # ----------------------------------------------------------------------------------- printing
    def __str__(self) -> str:
        if len(self._keys) == 0 or (self._offsets is None and self._lengths is None):
            return "KeyedJaggedTensor()\n"
        offsets = self.offsets().tolist()
        lengths_offset_per_key = self.lengths_offset_per_key()
        entries = []
        for index, key in enumerate(self._keys):
            first, last = lengths_offset_per_key[index], lengths_offset_per_key[index + 1]
            values = jagged_values_string(self._values, offsets, first, last)
            if self._weights is None:
                entries.append(f'    "{key}": {values}')
            else:
                weights = jagged_values_string(self._weights, offsets, first, last)
                entries.append(
                    f'    "{key}"'
                    + ': {\n        "values": '
                    + values
                    + ',\n        "weights": '
                    + weights
                    + "\n    }"
                )
        return "KeyedJaggedTensor({\n" + ",\n".join(entries) + "\n})\n"


# A pytree node as in TorchRec (pytree_nodes.py): the fields are the leaves, the keys the context.
_FIELDS = ["_values", "_weights", "_lengths", "_offsets", "_stride_per_key_per_rank", "_inverse_indices"]


def _kjt_flatten(kjt: KeyedJaggedTensor) -> Tuple[List[Optional[torch.Tensor]], List[str]]:
    inverse = kjt._inverse_indices[1] if kjt._inverse_indices is not None else None
    strides = pytree_nodes.strides_tensor(kjt._stride_per_key_per_rank)
    return [kjt._values, kjt._weights, kjt._lengths, kjt._offsets, strides, inverse], kjt._keys


def _kjt_unflatten(leaves: List[Optional[torch.Tensor]], keys: List[str]) -> KeyedJaggedTensor:
    values, weights, lengths, offsets, strides, inverse = leaves
    return KeyedJaggedTensor(keys, values, weights, lengths, offsets, stride_per_key_per_rank=strides,
                             inverse_indices=(keys, inverse) if inverse is not None else None, validate=False)


pytree_nodes.register_node(KeyedJaggedTensor, _FIELDS, _kjt_flatten, _kjt_unflatten)
KeyedJaggedTensor._fields = _FIELDS  # TorchRec's name for the pytree leaves
