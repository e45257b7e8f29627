"""Finding and killing every process a worker started, so that nothing outlives its job.

Each rank (its keeper and worker, see `_keeper`) is a session and process group of its own, and its
environment carries a tag (`RECTOOLKIT_LAUNCH_TAG=<job id>.<rank>`) that every process it starts inherits.
A worker's group is killed as a whole when the worker exits (helpers die with it), and at the end of the job
`/proc` is swept for anything still carrying the job's tag or still in a worker's session: a helper that
moved to a process group of its own, or even daemonized into a new session, is found by its tag. A helper that
also dropped the tag (started with an environment of its own) is found by its parent: each worker is a child
subreaper (`become_subreaper`), so what it starts stays its descendant even after a double fork: the worker
kills its descendants (`kill_descendants`) before it exits, its keeper (a subreaper above it, see `_keeper`) kills
those left when the worker could not (it was SIGKILLed), and the launcher, before it signals a rank's group, kills
the descendants that left that group (`kill_escaped_descendants`; once the rank is gone they would be init's).

The group is killed while the worker is still an unreaped zombie (`exit_status` looks without reaping), so
its process-group id cannot have been reused by an unrelated process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Iterable, List, Optional

TAG_VARIABLE = "RECTOOLKIT_LAUNCH_TAG"


def exit_status(pid: int) -> Optional[int]:
    """The child's return code (negative: killed by that signal) once it has exited, else None; never reaps."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped by someone else
        return 0
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


def kill_group(pgid: int, sig: int) -> None:
    """Send `sig` to every process of group `pgid` (no error when the group is already gone)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(pid_dir: Path) -> List[str]:
    # /proc/PID/stat: "pid (comm) state ppid pgrp session ..."; comm may contain spaces and parentheses
    return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()


def tagged_processes(tag_prefix: str, sessions: Iterable[int] = (), variable: str = TAG_VARIABLE) -> List[int]:
    """Live pids (not ours, not zombies) whose environment sets `variable` to `tag_prefix` or to a tag under
    it (`job` finds `job.0`, `job.1`; `job.1` does not find `job.10`), or that are in one of `sessions`.
    Linux only (reads /proc); returns [] where /proc is missing."""
    sessions = set(sessions)
    found, own = [], os.getpid()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == own:
            continue
        try:
            stat = _stat(pid_dir)
            if stat[0] == "Z":
                continue
            if int(stat[3]) in sessions:
                found.append(int(pid_dir.name))
                continue
            environ = (pid_dir / "environ").read_bytes()
        except (OSError, IndexError, ValueError):  # gone, another user's, or a kernel thread
            continue
        if _has_tag(environ, tag_prefix, variable, under=True):
            found.append(int(pid_dir.name))
    return found


def _has_tag(environ: bytes, tag: str, variable: str = TAG_VARIABLE, under: bool = False) -> bool:
    """Whether a /proc/PID/environ sets `variable` to `tag` (or, `under`, to a tag under it: `job.1`)."""
    marker = f"{variable}={tag}".encode()
    return any(entry == marker or (under and entry.startswith(marker + b".")) for entry in environ.split(b"\0"))


def carries_tag(pid: int, tag: str) -> bool:
    """Whether live process `pid` carries exactly `tag` (so a pid reused by an unrelated process is not taken for it)."""
    try:
        return _has_tag(Path(f"/proc/{pid}/environ").read_bytes(), tag)
    except OSError:  # gone, or another user's
        return False


def kill_tagged(tag_prefix: str, sessions: Iterable[int] = (), rounds: int = 5) -> List[int]:
    """SIGKILL every process `tagged_processes` finds, again until none is left (a helper may fork while we
    look); return the pids killed."""
    sessions = list(sessions)
    return _kill_until_none_left(lambda: tagged_processes(tag_prefix, sessions), rounds)


def _kill_until_none_left(find: Callable[[], List[int]], rounds: int) -> List[int]:
    """SIGKILL what `find()` returns, again until it returns nothing (or `rounds` times); the pids killed."""
    killed: List[int] = []
    for _ in range(rounds):
        pids = find()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed.append(pid)
    return killed



def become_subreaper() -> None:
    """Make this process the child subreaper of its subtree (Linux prctl PR_SET_CHILD_SUBREAPER): an orphaned
    descendant (a daemon's double fork) is re-parented to it, not to init. Elsewhere nothing happens."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(pid: int, outside_group: Optional[int] = None) -> List[int]:
    """Live (not zombie) descendants of `pid`, from /proc's parent links ([] where /proc is missing); with
    `outside_group`, only those not in that process group."""
    children: dict = {}
    groups: dict = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            stat = _stat(pid_dir)
        except (OSError, IndexError):
            continue
        if stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(pid_dir.name))
            groups[int(pid_dir.name)] = int(stat[2])
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return [p for p in found if outside_group is None or groups.get(p) != outside_group]


def kill_escaped_descendants(pid: int, group: Optional[int] = None) -> List[int]:
    """SIGKILL the live descendants of `pid` that left process group `group` (default: the one `pid` leads), which
    a signal to that group misses."""
    return kill_descendants(pid, outside_group=pid if group is None else group)


def kill_descendants(pid: int, rounds: int = 5, outside_group: Optional[int] = None) -> List[int]:
    """SIGKILL every live descendant of `pid` (not in `outside_group`'s process group, if given), again until none
    is left; return the pids killed."""
    return _kill_until_none_left(lambda: descendants(pid, outside_group), rounds)
