"""The files of a checkpoint: their names, what each holds, and reading them back checked.

A checkpoint directory (see rectoolkit.distributed.checkpoint for how a save commits it) holds metadata.json, the
commit record, and one data directory ``data-<16 hex digits>`` of ``rank<r>-of-<world size>.pt`` files (each rank's
shards) and ``dense.pt`` (the dense state, rank 0's). Every file is written durably (fsynced) and recorded in
metadata.json by size and SHA-256; metadata.json records its own SHA-256. Reading checks all of it and raises a
CheckpointError naming the file and what is wrong with it.

    >>> rank_file(1, 4)
    'rank1-of-4.pt'
    >>> bool(DATA_DIRECTORY.match("data-0123456789abcdef"))
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from rectoolkit.distributed.table_view import table_state_skipped
from rectoolkit.plan.types import ShardingType

FORMAT = "rectoolkit.checkpoint"
FORMAT_VERSION = 2
METADATA = "metadata.json"
DENSE = "dense.pt"
DATA_DIRECTORY = re.compile(r"^data-[0-9a-f]{16}$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be saved or loaded: the message names the file and what is wrong with it."""


def fsync_directory(path: Path) -> None:
    """Make the directory's entries (new files, renames) durable; POSIX only (Windows cannot open a directory)."""
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_record(path: Path) -> Dict[str, Any]:
    """Size and SHA-256 of a file, as read from disk."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def write_file(obj: Any, path: Path) -> Dict[str, Any]:
    """torch.save `obj` into `path` and fsync it; returns its size and SHA-256."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return file_record(path)


def rank_file(rank: int, world_size: int) -> str:
    return f"rank{rank}-of-{world_size}.pt"


def saved_shards(model) -> List[Dict[str, Any]]:
    """This rank's shards as its rank file holds them: table, offsets, sizes, weight, fused optimizer state."""
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


def dense_state(model) -> Dict[str, torch.Tensor]:
    """The dense parameters and buffers (every key outside the sharded collections), as dense.pt holds them."""
    if "" in model.sharded_modules:
        return {}
    prefixes = tuple(p + "." for p in model.sharded_modules)
    with table_state_skipped(model.sharded_modules.values()):  # (their shards are saved per rank, not here)
        state = model.module.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items() if not k.startswith(prefixes)}


def metadata_checksum(metadata: Dict[str, Any]) -> str:
    """SHA-256 of the metadata's canonical JSON, without the checksum itself."""
    return hashlib.sha256(json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True)
                          .encode()).hexdigest()


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
    if metadata.get("checksum") != metadata_checksum(metadata):
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
    expected = {rank_file(r, metadata["world_size"]) for r in range(metadata["world_size"])} | {DENSE}
    if set(metadata["files"]) != expected:
        raise CheckpointError(f"{file} lists files {sorted(metadata['files'])}; a checkpoint of world size "
                              f"{metadata['world_size']} has {sorted(expected)}")
    return metadata


def verified_files(path: Path, metadata: Dict[str, Any], checksum_of: Optional[Set[str]] = None) -> Dict[str, Path]:
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
        found = file_record(file)["sha256"] if checksum_of is None or name in checksum_of else record.get("sha256")
        if found != record.get("sha256"):
            raise CheckpointError(f"{file}: content checksum mismatch (SHA-256 {found[:16]}..., written "
                                  f"{str(record.get('sha256'))[:16]}...): the file was changed or corrupted after "
                                  "it was saved")
        out[name] = file
    return out


def saved_index(metadata: Dict[str, Any]) -> Dict[Tuple[str, str], List[Tuple[str, List[int], List[int]]]]:
    """(collection, table) -> (file, offsets, sizes) of every saved shard, from metadata.json (no file is read)."""
    index: Dict[Tuple[str, str], List[Tuple[str, List[int], List[int]]]] = {}
    try:
        for name, record in metadata["files"].items():
            for collection, table, r0, c0, rows, cols in record.get("shards", []) if name != DENSE else []:
                index.setdefault((collection, table), []).append((name, [int(r0), int(c0)], [int(rows), int(cols)]))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{METADATA}: the shard index is malformed ({error}); the file is corrupted") from error
    return index


def torch_load(file: Path, **kwargs: Any) -> Any:
    try:
        return torch.load(file, map_location="cpu", **kwargs)
    except Exception as error:
        raise CheckpointError(f"{file}: cannot be read ({type(error).__name__}: {error})") from error


def read_shards(files: Dict[str, Path], metadata: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The saved shards of these rank files (tensors memory-mapped), each checked for form and against the index
    in metadata.json, and tagged with its file."""
    shards = []
    for name, file in files.items():
        if name == DENSE:
            continue
        content = torch_load(file, mmap=True, weights_only=True)
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
    return read_shards(verified_files(path, metadata), metadata)
