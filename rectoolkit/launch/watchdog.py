"""When a running job must stop, and why: a rank's failure, or a time limit; and which rank hangs.

A rank's own failure (it raised, or died) stops the job at once. A failure that may be the consequence of another
rank (a lost peer, a collective that timed out) waits a moment (`SETTLE_S`, for the peers' own reports), then the
ranks still running are asked where their main thread is: one that is not inside torch.distributed, or that does
not answer, is the rank its peers waited for (a `RankHung` failure; see `blame`). A time limit (`timeout_s` for
the job, `straggler_timeout_s` once a rank has returned, `idle_timeout_s` for a silent rank) asks the late ranks
where they are, then stops the job with a LaunchTimeout that says it. How the ranks are then stopped is
`stopping`'s concern.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

from rectoolkit.launch.blame import (Failure, in_collective, is_timeout, last_sign_of_life, location, never_arrived,
                                    what_a_late_rank_looks_like)
from rectoolkit.launch.errors import LaunchTimeout
from rectoolkit.launch.rank import RankState, running_ranks, unfinished_ranks
from rectoolkit.launch.stopping import StopPolicy

PROBE_S = 3.0  # how long ranks get to say where their main thread is
# After a rank times out in a collective, how long the others get to report their own timeout before the
# launcher asks who is elsewhere: peers waiting in the same collective time out within moments of each other (a
# busy machine spreads that by seconds), and a peer caught between its timeout and its report is not the one
# that hung. At most half the collective timeout.
SETTLE_S = 5.0


class Watchdog:
    """Watches one job's ranks for failures and time limits, and starts its stop (`stopping.begin`) with the
    reason; a time limit's error is kept in `timeout_error`. Used by the job's monitor thread only: `fail` for
    each failure, `check` every poll."""

    def __init__(self, ranks: List[RankState], stopping: StopPolicy, ask_where: Callable[[RankState], None],
                 timeout_s: Optional[float], idle_timeout_s: Optional[float], straggler_timeout_s: Optional[float],
                 collective_timeout_s: float) -> None:
        self.ranks = ranks
        self.timeout_error: Optional[LaunchTimeout] = None
        self._stopping = stopping
        self._ask_where = ask_where
        self._timeout_s = timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._straggler_timeout_s = straggler_timeout_s
        self._collective_timeout_s = collective_timeout_s
        self._started_s = time.monotonic()
        self._probe: Optional[Tuple[float, List[RankState], Callable[[], None]]] = None
        self._probe_at: Optional[float] = None  # when to ask the ranks still running where they are (see fail)

    def fail(self, state: RankState, failure: Failure) -> None:
        """Record a rank's failure; stop the job, after asking the others where they are if it may be a
        consequence of a rank that hangs elsewhere."""
        if state.failure is None:
            state.failure = failure
        if self._stopping.reason is not None:
            return
        if failure.primary:
            self._probe = self._probe_at = None
            self._stopping.begin("failure")
        elif self._probe is None and self._probe_at is None:
            settle = min(SETTLE_S, (self._collective_timeout_s or 2 * SETTLE_S) / 2)
            self._probe_at = time.monotonic() + settle

    def check(self) -> None:
        """Start what is due: a time limit's probe, the probe after a consequence, the stop after a probe."""
        self._check_timeouts()
        self._check_probe()

    def _blame_the_absent(self) -> None:
        """After a collective timed out: a rank still running that is not inside a collective, or that does not
        answer, is the one its peers waited for. (A lost peer is found by its exit instead.)"""
        failed = [r for r in self.ranks if r.failure is not None]
        if any(r.failure.primary for r in failed) or not any(is_timeout(r.error.exc_message) for r in failed):
            return
        waiting = [r.rank for r in failed]
        first = min(r.failure.time for r in failed)
        for state in running_ranks(self.ranks):
            if state.where is None or not in_collective(state.where):
                state.failure = Failure(never_arrived(state.rank, waiting, state.where or "",
                                                      self._collective_timeout_s), first, True)

    def _whereabouts(self, ranks: Sequence[int]) -> str:
        parts = []
        for rank in ranks:
            state = self.ranks[rank]
            step = state.last_step if state.last_step is not None else "none"
            place = location(state.where) if state.where else "(no answer)"
            parts.append(f"rank {rank} (last reported step: {step}) is at {place}")
        return "; ".join(parts)

    def _check_timeouts(self) -> None:
        if self._stopping.reason is not None or self._probe is not None or self._probe_at is not None:
            return
        now = time.monotonic()
        unfinished = unfinished_ranks(self.ranks)
        if not unfinished:
            return
        returned = [r for r in self.ranks if r.returned_s is not None]
        if self._timeout_s is not None and now - self._started_s > self._timeout_s:
            self._timeout(unfinished, f"the job did not finish within timeout_s={self._timeout_s:g}: rank(s) "
                                      f"{unfinished} were still running", "otherwise raise timeout_s")
        elif (self._straggler_timeout_s is not None and returned
              and now - min(r.returned_s for r in returned) > self._straggler_timeout_s):
            self._timeout(unfinished, f"rank(s) {unfinished} were still running straggler_timeout_s="
                                      f"{self._straggler_timeout_s:g} s after rank(s) {[r.rank for r in returned]} "
                                      f"returned", "otherwise raise straggler_timeout_s (None: wait forever)")
        elif self._idle_timeout_s is not None:
            # counted from when a rank is up (its function called), not from its spawn: starting a rank (python,
            # torch, unpickling fn, the rendezvous, bounded by collective_timeout_s) may take long on a busy machine
            idle = [r for r in self.ranks if r.rank in unfinished and r.started
                    and now - r.last_message_s > self._idle_timeout_s]
            if idle:
                silences = "; ".join(f"rank {r.rank} since {last_sign_of_life(r.reports, r.last_step)}"
                                     for r in idle)
                self._timeout([r.rank for r in idle],
                              f"rank(s) {[r.rank for r in idle]} reported nothing for idle_timeout_s="
                              f"{self._idle_timeout_s:g} s ({silences})",
                              "if it was working, call ctx.report() more often or raise idle_timeout_s (None: no "
                              "limit)")

    def _timeout(self, ranks: List[int], what: str, fix: str) -> None:
        """Ask the late ranks where they are, then stop the job with a LaunchTimeout that says it."""
        def stop_with_timeout() -> None:
            looks = what_a_late_rank_looks_like([self.ranks[r].where or "" for r in ranks])
            self.timeout_error = LaunchTimeout(f"{what}: {self._whereabouts(ranks)}. {looks}; {fix}.", ranks)

        self._probe_then([self.ranks[r] for r in ranks], stop_with_timeout)

    def _probe_then(self, ranks: List[RankState], then: Callable[[], None]) -> None:
        for state in ranks:
            state.where = None
            self._ask_where(state)
        self._probe = (time.monotonic() + PROBE_S, ranks, then)

    def _check_probe(self) -> None:
        if self._probe_at is not None and time.monotonic() >= self._probe_at:
            self._probe_at = None
            if self._stopping.reason is None and self._probe is None:
                self._probe_then(running_ranks(self.ranks), self._blame_the_absent)
        if self._probe is None:
            return
        deadline, ranks, then = self._probe
        if time.monotonic() < deadline and any(r.where is None and r.returncode is None for r in ranks):
            return
        self._probe = None
        if self._stopping.reason is None:
            then()
            self._stopping.begin("timeout" if self.timeout_error is not None else "failure")
