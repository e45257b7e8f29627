"""Managed collisions (TorchRec's `torchrec.modules.mc_modules`): raw ids of any size remapped into a fixed table.

An `MCHManagedCollisionModule` keeps a table of `zch_size` slots. Each slot holds one raw id; an id that holds a
slot is looked up at that slot's row, so ids that fit are never aliased (zero collisions). The last slot is
reserved: every id without a slot maps to it. Every `eviction_interval` training batches the ids seen since the
last eviction are counted, and the eviction policy scores the ids already in the table against the newcomers:

    raw ids --input_hash_func--> ids in [0, input_hash_size)
        training: record ids (history) --every eviction_interval batches--> score slots and newcomers,
                  the zch_size - 1 best keep or win a slot; evicted rows are reported by evict()
        remap: id with a slot -> its row; any other id -> the reserved row (offset + zch_size - 1)

Policies: `LFU_EvictionPolicy` (most counted stay), `LRU_EvictionPolicy` (most recently seen stay),
`DistanceLFU_EvictionPolicy` (count over recency). Ties keep the slot's holder, then the more frequent newcomer,
exactly as TorchRec 1.8 breaks them, so the same batches give the same rows and the same state_dict.

    >>> import torch
    >>> from rectoolkit.sparse import JaggedTensor
    >>> mch = MCHManagedCollisionModule(zch_size=4, device="cpu", eviction_policy=LFU_EvictionPolicy(),
    ...                                 eviction_interval=1)
    >>> out = mch({"t": JaggedTensor(values=torch.tensor([10**12, 7, 10**12]), lengths=torch.tensor([2, 1]))})
    >>> out["t"].values().tolist(), mch.open_slots().item()
    ([1, 2, 1], 1)
    >>> mch.eval()({"t": JaggedTensor(values=torch.tensor([5]), lengths=torch.tensor([1]))})["t"].values().tolist()
    [3]
"""

from __future__ import annotations

import abc
import logging
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from rectoolkit.modules.configs import BaseEmbeddingConfig
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor

_EMPTY_SLOT = torch.iinfo(torch.int64).max  # the raw id of a slot no id holds (sorts last)
logger = logging.getLogger(__name__)
_MAX_SEGMENTS = 1025  # TorchRec's fixed length of _output_segments_tensor (at most 1024 row-wise shards)

ThresholdFilter = Callable[[torch.Tensor], Tuple[torch.Tensor, Union[float, torch.Tensor]]]


# ------------------------------------------------------------------------------------------------ threshold filters
@torch.no_grad()
def dynamic_threshold_filter(id_counts: torch.Tensor, threshold_skew_multiplier: float = 10.0
                             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keep the ids counted more than threshold_skew_multiplier times the mean count: (mask, threshold).

    >>> dynamic_threshold_filter(torch.tensor([1, 1, 30, 2]), threshold_skew_multiplier=2.0)[0].tolist()
    [False, False, True, False]
    """
    threshold = threshold_skew_multiplier / id_counts.numel() * id_counts.sum()
    return id_counts > threshold, threshold


@torch.no_grad()
def average_threshold_filter(id_counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keep the ids counted more than the mean count: (mask, threshold).

    >>> average_threshold_filter(torch.tensor([1, 3, 2]))[0].tolist()
    [False, True, False]
    """
    threshold = id_counts.float().mean()
    return id_counts > threshold, threshold


@torch.no_grad()
def probabilistic_threshold_filter(id_counts: torch.Tensor, per_id_probability: float = 0.01
                                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keep each id with probability 1 - (1 - per_id_probability) ** count (torch's global RNG): (mask, draws)."""
    scores = 1 - torch.pow(torch.full_like(id_counts, 1 - per_id_probability, dtype=torch.float), id_counts)
    threshold = torch.rand(id_counts.size(), device=id_counts.device)
    return scores > threshold, threshold


# ------------------------------------------------------------------------------------------------ policies
class MCHEvictionPolicyMetadataInfo(NamedTuple):
    """One statistic an eviction policy keeps per slot (`_mch_<name>`) and, if history, per recorded id."""

    metadata_name: str
    is_mch_metadata: bool
    is_history_metadata: bool


_COUNTS = MCHEvictionPolicyMetadataInfo("counts", is_mch_metadata=True, is_history_metadata=False)
_LAST_ACCESS = MCHEvictionPolicyMetadataInfo("last_access_iter", is_mch_metadata=True, is_history_metadata=True)


class MCHEvictionPolicy(abc.ABC):
    """Decides which ids keep a slot: scores every slot holder and newcomer; the highest scores stay.

    The statistics are "counts" (how often an id was seen: a holder's count grows) and "last_access_iter" (the
    last training iteration it was seen in). `threshold_filtering_func` (TorchRec's experimental filter) maps the
    newcomers' counts to (mask, threshold): only ids passing the mask are counted and may win a slot.
    """

    def __init__(self, metadata_info: List[MCHEvictionPolicyMetadataInfo],
                 threshold_filtering_func: Optional[ThresholdFilter] = None) -> None:
        unknown = [info.metadata_name for info in metadata_info if info not in (_COUNTS, _LAST_ACCESS)]
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown eviction metadata {unknown}; rectoolkit keeps "
                             f"{[_COUNTS, _LAST_ACCESS]}")
        self._metadata_info = metadata_info
        self._threshold_filtering_func = threshold_filtering_func

    @property
    def metadata_info(self) -> List[MCHEvictionPolicyMetadataInfo]:
        """The per-slot statistics this policy keeps (each a `_mch_<name>` buffer of the module)."""
        return self._metadata_info

    @abc.abstractmethod
    def eviction_scores(self, current_iter: int, metadata: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One score per entry of `metadata`'s tensors (slot holders, then newcomers); higher scores stay."""

    def _distance(self, current_iter: int, last_access_iter: torch.Tensor, decay_exponent: float) -> torch.Tensor:
        return torch.pow(current_iter - last_access_iter + 1, decay_exponent)


class LFU_EvictionPolicy(MCHEvictionPolicy):
    """Least frequently used leaves first: the score is how often the id was seen since it won its slot.

    >>> LFU_EvictionPolicy().eviction_scores(5, {"counts": torch.tensor([3, 1, 2])}).tolist()
    [3, 1, 2]
    """

    def __init__(self, threshold_filtering_func: Optional[ThresholdFilter] = None) -> None:
        super().__init__([_COUNTS], threshold_filtering_func)

    def eviction_scores(self, current_iter: int, metadata: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The counts themselves."""
        return metadata["counts"]


class LRU_EvictionPolicy(MCHEvictionPolicy):
    """Least recently used leaves first: the score is -(iterations since last seen + 1) ** decay_exponent.

    >>> LRU_EvictionPolicy().eviction_scores(5, {"last_access_iter": torch.tensor([5, 1])}).tolist()
    [-1.0, -5.0]
    """

    def __init__(self, decay_exponent: float = 1.0,
                 threshold_filtering_func: Optional[ThresholdFilter] = None) -> None:
        super().__init__([_LAST_ACCESS], threshold_filtering_func)
        self._decay_exponent = decay_exponent

    def eviction_scores(self, current_iter: int, metadata: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Minus the decayed distance to the last access."""
        return torch.neg(self._distance(current_iter, metadata["last_access_iter"], self._decay_exponent))


class DistanceLFU_EvictionPolicy(MCHEvictionPolicy):
    """Frequency over recency: the score is counts / (iterations since last seen + 1) ** decay_exponent.

    >>> DistanceLFU_EvictionPolicy().eviction_scores(
    ...     5, {"counts": torch.tensor([4, 4]), "last_access_iter": torch.tensor([5, 4])}).tolist()
    [4.0, 2.0]
    """

    def __init__(self, decay_exponent: float = 1.0,
                 threshold_filtering_func: Optional[ThresholdFilter] = None) -> None:
        super().__init__([_COUNTS, _LAST_ACCESS], threshold_filtering_func)
        self._decay_exponent = decay_exponent

    def eviction_scores(self, current_iter: int, metadata: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Counts divided by the decayed distance to the last access."""
        return torch.div(metadata["counts"],
                         self._distance(current_iter, metadata["last_access_iter"], self._decay_exponent))


# ------------------------------------------------------------------------------------------------ modules
class ManagedCollisionModule(nn.Module):
    """What every managed-collision module keeps: its output row segments and the training iteration.

    `_output_segments_tensor` lists the row offsets of the table's (row-wise) shards, padded with -1 to 1025
    entries; `_current_iter_tensor` counts training batches. Both are saved, under TorchRec's names.
    """

    def __init__(self, device: Union[str, torch.device], output_segments: List[int], skip_state_validation: bool = False,
                 read_only_suffix: str = "_readonly", enable_per_feature_lookups: bool = False) -> None:
        """TorchRec's arguments: `skip_state_validation` registers neither buffer nor the check after loading (the
        module then cannot be resharded, as TorchRec warns); `read_only_suffix` (`readable_suffix`) and
        `enable_per_feature_lookups` are kept for subclasses, as TorchRec's base keeps them."""
        super().__init__()
        self._device = torch.device(device)
        self._enable_per_feature_lookups = enable_per_feature_lookups
        self._read_only_suffix = read_only_suffix
        if skip_state_validation:
            logger.warning(f"{type(self).__name__}: skip_state_validation=True: no output segments or iteration "
                           "counter kept, no check after loading; this module cannot be resharded")
            return
        if len(output_segments) > _MAX_SEGMENTS:
            raise ValueError(f"{type(self).__name__}: {len(output_segments) - 1} row-wise shards; at most "
                             f"{_MAX_SEGMENTS - 1} are supported (TorchRec's limit)")
        padded = output_segments + [-1] * (_MAX_SEGMENTS - len(output_segments))
        self.register_buffer("_output_segments_tensor", torch.tensor(padded, dtype=torch.int64, device=self._device))
        self.register_buffer("_current_iter_tensor", torch.tensor([0], dtype=torch.int64, device=self._device))
        self.register_load_state_dict_post_hook(lambda module, incompatible_keys: module.validate_state())

    @property
    def device(self) -> torch.device:
        """The device the module's buffers live on."""
        return self._device

    @property
    def readable_suffix(self) -> str:
        """The suffix of feature names looked up read-only (TorchRec's `read_only_suffix`)."""
        return self._read_only_suffix

    def validate_state(self) -> None:
        """Checks the state after `load_state_dict` (subclasses); the base keeps no rule."""


class MCHManagedCollisionModule(ManagedCollisionModule):
    """Zero-collision hashing (ZCH): up to zch_size - 1 ids each own a row; the others share the last row.

    Args (TorchRec's): zch_size: rows of the table; device; eviction_policy (LFU / LRU / DistanceLFU);
    eviction_interval: training batches between evictions; input_hash_size: ids lie in [0, input_hash_size)
    (after `input_hash_func(values, input_hash_size)` if given); name; output_global_offset: first row (a
    row-wise shard's offset); output_segments: the offsets of all the table's shards; buckets: how many.
    `mch_size` / `mch_hash_func` (TorchRec's deprecated residual table) are refused.

    Only training batches (`module.train()`) are recorded and evict; in eval mode ids are remapped only.
    """

    _mch_sorted_raw_ids: torch.Tensor
    _mch_remapped_ids_mapping: torch.Tensor

    def __init__(self, zch_size: int, device: Union[str, torch.device], eviction_policy: MCHEvictionPolicy,
                 eviction_interval: int, input_hash_size: int = (2**63) - 1,
                 input_hash_func: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                 mch_size: Optional[int] = None,
                 mch_hash_func: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                 name: Optional[str] = None, output_global_offset: int = 0,
                 output_segments: Optional[List[int]] = None, buckets: int = 1) -> None:
        subject = f"MCHManagedCollisionModule {name!r}" if name else "MCHManagedCollisionModule"
        if mch_size is not None or mch_hash_func is not None:
            raise ValueError(f"{subject}: mch_size / mch_hash_func (a residual hash table for missing ids) are "
                             "deprecated in TorchRec and not supported; drop them (missing ids share the last row)")
        for arg, value in (("zch_size", zch_size), ("eviction_interval", eviction_interval),
                           ("input_hash_size", input_hash_size), ("buckets", buckets)):
            if value <= 0:
                raise ValueError(f"{subject}: {arg}={value}; it must be > 0")
        if output_global_offset < 0:
            raise ValueError(f"{subject}: output_global_offset={output_global_offset}; it must be >= 0")
        if output_segments is None:
            output_segments = [output_global_offset, output_global_offset + zch_size]
        super().__init__(device, output_segments)
        self._init_output_segments_tensor = self._output_segments_tensor
        self._name = name
        self._subject = subject
        self._zch_size = zch_size
        self._eviction_policy = eviction_policy
        self._eviction_interval = eviction_interval
        self._input_hash_size = input_hash_size
        self._input_hash_func = input_hash_func
        self._output_global_offset = output_global_offset
        self._buckets = buckets

        self.register_buffer("_mch_sorted_raw_ids",
                             torch.full((zch_size,), _EMPTY_SLOT, dtype=torch.int64, device=self.device))
        self.register_buffer("_mch_remapped_ids_mapping",
                             torch.arange(output_global_offset, output_global_offset + zch_size, dtype=torch.int64,
                                          device=self.device))
        for info in eviction_policy.metadata_info:
            self.register_buffer(f"_mch_{info.metadata_name}",
                                 torch.zeros((zch_size,), dtype=torch.int64, device=self.device))

        self._current_iter = -1  # read from _current_iter_tensor at the first training batch
        self._last_eviction_iter = -1
        self._history_ids: List[torch.Tensor] = []  # ids recorded since the last eviction
        self._history_iters: List[int] = []  # the iteration each recorded chunk was seen in
        self._evicted = False
        self._evicted_emb_indices = torch.empty((0,), dtype=torch.int64, device=self.device)

    # ------------------------------------------------------------------ state
    def _mch_metadata(self) -> Dict[str, torch.Tensor]:
        return {info.metadata_name: getattr(self, f"_mch_{info.metadata_name}")
                for info in self._eviction_policy.metadata_info}

    @torch.no_grad()
    def _sort_mch_buffers(self) -> None:
        order = torch.argsort(self._mch_sorted_raw_ids, stable=True)
        for buffer in [self._mch_sorted_raw_ids, self._mch_remapped_ids_mapping, *self._mch_metadata().values()]:
            buffer.copy_(buffer[order])

    def validate_state(self) -> None:
        """After loading: this module's row range must be one of the saved segments; re-sorts the slots."""
        start, end = self._output_global_offset, self._output_global_offset + self._zch_size
        segments = self._output_segments_tensor.tolist()
        if start not in segments or end not in segments:
            raise ValueError(f"{self._subject}: rows [{start}, {end}) cannot be built out of the loaded output "
                             f"segments {[s for s in segments if s >= 0]}; load a checkpoint with the same row-wise "
                             "sharding of this table")
        self._output_segments_tensor = self._init_output_segments_tensor
        self._sort_mch_buffers()

    # ------------------------------------------------------------------ forward, in order
    def preprocess(self, features: Dict[str, JaggedTensor]) -> Dict[str, JaggedTensor]:
        """Hashes the ids with `input_hash_func` (if given) and checks they lie in [0, input_hash_size)."""
        processed: Dict[str, JaggedTensor] = {}
        for key, feature in features.items():
            values = feature.values()
            if self._input_hash_func is not None:
                values = self._input_hash_func(values, self._input_hash_size)
            if values.numel() and (values.min() < 0 or values.max() >= self._input_hash_size):
                bad = values[(values < 0) | (values >= self._input_hash_size)][0].item()
                fix = ("input_hash_func must map into that range" if self._input_hash_func is not None
                       else "pass input_hash_func (e.g. lambda ids, size: ids % size) or a larger input_hash_size")
                raise ValueError(f"{self._subject}: feature {key!r} has id {bad} outside [0, input_hash_size="
                                 f"{self._input_hash_size}); {fix}")
            processed[key] = JaggedTensor(values=values, lengths=feature.lengths(),  # (its lengths, checked)
                                          weights=feature.weights_or_none(), validate=False)
        return processed

    def profile(self, features: Dict[str, JaggedTensor]) -> Dict[str, JaggedTensor]:
        """Training only: records the batch's ids, and every `eviction_interval` batches updates the slots."""
        if not self.training:
            return features
        if self._current_iter == -1:
            self._current_iter = int(self._current_iter_tensor.item())
            self._last_eviction_iter = self._current_iter
        self._current_iter += 1
        self._current_iter_tensor.data += 1
        for feature in features.values():
            self._history_ids.append(feature.values().to(torch.int64))
            self._history_iters.append(self._current_iter)
        if self._current_iter - self._last_eviction_iter == self._eviction_interval:
            self._coalesce_history_and_evict()
            self._last_eviction_iter = self._current_iter
        return features

    def remap(self, features: Dict[str, JaggedTensor], mutate_miss_lengths: bool = True,
              write_weights: Optional[torch.Tensor] = None) -> Dict[str, JaggedTensor]:
        """Each id with a slot -> its row; any other id -> the reserved last row. Lengths never change.

        `mutate_miss_lengths` is TorchRec's flag for modules that drop missing ids; this one maps them to the
        reserved row instead, whatever the flag says (as TorchRec's MCH module does). `write_weights` belongs to
        TorchRec's hash-ZCH modules and is refused.
        """
        if write_weights is not None:
            raise NotImplementedError(f"{self._subject}: write_weights is for TorchRec's hash-ZCH modules; "
                                      "MCHManagedCollisionModule does not take it")
        miss_row = self._output_global_offset + self._zch_size - 1
        remapped: Dict[str, JaggedTensor] = {}
        for key, feature in features.items():
            values = feature.values()
            slots = torch.searchsorted(self._mch_sorted_raw_ids[:-1], values.to(torch.int64))
            hit = self._mch_sorted_raw_ids[slots] == values
            rows = torch.where(hit, self._mch_remapped_ids_mapping[slots], miss_row).to(values.dtype)
            remapped[key] = JaggedTensor(values=rows, lengths=feature.lengths(), weights=feature.weights_or_none(),
                                         validate=False)  # (one row per id of a checked feature)
        return remapped

    def forward(self, features: Dict[str, JaggedTensor], mutate_miss_lengths: bool = True) -> Dict[str, JaggedTensor]:
        """preprocess -> profile (training) -> remap: a dict of JaggedTensors with ids replaced by rows."""
        return self.remap(self.profile(self.preprocess(features)), mutate_miss_lengths)

    # ------------------------------------------------------------------ eviction
    @torch.no_grad()
    def _coalesce_history_and_evict(self) -> None:
        history = torch.cat(self._history_ids)
        seen_at = torch.cat([torch.full((len(ids),), it, dtype=torch.int64, device=self.device)
                             for ids, it in zip(self._history_ids, self._history_iters)])
        self._history_ids, self._history_iters = [], []
        unique_ids, inverse, counts = torch.unique(history, return_inverse=True, return_counts=True)
        last_access = torch.zeros_like(counts).scatter_reduce_(0, inverse, seen_at, reduce="amax", include_self=False)
        threshold_filter = self._eviction_policy._threshold_filtering_func
        if threshold_filter is not None:
            keep, _threshold = threshold_filter(counts)
            unique_ids, counts, last_access = unique_ids[keep], counts[keep], last_access[keep]
        self._update_slots(unique_ids, {"counts": counts, "last_access_iter": last_access})

    @torch.no_grad()
    def _update_slots(self, unique_ids: torch.Tensor, incoming: Dict[str, torch.Tensor]) -> None:
        # newcomers in order of falling frequency (stable), as TorchRec orders them: this decides ties
        by_frequency = torch.argsort(incoming["counts"], descending=True, stable=True)
        ids = unique_ids[by_frequency]
        incoming = {name: values[by_frequency] for name, values in incoming.items()}
        slots = torch.searchsorted(self._mch_sorted_raw_ids[:-1], ids)
        held = self._mch_sorted_raw_ids[slots] == ids

        metadata = self._mch_metadata()
        if "counts" in metadata:
            metadata["counts"][slots[held]] += incoming["counts"][held]
            metadata["counts"][-1] = _EMPTY_SLOT  # the reserved slot always stays
        if "last_access_iter" in metadata:
            metadata["last_access_iter"][slots[held]] = incoming["last_access_iter"][held]
            metadata["last_access_iter"][-1] = self._current_iter

        newcomers = {name: values[~held] for name, values in incoming.items()}
        merged = {name: torch.cat([metadata[name], newcomers[name]]) for name in metadata}
        ranking = torch.argsort(self._eviction_policy.eviction_scores(self._current_iter, merged),
                                descending=True, stable=True)
        kept, dropped = ranking[: self._zch_size], ranking[self._zch_size:]
        evicted_slots = dropped[dropped < self._zch_size]
        winners = kept[kept >= self._zch_size] - self._zch_size
        for name, buffer in metadata.items():
            buffer[evicted_slots] = newcomers[name][winners]
        self._mch_sorted_raw_ids[evicted_slots] = ids[~held][winners]

        evicted_rows = self._mch_remapped_ids_mapping[evicted_slots]
        if self._evicted:  # the last eviction's rows were not collected by evict() yet
            evicted_rows = torch.unique(torch.cat([self._evicted_emb_indices, evicted_rows]))
        self._evicted_emb_indices = evicted_rows
        self._evicted = True
        self._sort_mch_buffers()

    @torch.no_grad()
    def evict(self) -> Optional[torch.Tensor]:
        """The rows whose id changed since the last call (to re-initialize), or None if no eviction ran."""
        if not self._evicted:
            return None
        self._evicted = False
        return self._evicted_emb_indices

    def open_slots(self) -> torch.Tensor:
        """How many slots no id holds yet (the reserved row not counted), as a 1-element tensor."""
        filled = torch.searchsorted(self._mch_sorted_raw_ids,
                                    torch.tensor([_EMPTY_SLOT], dtype=torch.int64, device=self.device))
        return (self._zch_size - 1) - filled

    def reset_inference_mode(self) -> None:
        """Forgets a pending eviction and restarts the eviction clock (TorchRec's inference reset)."""
        self._evicted = False
        self._last_eviction_iter = -1

    # ------------------------------------------------------------------ sizes, sharding
    def output_size(self) -> int:
        """Rows this module maps into (zch_size)."""
        return self._zch_size

    def input_size(self) -> int:
        """The id range [0, input_size) (input_hash_size): row-wise sharding buckets ids by it."""
        return self._input_hash_size

    def buckets(self) -> int:
        """Number of row-wise buckets the table was built for."""
        return self._buckets

    def rebuild_with_output_id_range(self, output_id_range: Tuple[int, int], output_segments: List[int],
                                     device: Optional[torch.device] = None) -> "MCHManagedCollisionModule":
        """A fresh module for rows [start, end) of the table: one row-wise shard's local module."""
        start, end = output_id_range
        return type(self)(zch_size=end - start, device=device or self.device, eviction_policy=self._eviction_policy,
                          eviction_interval=self._eviction_interval, input_hash_size=self._input_hash_size,
                          input_hash_func=self._input_hash_func, name=self._name, output_global_offset=start,
                          output_segments=output_segments, buckets=len(output_segments) - 1)


# ------------------------------------------------------------------------------------------------ collection
class ManagedCollisionCollection(nn.Module):
    """One managed-collision module per table: remaps a KeyedJaggedTensor's ids into each table's rows.

    Every table config needs a module in `managed_collision_modules` whose `output_size()` equals the table's
    `num_embeddings`. The output KJT lists the features in the configs' order (TorchRec's).

        >>> import torch
        >>> from rectoolkit.modules.configs import EmbeddingBagConfig
        >>> tables = [EmbeddingBagConfig(name="t", num_embeddings=3, embedding_dim=2, feature_names=["f"])]
        >>> mcc = ManagedCollisionCollection({"t": MCHManagedCollisionModule(
        ...     3, "cpu", LRU_EvictionPolicy(), eviction_interval=1)}, tables)
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([99, 42, 99]), torch.tensor([1, 2]))
        >>> mcc(kjt).values().tolist()
        [0, 1, 0]
    """

    def __init__(self, managed_collision_modules: Dict[str, ManagedCollisionModule],
                 embedding_configs: Sequence[BaseEmbeddingConfig], need_preprocess: bool = True) -> None:
        super().__init__()
        if not need_preprocess:
            raise NotImplementedError("ManagedCollisionCollection: need_preprocess=False (skip input_hash_func "
                                      "before a sharded input_dist) is not supported; leave it True")
        self._embedding_configs = embedding_configs
        self.need_preprocess = need_preprocess
        names = [config.name for config in embedding_configs]
        extra = sorted(set(managed_collision_modules) - set(names))
        if extra:
            raise ValueError(f"ManagedCollisionCollection: managed_collision_modules has {extra} but no table config "
                             f"has that name (tables: {names})")
        for config in embedding_configs:
            if config.name not in managed_collision_modules:
                raise ValueError(f"ManagedCollisionCollection: table {config.name!r} has no managed collision module;"
                                 f" add one to managed_collision_modules (it has {sorted(managed_collision_modules)})")
            zch_size = managed_collision_modules[config.name].output_size()
            if zch_size != config.num_embeddings:
                too = "too small for" if config.num_embeddings < zch_size else "larger than"
                raise ValueError(f"ManagedCollisionCollection: table {config.name!r} has num_embeddings="
                                 f"{config.num_embeddings}, {too} its managed-collision module's zch_size={zch_size}"
                                 f" (the rows ids are remapped into); make num_embeddings == zch_size")
        # the modules run in the configs' order; the dict may list them otherwise
        self._managed_collision_modules = nn.ModuleDict({name: managed_collision_modules[name] for name in names})
        self._table_to_features = {config.name: list(config.feature_names) for config in embedding_configs}

    def embedding_configs(self) -> Sequence[BaseEmbeddingConfig]:
        """The table configs, as given."""
        return self._embedding_configs

    def table_to_number_buckets(self) -> Dict[str, int]:
        """Each table's number of row-wise buckets."""
        return {table: module.buckets() for table, module in self._managed_collision_modules.items()}

    def forward(self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True) -> KeyedJaggedTensor:
        """The features' ids remapped, table by table; keys in the configs' order."""
        features, per_table = features_by_table(features, self._table_to_features)
        remapped = [module({table: JaggedTensor(values=kjt.values(), lengths=kjt.lengths(), validate=False)},
                           mutate_miss_lengths=mutate_miss_lengths)[table]
                    for (table, module), kjt in zip(self._managed_collision_modules.items(), per_table)]
        return with_remapped_ids(features, [jt.values() for jt in remapped], [jt.lengths() for jt in remapped])

    def evict(self) -> Dict[str, Optional[torch.Tensor]]:
        """Each table's rows evicted since the last call (None where none)."""
        return {table: module.evict() for table, module in self._managed_collision_modules.items()}

    def open_slots(self) -> Dict[str, torch.Tensor]:
        """Each table's count of slots no id holds yet."""
        return {table: module.open_slots() for table, module in self._managed_collision_modules.items()}


def features_by_table(features: KeyedJaggedTensor, table_to_features: Dict[str, List[str]]
                      ) -> Tuple[KeyedJaggedTensor, List[KeyedJaggedTensor]]:
    """The features in the tables' order (raising for missing ones), and split into one KJT per table."""
    feature_names = [f for names in table_to_features.values() for f in names]
    missing = [f for f in feature_names if f not in features.keys()]
    if missing:
        tables = sorted(t for t, names in table_to_features.items() if set(names) & set(missing))
        raise ValueError(f"ManagedCollisionCollection: features {missing} of tables {tables} are not in the input "
                         f"(keys {features.keys()})")
    if features.keys() != feature_names:
        features = features.permute([features.keys().index(f) for f in feature_names])
    return features, features.split([len(names) for names in table_to_features.values()])


def with_remapped_ids(features: KeyedJaggedTensor, values: List[torch.Tensor],
                      lengths: List[torch.Tensor]) -> KeyedJaggedTensor:
    """`features` (in the tables' order) with each table's remapped ids and lengths in place of its own."""
    return KeyedJaggedTensor(keys=features.keys(), values=torch.cat(values), lengths=torch.cat(lengths),
                             weights=features.weights_or_none(), stride=features.stride(),
                             stride_per_key_per_rank=(features.stride_per_key_per_rank()
                                                      if features.variable_stride_per_key() else None),
                             inverse_indices=features.inverse_indices_or_none())
