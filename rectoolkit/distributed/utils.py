"""TorchRec's small distributed helpers (torchrec.distributed.utils), at TorchRec's path.

State-dict prefixes (`append_prefix`, `filter_state_dict`, `add_prefix_to_state_dict`), Optional checks
(`none_throws`, `assert_instance`), which children of a sharded model hold no sharded module
(`get_unsharded_module_names`), fused-params merging (`merge_fused_params`, `add_params_from_parameter_sharding`,
`convert_to_fbgemm_types`), optimizer class -> fbgemm's EmbOptimType, parameter initialisation, and copying a
model whose process groups must not be deep-copied (`sharded_model_copy`, `copy_to_device`).

    >>> append_prefix("model.ebc", "t1.weight")
    'model.ebc.t1.weight'
    >>> dict(filter_state_dict({"a.w": 1, "ab.w": 2, "a.b.w": 3}, "a"))
    {'w': 1, 'b.w': 3}
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Set, Tuple, Type, TypeVar, Union

import torch
from torch import nn

from rectoolkit.distributed.interfaces import ShardedModule
from rectoolkit.modules.configs import DataType, data_type_to_sparse_type
from rectoolkit.plan.types import EmbeddingComputeKernel, ParameterSharding, ShardingType, ShardMetadata

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = ["add_params_from_parameter_sharding", "add_prefix_to_state_dict", "append_prefix", "assert_instance",
           "convert_to_fbgemm_types", "copy_to_device", "CopyableMixin",
           "create_global_tensor_shape_stride_from_metadata", "emb_opt_type_to_optimizer_class", "filter_state_dict",
           "get_bucket_metadata_from_shard_metadata", "get_class_name", "get_device_type",
           "get_unsharded_module_names", "init_parameters", "merge_fused_params", "none_throws",
           "optimizer_type_to_emb_opt_type", "sharded_model_copy", "ShardingBucketMetadata"]


def get_device_type() -> str:
    """The accelerator kind torch sees first: "cuda", then "mtia", else "cpu" (TorchRec's order)."""
    if torch.cuda.is_available():
        return "cuda"
    mtia = getattr(torch, "mtia", None)
    if mtia is not None and mtia.is_available():
        return "mtia"
    return "cpu"


def get_class_name(obj: object) -> str:
    """The class name of obj, "None" for None: `get_class_name(3) == "int"`."""
    return "None" if obj is None else type(obj).__name__


def assert_instance(obj: object, t: Type[_T]) -> _T:
    """obj, after an AssertionError ("Got <class>") unless it is a t (as TorchRec's)."""
    assert isinstance(obj, t), f"Got {get_class_name(obj)}"
    return obj


def none_throws(optional: Optional[_T], message: str = "Unexpected `None`") -> _T:
    """The value of an Optional; AssertionError(message) when it is None.

    >>> none_throws(0)
    0
    """
    if optional is None:
        raise AssertionError(message)
    return optional


def append_prefix(prefix: str, name: str) -> str:
    """prefix + "." + name, without the dot when either is empty."""
    return f"{prefix}.{name}" if prefix and name else prefix + name


def filter_state_dict(state_dict: Dict[str, Any], name: str) -> "OrderedDict[str, Any]":
    """The entries under module `name` (keys starting with "name."), with that prefix removed, in order."""
    head = name + "."
    return OrderedDict((key[len(head):], value) for key, value in state_dict.items() if key.startswith(head))


def add_prefix_to_state_dict(state_dict: Dict[str, Any], prefix: str) -> None:
    """Prefix every key of state_dict in place (keys re-inserted in sorted order, as TorchRec's), and the non-empty
    keys of its `_metadata` too. The prefix is prepended as given: pass "name." to get "name.key"."""
    for key in sorted(state_dict):
        state_dict[prefix + key] = state_dict.pop(key)
    metadata = state_dict.get("_metadata")
    if metadata is not None:
        for key in [key for key in metadata if key]:
            metadata[prefix + key] = metadata.pop(key)


def _holds_sharded(module: nn.Module, path: str, unsharded: Set[str]) -> bool:
    """Whether module holds a ShardedModule below it; adds the sibling paths of those that do to `unsharded`."""
    holding = {name for name, child in module.named_children()
               if isinstance(child, ShardedModule) or _holds_sharded(child, f"{path}{name}.", unsharded)}
    if holding:
        unsharded.update(path + name for name, _ in module.named_children() if name not in holding)
    return bool(holding)


def get_unsharded_module_names(model: nn.Module) -> List[str]:
    """Paths of the modules with no sharded module inside that sit beside ones that have one (what DMP wraps in
    DDP). An unordered list, as TorchRec's (built from a set)."""
    unsharded: Set[str] = set()
    _holds_sharded(model, "", unsharded)
    return list(unsharded)


class sharded_model_copy:
    """Context manager under which `copy.deepcopy` of a sharded model works: tensors and parameters copy to
    `device` (detached; or are shared when device is None), and process groups, work handles and CUDA streams
    are shared rather than copied. TorchRec's; the patches are undone on exit.

        with sharded_model_copy(torch.device("cpu")):
            cpu_model = copy.deepcopy(dmp)

    As TorchRec's, a tensor that `.to(device)` would leave where it is (a device given as a string or an index) is
    shared, not copied. Unlike TorchRec's, tensors that share storage in the model share it in the copy: each
    storage is copied once and every tensor on it becomes the same view of the copy (rectoolkit's collections hold
    their tables as views of one flat buffer, which TorchRec's per-tensor copy would split from the kernel's, so the
    copy's parameters and state_dict would no longer be what it looks up and trains).
    """

    def __init__(self, device: Optional[Union[str, int, torch.device]]) -> None:
        self.device = device

    def _shared_types(self) -> List[type]:
        import torch.distributed as dist

        c10d = getattr(torch._C, "_distributed_c10d", None) if dist.is_available() else None
        names = ("ProcessGroupNCCL", "ProcessGroupGloo", "Work")
        return [getattr(c10d, name) for name in names if hasattr(c10d, name)] + [torch.cuda.streams.Stream]

    def __enter__(self) -> None:
        device = self.device

        def tensor_copy(tensor: torch.Tensor, memo: Any) -> torch.Tensor:
            detached = tensor.detach()
            if detached.device == device:  # only a torch.device compares equal: a copy in place, as TorchRec's clone
                return _copy_keeping_views(detached, torch.Tensor.clone, memo)
            if not _moves(detached.device, device):
                return detached  # TorchRec's `.to(device)` returns the tensor itself there: shared
            return _copy_keeping_views(detached, lambda whole: whole.to(device), memo)

        def share(obj: Any, memo: Any) -> Any:
            return obj

        copy_tensor = share if device is None else tensor_copy

        def param_copy(param: nn.Parameter, memo: Any) -> nn.Parameter:
            return nn.Parameter(copy_tensor(param, memo), requires_grad=param.requires_grad)

        from torch.distributed._shard.sharded_tensor import ShardedTensor

        def sharded_copy(sharded: ShardedTensor, memo: Any) -> ShardedTensor:
            return _copy_sharded_tensor(sharded, lambda tensor: copy.deepcopy(tensor, memo))

        self._saved = (torch.Tensor.__deepcopy__, nn.Parameter.__deepcopy__, ShardedTensor.__dict__.get("__deepcopy__"))
        torch.Tensor.__deepcopy__ = copy_tensor
        nn.Parameter.__deepcopy__ = param_copy
        ShardedTensor.__deepcopy__ = sharded_copy  # (a sharded fused optimizer's tables and states)
        for shared in self._shared_types():
            shared.__deepcopy__ = share

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        torch.Tensor.__deepcopy__, nn.Parameter.__deepcopy__, sharded_deepcopy = self._saved
        if sharded_deepcopy is None:
            del ShardedTensor.__deepcopy__
        else:
            ShardedTensor.__deepcopy__ = sharded_deepcopy
        for shared in self._shared_types():
            shared.__deepcopy__ = None


def _copy_sharded_tensor(sharded: Any, copy_tensor: Any) -> Any:
    """A ShardedTensor over copies of its local shards (`copy_tensor` of each: the same views of the copied storage
    as the rest of the model's copy), on the same process group; a shard copied to another device is placed there."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

    metadata = copy.deepcopy(sharded.metadata())
    local = []
    for shard in sharded.local_shards():
        tensor = copy_tensor(shard.tensor)
        placed = shard.metadata
        if tensor.device != shard.tensor.device:
            rank = placed.placement.rank()
            placed = ShardMetadata(list(placed.shard_offsets), list(placed.shard_sizes), f"rank:{rank}/{tensor.device}")
            metadata.shards_metadata = [
                placed if entry.shard_offsets == placed.shard_offsets and entry.placement.rank() == rank else entry
                for entry in metadata.shards_metadata]
        local.append(Shard(tensor, placed))
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, metadata,
                                                                     process_group=sharded._process_group)


def _moves(tensor_device: torch.device, device: Any) -> bool:
    """Whether `.to(device)` moves a tensor on `tensor_device` (False: it returns the tensor itself)."""
    probe = torch.empty(0, device=tensor_device)
    return probe.to(device) is not probe


def _copy_keeping_views(tensor: torch.Tensor, copy_bytes: Any, memo: Dict[Any, Any]) -> torch.Tensor:
    """`tensor` copied by `copy_bytes` (a function of a uint8 tensor over its whole storage) as the same view of a
    copy of its storage, made once per storage in this deepcopy (`memo`), so that tensors sharing storage share it
    in the copy too, as torch's own deepcopy keeps them. Tensors without plain strided storage (or with a
    conjugate or negative bit, which lives on the tensor) are copied on their own."""
    plain = tensor.layout == torch.strided and not (tensor.is_quantized or tensor.is_conj() or tensor.is_neg())
    storage = tensor.untyped_storage() if plain else None
    if storage is None or storage.nbytes() == 0:
        return copy_bytes(tensor)
    key = ("sharded_model_copy storage", storage.data_ptr(), str(tensor.device))
    whole = memo.get(key)
    if whole is None:
        whole = memo[key] = copy_bytes(torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage))
    return torch.empty(0, dtype=tensor.dtype, device=whole.device).set_(
        whole.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


def copy_to_device(module: nn.Module, current_device: torch.device, to_device: torch.device) -> nn.Module:
    """A copy of module whose parameters and buffers on `current_device` move to `to_device` (the others stay
    where they are). Process groups are shared with the original. A submodule with a `copy(device)` method
    (TorchRec's CopyMixIn) copies itself."""
    with sharded_model_copy(device=None):
        module_copy = copy.deepcopy(module)
    return _move_matching(module_copy, current_device, to_device)


def _move_matching(module: nn.Module, current_device: torch.device, to_device: torch.device) -> nn.Module:
    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(to_device) if tensor.device == current_device else tensor

    if _is_copy_mixin(module):
        return module.copy(to_device)
    for name, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(name, nn.Parameter(move(param.data), requires_grad=param.requires_grad))
    for name, buffer in list(module.named_buffers(recurse=False)):
        module.register_buffer(name, move(buffer))
    for name, child in list(module.named_children()):
        if any(_is_copy_mixin(sub) for sub in child.modules()):
            child = _move_matching(child, current_device, to_device)
        else:
            child = child._apply(move)
        module.register_module(name, child)
    return module


class CopyableMixin(nn.Module):
    """A module whose `copy(device)` is copy_to_device from the CPU to `device` (TorchRec's)."""

    def copy(self, device: torch.device) -> nn.Module:
        return copy_to_device(self, current_device=torch.device("cpu"), to_device=device)


def create_global_tensor_shape_stride_from_metadata(
        parameter_sharding: ParameterSharding, devices_per_node: Optional[int] = None) -> Tuple[Any, Any]:
    """The whole table's (torch.Size, stride) from a ParameterSharding's shards: column blocks side by side
    (COLUMN_WISE), row blocks stacked (ROW_WISE, TABLE_ROW_WISE), the one shard (TABLE_WISE), or for GRID_SHARD
    (`devices_per_node` rows blocks of the first shard's size) the first shard tiled. As TorchRec's, for another
    sharding type it returns (None, (torch.Size([0, 0]), (0, 1)))."""
    shards = parameter_sharding.shards
    sharding_type = parameter_sharding.sharding_type
    size = None
    if sharding_type == ShardingType.COLUMN_WISE.value:
        size = torch.Size([shards[0].shard_sizes[0], sum(shard.shard_sizes[1] for shard in shards)])
    elif sharding_type in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
        size = torch.Size([sum(shard.shard_sizes[0] for shard in shards), shards[0].shard_sizes[1]])
    elif sharding_type == ShardingType.TABLE_WISE.value:
        size = torch.Size(shards[0].shard_sizes)
    elif sharding_type == ShardingType.GRID_SHARD.value:
        if devices_per_node is None:
            raise ValueError("create_global_tensor_shape_stride_from_metadata: a GRID_SHARD table needs "
                             "devices_per_node (the ranks of one host) to know how its shards tile; pass it")
        column_blocks = len(shards) // devices_per_node
        size = torch.Size([devices_per_node * shards[0].shard_sizes[0], column_blocks * shards[0].shard_sizes[1]])
    if size:
        return size, (size[1], 1)
    return size, (torch.Size([0, 0]), (0, 1))


@dataclass
class ShardingBucketMetadata:
    """How a row-wise table's equal buckets fall on its shards: buckets per shard, the first bucket of each shard,
    and the rows of one bucket (TorchRec's, of torchrec.distributed.types)."""

    num_buckets_per_shard: List[int]
    bucket_offsets_per_shard: List[int]
    bucket_size: int


def get_bucket_metadata_from_shard_metadata(shards: List[ShardMetadata], num_buckets: int) -> ShardingBucketMetadata:
    """The buckets of a row-wise sharded table cut into `num_buckets` equal buckets (TorchRec's). ValueError, naming
    the sizes, when there are no shards, the rows do not divide into num_buckets, a shard is not whole buckets or
    is a column block."""
    if not shards:
        raise ValueError("get_bucket_metadata_from_shard_metadata: no shards given; pass the table's row-wise shards")
    table_rows = shards[-1].shard_offsets[0] + shards[-1].shard_sizes[0]
    if table_rows % num_buckets:
        raise ValueError(f"get_bucket_metadata_from_shard_metadata: the table's {table_rows} rows do not divide into "
                         f"num_buckets={num_buckets} equal buckets; pick a divisor of {table_rows}")
    bucket_size = table_rows // num_buckets
    metadata = ShardingBucketMetadata(num_buckets_per_shard=[], bucket_offsets_per_shard=[], bucket_size=bucket_size)
    for index, shard in enumerate(shards):
        if len(shard.shard_offsets) > 1 and shard.shard_offsets[1] != 0:
            raise ValueError(f"get_bucket_metadata_from_shard_metadata: shard {index} starts at column "
                             f"{shard.shard_offsets[1]}; bucketized tables are sharded by rows only")
        if shard.shard_sizes[0] % bucket_size:
            raise ValueError(f"get_bucket_metadata_from_shard_metadata: shard {index} has {shard.shard_sizes[0]} rows, "
                             f"not whole buckets of {bucket_size} rows; make each shard's rows a multiple of it")
        metadata.bucket_offsets_per_shard.append(sum(metadata.num_buckets_per_shard))
        metadata.num_buckets_per_shard.append(shard.shard_sizes[0] // bucket_size)
    return metadata


def _is_copy_mixin(module: nn.Module) -> bool:
    """Whether module copies itself: a subclass of a class named CopyMixIn (TorchRec's torchrec.types.CopyMixIn,
    matched by name so that TorchRec need not be imported)."""
    return any(base.__name__ == "CopyMixIn" for base in type(module).__mro__)


def _optimizer_table() -> Dict[type, str]:
    """optimizer class -> the name of fbgemm's EmbOptimType member (TorchRec's mapping, with rectoolkit.optim's
    classes where TorchRec lists torchrec.optim's)."""
    import rectoolkit.optim as optim

    return {torch.optim.SGD: "EXACT_SGD", torch.optim.Adagrad: "EXACT_ADAGRAD", torch.optim.Adam: "ADAM",
            optim.SGD: "EXACT_SGD", optim.LarsSGD: "LARS_SGD", optim.LAMB: "LAMB",
            optim.PartialRowWiseLAMB: "PARTIAL_ROWWISE_LAMB", optim.Adam: "ADAM",
            optim.PartialRowWiseAdam: "PARTIAL_ROWWISE_ADAM", optim.Adagrad: "EXACT_ADAGRAD",
            optim.RowWiseAdagrad: "EXACT_ROWWISE_ADAGRAD"}


def _emb_optim_type() -> Any:
    from rectoolkit.fbgemm_probe import fbgemm_imports

    if fbgemm_imports():
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        return EmbOptimType
    raise ImportError("rectoolkit.distributed.utils: the optimizer <-> EmbOptimType helpers return fbgemm-gpu's "
                      "EmbOptimType, as TorchRec's; fbgemm_gpu does not import here: install fbgemm-gpu or "
                      "fbgemm-gpu-cpu")


def optimizer_type_to_emb_opt_type(optimizer_class: Type[torch.optim.Optimizer]) -> Any:
    """fbgemm's EmbOptimType for an optimizer class (torch's SGD / Adagrad / Adam, or rectoolkit.optim's), as
    TorchRec's; ValueError for any other class. Needs fbgemm-gpu."""
    EmbOptimType = _emb_optim_type()
    table = _optimizer_table()
    if optimizer_class not in table:
        known = sorted(f"{cls.__module__}.{cls.__name__}" for cls in table)
        raise ValueError(f"Cannot cast {optimizer_class} to an EmbOptimType: use one of {known}")
    return EmbOptimType[table[optimizer_class]]


def emb_opt_type_to_optimizer_class(emb_opt_type: Optional[Any]) -> Optional[Type[torch.optim.Optimizer]]:
    """The rectoolkit.optim class for an EmbOptimType (None for None or a type with no class), the inverse of
    optimizer_type_to_emb_opt_type where TorchRec prefers its own optimizer wrappers."""
    if emb_opt_type is None:
        return None
    import rectoolkit.optim as optim

    by_name = {"EXACT_SGD": optim.SGD, "EXACT_ADAGRAD": optim.Adagrad, "ADAM": optim.Adam,
               "LARS_SGD": optim.LarsSGD, "LAMB": optim.LAMB, "PARTIAL_ROWWISE_LAMB": optim.PartialRowWiseLAMB,
               "PARTIAL_ROWWISE_ADAM": optim.PartialRowWiseAdam, "EXACT_ROWWISE_ADAGRAD": optim.RowWiseAdagrad}
    return by_name.get(getattr(emb_opt_type, "name", None))


def merge_fused_params(fused_params: Optional[Dict[str, Any]] = None,
                       param_fused_params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A deep copy of fused_params updated by param_fused_params (the per-table ones win). As TorchRec's, an "lr"
    key of param_fused_params is renamed "learning_rate" in that dict itself."""
    fused_params = {} if fused_params is None else fused_params
    param_fused_params = {} if param_fused_params is None else param_fused_params
    if "lr" in param_fused_params:
        param_fused_params["learning_rate"] = param_fused_params.pop("lr")
    merged = copy.deepcopy(fused_params)
    merged.update(param_fused_params)
    return merged


_CACHE_KEYS = {"algorithm": "cache_algorithm", "load_factor": "cache_load_factor",
               "reserved_memory": "cache_reserved_memory", "precision": "cache_precision",
               "prefetch_pipeline": "prefetch_pipeline", "multipass_prefetch_config": "multipass_prefetch_config"}
_TABLE_KEYS = ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")


def add_params_from_parameter_sharding(fused_params: Optional[Dict[str, Any]],
                                       parameter_sharding: ParameterSharding) -> Dict[str, Any]:
    """fused_params (updated in place, or a new dict for None) with the table's own options from its
    ParameterSharding: the cache_params fields that are set (as `cache_*` keys), enforce_hbm, stochastic_rounding,
    bounds_check_mode and output_dtype. These win over the sharder's. A warning says the cache options are
    ignored for DATA_PARALLEL or the dense kernel, as TorchRec's."""
    fused_params = {} if fused_params is None else fused_params
    cache_params = parameter_sharding.cache_params
    if cache_params is not None:
        for field, key in _CACHE_KEYS.items():
            value = getattr(cache_params, field, None)
            if value is not None:
                fused_params[key] = value
    for key in _TABLE_KEYS:
        value = getattr(parameter_sharding, key)
        if value is not None:
            fused_params[key] = value
    if parameter_sharding.sharding_type == ShardingType.DATA_PARALLEL.value:
        logger.warning(f"Sharding Type is {parameter_sharding.sharding_type}, caching params will be ignored")
    elif parameter_sharding.compute_kernel == EmbeddingComputeKernel.DENSE.value:
        logger.warning(f"Compute Kernel is {parameter_sharding.compute_kernel}, caching params will be ignored")
    return fused_params


def convert_to_fbgemm_types(fused_params: Dict[str, Any]) -> Dict[str, Any]:
    """fused_params (in place) with the DataType values of cache_precision, weights_precision and output_dtype
    turned into fbgemm's SparseType (as TorchRec's). Needs fbgemm-gpu when one of them is a DataType."""
    for key in ("cache_precision", "weights_precision", "output_dtype"):
        if isinstance(fused_params.get(key), DataType):
            fused_params[key] = data_type_to_sparse_type(fused_params[key])
    return fused_params


def init_parameters(module: nn.Module, device: torch.device) -> None:
    """Move module to `device` when any parameter sits elsewhere (materialising meta parameters with to_empty),
    then call every submodule's `reset_parameters`. A module already on `device` is left as it is."""
    with torch.no_grad():
        params = list(module.parameters())
        if not any(param.device != torch.device(device) for param in params):
            return
        if any(param.is_meta for param in params):
            module.to_empty(device=device)
        else:
            module.to(device)
        module.apply(_reset_parameters)


def _reset_parameters(module: nn.Module) -> None:
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()

