"""KeyedJaggedTensor (KJT): several sparse features over one batch, stored as one flat jagged tensor.

    keys    = ["product", "user"]
    lengths = [3, 1,   2, 2]            key-major: all samples of "product", then all of "user"
    values  = [1, 2, 1, 5,   2, 3, 4, 1]
    stride  = 2                          samples per key (the batch size)

Same constructor arguments, methods, results and printed layout as ``torchrec.KeyedJaggedTensor``,
including a variable batch size per key (``stride_per_key_per_rank``, ``inverse_indices``; see
rectoolkit.sparse.variable_batch).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.sparse import kjt_dist, pytree_nodes, validation, variable_batch
from rectoolkit.sparse.fx_construct import traced_call, traced_construction
from rectoolkit.sparse.jagged_ops import (
    batched_lengths_to_offsets,
    cat_or_empty,
    cumsum_list,
    jagged_values_string,
    lengths_to_offsets,
    min_and_sum_per_row,
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

    # --------------------------------------------------------------------------------- validation
    def _validate(self) -> None:
        keys, values, lengths, offsets = self._keys, self._values, self._lengths, self._offsets
        validation.check_integer(lengths, "lengths", _OWNER)
        validation.check_integer(offsets, "offsets", _OWNER)
        validation.check_weights(values, self._weights, _OWNER)
        if self._stride_per_key_per_rank is not None:
            self._validate_variable_batch()
            return
        num_lengths = lengths.numel() if lengths is not None else max(offsets.numel() - 1, 0)
        stride = validation.check_keys_and_stride(keys, num_lengths, self._stride, _OWNER)
        self._stride = stride
        if offsets is not None:
            offset_lengths = validation.check_offsets(offsets, values, _OWNER, keys, stride)
            if lengths is not None and not torch.equal(lengths.to(offset_lengths.dtype), offset_lengths):
                raise ValueError(f"{_OWNER}: lengths do not match offsets; lengths must equal diff(offsets)")
            lengths = offset_lengths
        if len(keys) == 0 or num_lengths == 0:
            validation.check_total_length(0, values, _OWNER, f" (keys={validation._short_keys(keys)})")
            computed = [0] * len(keys)
        else:
            # One segment sum and one min, read back with a single .tolist().
            sum_dtype = torch.int32 if lengths.dtype == torch.int32 and values.size(0) < 2**31 else torch.int64
            *computed, min_length = min_and_sum_per_row(lengths.view(len(keys), stride), sum_dtype)
            validation.check_lengths_nonnegative(lengths, min_length, _OWNER, keys, stride)
            total = sum(computed)
            if total != values.size(0):  # the message (keys and all) is built only when it is needed
                validation.check_total_length(
                    total, values, _OWNER, f" (keys={validation._short_keys(keys)}, stride={stride})"
                )
        if self._length_per_key is not None and list(self._length_per_key) != computed:
            raise ValueError(
                f"{_OWNER}: length_per_key={list(self._length_per_key)} but the lengths sum to {computed} per key"
            )
        self._computed_length_per_key = computed
        if self._inverse_indices is not None:
            variable_batch.check_inverse_indices(self._inverse_indices, keys, [stride] * len(keys))

    def _validate_variable_batch(self) -> None:
        keys = self._keys
        stride_per_key = variable_batch.per_key_strides(self._stride_per_key_per_rank, keys)
        if self._stride_per_key is not None and list(self._stride_per_key) != stride_per_key:
            raise ValueError(f"{_OWNER}: stride_per_key={list(self._stride_per_key)} but stride_per_key_per_rank "
                             f"sums to {stride_per_key} per key")
        lengths = self._lengths
        if self._offsets is not None:
            offset_lengths = validation.check_offsets(self._offsets, self._values, _OWNER)
            if lengths is not None and not torch.equal(lengths.to(offset_lengths.dtype), offset_lengths):
                raise ValueError(f"{_OWNER}: lengths do not match offsets; lengths must equal diff(offsets)")
            lengths = offset_lengths
        computed = variable_batch.check_lengths(keys, lengths, stride_per_key, self._values.size(0))
        if self._length_per_key is not None and list(self._length_per_key) != computed:
            raise ValueError(
                f"{_OWNER}: length_per_key={list(self._length_per_key)} but the lengths sum to {computed} per key"
            )
        self._computed_length_per_key = computed
        if self._inverse_indices is not None:
            variable_batch.check_inverse_indices(self._inverse_indices, keys, stride_per_key)

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
        keys = list(jt_dict.keys())
        jts = list(jt_dict.values())
        strides = [jt.lengths().numel() for jt in jts]
        variable = len(set(strides)) > 1  # then a variable batch per key, as TorchRec
        weighted = [jt.weights_or_none() is not None for jt in jts]
        if any(weighted) and not all(weighted):
            raise ValueError(f"{_OWNER}.from_jt_dict: some JaggedTensors have weights and some do not ({dict(zip(keys, weighted))})")
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([jt.values() for jt in jts]),
            weights=torch.cat([jt.weights() for jt in jts]) if jts and all(weighted) else None,
            lengths=torch.cat([jt.lengths() for jt in jts]),
            stride=None if variable else (strides[0] if strides else None),
            stride_per_key_per_rank=[[stride] for stride in strides] if variable else None,
        ).sync()

    @staticmethod
    @traced_call
    def concat(kjt_list: List["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Keys of all KJTs side by side; they must share the batch size and all (or none) be weighted."""
        if len(kjt_list) == 0:
            raise ValueError("Can't concat empty KJT list")
        # a KJT with no keys adds nothing (and its values, e.g. KeyedJaggedTensor.empty()'s float32, must not promote
        # the others' ids)
        kjt_list = [kjt for kjt in kjt_list if kjt.keys()] or kjt_list[:1]
        weighted = kjt_list[0].weights_or_none() is not None
        variable = [kjt.variable_stride_per_key() for kjt in kjt_list]
        if any(variable) and not all(variable):
            raise validation.JaggedAssertionError(f"{_OWNER}.concat: some KJTs have a variable batch per key and some do not ({variable}); "
                             "give all of them stride_per_key_per_rank, or none")
        with_inverse = [kjt.inverse_indices_or_none() is not None for kjt in kjt_list]
        if any(with_inverse) and not all(with_inverse):
            raise validation.JaggedAssertionError(f"{_OWNER}.concat: some KJTs have inverse_indices and some do not ({with_inverse}); "
                             "give all of them inverse indices, or none")
        strides = [kjt.stride() for kjt in kjt_list if kjt.keys()]
        if not all(variable) and len(set(strides)) > 1:
            raise validation.JaggedAssertionError(f"{_OWNER}.concat: the KJTs have different strides {strides}; they must share the batch size")
        keys: List[str] = []
        length_per_key: List[int] = []
        for kjt in kjt_list[:-1]:  # padding inside the result would shift the next KJT's values (TorchRec's does)
            validation.check_not_padded(sum(kjt._known_length_per_key()), kjt.values(), _OWNER, "concat")
        for kjt in kjt_list:
            if (kjt.weights_or_none() is not None) != weighted:
                raise ValueError("Can't merge weighted KJT with unweighted KJT")
            keys += kjt.keys()
            length_per_key += kjt._known_length_per_key()
        # As TorchRec's: the result's length_per_key_or_none() is set only where every input's was
        cached = all(kjt.length_per_key_or_none() is not None for kjt in kjt_list)
        inverse = None
        if all(with_inverse):
            inverse = ([k for kjt in kjt_list for k in kjt.inverse_indices()[0]],
                       torch.cat([kjt.inverse_indices()[1] for kjt in kjt_list]))
        result = KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([kjt.values() for kjt in kjt_list]),
            weights=torch.cat([kjt.weights() for kjt in kjt_list]) if weighted else None,
            lengths=torch.cat([kjt.lengths() for kjt in kjt_list]),
            stride=None if all(variable) else (strides[0] if strides else kjt_list[0].stride()),
            stride_per_key_per_rank=[row for kjt in kjt_list for row in kjt.stride_per_key_per_rank()]
            if all(variable) else None,
            length_per_key=length_per_key if cached else None,
            inverse_indices=inverse,
            validate=False,
        )
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
        if device is None:
            weights = kjt.weights_or_none()
            return KeyedJaggedTensor(
                keys=[],
                values=kjt.values().new_empty(0),
                weights=weights.new_empty(0) if weights is not None else None,
                lengths=kjt.lengths().new_empty(0),
                stride=None if kjt.variable_stride_per_key() else kjt.stride(),
                stride_per_key_per_rank=kjt._stride_per_key_per_rank,
                validate=False,
            )

        def like(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return torch.empty_like(tensor, device=device) if tensor is not None else None

        return KeyedJaggedTensor(
            keys=kjt.keys(),
            values=like(kjt._values),
            weights=like(kjt._weights),
            lengths=like(kjt._lengths),
            offsets=like(kjt._offsets),
            stride=None if kjt.variable_stride_per_key() else kjt.stride(),
            stride_per_key_per_rank=kjt._stride_per_key_per_rank,
            length_per_key=kjt._length_per_key,
            offset_per_key=kjt._offset_per_key,
            inverse_indices=(kjt._inverse_indices[0], like(kjt._inverse_indices[1]))
            if kjt._inverse_indices is not None else None,
            validate=False,
        )

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
        if self._jt_dict is not None:
            return self._jt_dict
        keys = self._keys
        length_per_key = self.length_per_key()
        if not length_per_key:
            return {}
        validation.check_not_padded(sum(length_per_key), self._values, _OWNER, "to_dict")
        values = torch.split(self._values, length_per_key)
        weights = torch.split(self._weights, length_per_key) if self._weights is not None else None
        if self.variable_stride_per_key():
            split_lengths = torch.split(self.lengths(), self.stride_per_key())
            split_offsets = [lengths_to_offsets(part) for part in split_lengths] if compute_offsets else None
        else:
            lengths_2d = self.lengths().view(len(keys), self.stride())
            split_lengths = lengths_2d.unbind(0)
            split_offsets = batched_lengths_to_offsets(lengths_2d).unbind(0) if compute_offsets else None
        self._jt_dict = {
            key: JaggedTensor(
                values=values[i],
                weights=weights[i] if weights is not None else None,
                lengths=split_lengths[i],
                offsets=split_offsets[i] if split_offsets is not None else None,
                validate=False,
            )
            for i, key in enumerate(keys)
        }
        return self._jt_dict

    # --------------------------------------------------------------------------- reshaping by keys
    def split(self, segments: List[int]) -> List["KeyedJaggedTensor"]:
        """Consecutive groups of keys: segments=[1, 2] -> a KJT of key 0, a KJT of keys 1 and 2.

        >>> kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(3), lengths=torch.tensor([1, 1, 1]))
        >>> [part.keys() for part in kjt.split([1, 2])]
        [['a'], ['b', 'c']]
        """
        if any(segment < 0 for segment in segments) or sum(segments) > len(self._keys):
            raise validation.JaggedIndexError(
                f"{_OWNER}.split: segments {list(segments)} must be >= 0 and sum to at most the "
                f"{len(self._keys)} keys"
            )
        length_per_key = self.length_per_key()
        offset_per_key = self.offset_per_key()
        lengths_offset_per_key = self.lengths_offset_per_key()
        # A variable batch per key keeps each part's rows of stride_per_key_per_rank; like TorchRec, the parts
        # keep this KJT's stride and drop the inverse indices.
        variable = self._stride_per_key_per_rank
        stride = self.stride()
        lengths = self.lengths()
        parts: List[KeyedJaggedTensor] = []
        start = 0
        for segment in segments:
            end = start + segment
            part_strides = variable[start:end] if variable is not None else None
            if segment == len(self._keys):
                parts.append(self)
            elif segment == 0:
                parts.append(
                    KeyedJaggedTensor(
                        keys=[],
                        values=self._values.new_empty((0,) + tuple(self._values.shape[1:])),
                        weights=self._weights.new_empty(0) if self._weights is not None else None,
                        lengths=torch.empty(0, dtype=torch.int, device=self.device()),
                        offsets=torch.empty(0, dtype=torch.int, device=self.device()),
                        stride=stride,
                        stride_per_key_per_rank=part_strides,
                        validate=False,
                    )
                )
            else:
                first, last = offset_per_key[start], offset_per_key[end]
                parts.append(
                    KeyedJaggedTensor(
                        keys=self._keys[start:end],
                        values=self._values[first:last],
                        weights=self._weights[first:last] if self._weights is not None else None,
                        lengths=lengths[lengths_offset_per_key[start] : lengths_offset_per_key[end]],
                        stride=stride,
                        stride_per_key_per_rank=part_strides,
                        length_per_key=length_per_key[start:end],
                        validate=False,
                    )
                )
            start = end
        return parts

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
        num_keys = len(self._keys)
        positions: List[int] = []
        for index in indices:
            if isinstance(index, str):
                positions.append(self._key_index(index))
            elif -num_keys <= index < num_keys:
                positions.append(index % num_keys)
            else:
                raise validation.JaggedIndexError(
                    f"{_OWNER}.permute: index {index} is out of range for the {num_keys} keys "
                    f"{validation._short_keys(self._keys)}"
                )
        length_per_key = self.length_per_key()
        offset_per_key = self.offset_per_key()
        lengths = self.lengths()
        variable = self._stride_per_key_per_rank
        if variable is not None:  # a variable batch per key: each key's lengths are a block too
            lengths_offset_per_key = self.lengths_offset_per_key()
            return KeyedJaggedTensor(
                keys=[self._keys[p] for p in positions],
                values=cat_or_empty([self._values[offset_per_key[p] : offset_per_key[p + 1]] for p in positions],
                                    self._values),
                weights=cat_or_empty([self._weights[offset_per_key[p] : offset_per_key[p + 1]] for p in positions],
                                     self._weights) if self._weights is not None else None,
                lengths=cat_or_empty(
                    [lengths[lengths_offset_per_key[p] : lengths_offset_per_key[p + 1]] for p in positions], lengths),
                stride=self.stride(),
                stride_per_key_per_rank=[variable[p] for p in positions],
                length_per_key=[length_per_key[p] for p in positions] if positions else None,
                validate=False,
            )
        stride = self.stride()
        if indices_tensor is None or any(isinstance(index, str) for index in indices):
            indices_tensor = torch.tensor(positions, dtype=torch.long, device=lengths.device)
        # Each key's values are one contiguous block, so permuting keys is one cat of slices.
        value_blocks = [self._values[offset_per_key[p] : offset_per_key[p + 1]] for p in positions]
        weights = None
        if self._weights is not None:
            weights = cat_or_empty(
                [self._weights[offset_per_key[p] : offset_per_key[p + 1]] for p in positions], self._weights
            )
        if lengths.numel() > 0 or num_keys == 0:
            permuted_lengths = lengths.view(num_keys, stride).index_select(0, indices_tensor.long()).view(-1)
        else:
            permuted_lengths = lengths
        return KeyedJaggedTensor(
            keys=[self._keys[p] for p in positions],
            values=cat_or_empty(value_blocks, self._values),
            weights=weights,
            lengths=permuted_lengths,
            stride=stride,
            length_per_key=[length_per_key[p] for p in positions] if positions else None,
            validate=False,
        )

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """The same KJT with 1-D lengths; like TorchRec it drops the inverse indices (so a variable batch per
        key gets the largest key's stride back)."""
        return KeyedJaggedTensor(
            keys=self._keys,
            values=self._values,
            weights=self._weights,
            lengths=self.lengths().view(-1),
            stride=None if self._stride_per_key_per_rank is not None else self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self.length_per_key(),
            validate=False,
        )

    # ------------------------------------------------------------------------------------ devices
    def to(
        self, device: torch.device, non_blocking: bool = False, dtype: Optional[torch.dtype] = None
    ) -> "KeyedJaggedTensor":
        """A copy on ``device``; ``dtype`` converts the weights only (as in TorchRec)."""

        def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return tensor.to(device, non_blocking=non_blocking) if tensor is not None else None

        weights = self._weights
        if weights is not None:
            weights = weights.to(device=device, dtype=dtype, non_blocking=non_blocking)
        inverse = self._inverse_indices
        if inverse is not None:
            inverse = (inverse[0], inverse[1].to(device, non_blocking=non_blocking))
        moved = KeyedJaggedTensor(
            keys=self._keys,
            values=move(self._values),
            weights=weights,
            lengths=move(self._lengths),
            offsets=move(self._offsets),
            stride=self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            jt_dict=self._jt_dict,
            inverse_indices=inverse,
            validate=False,
        )
        moved._computed_length_per_key = self._computed_length_per_key  # no device sync to find it again
        return moved

    def pin_memory(self) -> "KeyedJaggedTensor":
        """A copy in pinned host memory, lengths and offsets both (the missing one is computed first), so that a
        following `.to(device, non_blocking=True)` carries everything and the device never has to derive them."""
        def pin(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return tensor.pin_memory() if tensor is not None else None

        pinned = KeyedJaggedTensor(
            keys=self._keys,
            values=pin(self._values),
            weights=pin(self._weights),
            lengths=pin(self.lengths()),
            offsets=pin(self.offsets()),
            stride=self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
            inverse_indices=(self._inverse_indices[0], self._inverse_indices[1].pin_memory())
            if self._inverse_indices is not None else None,
            validate=False,
        )
        pinned._computed_length_per_key = self._computed_length_per_key
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
