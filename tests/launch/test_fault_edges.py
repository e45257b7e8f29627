"""Faults at the edges of a job's life: ranks slow to start under `idle_timeout_s`, an interrupt while a failed
job is stopping, a function that closes its stdout. Each case runs as a caller script in a subprocess (`test_faults.run_case`), so a hang fails the
case instead of hanging the suite; the cases wait on files and reports, never on a guessed delay."""

from __future__ import annotations

import pytest
from test_faults import run_case

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def test_the_idle_clock_starts_when_a_rank_is_up_not_when_it_is_spawned(tmp_path):
    # Both ranks spend longer than idle_timeout_s importing a module before their function starts (the caller
    # holds the import until that much time has passed since the spawn); the job must still succeed.
    result = run_case(tmp_path, f'''
TMP = Path({str(tmp_path)!r})
(TMP / "slow_import.py").write_text("""
import os, time
from pathlib import Path
if "RANK" in os.environ:  # in a worker: an import that takes as long as the caller says
    Path(r"{tmp_path}", "importing-" + os.environ["RANK"]).write_text("")
    while not Path(r"{tmp_path}", "go").exists():
        time.sleep(0.05)

def work(ctx):
    ctx.report(step=0)
    return ctx.rank
""")
sys.path.insert(0, str(TMP))
from slow_import import work

IDLE_S = 4.0  # the ranks report at once once up; a clock counted from the spawn passes it 3 s before "go"
job = start(work, 2, idle_timeout_s=IDLE_S, grace_s=1.0, echo_output=False)
spawned = time.monotonic()
deadline = spawned + 120
while not all((TMP / f"importing-{{rank}}").exists() for rank in range(2)) and time.monotonic() < deadline:
    time.sleep(0.05)
importing = sorted(path.name for path in TMP.glob("importing-*"))
while time.monotonic() - spawned < IDLE_S + 3:  # the ranks have been silent since their spawn for longer
    time.sleep(0.1)
(TMP / "go").write_text("")
try:
    emit(results=job.wait(timeout=120), importing=importing, leftover=marked_processes())
except LaunchTimeout as error:
    emit(error=error_summary(error))
''')
    assert result.get("error") is None, result["error"]["text"]
    assert result["importing"] == ["importing-0", "importing-1"]
    assert result["results"] == [0, 1] and result["leftover"] == []


def test_an_idle_rank_is_named_with_where_it_was_and_what_to_raise(tmp_path):
    result = run_case(tmp_path, '''
def work(ctx):
    ctx.report(step=3)
    if ctx.rank == 1:
        thinking_without_reporting()
    return ctx.rank

def thinking_without_reporting():
    while True:
        time.sleep(0.1)

try:
    launch(work, 2, idle_timeout_s=3.0, grace_s=1.0, echo_output=False)
    emit(error=None)
except LaunchTimeout as error:
    emit(error=error_summary(error), leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["ranks"] == [1], error
    text = error["text"]
    assert "rank(s) [1] reported nothing for idle_timeout_s=3 s" in text, text
    assert "since its last report (step 3)" in text and "thinking_without_reporting" in text, text
    assert "raise idle_timeout_s" in text, text
    assert "collective" not in text, text  # it was in its own code: no collective is blamed
    assert result["leftover"] == []


def test_an_interrupt_while_a_failed_job_stops_kills_at_once_and_keeps_the_failure(tmp_path):
    # rank 1 fails; rank 0 ignores the SIGTERM that stops it, so the job would wait grace_s (an hour) before
    # SIGKILL. Ctrl-C then must kill rank 0 at once, and the KeyboardInterrupt must carry rank 1's error.
    result = run_case(tmp_path, '''
def work(ctx):
    import torch.distributed as dist
    terminated = threading.Event()
    if ctx.rank == 0:
        signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    dist.barrier()  # rank 1 fails only once rank 0 ignores SIGTERM
    if ctx.rank == 1:
        raise ValueError("rank 1's own error")
    while not terminated.wait(0.1):
        pass
    ctx.report(ignoring_sigterm=True)
    while True:
        time.sleep(0.1)

def interrupt_once_rank_0_ignores_its_sigterm(metrics):
    if metrics.get("ignoring_sigterm"):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while the failed job waits for rank 0

try:
    launch(work, 2, grace_s=3600.0, on_metrics=interrupt_once_rank_0_ignores_its_sigterm, echo_output=False)
    emit(outcome="returned")
except KeyboardInterrupt as interrupt:
    context = interrupt.__context__
    emit(outcome="KeyboardInterrupt", context=error_summary(context) if context is not None else None,
         notes=getattr(interrupt, "__notes__", []), leftover=marked_processes())
''')
    assert result["outcome"] == "KeyboardInterrupt", result
    context = result["context"]
    assert context is not None and context["type"] == "WorkerError", result
    assert context["rank"] == 1 and context["exc_type"] == "ValueError", context
    assert "rank 1's own error" in context["text"]
    assert any("rank 1 had already failed" in note for note in result["notes"]), result["notes"]
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


def test_a_function_that_closes_its_stdout_returns_cleanly(tmp_path):
    result = run_case(tmp_path, '''
def work(ctx):
    print("rank", ctx.rank, "closes its stdout", flush=True)
    sys.stdout.close()
    return ctx.rank

job = start(work, 2, echo_output=False)
emit(results=job.wait(timeout=120), output=[job.output(rank) for rank in range(2)], leftover=marked_processes())
''')
    assert result["results"] == [0, 1]
    for rank, output in enumerate(result["output"]):
        assert f"rank {rank} closes its stdout" in output and "Traceback" not in output, output
    assert result["leftover"] == []


def test_a_second_interrupt_while_launch_stops_the_job_kills_at_once(tmp_path):
    # The first Ctrl-C stops the job gracefully (SIGTERM, grace_s); rank 0 ignores its SIGTERM, so the stop
    # would wait grace_s (an hour). A second Ctrl-C then must kill it at once.
    result = run_case(tmp_path, f'''
IGNORING = Path({str(tmp_path / "ignoring")!r})

def work(ctx):
    if ctx.rank == 0:
        signal.signal(signal.SIGTERM, lambda *_: IGNORING.write_text("rank 0 ignores its SIGTERM"))
    ctx.report(ready=True)
    while True:
        time.sleep(0.1)

def interrupt_again_once_rank_0_ignores_its_sigterm():
    while not IGNORING.exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)

ready = set()
def interrupt_once_both_ranks_are_ready(metrics):
    ready.add(metrics["rank"])
    if ready == {{0, 1}}:
        threading.Thread(target=interrupt_again_once_rank_0_ignores_its_sigterm, daemon=True).start()
        os.kill(os.getpid(), signal.SIGINT)

try:
    launch(work, 2, grace_s=3600.0, on_metrics=interrupt_once_both_ranks_are_ready, echo_output=False)
    emit(outcome="returned")
except KeyboardInterrupt:
    emit(outcome="KeyboardInterrupt", ignored=IGNORING.exists(), leftover=marked_processes())
''')
    assert result["outcome"] == "KeyboardInterrupt" and result["ignored"] is True, result
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []
