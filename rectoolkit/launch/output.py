"""What the ranks print: kept per rank (`job.output(rank)`) and echoed to the caller as "[rank r] ..." as it arrives.

A line that ends in "\\n" is kept and echoed at once, as written. A line that is still open but holds a carriage
return is a progress bar (tqdm writes "\\r 10%|#  | 10/100" and no newline until the bar closes): it is echoed as a
terminal shows it, its latest segment, with the carriage return last ("[rank 0]  10%|#  | 10/100\\r") so that the
next echo overwrites it, in a terminal as in a notebook's output. Progress is echoed at most once per
`PROGRESS_INTERVAL_S` per rank, the latest segment winning, so a bar updated a thousand times a second does not
flood the notebook; a segment held back is echoed when its interval is over, even if nothing else arrives.

    >>> echo = Echo(write=print_as_is)
    >>> out = RankOutput(0, lines=[], echo=echo)
    >>> out.feed("epoch 1\\n\\r 10%|#  |", now=0.0)
    '[rank 0] epoch 1\\n'
    '[rank 0]  10%|#  |\\r'
    >>> out.feed("\\r 20%|## |", now=0.1)         # too soon after the last echo: held back
    >>> out.flush_due(now=0.3)                      # its interval is over: echoed
    '[rank 0]  20%|## |\\r'
    >>> out.feed("\\r100%|###|\\n", now=0.35)      # the bar closes: a line, kept as a terminal shows it
    '[rank 0] 100%|###|\\n'
    >>> out.lines
    ['epoch 1\\n', '100%|###|\\n']
"""

from __future__ import annotations

import codecs
import os
import select
import sys
import threading
import time
from typing import BinaryIO, Callable, MutableSequence, Optional

PROGRESS_INTERVAL_S = 0.2  # at most one progress echo per rank in this time; the latest segment is the one shown


def print_as_is(text: str) -> None:
    """Print `text` as its repr (for this module's examples, where "\\r" must show)."""
    print(repr(text))


def terminal_view(line: str) -> str:
    """What a terminal shows of a line written with carriage returns: its last non-empty segment.

        >>> terminal_view("\\r 10%|#  |\\r 20%|## |"), terminal_view("done\\r"), terminal_view("plain")
        (' 20%|## |', 'done', 'plain')
    """
    segments = [segment for segment in line.split("\r") if segment]
    return segments[-1] if segments else ""


class Echo:
    """Where the ranks' echoed output goes: `write` (default: the caller's sys.stdout, looked up at each write, so
    that a notebook's or a test's replacement is used). One lock for all ranks, and the width of a progress line
    still shown, so that the next line covers it completely (a terminal only overwrites the characters it writes)."""

    def __init__(self, write: Optional[Callable[[str], object]] = None) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._progress_width = 0  # characters of the progress line the cursor sits at the start of, 0 if none

    def _emit(self, text: str) -> None:
        (self._write or sys.stdout.write)(text)

    def line(self, text: str) -> None:
        """Echo one finished line (without its newline)."""
        with self._lock:
            self._emit(text.ljust(self._progress_width) + "\n")
            self._progress_width = 0

    def progress(self, text: str) -> None:
        """Echo a progress line, leaving the cursor at its start so that the next echo overwrites it."""
        with self._lock:
            self._emit(text.ljust(self._progress_width) + "\r")
            self._progress_width = len(text)


class RankOutput:
    """One rank's output as it arrives: finished lines kept in `lines` (trimmed by the caller's deque) and echoed
    through `echo` (None: kept only), progress echoed at most once per `interval_s`. Fed by one thread only."""

    def __init__(self, rank: int, lines: MutableSequence[str], echo: Optional[Echo],
                 interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.rank = rank
        self.lines = lines
        self._echo = echo
        self._interval_s = interval_s
        self._open = ""  # the line not finished yet (with progress: only its latest segment)
        self._shown: Optional[str] = None  # the progress segment last echoed for the open line
        self._last_progress_s = float("-inf")
        self._due_s: Optional[float] = None  # when the progress held back is to be echoed

    def feed(self, text: str, now: float) -> None:
        """Take what the rank wrote next (any piece: part of a line, several lines); `now` is time.monotonic()."""
        *finished, self._open = (self._open + text).split("\n")
        for line in finished:
            self._finish(terminal_view(line))
        if "\r" in self._open:
            latest = terminal_view(self._open)
            # only the latest segment matters to what is shown and to the line kept, however long the bar runs
            self._open = "\r" + latest + ("\r" if self._open.endswith("\r") else "")
            self._progress(latest, now)

    def due_in(self, now: float) -> Optional[float]:
        """Seconds until the progress held back is to be echoed (0 if overdue), None if nothing is held back."""
        return None if self._due_s is None else max(0.0, self._due_s - now)

    def flush_due(self, now: float) -> None:
        """Echo the progress held back if its interval is over."""
        if self._due_s is not None and now >= self._due_s:
            self._show(terminal_view(self._open), now)

    def close(self) -> None:
        """The rank's output has ended: keep and echo a last line that has no newline (as a line)."""
        view = terminal_view(self._open)
        self._open, self._due_s = "", None
        if view:
            self.lines.append(view)
            if self._echo is not None:
                self._echo.line(f"[rank {self.rank}] {view}")

    def _finish(self, view: str) -> None:
        self._shown, self._due_s = None, None
        self.lines.append(view + "\n")
        if self._echo is not None:
            self._echo.line(f"[rank {self.rank}] {view}")

    def _progress(self, latest: str, now: float) -> None:
        if not latest or latest == self._shown:
            self._due_s = None
        elif now - self._last_progress_s >= self._interval_s:
            self._show(latest, now)
        else:
            self._due_s = self._last_progress_s + self._interval_s

    def _show(self, latest: str, now: float) -> None:
        self._due_s = None
        if latest and latest != self._shown:
            self._shown, self._last_progress_s = latest, now
            if self._echo is not None:
                self._echo.progress(f"[rank {self.rank}] {latest}")


def read_output(stream: BinaryIO, output: RankOutput) -> None:
    """Read a rank's output pipe into `output` until every writer has closed it, then close it. Reads what has
    arrived (not line by line), so an open progress line is seen; wakes up when held-back progress is due."""
    fd = stream.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may be split between reads
    poller = select.poll()  # not select.select: a notebook may hold more than FD_SETSIZE files
    poller.register(fd, select.POLLIN)
    try:
        while True:
            wait_s = output.due_in(time.monotonic())
            if poller.poll(None if wait_s is None else max(1, int(wait_s * 1000) + 1)):
                data = os.read(fd, 65536)
                if not data:
                    break
                output.feed(decoder.decode(data), time.monotonic())
            output.flush_due(time.monotonic())
        output.feed(decoder.decode(b"", final=True), time.monotonic())
        output.close()
    finally:
        stream.close()
