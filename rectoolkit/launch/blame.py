"""Which rank is to blame when a job fails: the first failure that is not a consequence of another one.

When one rank dies (the OOM killer's SIGKILL, a crash in native code) or hangs, its peers notice a moment
later: their collectives fail with "Connection closed by peer", or time out waiting for it. The launcher
records every rank's failure with how it happened, and blames the earliest *primary* failure:

- a rank that raised an exception other than a lost peer or a timeout (ValueError, out of memory, ...);
- a rank that died (exit code or signal) before the launcher signalled it, or by a signal it did not send;
- a rank that never arrived at a collective its peers timed out in (the launcher asks every rank still
  running where its main thread is: a rank that is not inside torch.distributed is the one that hung).

Consequences (a lost peer, a collective timeout, a rank the launcher stopped) are kept in the error's
`other_errors`; only when every failure is a consequence is the earliest consequence reported.

    >>> describe_exit(-9)
    'was killed by signal 9 (SIGKILL; out of memory?)'
    >>> is_consequence("RuntimeError", "[pair.cc:534] Connection closed by peer [127.0.0.1]:6000")
    True
    >>> is_consequence("ValueError", "bad value 42")
    False
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from rectoolkit.launch.errors import WorkerError

# what a rank raises when a peer died, hung or closed its connection (gloo, NCCL, the TCPStore)
_CONSEQUENCE = re.compile(
    r"connection (closed|reset|refused)|closed by peer|broken pipe|remote process exited|ncclRemoteError|"
    r"timed out|timeout|failed to recv|recv\(\) failed|read error|was likely closed",
    re.IGNORECASE)

_LIKELY_CAUSE: Dict[int, str] = {
    signal.SIGKILL: "out of memory?",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGBUS: "a crash in native code, or /dev/shm full?",
    signal.SIGABRT: "an abort in native code",
    signal.SIGFPE: "a crash in native code",
    signal.SIGTERM: "stopped from outside the job",
    signal.SIGINT: "interrupted",
}


def describe_exit(returncode: int) -> str:
    """How a process ended, with the likely cause of a signal: 'was killed by signal 9 (SIGKILL; ...)'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"was killed by signal {number}"
    cause = _LIKELY_CAUSE.get(number)
    return f"was killed by signal {number} ({name}; {cause})" if cause else f"was killed by signal {number} ({name})"


# torch.distributed's own errors for a lost peer, store or backend
_DIST_ERROR_TYPES = ("DistNetworkError", "DistStoreError", "DistBackendError")
# the types a collective's failure reaches Python as (gloo and NCCL raise RuntimeError)
_TRANSPORT_ERROR_TYPES = ("RuntimeError", "ConnectionError", "ConnectionResetError", "ConnectionAbortedError",
                          "ConnectionRefusedError", "BrokenPipeError", "TimeoutError")
# where such an error comes from when it is a consequence: torch, or rectoolkit's collectives and launcher
_LIBRARY_FILE = re.compile(r"[/\\](torch|rectoolkit[/\\](distributed|launch))[/\\]")
# or the words of native code: a C++ source location ("[pair.cc:534]") or the backend's name
_NATIVE_MESSAGE = re.compile(r"\[[^\]]*\.(cc|cpp|cu|h|hpp):\d+\]|\bgloo\b|\bnccl|\bc10d\b", re.IGNORECASE)


def raised_in(traceback_text: str) -> str:
    """The file of the innermost frame of a formatted traceback ('' if it has none)."""
    files = re.findall(r'^\s*File "([^"]+)", line \d+', traceback_text, re.MULTILINE)
    return files[-1] if files else ""


def is_consequence(exc_type: str, message: str, traceback_text: Optional[str] = None) -> bool:
    """True for an error that a rank raises because of a peer: a lost connection, a timed-out collective.

    torch.distributed's own error types always are. Otherwise it takes a transport's error type (RuntimeError,
    ConnectionError, ...) with a lost peer's or a timeout's words, raised inside torch or rectoolkit's collectives
    (the innermost frame of `traceback_text`, when given) or in native code (the message names a C++ source
    location, gloo, NCCL or c10d: a Work.wait() in the caller's code): the caller's own ValueError("read_timeout must be
    positive"), or a RuntimeError its own code raises, is the failure itself, whatever its words.

        >>> is_consequence("ValueError", "config error: read_timeout must be positive")
        False
        >>> user_code = '  File "/home/me/train.py", line 3, in step'
        >>> is_consequence("RuntimeError", "timed out", user_code), is_consequence("RuntimeError", "timed out")
        (False, True)
    """
    if exc_type in _DIST_ERROR_TYPES:
        return True
    if exc_type not in _TRANSPORT_ERROR_TYPES or not _CONSEQUENCE.search(message):
        return False
    return (traceback_text is None or bool(_NATIVE_MESSAGE.search(message))
            or bool(_LIBRARY_FILE.search(raised_in(traceback_text))))


def is_timeout(message: str) -> bool:
    """True for a rank's error that says it gave up waiting (a collective or the store timed out)."""
    return bool(re.search(r"timed out|timeout", message, re.IGNORECASE))


def in_collective(stack: str) -> bool:
    """True if a rank's main-thread stack shows it inside torch.distributed (waiting in a collective)."""
    return "torch/distributed/" in stack.replace("\\", "/")


def location(stack: str) -> str:
    """The innermost frame of a formatted stack, on one line: 'File "x.py", line 7, in work: time.sleep(9)'."""
    lines = [line.strip() for line in stack.strip().splitlines()]
    frames = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not frames:
        return "an unknown place"
    last = frames[-1]
    code = lines[last + 1] if last + 1 < len(lines) and not lines[last + 1].startswith("File ") else ""
    return f"{lines[last]}: {code}" if code else lines[last]


def last_sign_of_life(reports: int, last_step) -> str:
    """What a silent rank last did that the launcher saw, after 'since':

        >>> last_sign_of_life(0, None), last_sign_of_life(3, 7)
        ('its function started (no report yet)', 'its last report (step 7)')
    """
    if not reports:
        return "its function started (no report yet)"
    return f"its last report (step {last_step})" if last_step is not None else "its last report"


def what_a_late_rank_looks_like(stacks: Sequence[str]) -> str:
    """The likely story of late ranks from where their main threads are ('' for no answer): a collective that
    a peer never entered only when one of them is inside torch.distributed, else their own code.

        >>> what_a_late_rank_looks_like(['File "train.py", line 3, in step']).split(" (")[0]
        'A rank busy or stuck in its own code'
        >>> what_a_late_rank_looks_like(['File ".../torch/distributed/c10d.py", line 9, in all_reduce', ''])[:26]
        'A rank waiting in a collec'
    """
    if any(in_collective(stack) for stack in stacks):
        return "A rank waiting in a collective that another rank never entered looks like this"
    return "A rank busy or stuck in its own code (a loop, a slow import or step, a wait on a lock) looks like this"


@dataclass
class Failure:
    """One rank's failure as the launcher saw it; `primary` is False for a consequence of another failure."""

    error: WorkerError
    time: float  # wall-clock seconds, comparable across ranks of one machine
    primary: bool


def died(rank: int, returncode: int, output_tail: str) -> WorkerError:
    """The error of a rank whose process ended without reporting a result or an exception."""
    message = f"rank {rank} {describe_exit(returncode)} without reporting a result or an exception"
    return WorkerError(rank, "WorkerDied", message,
                       f"last output of rank {rank}:\n{output_tail}" if output_tail else "")


def never_arrived(rank: int, waiting: Sequence[int], stack: str, collective_timeout_s: float) -> WorkerError:
    """The error of a rank that was elsewhere (or silent) while its peers timed out in a collective."""
    if stack:
        message = (f"rank {rank} never arrived at the collective that rank(s) {list(waiting)} waited in until "
                   f"collective_timeout_s={collective_timeout_s:g} ran out: it was at {location(stack)}")
        trace = f"where rank {rank}'s main thread was when its peers timed out:\n{stack}"
    else:
        message = (f"rank {rank} did not answer while rank(s) {list(waiting)} timed out waiting for it in a "
                   f"collective (collective_timeout_s={collective_timeout_s:g}): it looks stuck in native code")
        trace = ""
    return WorkerError(rank, "RankHung", message, trace)


def culprit(failures: Sequence[Failure], returned: Sequence[int] = ()) -> WorkerError:
    """The error to raise: the earliest primary failure (else the earliest one), the rest as `other_errors`.

    When only consequences are left and some ranks had already returned (`returned`), the message says so:
    a peer that returned is the usual reason for a collective that fails for lack of a peer.
    """
    ordered: List[Failure] = sorted(failures, key=lambda f: (not f.primary, f.time))
    first = ordered[0].error
    message = first.exc_message
    if not ordered[0].primary and returned:
        message += (f" (rank(s) {list(returned)} had already returned: did every rank call the same "
                    f"collectives?)")
    return WorkerError(first.rank, first.exc_type, message, first.traceback, [f.error for f in ordered[1:]])
