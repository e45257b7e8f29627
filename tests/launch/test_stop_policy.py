"""Stopping a job in which a rank has failed: a rank stuck in a collective that the failed rank will never join is
killed at once (it cannot use grace_s), a rank in its own code keeps grace_s, and the failed rank's error is the
one raised. `StopPolicy` is tested on stand-in ranks (real processes, answers given by the test); the cases run a
real job as a caller script in a subprocess (`test_faults.run_case`), with a timeout, so nothing can hang."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from test_faults import run_case

from rectoolkit.launch.blame import Failure, died
from rectoolkit.launch.rank import RankState
from rectoolkit.launch.stopping import StopPolicy

IN_A_COLLECTIVE = ('  File "/x/torch/distributed/distributed_c10d.py", line 2, in all_reduce\n'
                   '    work.wait()\n')
IN_ITS_OWN_CODE = '  File "/home/me/train.py", line 9, in save_checkpoint\n    torch.save(state, path)\n'
# a SIGTERM handler that Python ran when a barrier returned, on top of the barrier's frame
IN_A_HANDLER_ON_A_COLLECTIVE = IN_A_COLLECTIVE + '  File "/home/me/train.py", line 3, in on_sigterm\n    save()\n'


@pytest.fixture
def ranks():
    processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
                 for _ in range(3)]
    yield [RankState(rank=rank, process=process, conn=None, last_message_s=0.0)
           for rank, process in enumerate(processes)]
    for process in processes:
        process.kill()
        process.wait()


def _fail(state: RankState) -> None:
    state.failure = Failure(died(state.rank, 1, ""), 0.0, True)


def _answer(policy: StopPolicy, state: RankState, stack: str) -> None:
    state.where = stack
    policy.answered_where(state)


def _killed(state: RankState) -> bool:
    try:
        return state.process.wait(timeout=30) == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        return False


def test_a_rank_waiting_in_a_collective_of_a_failed_job_is_killed_at_once_one_in_its_own_code_is_not(ranks):
    asked = []
    policy = StopPolicy(ranks, grace_s=3600.0, ask_where=asked.append)
    _fail(ranks[2])
    ranks[2].returncode = 1
    policy.signal_all = lambda sig: None  # SIGTERM is not the subject here
    policy.begin("failure")
    assert asked == [ranks[0], ranks[1]]  # the ranks still running are asked where they are, at once
    _answer(policy, ranks[0], IN_A_COLLECTIVE)
    assert ranks[0].process.poll() is None  # one answer from a collective may be one that just failed
    _answer(policy, ranks[1], IN_ITS_OWN_CODE)
    _answer(policy, ranks[0], IN_A_COLLECTIVE)
    _answer(policy, ranks[1], IN_ITS_OWN_CODE)
    assert _killed(ranks[0]) and ranks[0].signals_sent == [signal.SIGKILL]
    assert ranks[1].process.poll() is None  # its own code: it keeps grace_s
    assert policy.kill_deadline is not None and policy.kill_deadline > 3000


def test_answers_from_a_collective_between_other_answers_do_not_add_up(ranks):
    policy = StopPolicy(ranks, grace_s=3600.0, ask_where=lambda state: None)
    policy.signal_all = lambda sig: None
    _fail(ranks[2])
    policy.begin("failure")
    for stack in (IN_A_COLLECTIVE, IN_ITS_OWN_CODE, IN_A_COLLECTIVE):
        _answer(policy, ranks[0], stack)
    assert ranks[0].process.poll() is None


def test_a_sigterm_handler_running_on_top_of_a_collectives_frame_keeps_its_grace(ranks):
    policy = StopPolicy(ranks, grace_s=3600.0, ask_where=lambda state: None)
    policy.signal_all = lambda sig: None
    _fail(ranks[2])
    policy.begin("failure")
    for _ in range(3):
        _answer(policy, ranks[0], IN_A_HANDLER_ON_A_COLLECTIVE)
    assert ranks[0].process.poll() is None


def test_with_no_failed_rank_every_rank_keeps_grace_s(ranks):
    policy = StopPolicy(ranks, grace_s=3600.0, ask_where=lambda state: None)
    policy.signal_all = lambda sig: None
    policy.begin("user")  # peers may run their SIGTERM handlers' collectives together
    for _ in range(3):
        _answer(policy, ranks[0], IN_A_COLLECTIVE)
    assert ranks[0].process.poll() is None and policy.reason == "user"


def test_a_stop_asked_for_in_a_failed_job_is_that_failures_stop(ranks):
    policy = StopPolicy(ranks, grace_s=3600.0, ask_where=lambda state: None)
    policy.signal_all = lambda sig: None
    _fail(ranks[1])
    policy.begin("user")
    assert policy.reason == "failure"  # so the job's error is the rank's, not JobStopped


@pytest.mark.multiprocess
@pytest.mark.timeout(330)
def test_stop_on_a_failed_job_kills_a_rank_stuck_in_collectives_at_once_and_raises_the_failure(tmp_path):
    # rank 1 fails; rank 0 ignores SIGTERM and keeps retrying a collective that rank 1 will never join, so only
    # the kill of a rank stuck in a collective ends it: grace_s is an hour, the caller gives up after 90 s
    result = run_case(tmp_path, f'''
IGNORED = Path({str(tmp_path / "ignored")!r})

def work(ctx):
    import torch
    import torch.distributed as dist
    if ctx.rank == 0:
        signal.signal(signal.SIGTERM, lambda *_: IGNORED.write_text("rank 0 ignored its SIGTERM"))
    dist.barrier()
    if ctx.rank == 1:
        raise ValueError("rank 1's own error")
    while True:
        try:
            dist.all_reduce(torch.ones(2))
        except RuntimeError:
            pass

job = start(work, 2, grace_s=3600.0, echo_output=False)
deadline = time.monotonic() + 120
while job.status()[1]["state"] != "failed" and not job.done and time.monotonic() < deadline:
    time.sleep(0.05)
stopping = threading.Thread(target=job.stop, daemon=True)
stopping.start()
stopping.join(90)
outcome = "stopped" if not stopping.is_alive() else "still waiting for grace_s"
if stopping.is_alive():
    job.kill()
try:
    job.wait()
    error = None
except Exception as raised:
    error = error_summary(raised)
emit(outcome=outcome, error=error, states=[row["state"] for row in job.status()], ignored=IGNORED.exists(),
     leftover=marked_processes())
''', timeout_s=270)
    assert result["outcome"] == "stopped", result
    error = result["error"]
    assert error is not None and error["type"] == "WorkerError", result
    assert error["rank"] == 1 and error["exc_type"] == "ValueError", error
    assert result["states"] == ["stopped", "failed"], result
    assert result["ignored"] is True  # rank 0 did ignore its SIGTERM: grace_s would have applied
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_rank_saving_in_its_own_code_after_a_peer_failed_keeps_its_grace(tmp_path):
    # rank 1 fails; rank 0's SIGTERM handler saves (for a few seconds, long enough to be asked where it is
    # several times) and exits: it must not be killed as a stuck rank
    result = run_case(tmp_path, f'''
SAVED = Path({str(tmp_path / "saved")!r})

def save_then_exit(*_):
    for _ in range(40):  # a checkpoint being written, in the rank's own code
        time.sleep(0.1)
    SAVED.write_text("saved")
    os._exit(0)

def work(ctx):
    import torch.distributed as dist
    if ctx.rank == 0:
        signal.signal(signal.SIGTERM, save_then_exit)
    dist.barrier()
    if ctx.rank == 1:
        raise ValueError("rank 1's own error")
    while True:
        time.sleep(0.1)

try:
    launch(work, 2, grace_s=120.0, echo_output=False)
    error = None
except WorkerError as raised:
    error = error_summary(raised)
emit(error=error, saved=SAVED.exists(), leftover=marked_processes())
''')
    assert result["saved"] is True, result
    assert result["error"]["rank"] == 1 and result["error"]["exc_type"] == "ValueError", result
    assert result["leftover"] == [] and result["leftover_after_caller_exit"] == []
