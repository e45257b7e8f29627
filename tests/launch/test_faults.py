"""Fault injection for rectoolkit.launch: interrupts, killed and crashing ranks, hangs, helpers left behind.

Each case runs a small caller script in a process of its own with a timeout, so a hang fails the test instead
of hanging the suite (forked from a server that has imported rectoolkit.launch once: `launch_callers`). The worker functions live in the script's `__main__`, as in a notebook. Every process of a
case (workers and the helpers they start) carries an environment mark unique to the case; the caller counts
the marked processes while the job runs (so the counter is shown to work) and after it (0 orphans).
"""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from pathlib import Path

import launch_callers
import pytest

from rectoolkit.launch import launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]

PRELUDE = '''
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path
from rectoolkit.launch import JobStopped, LaunchTimeout, WorkerError, launch, start

MARK = os.environ["FAULT_MARK"]
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a kernel, even if pytest runs with SIGINT ignored

def marked_processes():
    """Live processes (not this one) whose environment carries this case's mark: workers and helpers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
        except (OSError, IndexError):
            continue
        if state != "Z" and f"FAULT_MARK={MARK}".encode() in environ.split(b"\\0"):
            found.append(int(entry.name))
    return found

def start_helpers():
    """What a training function might start: a helper in its process group, and one that left it."""
    return [subprocess.Popen(["sleep", "300"]).pid,
            subprocess.Popen(["sleep", "300"], start_new_session=True).pid]

def error_summary(error):
    return {"type": type(error).__name__, "rank": getattr(error, "rank", None),
            "ranks": getattr(error, "ranks", None), "exc_type": getattr(error, "exc_type", None),
            "text": str(error), "traceback": getattr(error, "traceback", ""),
            "others": [(e.rank, e.exc_type, e.exc_message) for e in getattr(error, "other_errors", [])]}

def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)
'''


def run_case(tmp_path: Path, body: str, timeout_s: float = 180) -> dict:
    """Run PRELUDE + body as a caller script (in a process of its own, forked with rectoolkit.launch already
    imported: see launch_callers); return the dict it emitted. A hang fails here, after timeout_s."""
    script = tmp_path / "case.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(REPO), FAULT_MARK=mark)
    code, out, err = launch_callers.run(script, env, timeout_s)
    if code is None:
        pytest.fail(f"the case hung (no result within {timeout_s} s)\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert code == 0 and lines, f"exit {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    result["leftover_after_caller_exit"] = _marked_processes(mark)
    return result


def _marked_processes(mark: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes()
        except (OSError, IndexError):
            continue
        if state != "Z" and f"FAULT_MARK={mark}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


TRAIN = '''
def train(ctx, steps=None):
    """A training loop with a collective per step, that starts two helpers first."""
    import torch
    import torch.distributed as dist
    helpers = start_helpers()
    weight = torch.zeros(256)
    step = 0
    while steps is None or step < steps:
        grad = torch.randn(256)
        dist.all_reduce(grad)
        weight -= 0.01 * grad
        ctx.report(step=step, loss=float(weight.norm()), pid=os.getpid(), helpers=helpers)
        step += 1
        time.sleep(0.01)
    return ctx.rank
'''


def test_sigint_at_any_moment_stops_every_worker_and_helper_and_the_next_launch_works(tmp_path):
    # The caller interrupts itself (a process-directed SIGINT, as Ctrl-C or Jupyter's button sends) three
    # times: during start-up, mid-training, and while the first metrics arrive; then launches once more.
    result = run_case(tmp_path, TRAIN + '''
seen = {}
def remember(metrics):
    seen[metrics["rank"]] = [metrics["pid"]] + metrics["helpers"]

def interrupt_after(event, delay_s):
    def fire():
        event.wait()
        time.sleep(delay_s)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=fire, daemon=True).start()

rounds = []
for moment, delay_s in (("start-up", 0.5), ("mid-training", 1.5), ("first metrics", 0.0)):
    seen.clear()
    launched, first_metrics = threading.Event(), threading.Event()
    interrupt_after(launched if moment == "start-up" else first_metrics, delay_s)
    outcome = "returned"
    try:
        launched.set()
        launch(train, 2, on_metrics=lambda m: (remember(m), first_metrics.set()), grace_s=2.0,
               echo_output=False)
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    processes = [pid for pids in seen.values() for pid in pids]
    rounds.append({"moment": moment, "outcome": outcome, "seen_processes": len(processes),
                   "leftover": marked_processes()})
after = launch(train, 2, 3, echo_output=False)
emit(rounds=rounds, after=after, leftover=marked_processes())
''')
    for row in result["rounds"]:
        assert row["outcome"] == "KeyboardInterrupt", row
        assert row["leftover"] == [], f"processes left after an interrupt at {row['moment']}: {row}"
    mid = next(row for row in result["rounds"] if row["moment"] == "mid-training")
    assert mid["seen_processes"] == 6  # 2 workers + 2 helpers each were running when the interrupt came
    assert result["after"] == [0, 1]
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


def test_stop_from_the_metrics_callback_and_interrupt_during_wait(tmp_path):
    result = run_case(tmp_path, TRAIN + '''
job = start(train, 2, grace_s=2.0, echo_output=False, on_metrics=lambda m: job.stop())  # monitor's thread
try:
    job.wait(timeout=120)
    stopped = "returned"
except JobStopped as error:
    stopped = "JobStopped"
# an interrupt while the caller blocks in wait(): the caller stops the job, nothing is left
job = start(train, 2, grace_s=2.0, echo_output=False)
next(job.metrics())
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    job.wait()
    interrupted = "returned"
except KeyboardInterrupt:
    job.stop()
    interrupted = "KeyboardInterrupt"
emit(stopped=stopped, interrupted=interrupted, done=job.done, leftover=marked_processes())
''')
    assert result["stopped"] == "JobStopped"
    assert result["interrupted"] == "KeyboardInterrupt" and result["done"] is True
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


# how rank 1 fails mid-training, while rank 0 waits for it in a collective; what the error must say
FAILURES = {
    "sigkill": ("os.kill(os.getpid(), signal.SIGKILL)", "WorkerDied",
                ["rank 1 was killed by signal 9 (SIGKILL; out of memory?)"]),
    "sigsegv": ("os.kill(os.getpid(), signal.SIGSEGV)", "WorkerDied",
                ["rank 1 was killed by signal 11 (SIGSEGV; a crash in native code)"]),
    "exit": ("os._exit(3)", "WorkerDied", ["rank 1 exited with code 3"]),
    "raise": ("raise MemoryError('cannot allocate 12 GiB')", "MemoryError", ["cannot allocate 12 GiB"]),
    # the caller's own errors in a lost peer's or a timeout's words are still the caller's failure
    "raise_timeout_words": ("raise TimeoutError('the feature store timed out')", "TimeoutError",
                            ["the feature store timed out"]),
    "raise_connection_words": ("raise RuntimeError('lookup service: connection refused')", "RuntimeError",
                               ["lookup service: connection refused"]),
}


@pytest.mark.parametrize("how", sorted(FAILURES))
def test_the_rank_that_failed_is_blamed_not_the_rank_that_noticed(tmp_path, how):
    statement, exc_type, phrases = FAILURES[how]
    result = run_case(tmp_path, f'''
def work(ctx):
    import torch
    import torch.distributed as dist
    helpers = start_helpers()
    ctx.report(step=0, helpers=helpers)
    for step in range(1, 10_000):
        if ctx.rank == 1 and step == 20:
            {statement}
        dist.all_reduce(torch.ones(4))  # rank 0 is here, waiting for rank 1, when rank 1 fails
        time.sleep(0.005)
    return ctx.rank

during = []
def count(metrics):
    if len(during) == 0:
        during.append(len(marked_processes()))
try:
    launch(work, 2, on_metrics=count, grace_s=2.0, echo_output=False)
    emit(error=None)
except WorkerError as error:
    emit(error=error_summary(error), during=during, leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["rank"] == 1 and error["exc_type"] == exc_type, error
    for phrase in phrases:
        assert phrase in error["text"], error["text"]
    assert all(rank == 0 for rank, _, _ in error["others"]), error["others"]  # rank 0 only noticed
    assert result["during"][0] >= 4  # workers and helpers were visible to the counter
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


def test_an_error_in_timeout_words_from_the_callers_code_is_blamed_on_its_rank_not_on_a_busy_peer(tmp_path):
    # rank 0 computes (in no collective) while rank 1 fails with words a timed-out collective would use
    result = run_case(tmp_path, '''
def work(ctx):
    if ctx.rank == 1:
        raise ValueError("config error: read_timeout must be positive, got -1")
    time.sleep(60)
    return ctx.rank

try:
    launch(work, 2, grace_s=2.0, echo_output=False)
    emit(error=None)
except WorkerError as error:
    emit(error=error_summary(error), leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["rank"] == 1 and error["exc_type"] == "ValueError", error
    assert "read_timeout must be positive" in error["text"], error["text"]
    assert "collective_timeout_s" not in error["text"], error["text"]  # no collective timed out
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


def test_a_rank_that_never_arrives_at_a_collective_is_named(tmp_path):
    # 3 ranks: ranks 0 and 1 wait in all_reduce; rank 2 is stuck elsewhere and never calls it
    result = run_case(tmp_path, '''
def work(ctx):
    import torch
    import torch.distributed as dist
    dist.barrier()
    if ctx.rank == 2:
        stuck_forever_in_a_loop()
    dist.all_reduce(torch.ones(2))
    return ctx.rank

def stuck_forever_in_a_loop():
    while True:
        time.sleep(0.1)

try:
    # the timeout also bounds start-up's rendezvous: not too short for 3 workers on a loaded 2-core machine
    launch(work, 3, num_threads=1, collective_timeout_s=10.0, grace_s=1.0, echo_output=False)
    emit(error=None)
except WorkerError as error:
    emit(error=error_summary(error), leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["rank"] == 2 and error["exc_type"] == "RankHung", error
    assert "rank 2 never arrived at the collective" in error["text"]
    assert "stuck_forever_in_a_loop" in error["text"] and "stuck_forever_in_a_loop" in error["traceback"]
    waited = {rank for rank, _, message in error["others"] if "collective_timeout_s" in message}
    assert waited and waited <= {0, 1}, error["others"]  # the ranks that timed out waiting are kept, as such
    assert result["leftover"] == []


def test_a_collective_that_fails_because_a_peer_returned_says_so(tmp_path):
    result = run_case(tmp_path, '''
def work(ctx):
    import torch
    import torch.distributed as dist
    dist.barrier()
    if ctx.rank == 1:
        time.sleep(1.0)  # rank 0 has returned (and closed its connections) by now
        dist.all_reduce(torch.ones(2))
    return ctx.rank

try:
    launch(work, 2, collective_timeout_s=30.0, grace_s=1.0, echo_output=False)
    emit(error=None)
except WorkerError as error:
    emit(error=error_summary(error), leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["rank"] == 1, error
    assert "rank(s) [0] had already returned: did every rank call the same collectives?" in error["text"]
    assert result["leftover"] == []


def test_a_rank_still_running_after_the_others_returned_is_reported(tmp_path):
    result = run_case(tmp_path, '''
def work(ctx):
    ctx.report(step=7)
    if ctx.rank == 0:
        forgot_to_return()
    return ctx.rank

def forgot_to_return():
    while True:
        time.sleep(0.1)

try:
    launch(work, 2, straggler_timeout_s=3.0, grace_s=1.0, echo_output=False)
    emit(error=None)
except LaunchTimeout as error:
    emit(error=error_summary(error), leftover=marked_processes())
''')
    error = result["error"]
    assert error is not None and error["ranks"] == [0], error
    assert "rank(s) [0] were still running straggler_timeout_s=3" in error["text"]
    assert "after rank(s) [1] returned" in error["text"]
    assert "forgot_to_return" in error["text"] and "last reported step: 7" in error["text"]
    assert result["leftover"] == []


def test_the_straggler_timeout_is_on_by_default():
    import inspect

    default = inspect.signature(launch).parameters["straggler_timeout_s"].default
    assert isinstance(default, float) and 0 < default <= 600


def test_helpers_of_a_rank_that_returned_die_with_the_job(tmp_path):
    result = run_case(tmp_path, '''
def work(ctx):
    helpers = start_helpers()  # left running on purpose
    return helpers

results = launch(work, 2, echo_output=False)
emit(helpers=sum(len(h) for h in results), leftover=marked_processes())
''')
    assert result["helpers"] == 4
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


@pytest.mark.parametrize("forked", [False, True], ids=["sockets-close", "a-fork-keeps-the-sockets"])
def test_killing_the_caller_takes_workers_and_their_helpers_with_it(tmp_path, forked):
    # the script runs itself as a child that launches, and SIGKILLs that child mid-training (a crashed kernel);
    # `forked`: the child has forked a process that keeps running with the launcher's sockets open (as a
    # multiprocessing pool started with fork does), so the workers do not see their sockets close
    result = run_case(tmp_path, TRAIN + f'''
FORKED = {forked!r}
HOLDER_FILE = Path({str(tmp_path / "holder.pid")!r})
if os.environ.get("ROLE") == "child":
    job = start(train, 2, echo_output=False)
    if FORKED:
        holder = os.fork()
        if holder == 0:
            time.sleep(300)
            os._exit(0)
        HOLDER_FILE.write_text(str(holder))
    job.wait()
    sys.exit(0)
child = subprocess.Popen([sys.executable, __file__], env=dict(os.environ, ROLE="child"))
deadline = time.time() + 120
while (len(marked_processes()) < 7 + FORKED or (FORKED and not HOLDER_FILE.exists())) and time.time() < deadline:
    time.sleep(0.2)  # the child, 2 keepers, 2 workers (and helpers), the holder
holder = int(HOLDER_FILE.read_text()) if FORKED else None
running = len(marked_processes())
child.kill()
child.wait()
deadline = time.time() + 30
while [pid for pid in marked_processes() if pid != holder] and time.time() < deadline:
    time.sleep(0.2)
leftover = [pid for pid in marked_processes() if pid != holder]
if holder is not None:  # the caller's own process: not the launcher's to end
    os.kill(holder, signal.SIGKILL)
    while holder in marked_processes():
        time.sleep(0.05)
emit(running=running, leftover=leftover)
''')
    assert result["running"] >= 7
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


ESCAPEES = '''
def start_escapees():
    """Helpers that left everything a sweep could know them by: a new session and an environment of their own
    (no tag); one of them daemonized (a double fork, its parent gone)."""
    clean = {"PATH": os.environ["PATH"]}
    direct = subprocess.Popen(["sleep", "301"], env=clean, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).pid
    daemon = subprocess.run([sys.executable, "-c", "import os, subprocess, sys; os.setsid(); "
                             "print(subprocess.Popen(['sleep', '302'], start_new_session=True, stdout=subprocess.DEVNULL, "
                             "stderr=subprocess.DEVNULL).pid)"],
                            env=clean, capture_output=True, text=True).stdout
    return [direct, int(daemon)]

def alive(pids):
    """Those of `pids` still running as sleep (not a zombie, not a reused pid)."""
    found = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if state != "Z" and command.startswith(b"sleep"):
            found.append(pid)
    return found
'''


@pytest.mark.parametrize("end", ["a rank fails", "a rank is SIGKILLed", "the caller SIGKILLs a rank's pid",
                                 "the caller stops the job", "every rank returns"])
def test_helpers_that_left_session_and_environment_die_with_the_job(tmp_path, end):
    """Each worker is a child subreaper: what it starts, even daemonized with no tag, is killed with it; and its
    keeper is one too, for a worker that was SIGKILLed (no clean-up of its own ran); and when the keeper itself
    (job.pids) is killed first, the launcher kills them from the worker it knows."""
    result = run_case(tmp_path, ESCAPEES + f'''
END = {end!r}

def work(ctx):
    pids = start_escapees()
    Path(f"{{os.environ['FAULT_MARK']}}-{{ctx.rank}}.pids").write_text(json.dumps(pids))
    import torch.distributed as dist
    dist.barrier()  # rank 1 ends only once rank 0 has written its pids (the job's stop would cut that short)
    if END == "a rank fails" and ctx.rank == 1:
        raise ValueError("boom")
    if END == "a rank is SIGKILLed" and ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if END in ("the caller stops the job", "the caller SIGKILLs a rank's pid"):
        ctx.report(started=True)
        time.sleep(120)
    return pids

os.chdir({str(tmp_path)!r})
try:
    if END in ("the caller stops the job", "the caller SIGKILLs a rank's pid"):
        job = start(work, 2, echo_output=False)
        reported = set()
        for metrics in job.metrics():
            reported.add(metrics["rank"])
            if reported == {{0, 1}} and END == "the caller stops the job":
                job.stop()
            elif reported == {{0, 1}}:
                os.kill(job.pids[1], signal.SIGKILL)
        error = job.error
    else:
        launch(work, 2, echo_output=False)
        error = None
except WorkerError as failed:
    error = failed
pids = [pid for rank in range(2) for pid in json.loads(Path(f"{{MARK}}-{{rank}}.pids").read_text())]
running_at_end = alive(pids)
deadline = time.time() + 10
while alive(pids) and time.time() < deadline:
    time.sleep(0.1)
emit(started=len(pids), running_at_end=running_at_end, leftover=alive(pids), error=type(error).__name__)
''')
    assert result["started"] == 4
    assert result["leftover"] == [], result
    assert result["error"] == {"a rank fails": "WorkerError", "a rank is SIGKILLed": "WorkerError",
                               "the caller SIGKILLs a rank's pid": "WorkerError",
                               "the caller stops the job": "JobStopped",
                               "every rank returns": "NoneType"}[end]
