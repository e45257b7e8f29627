"""Checkpoints of a DistributedModelParallel: saved per rank, loadable under another plan or world size, and
never lost to a crash.

    save_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # every rank calls it
    load_checkpoint(model, "ckpt/step_100", dense_optimizer=opt)   # any plan, any world size

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
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from rectoolkit.distributed.agree import all_gather_bytes
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.mc_embeddingbag import sharded_mc_buffers
from rectoolkit.distributed.table_view import table_state_skipped
from rectoolkit.plan.types import ParameterSharding, ShardingType, ShardMetadata
from rectoolkit.plan.validation import check_tiling

FORMAT = "rectoolkit.checkpoint"
FORMAT_VERSION = 2
METADATA = "metadata.json"
DENSE = "dense.pt"
DATA_DIRECTORY = re.compile(r"^data-[0-9a-f]{16}$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be saved or loaded: the message names the file and what is wrong with it."""


# ------------------------------------------------------------------------------------------------ files
def _fsync_directory(path: Path) -> None:
    """Make the directory's entries (new files, renames) durable; POSIX only (Windows cannot open a directory)."""
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_record(path: Path) -> Dict[str, Any]:
    """Size and SHA-256 of a file, as read from disk."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _write_file(obj: Any, path: Path) -> Dict[str, Any]:
    """torch.save `obj` into `path` and fsync it; returns its size and SHA-256."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return _file_record(path)


def _rank_file(rank: int, world_size: int) -> str:
    return f"rank{rank}-of-{world_size}.pt"


# ------------------------------------------------------------------------------------------------ agreement
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


# ------------------------------------------------------------------------------------------------ save
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
    with table_state_skipped(model.sharded_modules.values()):  # (their whole tables would be a collective)
        state = model.module.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items() if not k.startswith(prefixes)}


class CheckpointPeerError(CheckpointError):
    """Raised on the ranks that did not fail themselves when another rank's part of a save or load failed
    (`peer_failure`: the launcher blames the rank that failed, not this one)."""

    peer_failure = True


class _DirectoryLock:
    """An exclusive lock on a checkpoint directory (flock of its `.lock` file), held by rank 0 for the whole
    save: a second save into the same directory, from another job or thread, is refused instead of deleting the
    first one's files. The file is removed on release (a holder that died leaves it, unlocked: the operating
    system releases a dead process's lock). POSIX only (elsewhere: no lock)."""

    def __init__(self, path: Path) -> None:
        self.path, self._file = path / ".lock", None

    def acquire(self) -> None:
        if os.name != "posix":
            return
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            file = open(self.path, "a+")
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                raise CheckpointError(f"{self.path.parent}: another save into this directory is in progress (it "
                                      f"holds {self.path}); wait for it to finish, or save into another "
                                      "directory") from None
            try:
                same = os.fstat(file.fileno()).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._file = file
                return
            file.close()  # locked a file its holder removed on release: lock the one now at the path

    def release(self) -> None:
        if self._file is not None:
            self.path.unlink(missing_ok=True)  # while still holding it: whoever locks the path next has a new file
            self._file.close()
            self._file = None


class _Readers:
    """A load's hold on a checkpoint directory: a shared flock of the directory itself, from before metadata.json
    is read until the files are copied. A save committed meanwhile does not delete the data directory the load
    reads (it tries an exclusive flock first and, while a load holds it, leaves the previous data directory for
    the next save to remove). Nothing is written, so read-only checkpoints load as before. POSIX only."""

    def __init__(self, path: Path, exclusive: bool = False) -> None:
        self.path, self.exclusive, self._fd = path, exclusive, None

    def acquire(self) -> bool:
        """Take the lock: shared (a load; waits while a save removes old data), or exclusive without waiting (a
        save about to remove old data). False if the exclusive lock is held by a load, or the directory is gone."""
        if os.name != "posix":
            return True
        import fcntl

        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # no directory: the load names it when it reads metadata.json
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB if self.exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            self.release()
            return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases its flock
            self._fd = None


def _begin_save(env: ShardingEnv, path: Path, lock: _DirectoryLock) -> Path:
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
    lock = _DirectoryLock(path)
    try:
        _save(model, env, path, lock, dense_optimizer, extra)
    finally:
        lock.release()


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


def _save(model, env: ShardingEnv, path: Path, lock: _DirectoryLock,
          dense_optimizer: Optional[torch.optim.Optimizer], extra: Optional[Dict[str, Any]]) -> None:
    data = _begin_save(env, path, lock)
    written: Dict[str, Dict[str, Any]] = {}
    error: Optional[BaseException] = None
    try:
        _check_dense_optimizer(model, dense_optimizer)
        _refuse_managed_collisions(model, "saved")
        data.mkdir(parents=True, exist_ok=True)
        shards = _saved_shards(model)
        written[_rank_file(env.rank, env.world_size)] = dict(_write_file(
            {"format": FORMAT_VERSION, "rank": env.rank, "world_size": env.world_size, "shards": shards},
            data / _rank_file(env.rank, env.world_size)),
            shards=[[e["collection"], e["table"], *e["offsets"], *e["sizes"]] for e in shards])
        if env.rank == 0:
            written[DENSE] = _write_file(
                {"model": _dense_state(model),
                 "optimizer": dense_optimizer.state_dict() if dense_optimizer is not None else None,
                 "optimizer_class": type(dense_optimizer).__name__ if dense_optimizer is not None else None,
                 "extra": extra or {}}, data / DENSE)
        _fsync_directory(data)
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
            _commit(path, data, {"format": FORMAT, "format_version": FORMAT_VERSION, "world_size": env.world_size,
                                 "local_world_size": env.local_world_size, "directory": data.name,
                                 "files": dict(sorted(files.items())), "tables": tables})
        except Exception as caught:
            error = caught
            committed = _names(path, data.name)
            if not committed:  # its data would only take the disk's space
                shutil.rmtree(data, ignore_errors=True)
            if isinstance(caught, OSError):
                error = _named_os_error(caught, f"rank 0 committing {path / METADATA}; the checkpoint at {path} is "
                                                f"{'this one' if committed else 'the previous one, unchanged'}")
    _agree(env, error, None, f"the commit of {data.name} failed on rank 0: the checkpoint at {path} is the "
                             "previous one or this one, complete either way")
    if env.rank == 0:
        _remove_stale(path, keep=data.name)


def _metadata_checksum(metadata: Dict[str, Any]) -> str:
    """SHA-256 of the metadata's canonical JSON, without the checksum itself."""
    return hashlib.sha256(json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True)
                          .encode()).hexdigest()


def _commit(path: Path, data: Path, metadata: Dict[str, Any]) -> None:
    """Atomically make `data` the checkpoint at `path`: write metadata.json aside, fsync, rename over, fsync.
    First every file the ranks reported must be in `data` as rank 0 sees it, of its reported size (ranks that
    wrote to disks rank 0 does not see, or a directory removed under the save, are refused, not committed)."""
    for name, record in metadata["files"].items():
        file = data / name
        size = file.stat().st_size if file.is_file() else None
        if size != record["bytes"]:
            writer = re.match(r"rank(\d+)-of-", name)
            who = f"rank {writer.group(1)}" if writer else "rank 0"
            seen = "is missing" if size is None else f"has {size} bytes, not the {record['bytes']} written"
            raise CheckpointError(f"{file} {seen} as rank 0 sees it ({who} wrote it): every rank must save into "
                                  "one directory that rank 0 sees too (a shared file system), and nothing else may "
                                  "change it during the save")
    tmp = path / f".{METADATA}.tmp-{data.name}"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(dict(metadata, checksum=_metadata_checksum(metadata)), indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / METADATA)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path)
    _fsync_directory(path.parent)  # in case `path` itself is new


def _names(path: Path, directory: str) -> bool:
    """Whether metadata.json at `path` (as on disk now) names data directory `directory`: the save was committed."""
    try:
        return json.loads((path / METADATA).read_text()).get("directory") == directory
    except (OSError, ValueError, AttributeError):
        return False


def _remove_stale(path: Path, keep: str) -> None:
    """Delete data directories other than `keep` (the previous checkpoint, crashed saves) and leftover temporary
    metadata files; not while a load is reading the directory (it may be reading the previous data directory).
    Best effort: what stays is ignored by load and removed by the next save."""
    readers = _Readers(path, exclusive=True)
    if not readers.acquire():
        return
    try:
        _remove_entries(path, keep)
    finally:
        readers.release()


def _remove_entries(path: Path, keep: str) -> None:
    for entry in path.iterdir():
        if DATA_DIRECTORY.match(entry.name) and entry.name != keep:
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(f".{METADATA}.tmp-"):
            entry.unlink(missing_ok=True)


def _refuse_managed_collisions(model, done: str) -> None:
    held = sorted(sharded_mc_buffers(model.module))
    if held:
        raise NotImplementedError(f"checkpoint: the model has managed-collision state sharded per rank ({held[0]}, "
                                  f"...), which cannot be {done} by rectoolkit's checkpoints yet (its row blocks' "
                                  "slots would be lost); save each rank's dmp.state_dict() yourself")


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


# ------------------------------------------------------------------------------------------------ read and check
def read_metadata(path: Union[str, Path]) -> Dict[str, Any]:
    """The checkpoint's metadata.json, checked for form (raises CheckpointError naming the file)."""
    path = Path(path)
    file = path / METADATA
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file, not a checkpoint directory; pass the directory "
                              "save_checkpoint wrote")
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist (no such directory)")
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint: it has no {METADATA} (a save did not "
                                "finish, or this is not a rectoolkit checkpoint directory)")
    try:
        metadata = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON ({error}): the file is truncated or corrupted") from error
    if isinstance(metadata, dict) and metadata.get("format") == 1:
        raise CheckpointError(f"{file}: format 1, written by rectoolkit before checkpoints had checksums; this "
                              "rectoolkit cannot read it")
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not the metadata of a rectoolkit checkpoint: expected a JSON object "
                              f"with \"format\": \"{FORMAT}\"")
    if metadata.get("checksum") != _metadata_checksum(metadata):
        raise CheckpointError(f"{file}: content checksum mismatch: the file was changed or corrupted after it was "
                              "saved")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{file} has format_version {metadata.get('format_version')!r}; this rectoolkit reads "
                              f"version {FORMAT_VERSION}")
    for key, kind in (("directory", str), ("files", dict), ("tables", dict), ("world_size", int)):
        if not isinstance(metadata.get(key), kind):
            raise CheckpointError(f"{file}: {key!r} is missing or not a {kind.__name__}; the file is corrupted")
    if not DATA_DIRECTORY.match(metadata["directory"]):
        raise CheckpointError(f"{file}: 'directory' is {metadata['directory']!r}, not a data directory name")
    expected = {_rank_file(r, metadata["world_size"]) for r in range(metadata["world_size"])} | {DENSE}
    if set(metadata["files"]) != expected:
        raise CheckpointError(f"{file} lists files {sorted(metadata['files'])}; a checkpoint of world size "
                              f"{metadata['world_size']} has {sorted(expected)}")
    return metadata


def _verified_files(path: Path, metadata: Dict[str, Any], checksum_of: Optional[Set[str]] = None) -> Dict[str, Path]:
    """name -> path of every file the metadata lists, each checked for presence and size, and for SHA-256 those
    in `checksum_of` (default: all; a load reads, so checks, only the files holding its ranks' shards)."""
    data = path / metadata["directory"]
    out = {}
    for name, record in metadata["files"].items():
        file = data / name
        if not file.exists():
            raise CheckpointError(f"{file}: missing (the checkpoint's {METADATA} lists it); the checkpoint is "
                                  "incomplete: restore the file or load another checkpoint")
        size = file.stat().st_size
        if size != record.get("bytes"):
            what = "truncated" if size < record.get("bytes", 0) else "longer than written"
            raise CheckpointError(f"{file}: {size} bytes, but {record.get('bytes')} were written: the file is {what}")
        found = _file_record(file)["sha256"] if checksum_of is None or name in checksum_of else record.get("sha256")
        if found != record.get("sha256"):
            raise CheckpointError(f"{file}: content checksum mismatch (SHA-256 {found[:16]}..., written "
                                  f"{str(record.get('sha256'))[:16]}...): the file was changed or corrupted after "
                                  "it was saved")
        out[name] = file
    return out


def _saved_index(metadata: Dict[str, Any]) -> Dict[Tuple[str, str], List[Tuple[str, List[int], List[int]]]]:
    """(collection, table) -> (file, offsets, sizes) of every saved shard, from metadata.json (no file is read)."""
    index: Dict[Tuple[str, str], List[Tuple[str, List[int], List[int]]]] = {}
    try:
        for name, record in metadata["files"].items():
            for collection, table, r0, c0, rows, cols in record.get("shards", []) if name != DENSE else []:
                index.setdefault((collection, table), []).append((name, [int(r0), int(c0)], [int(rows), int(cols)]))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{METADATA}: the shard index is malformed ({error}); the file is corrupted") from error
    return index


def _torch_load(file: Path, **kwargs: Any) -> Any:
    try:
        return torch.load(file, map_location="cpu", **kwargs)
    except Exception as error:
        raise CheckpointError(f"{file}: cannot be read ({type(error).__name__}: {error})") from error


def _read_shards(files: Dict[str, Path], metadata: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The saved shards of these rank files (tensors memory-mapped), each checked for form and against the index
    in metadata.json, and tagged with its file."""
    shards = []
    for name, file in files.items():
        if name == DENSE:
            continue
        content = _torch_load(file, mmap=True, weights_only=True)
        if not isinstance(content, dict) or not isinstance(content.get("shards"), list):
            raise CheckpointError(f"{file}: not a rectoolkit rank file (no list of shards)")
        for entry in content["shards"]:
            weight = entry.get("weight") if isinstance(entry, dict) else None
            if not isinstance(weight, torch.Tensor) or list(weight.shape) != list(entry.get("sizes", [])) \
                    or not isinstance(entry.get("optimizer"), dict) or len(entry.get("offsets", [])) != 2:
                raise CheckpointError(f"{file}: a shard entry is malformed (weight, sizes, offsets, optimizer)")
            shards.append(dict(entry, file=file))
        held = [[e["collection"], e["table"], *e["offsets"], *e["sizes"]] for e in content["shards"]]
        if held != metadata["files"][name].get("shards"):
            raise CheckpointError(f"{file}: holds shards {held}, but {METADATA} lists {metadata['files'][name].get('shards')}")
    return shards


def load_saved_shards(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """Every saved shard of a checkpoint, its files checked (tensors memory-mapped: a slice reads only that slice)."""
    path = Path(path)
    metadata = read_metadata(path)
    return _read_shards(_verified_files(path, metadata), metadata)


# ------------------------------------------------------------------------------------------------ load
Copy = Tuple[torch.Tensor, Tuple[slice, ...], torch.Tensor, Tuple[slice, ...]]


def _check_saved_tiling(label: str, saved: List[Tuple[str, List[int], List[int]]], shape: List[int],
                        path: Path) -> None:
    """The saved shards of a table (file, offsets, sizes) must tile it: then every local cell is copied exactly once."""
    try:
        check_tiling(label, ParameterSharding("row_wise", shards=[
            ShardMetadata(offsets, sizes, f"rank:{name[4:name.find('-of-')]}/cpu") for name, offsets, sizes in saved]),
            *shape, source=f"checkpoint {path}")
    except ValueError as error:  # PlanValidationError, or a negative offset
        raise CheckpointError(f"{error} (saved shards in files {sorted({name for name, _, _ in saved})})") from error


def _overlaps(offsets: List[int], sizes: List[int], other_offsets: List[int], other_sizes: List[int]) -> bool:
    return all(max(a, b) < min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, other_offsets, other_sizes))


def _table_copies(label: str, saved: List[Dict[str, Any]], shard: ShardMetadata, weight: torch.Tensor,
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


def _check_tables(model, metadata: Dict[str, Any], file: Path) -> None:
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


def _check_dense(model, dense: Any, file: Path, dense_optimizer: Optional[torch.optim.Optimizer]) -> None:
    """dense.pt holds the model's dense keys with their shapes and dtypes, and an optimizer state that fits."""
    if not isinstance(dense, dict) or not {"model", "optimizer", "extra"} <= set(dense):
        raise CheckpointError(f"{file}: not a rectoolkit dense file (expected model, optimizer and extra)")
    mine, saved = _dense_state(model), dense["model"]
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
    _trial_load(dense_optimizer, state, file)


def _trial_load(optimizer: torch.optim.Optimizer, state: Dict[str, Any], file: Path) -> None:
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
                  ) -> Tuple[List[Copy], Dict[str, Any]]:
    """Read and check the whole checkpoint against the model; return the copies to make and the dense file."""
    _refuse_managed_collisions(model, "loaded")
    _check_tables(model, metadata, path / METADATA)
    index = _saved_index(metadata)
    for coll_path, tables in metadata["tables"].items():
        for table, shape in tables.items():
            _check_saved_tiling(f"{coll_path}.{table}" if coll_path else table, index.get((coll_path, table), []),
                                shape, path)
    local = [(coll_path, table, shard, weight, state) for coll_path, collection in model.sharded_modules.items()
             for table, shard, weight, state in collection.local_shards()]
    needed = {DENSE} | {name for coll_path, table, shard, weight, _ in local
                        for name, offsets, sizes in index.get((coll_path, table), [])
                        if _overlaps(shard.shard_offsets, list(weight.shape), offsets, sizes)}
    files = _verified_files(path, metadata, checksum_of=needed)
    by_table: Dict[tuple, List[Dict[str, Any]]] = {}
    for entry in _read_shards({name: files[name] for name in sorted(needed)}, metadata):
        by_table.setdefault((entry["collection"], entry["table"]), []).append(entry)
    copies: List[Copy] = []
    for coll_path, table, shard, weight, state in local:
        copies += _table_copies(f"{coll_path}.{table}" if coll_path else table,
                                by_table.get((coll_path, table), []), shard, weight, state)
    dense = _torch_load(files[DENSE], weights_only=False)
    _check_dense(model, dense, files[DENSE], dense_optimizer)
    return copies, dense


@torch.no_grad()
def load_checkpoint(model, path: Union[str, Path], dense_optimizer: Optional[torch.optim.Optimizer] = None
                    ) -> Dict[str, Any]:
    """Load a checkpoint into `model`, whatever plan and world size saved it; returns the saved `extra`.
    Everything is checked first, on every rank: if anything is wrong, every rank raises and nothing changed."""
    _require_sharded_model(model, "load_checkpoint")
    path = Path(path)
    readers = _Readers(path)  # a save committed meanwhile leaves the data this load reads
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
