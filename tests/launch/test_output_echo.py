"""The ranks' output echoed to the caller: whole lines as written, progress bars (carriage returns, no newline
until the end) as their latest state while they run, never flooding. The unit tests feed `RankOutput` with a
clock of their own (no sleeps, no processes); one case checks a real job end to end, waiting on a file."""

from __future__ import annotations

import doctest
import io
import os
import threading

import pytest
from test_faults import run_case

import rectoolkit.launch.output
from rectoolkit.launch.output import Echo, RankOutput, read_output, terminal_view


def _output(rank: int = 0, interval_s: float = 0.2):
    stream = io.StringIO()
    lines: list = []
    return RankOutput(rank, lines, Echo(write=stream.write), interval_s=interval_s), stream, lines


def test_the_module_examples_run():
    assert doctest.testmod(rectoolkit.launch.output).failed == 0


def test_lines_that_end_in_a_newline_are_echoed_at_once_as_written():
    out, stream, lines = _output(rank=3)
    out.feed("first line\nsecond ", now=0.0)
    assert stream.getvalue() == "[rank 3] first line\n"  # the open line waits for its newline, as before
    out.feed("half\n\n", now=0.0)
    assert stream.getvalue() == "[rank 3] first line\n[rank 3] second half\n[rank 3] \n"
    assert lines == ["first line\n", "second half\n", "\n"]


def test_a_carriage_return_segment_is_echoed_as_it_arrives_with_the_rank_prefix():
    out, stream, _ = _output(rank=1)
    out.feed("step 1 of 3\r", now=0.0)  # \r-terminated
    assert stream.getvalue() == "[rank 1] step 1 of 3\r"
    out.feed("\rstep 2 of 3", now=5.0)  # tqdm's way: the \r first, the text open
    assert stream.getvalue() == "[rank 1] step 1 of 3\r[rank 1] step 2 of 3\r"


def test_progress_is_rate_limited_and_the_latest_segment_is_shown_when_due():
    out, stream, _ = _output(interval_s=0.2)
    for update in range(10_000):  # a bar redrawn 10,000 times within one second
        out.feed(f"\r{update:5d}/10000", now=update * 1e-4)
        out.flush_due(now=update * 1e-4)
    echoed = stream.getvalue().split("\r")[:-1]
    assert 2 <= len(echoed) <= 1 / 0.2 + 1, len(echoed)
    assert out.due_in(now=0.9999) is not None  # the last update is held back, not lost
    out.flush_due(now=2.0)
    assert stream.getvalue().split("\r")[-2] == "[rank 0]  9999/10000"
    assert out.due_in(now=2.0) is None


def test_a_line_that_ends_a_progress_bar_is_kept_as_a_terminal_shows_it_and_covers_the_bar():
    out, stream, lines = _output()
    out.feed("\r 10%|#         | 1/10 [00:01<00:09]", now=0.0)
    out.feed("\r100%|##########| 10/10\n", now=1.0)
    assert lines == ["100%|##########| 10/10\n"]
    echoed = stream.getvalue().split("\r")[-1]
    assert echoed.startswith("[rank 0] 100%|##########| 10/10") and echoed.endswith("\n")
    assert len(echoed) - 1 >= len("[rank 0]  10%|#         | 1/10 [00:01<00:09]")  # no tail of the bar left


def test_windows_line_endings_and_a_last_line_without_newline():
    out, stream, lines = _output()
    out.feed("one\r\ntwo\r", now=0.0)
    out.feed("\nthree", now=0.0)
    out.close()
    assert lines == ["one\n", "two\n", "three"]
    assert stream.getvalue().endswith("[rank 0] three\n")


def test_nothing_is_echoed_when_echo_is_off_but_lines_are_kept():
    lines: list = []
    out = RankOutput(0, lines, None)
    out.feed("a\n\rb", now=0.0)
    out.close()
    assert lines == ["a\n", "b"]


def test_terminal_view():
    assert terminal_view("") == "" and terminal_view("\r\r") == "" and terminal_view("a\rb\r") == "b"


def test_read_output_reads_pieces_splits_no_character_and_closes_the_pipe():
    read_end, write_end = os.pipe()
    lines: list = []
    stream = io.StringIO()
    out = RankOutput(0, lines, Echo(write=stream.write))
    data = "caf\u00e9\n\r 50%".encode()
    cut = data.index(b"\xa9")  # in the middle of the two bytes of "é"
    os.write(write_end, data[:cut])
    reader = threading.Thread(target=read_output, args=(os.fdopen(read_end, "rb"), out))
    reader.start()
    os.write(write_end, data[cut:])
    os.close(write_end)
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert lines == ["caf\u00e9\n", " 50%"]
    assert "[rank 0] caf\u00e9\n" in stream.getvalue()


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_job_echoes_a_progress_line_before_its_newline_comes(tmp_path):
    # rank 0 draws a progress bar and does not end its line until the caller has echoed the bar's latest state
    result = run_case(tmp_path, f'''
SEEN = Path({str(tmp_path / "seen")!r})

class WatchedStdout:
    """The caller's stdout, which notes when rank 0's latest progress has been echoed."""
    def __init__(self, stream):
        self.stream, self.text = stream, ""
    def write(self, text):
        self.text += text
        if "[rank 0] step 2 of 3\\r" in self.text and not SEEN.exists():
            SEEN.write_text("")
        return self.stream.write(text)
    def flush(self):
        self.stream.flush()

def work(ctx):
    if ctx.rank == 0:
        print("starting", flush=True)
        print("\\rstep 1 of 3", end="", flush=True)
        print("\\rstep 2 of 3", end="", flush=True)  # at once: held back, then shown when due
        deadline = time.time() + 90
        while not SEEN.exists():
            if time.time() > deadline:
                raise TimeoutError("the caller never echoed the progress line")
            time.sleep(0.05)
        print("\\rstep 3 of 3\\ndone", flush=True)
    return ctx.rank

watched = sys.stdout = WatchedStdout(sys.stdout)
try:
    results = launch(work, 2, grace_s=1.0)
    error = None
except WorkerError as failed:
    results, error = None, str(failed)
sys.stdout = watched.stream
emit(results=results, error=error, echoed=watched.text)
''')
    assert result["error"] is None, result["error"]
    assert result["results"] == [0, 1]
    echoed = result["echoed"]
    assert "[rank 0] starting\n" in echoed and "[rank 0] step 2 of 3\r" in echoed, echoed
    assert "[rank 0] step 3 of 3" in echoed and "[rank 0] done\n" in echoed, echoed
    assert echoed.index("[rank 0] step 2 of 3\r") < echoed.index("[rank 0] step 3 of 3"), echoed
