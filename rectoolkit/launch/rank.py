"""What the launcher knows about one rank: its keeper process, its socket, its output, what it reported, how it
ended. One `RankState` per rank, changed by the job's monitor thread only (and its output by its reader thread).

    >>> import subprocess, sys
    >>> process = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> state = RankState(rank=0, process=process, conn=None, last_message_s=0.0)
    >>> state.state
    'starting'
    >>> state.returncode = process.wait()
    >>> state.state
    'stopped'
"""

from __future__ import annotations

import subprocess
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Deque, List, Optional

from rectoolkit.launch.blame import Failure
from rectoolkit.launch.errors import WorkerError

OUTPUT_LINES = 200  # how many of a rank's last lines `job.output(rank)` keeps


@dataclass
class RankState:
    """What the monitor knows about one worker. Only the monitor thread changes it."""

    rank: int
    process: subprocess.Popen
    conn: Optional[Connection]
    last_message_s: float
    output: Deque[str] = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    started: bool = False  # up: its function has been called
    worker_pid: Optional[int] = None  # known once started; the process the launcher started is its keeper
    reports: int = 0
    has_result: bool = False
    result: Any = None
    returned_s: Optional[float] = None
    failure: Optional[Failure] = None
    last_step: Any = None
    returncode: Optional[int] = None  # set once the monitor has reaped the process
    exited_s: Optional[float] = None
    signals_sent: List[int] = field(default_factory=list)  # what the launcher sent it while it was alive
    where: Optional[str] = None  # its answer to the last "where is your main thread?"

    @property
    def error(self) -> Optional[WorkerError]:
        """The rank's own failure (None if it has not failed)."""
        return self.failure.error if self.failure is not None else None

    @property
    def state(self) -> str:
        """starting, running, finishing (returned, not exited yet), finished, failed or stopped."""
        if self.failure is not None:
            return "failed"
        if self.has_result:
            return "finished" if self.returncode is not None else "finishing"
        if self.returncode is not None:
            return "stopped"
        return "running" if self.started else "starting"


def running_ranks(ranks: List[RankState]) -> List[RankState]:
    """The ranks still running their function: not exited, not returned, not failed."""
    return [r for r in ranks if r.returncode is None and not r.has_result and r.failure is None]


def unfinished_ranks(ranks: List[RankState]) -> List[int]:
    """The ranks (numbers) that have neither returned nor failed."""
    return [r.rank for r in ranks if not r.has_result and r.failure is None]
