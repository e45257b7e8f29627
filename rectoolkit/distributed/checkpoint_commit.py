"""How a save becomes the checkpoint atomically, and how saves and loads of one directory keep out of each
other's way.

The commit is the replacement of metadata.json (``commit``: written aside, fsynced, renamed over, the directory
fsynced), so a crash leaves either the previous checkpoint or the new one (steps 3 and 4 of the protocol in
rectoolkit.distributed.checkpoint). A save holds ``DirectoryLock`` (an exclusive flock of ``.lock``) throughout, so
a second save into the directory is refused; a load holds ``Readers`` (a shared flock of the directory), so a save
committed meanwhile leaves the data the load reads (``remove_stale`` removes it at the next save).

    >>> import tempfile
    >>> is_committed(Path(tempfile.mkdtemp()), "data-0123456789abcdef")  # no metadata.json: nothing committed
    False
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict

from rectoolkit.distributed import checkpoint_format
from rectoolkit.distributed.checkpoint_format import DATA_DIRECTORY, METADATA, CheckpointError

class DirectoryLock:
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


class Readers:
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


def commit(path: Path, data: Path, metadata: Dict[str, Any]) -> None:
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
            f.write(json.dumps(dict(metadata, checksum=checkpoint_format.metadata_checksum(metadata)), indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / METADATA)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    checkpoint_format.fsync_directory(path)
    checkpoint_format.fsync_directory(path.parent)  # in case `path` itself is new


def is_committed(path: Path, directory: str) -> bool:
    """Whether metadata.json at `path` (as on disk now) names data directory `directory`: the save was committed."""
    try:
        return json.loads((path / METADATA).read_text()).get("directory") == directory
    except (OSError, ValueError, AttributeError):
        return False


def remove_stale(path: Path, keep: str) -> None:
    """Delete data directories other than `keep` (the previous checkpoint, crashed saves) and leftover temporary
    metadata files; not while a load is reading the directory (it may be reading the previous data directory).
    Best effort: what stays is ignored by load and removed by the next save."""
    readers = Readers(path, exclusive=True)
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
