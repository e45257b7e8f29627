"""Checkpoints of a DistributedModelParallel: saved per rank, loadable under another plan or world size, and
never lost to a crash.

    save_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # every rank calls it
    load_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # any plan, any world size

A DMPCollection (2D) is saved once, by its first sharding group as a DistributedModelParallel of the group's
ranks, after its groups were synced (a save while their shards differ is refused: call dmp.sync() first); every
group loads it (or loads any other checkpoint, as a DistributedModelParallel of its ranks would).

Layout of the directory (and `.lock` while a save runs: a second save into it is refused):

    metadata.json            the commit record: world size, tables, which data directory holds the checkpoint,
                             the size and SHA-256 of each of its files, and its own SHA-256
    data-<16 hex digits>/    the files of one save:
        rank0-of-2.pt ...    each rank's shards: table, offsets, sizes, weight, fused optimizer state
                             (a DATA_PARALLEL replica is saved once, by rank 0, with no fused state: its
                             optimizer is your dense one, as in TorchRec)
        dense.pt             the dense parameters and buffers, the dense optimizer (with the DATA_PARALLEL
                             replicas' state when it updates them), `extra` (rank 0)

Saving over an existing checkpoint never loses it. A directory cannot atomically replace a non-empty one, but
a file can replace a file, so the commit is the replacement of metadata.json:
1. rank 0 draws a new data directory name and tells the others; every rank writes its files there, fsyncs
   them and the directory;
2. the ranks exchange each file's size and SHA-256, or their error: if any rank failed, nothing is committed
   and every rank raises, naming it;
3. rank 0 writes metadata.json under a temporary name, fsyncs it, renames it over metadata.json (os.replace,
   atomic) and fsyncs the checkpoint directory: from this instant the new checkpoint is the checkpoint;
4. rank 0 deletes the previous data directory and whatever a crashed save left behind (data directories
   metadata.json does not name); until then they are ignored. Not while a load is reading the directory (it holds
   a shared flock of it): then they are left for the next save to remove.
A rank killed at any point leaves metadata.json naming either the previous data directory or the new one,
both complete. (tests/distributed/test_checkpoint_faults.py kills ranks at random points of a save to check it.)

Loading checks everything before it touches the model: metadata.json well-formed and of its own SHA-256, and
the same on every rank (a save committed between the ranks' reads makes them read it again); every
file present and of its recorded size; the SHA-256 of every file the rank reads (the dense file and the rank files
holding shards that overlap its own: flipped bytes are caught); the tables, shapes and dtypes the model expects,
saved shards (listed in metadata.json) that tile each table; the dense file's keys, shapes and dtypes; the dense
optimizer's groups. The ranks
agree that all of them passed before any rank copies, so a failed load changes nothing, on any rank. Every
error names the file and what is wrong with it. Loading reads only the overlaps of the saved shards
(memory-mapped) and copies them: weights are bit-identical after the round trip, whatever the two plans.
Optimizer state moves the same way; a row-wise state (row-wise Adagrad: one value per row and shard) is taken
from the saved shard holding the new shard's first column.

This module runs the save and the load, in the order above, and the ranks' agreement; the parts live in one module
each: the files and reading them checked (checkpoint_format), the atomic commit and the directory locks
(checkpoint_commit), the checks against the model and the copies of a load under another plan
(checkpoint_resharding).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from rectoolkit.distributed import checkpoint_commit, checkpoint_format, checkpoint_resharding
from rectoolkit.distributed.agree import all_gather_bytes
from rectoolkit.distributed.checkpoint_format import (  # noqa: F401 (DATA_DIRECTORY, load_saved_shards: old path)
    DATA_DIRECTORY, DENSE, FORMAT, FORMAT_VERSION, METADATA, CheckpointError, load_saved_shards, read_metadata,
)
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.mc_embeddingbag import sharded_mc_buffers
from rectoolkit.plan.types import ShardingType


def _agree(env: ShardingEnv, error: Optional[BaseException], payload: Any, consequence: str) -> List[Any]:
    """Every rank's payload once every rank succeeded. Otherwise every rank raises: a rank that failed its own
    error, the others a CheckpointError naming the ranks that failed and why. A collective."""
    reply = {"error": None if error is None else f"{type(error).__name__}: {error}", "payload": payload}
    try:
        replies = [json.loads(raw) for raw in all_gather_bytes(env, json.dumps(reply).encode())]
    except RuntimeError as lost:  # the transport's error: a peer's process ended (killed, interrupted) meanwhile
        if error is not None:
            raise error from lost
        raise CheckpointPeerError(f"another rank stopped answering while the ranks compared their parts ({lost}); "
                                  f"{consequence}") from lost
    if error is not None:
        raise error
    failed = {rank: r["error"] for rank, r in enumerate(replies) if r["error"] is not None}
    if failed:
        raise CheckpointPeerError(f"rank(s) {sorted(failed)} failed ("
                              + "; ".join(f"rank {rank}: {message}" for rank, message in failed.items())
                              + f"); {consequence}")
    return [r["payload"] for r in replies]


class CheckpointPeerError(CheckpointError):
    """Raised on the ranks that did not fail themselves when another rank's part of a save or load failed
    (`peer_failure`: the launcher blames the rank that failed, not this one)."""

    peer_failure = True


def _begin_save(env: ShardingEnv, path: Path, lock: checkpoint_commit.DirectoryLock) -> Path:
    """Every rank's path must be rank 0's (one shared directory); rank 0 takes the directory's lock and draws a
    fresh data directory name, the same on every rank. Raises on every rank, before anything is written, if the
    paths differ or the lock is held."""
    reply = {"path": os.path.abspath(path), "name": "", "error": None}
    if env.rank == 0:
        try:
            lock.acquire()
            name = f"data-{secrets.token_hex(8)}"
            while (path / name).exists():
                name = f"data-{secrets.token_hex(8)}"
            reply["name"] = name
        except CheckpointError as error:
            reply["error"] = str(error)
        except OSError as error:
            what = ("is a file, not a directory" if path.exists() and not path.is_dir() else
                    f"exists, but its lock file {lock.path.name} cannot be created" if path.is_dir() else
                    "cannot be created")
            reply["error"] = f"{path}: the checkpoint directory {what} on rank 0: {error}"
    replies = [json.loads(raw) for raw in all_gather_bytes(env, json.dumps(reply).encode())]
    if replies[0]["error"] is not None:
        raise (CheckpointError if env.rank == 0 else CheckpointPeerError)(
            replies[0]["error"] + (f"; nothing was saved: the checkpoint at {path} is unchanged"))
    others = {rank: r["path"] for rank, r in enumerate(replies) if r["path"] != replies[0]["path"]}
    if others:
        lock.release()
        raise CheckpointError(
            "save_checkpoint: every rank must pass the same directory (one directory all ranks see), but rank 0 "
            f"passed {replies[0]['path']} and " + ", ".join(f"rank {rank} {p}" for rank, p in others.items())
            + f"; nothing was saved: the checkpoint at {path} is unchanged")
    return path / replies[0]["name"]


def save_checkpoint(model, path: Union[str, Path], dense_optimizer: Optional[torch.optim.Optimizer] = None,
                    extra: Optional[Dict[str, Any]] = None) -> None:
    """Save `model` (a DistributedModelParallel) into directory `path`; every rank calls it. Atomic: a crash
    at any point leaves the previous checkpoint at `path` (or the new one, once committed)."""
    _require_sharded_model(model, "save_checkpoint")
    env = model.env
    path = Path(path)
    _refuse_managed_collisions(model, "saved")  # the same on every rank: before the ranks compare their paths
    if getattr(model, "sync_env", None) is not None:  # a DMPCollection: its sharding groups hold one model
        _save_first_group(model, path, dense_optimizer, extra)
        return
    lock = checkpoint_commit.DirectoryLock(path)
    try:
        _save(model, env, path, lock, dense_optimizer, extra)
    finally:
        lock.release()


def _save_first_group(model, path: Path, dense_optimizer: Optional[torch.optim.Optimizer],
                      extra: Optional[Dict[str, Any]]) -> None:
    """A DMPCollection's checkpoint: one copy of the model, written by the first sharding group (as a
    DistributedModelParallel of the group's ranks saves it) while the other groups wait; refused while the groups'
    shards differ (they trained since the last sync(), and one copy would lose the others' updates). Every rank
    returns or raises together."""
    import torch.distributed as dist

    env = model.env
    differing = _tables_differing_from_replicas(model)
    verdict = torch.tensor([len(differing)])
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX, group=env.global_pg)
    if int(verdict):
        raise CheckpointError(
            f"save_checkpoint: the sharding groups of this DMPCollection hold different weights "
            f"({', '.join(differing) or 'on another rank'}), and a checkpoint holds one copy of the model: call "
            f"dmp.sync() before saving (the train pipeline syncs every dmp_collection_sync_interval_batches); "
            f"nothing was saved: the checkpoint at {path} is unchanged")
    error: Optional[BaseException] = None
    if dist.get_rank(env.replica_pg) == 0:  # (the first of every replica group: the first sharding group)
        lock = checkpoint_commit.DirectoryLock(path)
        try:
            _save(model, env, path, lock, dense_optimizer, extra)
        except Exception as caught:
            error = caught
        finally:
            lock.release()
    failed = torch.tensor([0 if error is None else 1])
    dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=env.global_pg)
    if error is not None:
        raise error
    if int(failed):
        raise CheckpointPeerError(f"save_checkpoint: the first sharding group, which writes the checkpoint, failed "
                                  f"(its ranks raised why); the checkpoint at {path} is the previous one or this one")


def _tables_differing_from_replicas(model) -> List[str]:
    """The tables whose shards on this rank differ from the same shards on its replicas (weights or fused state),
    compared by exact checksums over the replica group (a collective)."""
    import torch.distributed as dist

    names, sums = [], []
    for path in sorted(model.sharded_modules):
        for table, shard, weight, state in model.sharded_modules[path].local_shards():
            for tensor in [weight, *(state[k] for k in sorted(state))]:
                names.append(f"{path}.{table}" if path else table)
                values = tensor.detach().double()
                sums.append(torch.stack([values.sum(), values.square().sum()]))
    mine = (torch.stack(sums) if sums else torch.zeros(0, 2, dtype=torch.float64)).to(model.env.device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(model.env.replica_pg))]
    dist.all_gather(every, mine, group=model.env.replica_pg)
    differs = torch.zeros(len(names), dtype=torch.bool, device=mine.device)
    for theirs in every:
        differs |= (theirs != mine).any(dim=1)
    return sorted({name for name, flag in zip(names, differs.tolist()) if flag})


def _require_sharded_model(model: Any, what: str) -> None:
    if not (hasattr(model, "env") and hasattr(model, "sharded_modules")):
        raise TypeError(f"{what} takes a DistributedModelParallel (every rank calls it with its shards), got a "
                        f"{type(model).__name__}; wrap the model in DistributedModelParallel, or for a model in one "
                        "process use torch.save(model.state_dict(), file) / model.load_state_dict(torch.load(file))")


def _named_os_error(error: OSError, context: str) -> OSError:
    """`error` again (same type and errno), its message naming the file and `context`."""
    text = str(error.strerror or error) + (f": {error.filename}" if error.filename else "") + f" ({context})"
    named = type(error)(error.errno, text) if error.errno is not None else type(error)(text)
    named.__cause__ = error
    return named


def _save(model, env: ShardingEnv, path: Path, lock: checkpoint_commit.DirectoryLock,
          dense_optimizer: Optional[torch.optim.Optimizer], extra: Optional[Dict[str, Any]]) -> None:
    data = _begin_save(env, path, lock)
    written: Dict[str, Dict[str, Any]] = {}
    error: Optional[BaseException] = None
    try:
        _check_dense_optimizer(model, dense_optimizer)
        _refuse_managed_collisions(model, "saved")
        data.mkdir(parents=True, exist_ok=True)
        shards = checkpoint_format.saved_shards(model)
        written[checkpoint_format.rank_file(env.rank, env.world_size)] = dict(checkpoint_format.write_file(
            {"format": FORMAT_VERSION, "rank": env.rank, "world_size": env.world_size, "shards": shards},
            data / checkpoint_format.rank_file(env.rank, env.world_size)),
            shards=[[e["collection"], e["table"], *e["offsets"], *e["sizes"]] for e in shards])
        if env.rank == 0:
            written[DENSE] = checkpoint_format.write_file(
                {"model": checkpoint_format.dense_state(model),
                 "optimizer": dense_optimizer.state_dict() if dense_optimizer is not None else None,
                 "optimizer_class": type(dense_optimizer).__name__ if dense_optimizer is not None else None,
                 "extra": extra or {}}, data / DENSE)
        checkpoint_format.fsync_directory(data)
    except OSError as caught:  # a full disk, a read-only directory: the same error, naming the rank and the file
        error = _named_os_error(caught, f"rank {env.rank} writing its part of the checkpoint into {data}; nothing "
                                        f"was saved: the checkpoint at {path} is unchanged")
    except Exception as caught:  # every rank learns of it in _agree, then it is raised here
        error = caught
    except BaseException:  # KeyboardInterrupt: this process goes on, so it removes what it started
        if env.rank == 0:
            shutil.rmtree(data, ignore_errors=True)
        raise
    try:
        records = _agree(env, error, written, f"nothing was saved: the checkpoint at {path} is unchanged")
    except BaseException:
        if env.rank == 0:
            shutil.rmtree(data, ignore_errors=True)  # never committed; a leftover would be ignored and removed later
        raise
    error = None
    if env.rank == 0:
        try:
            files = {name: record for per_rank in records for name, record in per_rank.items()}
            tables = {p: {c.name: [c.num_embeddings, c.embedding_dim] for c in coll.embedding_configs()}
                      for p, coll in model.sharded_modules.items()}
            checkpoint_commit.commit(path, data, {
                "format": FORMAT, "format_version": FORMAT_VERSION, "world_size": env.world_size,
                "local_world_size": env.local_world_size, "directory": data.name,
                "files": dict(sorted(files.items())), "tables": tables})
        except Exception as caught:
            error = caught
            committed = checkpoint_commit.is_committed(path, data.name)
            if not committed:  # its data would only take the disk's space
                shutil.rmtree(data, ignore_errors=True)
            if isinstance(caught, OSError):
                error = _named_os_error(caught, f"rank 0 committing {path / METADATA}; the checkpoint at {path} is "
                                                f"{'this one' if committed else 'the previous one, unchanged'}")
    _agree(env, error, None, f"the commit of {data.name} failed on rank 0: the checkpoint at {path} is the "
                             "previous one or this one, complete either way")
    if env.rank == 0:
        checkpoint_commit.remove_stale(path, keep=data.name)


def _refuse_managed_collisions(model, done: str) -> None:
    held = sorted(sharded_mc_buffers(model.module))
    if held:
        raise NotImplementedError(f"checkpoint: the model has managed-collision state sharded per rank ({held[0]}, "
                                  f"...), which cannot be {done} by rectoolkit's checkpoints yet (its row blocks' "
                                  "slots would be lost); save it with torch.distributed.checkpoint: "
                                  "dcp.save(dmp.state_dict(), checkpoint_id=...) keeps every rank's row blocks "
                                  "(ShardedTensors there)")


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


READ_ATTEMPTS = 3


def _agreed_metadata(env: ShardingEnv, path: Path) -> Dict[str, Any]:
    """metadata.json as every rank read it, the same on every rank (a collective). A save that commits between
    the ranks' reads makes them differ: they read again (the commit is one rename, so the second reads agree).
    Ranks that still differ read different checkpoints (each its own directory): refused on every rank, naming
    what each read. A rank that cannot read it raises here; its peers learn of it in the load's agreement."""
    for attempt in range(READ_ATTEMPTS):
        metadata, error = None, None
        try:
            metadata = read_metadata(path)
        except Exception as caught:
            error = caught
        seen = {"checksum": metadata["checksum"] if metadata else None,
                "directory": metadata["directory"] if metadata else None, "path": os.path.abspath(path)}
        replies = [json.loads(raw) for raw in all_gather_bytes(env, json.dumps(seen).encode())]
        if error is not None:
            raise error
        if any(r["checksum"] is None for r in replies):  # a peer could not read it: its error comes in _agree
            return metadata
        if len({r["checksum"] for r in replies}) == 1:
            return metadata
    raise CheckpointError(
        "load_checkpoint: the ranks read different checkpoints (" + ", ".join(
            f"rank {rank}: {r['path']}/{METADATA} naming {r['directory']}" for rank, r in enumerate(replies))
        + f") {READ_ATTEMPTS} times over; every rank must load the same checkpoint (one directory all ranks see, "
        "or identical copies of it)")


def _prepare_load(model, path: Path, metadata: Dict[str, Any], dense_optimizer: Optional[torch.optim.Optimizer]
                  ) -> Tuple[List[checkpoint_resharding.Copy], Dict[str, Any]]:
    """Read and check the whole checkpoint against the model; return the copies to make and the dense file."""
    _refuse_managed_collisions(model, "loaded")
    checkpoint_resharding.check_tables(model, metadata, path / METADATA)
    index = checkpoint_format.saved_index(metadata)
    for coll_path, tables in metadata["tables"].items():
        for table, shape in tables.items():
            checkpoint_resharding.check_saved_tiling(f"{coll_path}.{table}" if coll_path else table,
                                                     index.get((coll_path, table), []), shape, path)
    local = [(coll_path, table, shard, weight, state) for coll_path, collection in model.sharded_modules.items()
             for table, shard, weight, state in collection.local_shards()]
    needed = {DENSE} | {name for coll_path, table, shard, weight, _ in local
                        for name, offsets, sizes in index.get((coll_path, table), [])
                        if checkpoint_resharding.overlaps(shard.shard_offsets, list(weight.shape), offsets, sizes)}
    files = checkpoint_format.verified_files(path, metadata, checksum_of=needed)
    by_table: Dict[tuple, List[Dict[str, Any]]] = {}
    for entry in checkpoint_format.read_shards({name: files[name] for name in sorted(needed)}, metadata):
        by_table.setdefault((entry["collection"], entry["table"]), []).append(entry)
    copies: List[checkpoint_resharding.Copy] = []
    for coll_path, table, shard, weight, state in local:
        copies += checkpoint_resharding.table_copies(f"{coll_path}.{table}" if coll_path else table,
                                                     by_table.get((coll_path, table), []), shard, weight, state)
    dense = checkpoint_format.torch_load(files[DENSE], weights_only=False)
    checkpoint_resharding.check_dense(model, dense, files[DENSE], dense_optimizer)
    return copies, dense


@torch.no_grad()
def load_checkpoint(model, path: Union[str, Path], dense_optimizer: Optional[torch.optim.Optimizer] = None
                    ) -> Dict[str, Any]:
    """Load a checkpoint into `model`, whatever plan and world size saved it; returns the saved `extra`.
    Everything is checked first, on every rank: if anything is wrong, every rank raises and nothing changed."""
    _require_sharded_model(model, "load_checkpoint")
    path = Path(path)
    readers = checkpoint_commit.Readers(path)  # a save committed meanwhile leaves the data this load reads
    readers.acquire()
    try:
        copies, dense, error = [], None, None
        try:
            metadata = _agreed_metadata(model.env, path)
            copies, dense = _prepare_load(model, path, metadata, dense_optimizer)
        except Exception as caught:  # every rank learns of it in _agree, then it is raised here
            error = caught
        _agree(model.env, error, None, f"checkpoint {path} was not loaded; the model is unchanged")
        for target, target_slices, source, source_slices in copies:
            target[target_slices] = source[source_slices]
    finally:
        readers.release()
    if dense["model"]:
        model.module.load_state_dict(dense["model"], strict=False)  # keys, shapes, dtypes checked above
    if dense_optimizer is not None:
        dense_optimizer.load_state_dict(dense["optimizer"])
    return dense["extra"]
