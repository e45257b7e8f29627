"""TorchRec's module helpers (torchrec.modules.utils), at TorchRec's path.

Building nested ModuleLists of copies (`construct_modulelist_from_single_module`,
`convert_list_of_modules_to_modulelist`), probing a module's output width (`get_module_output_dimension`,
`check_module_output_dimension`), turning a sequence lookup's rows back into one JaggedTensor per feature
(`construct_jagged_tensors`, `construct_jagged_tensors_inference`), and id helpers (`deterministic_dedup`,
`jagged_index_select_with_empty`). Pure torch: no fbgemm op is needed.

    >>> ids, last = deterministic_dedup(torch.tensor([5, 3, 5, 3, 9]))
    >>> ids.tolist(), last.tolist()
    ([3, 5, 9], [3, 2, 4])
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from rectoolkit.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor
from rectoolkit.streamable import Multistreamable

__all__ = ["SequenceVBEContext", "check_module_output_dimension", "construct_jagged_tensors",
           "construct_jagged_tensors_inference", "construct_modulelist_from_single_module",
           "convert_list_of_modules_to_modulelist", "deterministic_dedup", "extract_module_or_tensor_callable",
           "get_module_output_dimension", "init_mlp_weights_xavier_uniform", "jagged_index_select_with_empty"]


@dataclass
class SequenceVBEContext(Multistreamable):
    """How a sequence lookup over a batch that varies per feature reorders its rows: `recat` (the order of the
    segments), `unpadded_lengths` (rows per segment), and the lengths, length per key and values after it."""

    recat: torch.Tensor
    unpadded_lengths: torch.Tensor
    reindexed_lengths: torch.Tensor
    reindexed_length_per_key: List[int]
    reindexed_values: Optional[torch.Tensor] = None

    def record_stream(self, stream: torch.Stream) -> None:
        for tensor in (self.recat, self.unpadded_lengths, self.reindexed_lengths, self.reindexed_values):
            if tensor is not None:
                tensor.record_stream(stream)


def extract_module_or_tensor_callable(
        module_or_callable: Union[Callable[[], torch.nn.Module], torch.nn.Module,
                                  Callable[[torch.Tensor], torch.Tensor]]
) -> Union[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """A factory's module (a callable of no argument returning an nn.Module is called), or the callable itself
    when it needs an argument (a module, a tensor function). ValueError when a factory returns no nn.Module."""
    try:
        made = module_or_callable()
    except TypeError as error:
        if "required positional argument" in str(error):
            return module_or_callable
        raise
    if not isinstance(made, torch.nn.Module):
        raise ValueError(f"Expected callable that takes no input to return a torch.nn.Module, but got: {type(made)}")
    return made


def get_module_output_dimension(module: Union[Callable[[torch.Tensor], torch.Tensor], torch.nn.Module],
                                in_features: int) -> int:
    """The last dimension of module's output for one zero row of `in_features` inputs."""
    return module(torch.zeros(1, in_features)).size(-1)


def check_module_output_dimension(module: Union[Iterable[torch.nn.Module], torch.nn.Module], in_features: int,
                                  out_features: int) -> bool:
    """Whether module (every module of a list or ModuleList, nested) outputs `out_features` for `in_features`."""
    if isinstance(module, (list, torch.nn.ModuleList)):
        return all(check_module_output_dimension(sub, in_features, out_features) for sub in module)
    return get_module_output_dimension(module, in_features) == out_features


def init_mlp_weights_xavier_uniform(m: torch.nn.Module) -> None:
    """For nn.Linear: Xavier-uniform weight, zero bias (for `module.apply`)."""
    if isinstance(m, torch.nn.Linear):
        torch.nn.init.xavier_uniform_(m.weight)
        m.bias.data.fill_(0.0)


def construct_modulelist_from_single_module(module: torch.nn.Module, sizes: Tuple[int, ...]) -> torch.nn.Module:
    """Nested ModuleLists of shape `sizes` of deep copies of module, each Linear re-initialised (Xavier), in
    depth-first order."""
    if len(sizes) == 1:
        return torch.nn.ModuleList(copy.deepcopy(module).apply(init_mlp_weights_xavier_uniform)
                                   for _ in range(sizes[0]))
    return torch.nn.ModuleList(construct_modulelist_from_single_module(module, sizes[1:]) for _ in range(sizes[0]))


def convert_list_of_modules_to_modulelist(modules: Iterable[torch.nn.Module],
                                          sizes: Tuple[int, ...]) -> torch.nn.Module:
    """Nested lists of modules of shape `sizes` as nested ModuleLists; AssertionError when a level's count
    differs from its size."""
    modules = list(modules)
    assert len(modules) == sizes[0], (
        f"the counts of modules ({len(modules)}) do not match with the required counts {sizes}")
    if len(sizes) == 1:
        return torch.nn.ModuleList(modules)
    return torch.nn.ModuleList(convert_list_of_modules_to_modulelist(m, sizes[1:]) for m in modules)


def _reorder_segments(flat: torch.Tensor, segment_sizes: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    segments = torch.split(flat, segment_sizes.tolist())
    return torch.cat([segments[i] for i in order.tolist()]) if len(order) else flat[:0]


def _per_key(embeddings: torch.Tensor, lengths: torch.Tensor, length_per_key: List[int],
             values: Optional[torch.Tensor], embedding_names: List[str], need_indices: bool,
             features_to_permute_indices: Optional[Dict[str, List[int]]]) -> Dict[str, JaggedTensor]:
    """One JaggedTensor per embedding name: its rows of embeddings (the column blocks of a name given more than
    once concatenated, in `features_to_permute_indices` order), its lengths and, with need_indices, its ids."""
    lengths_per_feature = torch.unbind(lengths, dim=0)
    rows = torch.split(embeddings, length_per_key, dim=0)
    ids = torch.split(values, length_per_key) if need_indices and values is not None else None
    positions: Dict[str, List[int]] = {}
    for position, name in enumerate(embedding_names):
        positions.setdefault(name, []).append(position)
    result: Dict[str, JaggedTensor] = {}
    for name, where in positions.items():
        if features_to_permute_indices and name in features_to_permute_indices:
            where = [where[block] for block in features_to_permute_indices[name]]
        result[name] = JaggedTensor(
            values=rows[where[0]] if len(where) == 1 else torch.cat([rows[i] for i in where], dim=1),
            lengths=lengths_per_feature[where[0]], weights=ids[where[0]] if ids is not None else None)
    return result


def construct_jagged_tensors(embeddings: torch.Tensor, features: KeyedJaggedTensor, embedding_names: List[str],
                             need_indices: bool = False,
                             features_to_permute_indices: Optional[Dict[str, List[int]]] = None,
                             original_features: Optional[KeyedJaggedTensor] = None,
                             reverse_indices: Optional[torch.Tensor] = None,
                             seq_vbe_ctx: Optional[SequenceVBEContext] = None,
                             use_gather_select: bool = False) -> Dict[str, JaggedTensor]:
    """A sequence lookup's rows (one per id of `features`, in its order) as a dict name -> JaggedTensor of that
    feature's rows and lengths (its ids as weights with need_indices), as TorchRec's EmbeddingCollection returns.
    `reverse_indices` first expands deduplicated rows (index_select, or gather: same values); `seq_vbe_ctx`
    reorders the rows of a batch that varies per feature."""
    if original_features is not None:
        features = original_features
    if reverse_indices is not None:
        if use_gather_select:
            embeddings = torch.gather(embeddings, 0, reverse_indices.unsqueeze(1).expand(-1, embeddings.size(-1)))
        else:
            embeddings = torch.index_select(embeddings, 0, reverse_indices)
    if seq_vbe_ctx is not None:
        dim = embeddings.shape[1]
        embeddings = _reorder_segments(embeddings.flatten(), seq_vbe_ctx.unpadded_lengths * dim,
                                       seq_vbe_ctx.recat).view(-1, dim)
        lengths, length_per_key = seq_vbe_ctx.reindexed_lengths, seq_vbe_ctx.reindexed_length_per_key
        values = seq_vbe_ctx.reindexed_values
        if lengths.dim() != 2:
            raise ValueError(f"construct_jagged_tensors: seq_vbe_ctx.reindexed_lengths must be 2-D (features x "
                             f"batch), got shape {tuple(lengths.shape)}")
    else:
        lengths = features.lengths().view(-1, features.stride())
        length_per_key, values = features.length_per_key(), features.values()
    return _per_key(embeddings, lengths, length_per_key, values, embedding_names, need_indices,
                    features_to_permute_indices)


def construct_jagged_tensors_inference(embeddings: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor,
                                       embedding_names: List[str], need_indices: bool = False,
                                       features_to_permute_indices: Optional[Dict[str, List[int]]] = None,
                                       reverse_indices: Optional[torch.Tensor] = None,
                                       remove_padding: bool = False) -> Dict[str, JaggedTensor]:
    """construct_jagged_tensors for inference, from `lengths` (features x batch) and `values` directly;
    `remove_padding` drops rows past the lengths' sum."""
    if reverse_indices is not None:
        embeddings = torch.index_select(embeddings, 0, reverse_indices.to(torch.int32))
    elif remove_padding:
        embeddings = embeddings[: int(lengths.sum().item())]
    length_per_key = torch.sum(lengths, dim=1).long().tolist()
    return _per_key(embeddings, lengths, length_per_key, values, embedding_names, need_indices,
                    features_to_permute_indices)


def jagged_index_select_with_empty(values: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,
                                   output_offsets: torch.Tensor) -> torch.Tensor:
    """The segments `ids` of values, one after another, as a column ([n, 1]; an empty 1-D tensor for no ids).
    `offsets` and `output_offsets` are the segments' end positions (inclusive cumsums of their lengths), of the
    input and of the output."""
    if ids.size(0) == 0:
        return torch.empty(0, device=values.device, dtype=values.dtype)
    offsets, output_offsets, ids = offsets.long(), output_offsets.long(), ids.long()
    input_starts = offsets - torch.diff(offsets, prepend=offsets.new_zeros(1))
    output_lengths = torch.diff(output_offsets, prepend=output_offsets.new_zeros(1))
    segment = torch.repeat_interleave(torch.arange(ids.numel(), device=ids.device), output_lengths)
    within = torch.arange(segment.numel(), device=ids.device) - (output_offsets - output_lengths)[segment]
    return values.flatten()[input_starts[ids[segment]] + within].unsqueeze(-1)


def deterministic_dedup(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The sorted unique ids, and for each the position of its last occurrence in `ids` (so that a conflicting
    update keeps the last one, whatever the thread order)."""
    sorted_ids, order = ids.sort()
    unique_ids, inverse = sorted_ids.unique_consecutive(return_inverse=True)
    last = torch.zeros_like(unique_ids, dtype=torch.int64).scatter_reduce(0, inverse, order, reduce="amax")
    return unique_ids.view(-1), last.flatten()
