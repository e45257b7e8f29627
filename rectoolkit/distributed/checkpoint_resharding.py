"""Loading under another plan or world size: the checks of a checkpoint against the model, and the copies that
fill the model's shards from the saved ones.

The saved shards of each table must tile it; each local shard is filled from the saved shards that overlap it,
slice by slice (weights bit-identical whatever the two plans), and its fused optimizer state the same way (a
row-wise state from the saved shard holding the local shard's first column). The dense file must hold the model's
dense keys, shapes and dtypes, and a dense optimizer state that loads into the given optimizer. Every check raises
a CheckpointError naming the file, before anything is copied.

    >>> overlaps([0, 0], [4, 8], [2, 0], [4, 8]), overlaps([0, 0], [4, 8], [4, 0], [4, 8])
    (True, False)
"""

from __future__ import annotations

import collections
import copy
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from rectoolkit.distributed import checkpoint_format
from rectoolkit.distributed.checkpoint_format import CheckpointError
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.plan.validation import check_tiling

Copy = Tuple[torch.Tensor, Tuple[slice, ...], torch.Tensor, Tuple[slice, ...]]


def check_saved_tiling(label: str, saved: List[Tuple[str, List[int], List[int]]], shape: List[int],
                        path: Path) -> None:
    """The saved shards of a table (file, offsets, sizes) must tile it: then every local cell is copied exactly once."""
    try:
        check_tiling(label, ParameterSharding("row_wise", shards=[
            ShardMetadata(offsets, sizes, f"rank:{name[4:name.find('-of-')]}/cpu") for name, offsets, sizes in saved]),
            *shape, source=f"checkpoint {path}")
    except ValueError as error:  # PlanValidationError, or a negative offset
        raise CheckpointError(f"{error} (saved shards in files {sorted({name for name, _, _ in saved})})") from error


def overlaps(offsets: List[int], sizes: List[int], other_offsets: List[int], other_sizes: List[int]) -> bool:
    return all(max(a, b) < min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, other_offsets, other_sizes))


def table_copies(label: str, saved: List[Dict[str, Any]], shard: ShardMetadata, weight: torch.Tensor,
                  state: Dict[str, torch.Tensor]) -> List[Copy]:
    """The copies that fill one local shard (weight and optimizer state) from the saved shards, all checked."""
    r0, c0 = shard.shard_offsets
    r1, c1 = r0 + weight.shape[0], c0 + weight.shape[1]
    copies: List[Copy] = []
    for entry in saved:
        if entry["weight"].dtype != weight.dtype:
            raise CheckpointError(f"{entry['file']}: table {label!r} was saved as {entry['weight'].dtype}; the model "
                                  f"holds it as {weight.dtype}")
        s_r0, s_c0 = entry["offsets"]
        s_r1, s_c1 = s_r0 + entry["sizes"][0], s_c0 + entry["sizes"][1]
        lo_r, hi_r, lo_c, hi_c = max(r0, s_r0), min(r1, s_r1), max(c0, s_c0), min(c1, s_c1)
        if lo_r >= hi_r or lo_c >= hi_c:
            continue
        mine = (slice(lo_r - r0, hi_r - r0), slice(lo_c - c0, hi_c - c0))
        theirs = (slice(lo_r - s_r0, hi_r - s_r0), slice(lo_c - s_c0, hi_c - s_c0))
        copies.append((weight, mine, entry["weight"], theirs))
        for name, my_state in state.items():
            their_state = entry["optimizer"].get(name)
            wanted = list(entry["sizes"]) if my_state.dim() == 2 else [entry["sizes"][0]]
            if not isinstance(their_state, torch.Tensor) or list(their_state.shape) != wanted:
                raise CheckpointError(
                    f"{entry['file']}: table {label!r} has no optimizer state {name!r} of shape {wanted} (it has "
                    f"{ {k: list(v.shape) for k, v in entry['optimizer'].items()} }); the model's fused optimizer "
                    "needs it: load into a model with the optimizer that was saved (a DATA_PARALLEL replica or a "
                    "'dense' shard saves none, its optimizer being the dense one, as in TorchRec: plan such a table as "
                    "it was saved), or load the weights alone (model.load_state_dict)")
            if my_state.dim() == 2:
                copies.append((my_state, mine, their_state, theirs))
            elif s_c0 <= c0 < s_c1:  # one value per row: from the saved shard holding my first column
                copies.append((my_state, mine[:1], their_state, theirs[:1]))
    return copies


def check_tables(model, metadata: Dict[str, Any], file: Path) -> None:
    """The checkpoint holds exactly the model's collections and tables, with the same shapes."""
    saved_paths, model_paths = set(metadata["tables"]), set(model.sharded_modules)
    if saved_paths != model_paths:
        raise CheckpointError(f"{file}: the checkpoint holds collections {sorted(saved_paths)}, the model "
                              f"{sorted(model_paths)}")
    for coll_path, collection in model.sharded_modules.items():
        saved = metadata["tables"][coll_path]
        mine = {c.name: [c.num_embeddings, c.embedding_dim] for c in collection.embedding_configs()}
        for table in sorted(set(saved) | set(mine)):
            if saved.get(table) != mine.get(table):
                raise CheckpointError(
                    f"{file}: table {table!r} of collection {coll_path!r} was saved as {saved.get(table)} (rows, dim); "
                    f"the model has {mine.get(table)}" + (" (None: no such table)" if None in (saved.get(table),
                                                                                               mine.get(table)) else ""))


def check_dense(model, dense: Any, file: Path, dense_optimizer: Optional[torch.optim.Optimizer]) -> None:
    """dense.pt holds the model's dense keys with their shapes and dtypes, and an optimizer state that fits."""
    if not isinstance(dense, dict) or not {"model", "optimizer", "extra"} <= set(dense):
        raise CheckpointError(f"{file}: not a rectoolkit dense file (expected model, optimizer and extra)")
    mine, saved = checkpoint_format.dense_state(model), dense["model"]
    if set(mine) != set(saved):
        raise CheckpointError(f"{file}: dense keys differ: missing {sorted(set(mine) - set(saved))}, unexpected "
                              f"{sorted(set(saved) - set(mine))}")
    for key, value in mine.items():
        if saved[key].shape != value.shape or saved[key].dtype != value.dtype:
            raise CheckpointError(f"{file}: dense {key!r} was saved as {list(saved[key].shape)} {saved[key].dtype}; "
                                  f"the model has {list(value.shape)} {value.dtype}")
    if dense_optimizer is None:
        return
    state = dense["optimizer"]
    if state is None:
        raise CheckpointError(f"{file} holds no dense optimizer state (it was saved without dense_optimizer); "
                              "load without dense_optimizer")
    groups = dense_optimizer.param_groups
    if [len(g["params"]) for g in state["param_groups"]] != [len(g["params"]) for g in groups]:
        raise CheckpointError(f"{file}: the dense optimizer was saved with parameter groups of sizes "
                              f"{[len(g['params']) for g in state['param_groups']]}; this one has "
                              f"{[len(g['params']) for g in groups]}")
    params = {index: p for saved_group, group in zip(state["param_groups"], groups)
              for index, p in zip(saved_group["params"], group["params"])}
    for index, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[index].shape:
                raise CheckpointError(f"{file}: dense optimizer state {name!r} of parameter {index} has shape "
                                      f"{list(value.shape)}; the parameter has {list(params[index].shape)}")
    saved_class = dense.get("optimizer_class")  # (absent from checkpoints written before it was recorded)
    if saved_class is not None and saved_class != type(dense_optimizer).__name__:
        raise CheckpointError(f"{file}: the dense optimizer state was saved from a {saved_class}; this dense_optimizer "
                              f"is a {type(dense_optimizer).__name__}: load into a {saved_class}, or load without "
                              "dense_optimizer (the weights alone)")
    trial_load(dense_optimizer, state, file)


def trial_load(optimizer: torch.optim.Optimizer, state: Dict[str, Any], file: Path) -> None:
    """Load `state` into a shallow copy of `optimizer` (its own state and groups), so that what torch's
    load_state_dict would refuse (state of another optimizer class, missing keys) is refused before the model
    changes; `optimizer` itself is untouched."""
    saved_keys = {key for group in state["param_groups"] for key in group} - {"params"}
    own_keys = {key for group in optimizer.param_groups for key in group} - {"params"}
    if own_keys - saved_keys:
        raise CheckpointError(f"{file}: the dense optimizer's groups were saved without {sorted(own_keys - saved_keys)}, "
                              f"which this {type(optimizer).__name__} has: it was saved from another optimizer class")
    trial = copy.copy(optimizer)
    trial.state = collections.defaultdict(dict)
    trial.param_groups = [dict(group) for group in optimizer.param_groups]
    try:
        trial.load_state_dict(state)
    except Exception as error:
        raise CheckpointError(f"{file}: the dense optimizer state does not load into this "
                              f"{type(optimizer).__name__} ({type(error).__name__}: {error}); it was saved from "
                              "another optimizer, or another version of it") from error
