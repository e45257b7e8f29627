"""How a job's ranks are stopped: SIGTERM to each rank's process group, then SIGKILL after `grace_s`, or at once
for a rank that cannot use its grace.

`grace_s` is for a rank that can still do something with it: a SIGTERM handler that saves a checkpoint, a loop
that finishes its step, peers that run their SIGTERM handlers' collectives together. Once a rank has *failed*
(raised, died, or hung while its peers timed out), no collective that needs it can complete, and a rank waiting in
one cannot even run its SIGTERM handler (Python runs handlers between bytecodes, not inside gloo's or NCCL's wait;
a rank that retries a failed collective is no better off): it would only sit out `grace_s`. So, while a job in
which a rank has failed stops, the launcher asks every rank still running where its main thread is, at once and
every `REPROBE_S` until the job ends, and kills at once (SIGKILL to its group) a rank whose innermost frame was
torch.distributed's (a collective, a store wait, the rendezvous) at two answers in a row: twice, so that a rank
whose collective has just failed, on its way to its SIGTERM handler or an `except` that saves, is not taken for a
stuck one. A rank in its own code (a SIGTERM handler saving, even one that runs on top of a collective's frame),
or one that does not answer (busy in native code), keeps its `grace_s`; `job.kill()` or an interrupt kills every
rank at once. With no failed rank (a plain `stop()`, a timeout), every rank gets `grace_s`: its peers may be
running the same collectives in their own SIGTERM handlers. The failed rank's error is the job's error whatever
the stop did to the others: a rank the launcher signalled is no failure of its own.
"""

from __future__ import annotations

import signal
import time
from typing import Callable, List, Optional

from rectoolkit.launch._reap import exit_status, kill_escaped_descendants, kill_group
from rectoolkit.launch.blame import in_collective, location
from rectoolkit.launch.rank import RankState

REPROBE_S = 0.5  # while a failed job stops: how often the ranks still running are asked where they are
_AGAIN_S = 1.0  # after a SIGKILL: when to send it again, to a process slow to go


def waits_in_torch_distributed(stack: str) -> bool:
    """True if the innermost frame of a rank's main-thread stack is torch.distributed's (a collective, a store
    wait, the rendezvous); not when a SIGTERM handler or an `except` block runs on top of such a frame.

        >>> waits_in_torch_distributed('  File "/t/torch/distributed/distributed_c10d.py", line 2, in barrier\\n')
        True
        >>> waits_in_torch_distributed('  File "/t/torch/distributed/distributed_c10d.py", line 2, in barrier\\n'
        ...                            '  File "/home/me/train.py", line 9, in on_sigterm\\n')
        False
    """
    return bool(stack.strip()) and in_collective(location(stack))


class StopPolicy:
    """The stop of one job: its reason, when its ranks are SIGKILLed, which are killed before that. Used by the
    job's monitor thread only: `begin`, `kill_now`, `answered_where` (a rank said where its main thread is) and
    `tick` (every poll)."""

    def __init__(self, ranks: List[RankState], grace_s: float, ask_where: Callable[[RankState], None]) -> None:
        self.ranks = ranks
        self.grace_s = grace_s
        self.reason: Optional[str] = None  # None until the job stops: "user", "failure" or "timeout"
        self.kill_deadline: Optional[float] = None
        self._ask_where = ask_where
        self._next_probe_s: Optional[float] = None
        self._in_collective: dict = {}  # rank -> answers in a row from inside torch.distributed, this stop

    def begin(self, reason: str) -> None:
        """Stop every rank: SIGTERM now, SIGKILL after grace_s. A stop the user asks for in a job where a rank has
        already failed is that failure's stop (its error is the job's, not JobStopped). Later calls do nothing."""
        if self.reason is not None:
            return
        self.reason = "failure" if reason == "user" and self.a_rank_failed() else reason
        self.kill_deadline = time.monotonic() + self.grace_s
        self.signal_all(signal.SIGTERM)
        self.tick()

    def kill_now(self) -> None:
        """Kill every rank at once (`job.kill()`, an interrupt while the job stops)."""
        self.begin("user")
        self.kill_deadline = time.monotonic()

    def a_rank_failed(self) -> bool:
        """True once a rank has failed: collectives that need it can no longer complete."""
        return any(state.failure is not None for state in self.ranks)

    def tick(self) -> None:
        """SIGKILL every rank once grace_s is over; while a failed job stops, ask the ranks where they are."""
        if self.reason is None:
            return
        now = time.monotonic()
        if self.kill_deadline is not None and now >= self.kill_deadline:
            self.kill_deadline = now + _AGAIN_S
            self.signal_all(signal.SIGKILL)
        elif self.a_rank_failed() and (self._next_probe_s is None or now >= self._next_probe_s):
            self._next_probe_s = now + REPROBE_S
            for state in self.ranks:
                if state.returncode is None and state.failure is None:
                    self._ask_where(state)

    def answered_where(self, state: RankState) -> None:
        """A rank said where its main thread is: while a failed job stops, kill it if it waits in torch.distributed
        for the second answer in a row."""
        if self.reason is None or not self.a_rank_failed() or state.returncode is not None:
            return
        waiting = waits_in_torch_distributed(state.where or "")
        self._in_collective[state.rank] = self._in_collective.get(state.rank, 0) + 1 if waiting else 0
        if self._in_collective[state.rank] >= 2:
            self.signal(state, signal.SIGKILL)

    def signal_all(self, sig: int) -> None:
        """Send `sig` to every live rank (see `signal`)."""
        for state in self.ranks:
            self.signal(state, sig)

    @staticmethod
    def signal(state: RankState, sig: int) -> None:
        """Send `sig` to a live rank's whole process group (its keeper, its worker and what they started); first
        SIGKILL what it started that left the group (once the worker is gone, nothing would find those)."""
        if state.returncode is not None:
            return
        if exit_status(state.process.pid) is None:  # an exit we have not seen yet was not our doing
            state.signals_sent.append(sig)
        kill_escaped_descendants(state.process.pid)
        kill_group(state.process.pid, sig)
