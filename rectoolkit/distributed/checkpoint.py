"""Checkpoints of a DistributedModelParallel: saved per rank, loadable under another plan or world size.

    save_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # every rank calls it
    load_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # any plan, any world size

Layout of the directory:

    rank0-of-2.pt, rank1-of-2.pt   each rank's shards: table, offsets, sizes, weight, fused optimizer state
                                   (a DATA_PARALLEL replica is saved once, by rank 0)
    dense.pt                       the dense parameters and buffers, the dense optimizer, `extra` (rank 0)
    metadata.json                  written last: world size, files, tables; a directory without it is an
                                   incomplete checkpoint and is refused

Every file is written to a temporary name and renamed (os.replace), and an existing metadata.json is
removed before anything is overwritten, so a crash never leaves a checkpoint that looks complete but is not.
Loading reads every saved shard that overlaps one of this rank's shards (memory-mapped, so only the
overlaps are read) and copies the overlap: weights are bit-identical after the round trip, whatever the
two plans. Optimizer state moves the same way; a row-wise state (row-wise Adagrad: one value per row and
shard) is taken from the saved shard holding the new shard's first column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from rectoolkit.distributed.comm import barrier
from rectoolkit.plan.types import ShardingType

FORMAT_VERSION = 1
METADATA = "metadata.json"


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(obj, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _rank_file(rank: int, world_size: int) -> str:
    return f"rank{rank}-of-{world_size}.pt"


def _saved_shards(model) -> List[Dict[str, Any]]:
    env = model.env
    shards = []
    for path, collection in model.sharded_modules.items():
        for table, shard, weight, state in collection.local_shards():
            kind = ShardingType.parse(collection.module_plan[table].sharding_type)
            if kind == ShardingType.DATA_PARALLEL and env.rank != 0:
                continue  # replicas are equal: rank 0 saves one
            shards.append({"collection": path, "table": table, "offsets": list(shard.shard_offsets),
                           "sizes": list(weight.shape), "weight": weight.detach().cpu().clone(),
                           "optimizer": {k: v.detach().cpu().clone() for k, v in state.items()}})
    return shards


def _dense_state(model) -> Dict[str, torch.Tensor]:
    if "" in model.sharded_modules:
        return {}
    prefixes = tuple(p + "." for p in model.sharded_modules)
    return {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items() if not k.startswith(prefixes)}


def save_checkpoint(model, path: Union[str, Path], dense_optimizer: Optional[torch.optim.Optimizer] = None,
                    extra: Optional[Dict[str, Any]] = None) -> None:
    """Save `model` (a DistributedModelParallel) into directory `path`; every rank calls it."""
    env = model.env
    path = Path(path)
    _check_dense_optimizer(model, dense_optimizer)
    if env.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / METADATA).unlink(missing_ok=True)  # from here on the directory reads as incomplete
    barrier(env)
    _atomic_torch_save({"format": FORMAT_VERSION, "rank": env.rank, "world_size": env.world_size,
                        "shards": _saved_shards(model)}, path / _rank_file(env.rank, env.world_size))
    if env.rank == 0:
        _atomic_torch_save({"model": _dense_state(model),
                            "optimizer": dense_optimizer.state_dict() if dense_optimizer is not None else None,
                            "extra": extra or {}}, path / "dense.pt")
    barrier(env)
    if env.rank == 0:
        files = [_rank_file(r, env.world_size) for r in range(env.world_size)]
        for stale in path.glob("rank*-of-*.pt"):
            if stale.name not in files:
                stale.unlink()
        tables = {p: {c.name: [c.num_embeddings, c.embedding_dim] for c in coll.embedding_configs()}
                  for p, coll in model.sharded_modules.items()}
        metadata = {"format": FORMAT_VERSION, "world_size": env.world_size,
                    "local_world_size": env.local_world_size, "files": files + ["dense.pt"], "tables": tables}
        _atomic_write_text(json.dumps(metadata, indent=1), path / METADATA)
    barrier(env)


def _check_dense_optimizer(model, dense_optimizer: Optional[torch.optim.Optimizer]) -> None:
    """The dense optimizer is saved once (rank 0's): refuse one that also updates embedding shards (compute_kernel
    "dense"), whose parameters differ from rank to rank and could not be loaded under another plan. Data-parallel
    replicas are fine: they and their optimizer state are the same on every rank, like the dense layers'."""
    if dense_optimizer is None:
        return
    shards = {id(p): table for collection in model.sharded_modules.values()
              for table, _, weight, _ in collection.local_shards() for p in [weight]
              if ShardingType(collection.module_plan[table].sharding_type) != ShardingType.DATA_PARALLEL}
    held = sorted({shards[id(p)] for group in dense_optimizer.param_groups for p in group["params"] if id(p) in shards})
    if held:
        raise ValueError(f"save_checkpoint: the dense optimizer also updates the embedding shards of table(s) {held} "
                         f"on rank {model.env.rank} (compute_kernel 'dense'); their optimizer state differs per rank "
                         "and cannot be resharded. Give save_checkpoint an optimizer over the replicated "
                         "parameters only (their weights are saved either way), or plan those tables 'fused'.")


def read_metadata(path: Union[str, Path]) -> Dict[str, Any]:
    path = Path(path)
    if not (path / METADATA).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint: it has no {METADATA} (a save did not "
                                "finish, or this is not a rectoolkit checkpoint directory)")
    return json.loads((path / METADATA).read_text())


def load_saved_shards(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """Every saved shard of a checkpoint (tensors memory-mapped: reading a slice reads only that slice)."""
    path = Path(path)
    metadata = read_metadata(path)
    shards = []
    for name in metadata["files"]:
        if name == "dense.pt":
            continue
        shards += torch.load(path / name, map_location="cpu", mmap=True, weights_only=True)["shards"]
    return shards


@torch.no_grad()
def load_checkpoint(model, path: Union[str, Path], dense_optimizer: Optional[torch.optim.Optimizer] = None
                    ) -> Dict[str, Any]:
    """Load a checkpoint into `model`, whatever plan and world size saved it; returns the saved `extra`."""
    path = Path(path)
    metadata = read_metadata(path)
    saved = load_saved_shards(path)
    by_table: Dict[tuple, List[Dict[str, Any]]] = {}
    for entry in saved:
        by_table.setdefault((entry["collection"], entry["table"]), []).append(entry)
    for coll_path, collection in model.sharded_modules.items():
        saved_tables = metadata["tables"].get(coll_path, {})
        for table, shard, weight, state in collection.local_shards():
            config = next(c for c in collection.embedding_configs() if c.name == table)
            if saved_tables.get(table) != [config.num_embeddings, config.embedding_dim]:
                raise ValueError(f"checkpoint {path}: table {table!r} of collection {coll_path!r} was saved as "
                                 f"{saved_tables.get(table)} (rows, dim); the model has "
                                 f"{[config.num_embeddings, config.embedding_dim]}")
            _fill_shard(by_table.get((coll_path, table), []), table, shard.shard_offsets, weight, state, path)
    dense = torch.load(path / "dense.pt", map_location="cpu", weights_only=False)
    if dense["model"]:
        result = model.module.load_state_dict(dense["model"], strict=False)
        if result.unexpected_keys:
            raise ValueError(f"checkpoint {path}: dense keys {result.unexpected_keys} are not in the model")
    if dense_optimizer is not None and dense["optimizer"] is not None:
        dense_optimizer.load_state_dict(dense["optimizer"])
    barrier(model.env)
    return dense["extra"]


def _fill_shard(saved: List[Dict[str, Any]], table: str, offsets: List[int], weight: torch.Tensor,
                state: Dict[str, torch.Tensor], path: Path) -> None:
    """Copy into one local shard every overlapping piece of the saved shards; check every cell was covered."""
    r0, c0 = offsets
    r1, c1 = r0 + weight.shape[0], c0 + weight.shape[1]
    covered = 0
    for entry in saved:
        s_r0, s_c0 = entry["offsets"]
        s_r1, s_c1 = s_r0 + entry["sizes"][0], s_c0 + entry["sizes"][1]
        lo_r, hi_r, lo_c, hi_c = max(r0, s_r0), min(r1, s_r1), max(c0, s_c0), min(c1, s_c1)
        if lo_r >= hi_r or lo_c >= hi_c:
            continue
        weight[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0] = entry["weight"][lo_r - s_r0:hi_r - s_r0, lo_c - s_c0:hi_c - s_c0]
        covered += (hi_r - lo_r) * (hi_c - lo_c)
        for name, mine in state.items():
            theirs = entry["optimizer"].get(name)
            if theirs is None:
                continue
            if mine.dim() == 2:
                mine[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0] = theirs[lo_r - s_r0:hi_r - s_r0, lo_c - s_c0:hi_c - s_c0]
            elif s_c0 <= c0 < s_c1:  # one value per row: from the saved shard holding my first column
                mine[lo_r - r0:hi_r - r0] = theirs[lo_r - s_r0:hi_r - s_r0]
    if covered != weight.numel():
        raise ValueError(f"checkpoint {path}: the saved shards of table {table!r} cover {covered} of the "
                         f"{weight.numel()} cells of rows {r0}..{r1}, columns {c0}..{c1}")
