"""The errors a launched job raises in the caller: a worker failed, or the job ran out of time."""

from __future__ import annotations

from typing import List, Optional, Sequence


def exception_text(exc: BaseException) -> str:
    """str(exc), or what can be said when that raises too (an exception class with a broken __str__, even one
    that raises KeyboardInterrupt or another BaseException).

        >>> class Unprintable(Exception):
        ...     def __str__(self):
        ...         raise KeyboardInterrupt
        >>> exception_text(ValueError("bad")), exception_text(Unprintable())
        ('bad', '<str() of this Unprintable raised KeyboardInterrupt: >')
    """
    try:
        return str(exc)
    except BaseException as broken:
        try:
            said = str(broken)
        except BaseException:
            said = "(its str() raised too)"
        return f"<str() of this {type(exc).__name__} raised {type(broken).__name__}: {said}>"


class LaunchError(RuntimeError):
    """Base class of everything `rectoolkit.launch` raises about a job."""


class WorkerError(LaunchError):
    """A worker raised, died or hung: names the rank at fault and carries that worker's formatted traceback.

    Attributes: `rank`, `exc_type` (the exception's class name, e.g. "ValueError"; "WorkerDied" for a process
    that ended without a word, e.g. killed by a signal; "RankHung" for a rank that never arrived at a
    collective its peers timed out in), `exc_message`, `traceback` (the worker's text, or where a hung rank
    was), `other_errors` (what other ranks reported, usually consequences such as "Connection closed by
    peer"; see `rectoolkit.launch.blame`).
    """

    def __init__(self, rank: int, exc_type: str, exc_message: str, traceback: str,
                 other_errors: Optional[Sequence["WorkerError"]] = None) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback = traceback
        self.other_errors: List[WorkerError] = list(other_errors or [])
        text = f"rank {rank} failed: {exc_type}: {exc_message}"
        if traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{traceback.rstrip()}"
        if self.other_errors:
            others = ", ".join(f"rank {e.rank} ({e.exc_type})" for e in self.other_errors)
            text += f"\n\n(also failed while the job was stopped: {others}; see .other_errors)"
        super().__init__(text)

    def __reduce__(self):
        return (WorkerError, (self.rank, self.exc_type, self.exc_message, self.traceback, self.other_errors))


class LaunchTimeout(LaunchError):
    """The job (or some ranks) did not finish in time; `ranks` lists the ranks still running."""

    def __init__(self, message: str, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        super().__init__(message)

    def __reduce__(self):
        return (LaunchTimeout, (self.args[0], self.ranks))


class JobStopped(LaunchError):
    """The job was stopped by the caller (`job.stop()` or an interrupt) before every rank finished."""
