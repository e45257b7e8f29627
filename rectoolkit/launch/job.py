"""Run a function on W local worker processes with torch.distributed set up, and watch it live.

    >>> def hello(ctx, greeting):
    ...     ctx.report(step=0, rank_seen=ctx.rank)
    ...     return f"{greeting} from rank {ctx.rank} of {ctx.world_size}"
    >>> launch(hello, 2, "hi", echo_output=False)          # doctest: +SKIP
    ['hi from rank 0 of 2', 'hi from rank 1 of 2']

`launch` blocks and returns each rank's return value; `start` returns a `Job` at once (for widgets):

    job = start(train, 2, config)
    for metrics in job.metrics():      # live, in arrival order: {"rank": 0, "time_s": 1.2, "step": 10, ...}
        print(metrics)
    results = job.results()            # each rank's return value, or raises WorkerError / LaunchTimeout

How it works (one module per part: `arguments`, `spawning`, `output`, `watchdog`, `stopping`, `blame`, `rank`;
this one holds the job and its monitor thread): every rank is a fresh keeper process (`_keeper`: the leader of a session and process group of its
own, which kills what its worker left once the worker has gone, even SIGKILLed) and its worker (`python -m
rectoolkit.launch._worker`, in that group), talking to the caller over a socket pair. The worker function travels by value
with cloudpickle, so functions defined in a notebook cell or a `__main__` script work. The caller hosts the
rendezvous TCPStore (so the port is free by construction). A monitor thread reads metrics, results and
tracebacks; on the first failure, a timeout or `stop()`, it sends SIGTERM to every worker's process group
and SIGKILL after `grace_s` (at once for a rank stuck in a collective that a failed rank will never join:
see `stopping`). A worker's group is killed as soon as the worker exits, and at the end of the
job everything still carrying the job's tag is killed (see `_reap`), so no helper a worker started survives.
Workers kill themselves (and their helpers) when the caller goes away.

Interrupts: the caller's thread, where Ctrl-C / Jupyter's interrupt raises KeyboardInterrupt at any
bytecode, only reads a lock-free SimpleQueue, sets flags and joins the monitor; everything else (signals,
reaping, errors) happens in the monitor thread. So an interrupt at any moment stops the job and re-raises,
and the next launch works; an interrupt while the job is already stopping (a rank failed, a timeout, an earlier
interrupt) kills its ranks at once, and `launch`'s KeyboardInterrupt keeps the failure already known. Which rank is blamed for a failure is decided in `blame`.
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import threading
import time
import uuid
import weakref
from multiprocessing.connection import wait
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import cloudpickle
import torch.distributed as dist

from rectoolkit.launch._reap import carries_tag, exit_status, kill_escaped_descendants, kill_group, kill_tagged
from rectoolkit.launch.affinity import CpuBinding, all_rank_cpus
from rectoolkit.launch.arguments import BACKENDS, check_arguments, default_backend, default_num_threads
from rectoolkit.launch.blame import Failure, culprit, died, is_consequence, is_timeout
from rectoolkit.launch.errors import JobStopped, LaunchError, WorkerError, exception_text
from rectoolkit.launch.output import Echo, RankOutput, read_output
from rectoolkit.launch.rank import RankState, unfinished_ranks
from rectoolkit.launch.shipping import dumps_keeping_file_names
from rectoolkit.launch.spawning import send_spec, start_rank
from rectoolkit.launch.stopping import StopPolicy
from rectoolkit.launch.watchdog import Watchdog

__all__ = ["BACKENDS", "Job", "STRAGGLER_TIMEOUT_S", "default_backend", "default_num_threads", "launch", "start"]

_END = object()
_POLL_S = 0.1
_DRAIN_S = 1.0  # how long an exited worker's last messages get to arrive
STRAGGLER_TIMEOUT_S = 120.0  # default: as long as a collective may wait for a late rank
_LIVE_JOBS: "weakref.WeakSet[Job]" = weakref.WeakSet()
_Rank = RankState  # its name before it moved to rectoolkit.launch.rank


class Job:
    """A running (or finished) launch: live metrics, per-rank status, results, stop.

    Create it with `start(...)`. Thread-safe to poll from a widget: `status()`, `history`, `done`.
    """

    def __init__(self, fn: Callable[..., Any], world_size: int, args: Sequence[Any], kwargs: Mapping[str, Any],
                 backend: Optional[str], num_threads: Optional[int], timeout_s: Optional[float],
                 idle_timeout_s: Optional[float], straggler_timeout_s: Optional[float], collective_timeout_s: float,
                 grace_s: float, on_metrics: Optional[Callable[[Dict[str, Any]], None]],
                 env: Optional[Mapping[str, str]], echo_output: bool, cpu_binding: CpuBinding) -> None:
        backend = check_arguments(fn, world_size, backend, num_threads, timeout_s, idle_timeout_s,
                                  straggler_timeout_s, collective_timeout_s, grace_s)
        try:
            payload = dumps_keeping_file_names((fn, tuple(args), dict(kwargs)))
        except Exception as exc:
            raise TypeError(f"cannot send the worker function {getattr(fn, '__name__', fn)!r} and its arguments "
                            f"to the workers (cloudpickle failed: {exc}); pass picklable arguments and create "
                            f"locks, files and sockets inside the function") from exc
        self.world_size = world_size
        self.backend = backend
        self.num_threads = num_threads or default_num_threads(world_size)
        # the cores each rank is bound to (None: not bound); rectoolkit.launch.affinity says why and how
        self.cpus: List[Optional[List[int]]] = all_rank_cpus(cpu_binding, world_size)
        self.history: List[Dict[str, Any]] = []
        self._collective_timeout_s = collective_timeout_s
        self._on_metrics = on_metrics
        self._echo = Echo() if echo_output else None  # one for all ranks: they share the caller's stdout
        self._tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # inherited by everything the workers start
        # The caller's thread (where Ctrl-C strikes) only sets these flags, reads the SimpleQueue and joins the
        # monitor thread; it never holds a lock the monitor needs, so an interrupt anywhere cannot hang the job.
        self._stop_requested = False
        self._kill_requested = False
        self._cooperative_stop_requested = False
        self._events: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._finished = False
        self._error: Optional[LaunchError] = None
        self._callback_error: Optional[BaseException] = None
        self._start_wall = time.time()
        self._ranks: List[_Rank] = []
        self._stopping = StopPolicy(self._ranks, grace_s, lambda state: self._send(state, "where"))
        self._watchdog = Watchdog(self._ranks, self._stopping, lambda state: self._send(state, "where"), timeout_s,
                                  idle_timeout_s, straggler_timeout_s, collective_timeout_s)
        self._output_threads: List[threading.Thread] = []
        self._monitor_thread = threading.Thread(target=self._monitor, name="rectoolkit-launch-monitor", daemon=True)
        try:
            self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
            for rank in range(world_size):
                self._spawn(rank, payload, env)
            _LIVE_JOBS.add(self)
            self._monitor_thread.start()
        except BaseException:  # an interrupt or a failure while starting: leave nothing behind
            if self._monitor_thread.ident is not None:
                self.stop()
            else:
                self._abort_start()
            raise

    # ---------------------------------------------------------------- spawning
    def _spawn(self, rank: int, payload: bytes, env: Optional[Mapping[str, str]]) -> None:
        state = start_rank(rank, self.world_size, self._store.port, self.num_threads, self._tag, env)
        self._ranks.append(state)
        send_spec(state, {"world_size": self.world_size, "backend": self.backend, "store_port": self._store.port,
                          "collective_timeout_s": self._collective_timeout_s, "num_threads": self.num_threads,
                          "payload": payload}, self.cpus[rank])
        output = RankOutput(rank, state.output, self._echo)
        reader = threading.Thread(target=read_output, args=(state.process.stdout, output), daemon=True,
                                  name=f"rectoolkit-launch-output-{rank}")
        reader.start()
        self._output_threads.append(reader)

    def _abort_start(self) -> None:
        for state in self._ranks:
            kill_group(state.process.pid, signal.SIGKILL)
            state.process.wait()
            state.conn.close()
        kill_tagged(self._tag)  # a worker spawned but not yet recorded

    # ---------------------------------------------------------------- monitor thread
    def _monitor(self) -> None:
        try:
            while not self._all_exited_and_drained():
                conns = [r.conn for r in self._ranks if r.conn is not None]
                ready = wait(conns, timeout=_POLL_S) if conns else []
                if not conns:
                    time.sleep(_POLL_S)
                for conn in ready:
                    self._receive(next(r for r in self._ranks if r.conn is conn))
                if self._stop_requested:
                    self._stopping.begin("user")
                if self._kill_requested:  # kill() or an interrupt while the job was already stopping
                    self._kill_requested = False
                    self._stopping.kill_now()
                if self._cooperative_stop_requested:
                    self._cooperative_stop_requested = False
                    self._send_all("stop")
                self._check_processes()
                self._watchdog.check()
                self._stopping.tick()
        except BaseException as exc:  # a bug here must not leave workers behind
            self._error = LaunchError(f"the launch monitor failed: {exc!r}")
            self._stopping.signal_all(signal.SIGKILL)
        finally:
            self._finish()

    def _receive(self, state: _Rank) -> None:
        try:
            kind, payload = cloudpickle.loads(state.conn.recv_bytes())
        except (EOFError, OSError):
            state.conn.close()
            state.conn = None
            return
        except BaseException as exc:  # a result whose class the caller cannot import, or whose unpickling raises
            # anything (KeyboardInterrupt, SystemExit: signals never reach this thread, so it came from the message)
            why = f"{type(exc).__name__}: {exception_text(exc)}"
            kind, payload = "error", {"exc_type": type(exc).__name__, "time": time.time(), "traceback": "",
                                      "message": f"the caller could not unpickle a message from rank {state.rank} "
                                                 f"(its return value or a metric; {why}): it cannot be pickled "
                                                 f"back to the caller; send plain values (numbers, strings, lists, "
                                                 f"dicts, tensors) or make its class importable in the caller"}
        state.last_message_s = time.monotonic()
        if kind == "started":
            state.started, state.worker_pid = True, payload["pid"]
        elif kind == "where":
            state.where = payload
            self._stopping.answered_where(state)
        elif kind == "metrics":
            metrics = {"rank": state.rank, "time_s": round(time.time() - self._start_wall, 4), **payload}
            state.last_step = payload.get("step", state.last_step)
            state.reports += 1
            self.history.append(metrics)
            self._events.put(metrics)
            if self._on_metrics is not None and self._callback_error is None:
                try:
                    self._on_metrics(metrics)
                except Exception as exc:  # keep the job running; the error is re-raised by wait()
                    self._callback_error = exc
        elif kind == "result":
            state.has_result, state.result, state.returned_s = True, payload, time.monotonic()
        elif kind == "error":
            message = payload["message"]
            consequence = payload.get("peer_failure", False) or is_consequence(payload["exc_type"], message,
                                                                               payload["traceback"])
            if consequence and is_timeout(message) and not payload.get("peer_failure", False):
                message += (" (a collective did not complete within collective_timeout_s: did every rank call "
                            "the same collectives in the same order?)")
            error = WorkerError(state.rank, payload["exc_type"], message, payload["traceback"])
            self._watchdog.fail(state, Failure(error, payload["time"], not consequence))

    def _check_processes(self) -> None:
        now = time.monotonic()
        for state in self._ranks:
            if state.returncode is None:
                code = exit_status(state.process.pid)
                if code is None:
                    continue
                # whatever it started dies with it: its group, its session, its tag (while it is an unreaped
                # zombie, its pid, group and session ids cannot be reused by an unrelated process); a keeper killed
                # before its worker could not sweep: the helpers that left the group are still the worker's
                if state.worker_pid is not None and carries_tag(state.worker_pid, f"{self._tag}.{state.rank}"):
                    kill_escaped_descendants(state.worker_pid, group=state.process.pid)
                kill_group(state.process.pid, signal.SIGKILL)
                kill_tagged(f"{self._tag}.{state.rank}", sessions=[state.process.pid])
                state.returncode = state.process.wait()
                state.exited_s = now
            if state.has_result or state.failure is not None:
                continue
            if state.conn is not None and now - state.exited_s < _DRAIN_S:
                continue  # its last messages (an exception?) may still be on the way
            stopped_by_us = state.signals_sent and (state.returncode >= 0 or -state.returncode in state.signals_sent)
            if not stopped_by_us:
                tail = "".join(list(state.output)[-20:])
                exited_wall_s = time.time() - (now - state.exited_s) - _POLL_S
                self._watchdog.fail(state, Failure(died(state.rank, state.returncode, tail), exited_wall_s, True))

    def _send(self, state: _Rank, kind: str) -> None:
        if state.conn is not None:
            try:
                state.conn.send_bytes(cloudpickle.dumps((kind, None)))
            except OSError:
                pass

    def _send_all(self, kind: str) -> None:
        for state in self._ranks:
            self._send(state, kind)

    def _all_exited_and_drained(self) -> bool:
        now = time.monotonic()
        return all(r.returncode is not None and (r.conn is None or now - r.exited_s >= _DRAIN_S)
                   for r in self._ranks)

    def _finish(self) -> None:
        for state in self._ranks:
            if state.returncode is None:  # only reached when the monitor itself failed
                kill_group(state.process.pid, signal.SIGKILL)
                state.returncode = state.process.wait()
            if state.conn is not None:
                state.conn.close()
                state.conn = None
        kill_tagged(self._tag)  # a helper that left its worker's group and session, or was started late
        for thread in self._output_threads:
            thread.join(timeout=1.0)
        failures = [r.failure for r in self._ranks if r.failure is not None]
        self._error = self._error or self._watchdog.timeout_error
        if self._error is None and self._stop_reason == "user":  # what stopped ranks raised is no failure
            self._error = JobStopped(f"the job was stopped before rank(s) {unfinished_ranks(self._ranks)} finished")
        elif self._error is None and failures:
            self._error = culprit(failures, [r.rank for r in self._ranks if r.has_result])
        del self._store
        _LIVE_JOBS.discard(self)
        self._finished = True
        self._events.put(_END)

    @property
    def _stop_reason(self) -> Optional[str]:
        """Why the job is stopping ("user", "failure", "timeout"), None while it runs."""
        return self._stopping.reason

    # ---------------------------------------------------------------- public API
    @property
    def done(self) -> bool:
        """True once every worker has exited (successfully or not)."""
        return self._finished

    @property
    def error(self) -> Optional[LaunchError]:
        """The job's error once done (WorkerError, LaunchTimeout, JobStopped), else None."""
        return self._error if self.done else None

    @property
    def pids(self) -> List[int]:
        """The process the launcher started for each rank, by rank: its keeper, the leader of the rank's process
        group (`os.killpg(pid, signal.SIGKILL)` ends the rank and what it started; see `_keeper`)."""
        return [r.process.pid for r in self._ranks]

    @property
    def worker_pids(self) -> List[Optional[int]]:
        """The process that runs fn on each rank (for py-spy, gdb, top), by rank; None until the rank is up."""
        return [r.worker_pid for r in self._ranks]

    def status(self) -> List[Dict[str, Any]]:
        """One row per rank: rank, pid, state (starting/running/finishing/finished/failed/stopped), last step."""
        return [{"rank": r.rank, "pid": r.process.pid, "state": r.state, "last_step": r.last_step,
                 "returncode": r.returncode} for r in self._ranks]

    def output(self, rank: int) -> str:
        """The last lines (up to 200) that rank printed."""
        return "".join(self._ranks[rank].output)

    def metrics(self, raise_on_error: bool = True) -> Iterator[Dict[str, Any]]:
        """Yield every metrics dict as it arrives (rank, time_s and what the worker reported), until the job ends.

        Ends by raising the job's error (WorkerError / LaunchTimeout) unless `raise_on_error=False`.
        """
        while True:
            try:  # a timeout, so that a signal delivered to another thread is still handled promptly
                item = self._events.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                self._events.put(_END)  # let other consumers end too
                break
            yield item
        if raise_on_error and self._error is not None and not isinstance(self._error, JobStopped):
            raise self._error

    def _join(self, timeout: Optional[float]) -> bool:
        """Wait for the monitor to finish (True) or `timeout` seconds to pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            self._monitor_thread.join(left)
        return True

    def wait(self, timeout: Optional[float] = None) -> List[Any]:
        """Block until every worker has exited; return each rank's return value (index = rank).

        Raises the WorkerError / LaunchTimeout / JobStopped that ended the job, or TimeoutError when `timeout`
        (seconds, for this call only) passes first.
        """
        if not self._join(timeout):
            raise TimeoutError(f"the job is still running after {timeout} s (ranks {unfinished_ranks(self._ranks)})")
        if self._error is not None:
            raise self._error
        if self._callback_error is not None:
            raise self._callback_error
        return [r.result for r in self._ranks]

    results = wait

    def request_stop(self) -> None:
        """Ask the workers to stop cooperatively: `ctx.stop_requested()` becomes True in each of them."""
        self._cooperative_stop_requested = True

    def stop(self) -> None:
        """Stop every worker now (SIGTERM to its process group, SIGKILL after `grace_s`) and wait until all
        have exited. An interrupt (Ctrl-C) while it waits kills them at once (as `kill`), then is re-raised.
        Called from `on_metrics` (the monitor's thread), it only asks.

        In a job where a rank has already failed (as when the job stops itself for that failure), a rank found
        waiting inside torch.distributed (a collective the failed rank will never join; asked every half second)
        is killed at once instead of after grace_s, and the failed rank's error stays the job's error (`wait()`
        raises it, not JobStopped); a rank in its own code (a SIGTERM handler saving a checkpoint) still gets
        grace_s. `rectoolkit.launch.stopping` says why."""
        self._ask_and_wait(kill=False)

    def kill(self) -> None:
        """Stop every worker at once (SIGKILL to its process group, no grace) and wait until all have exited:
        for a job whose ranks do not go when asked (a SIGTERM handler that keeps running, a rank stuck in
        native code). `launch` does this when it is interrupted while the job is already stopping."""
        self._ask_and_wait(kill=True)

    def _ask_and_wait(self, kill: bool) -> None:
        interrupt: Optional[KeyboardInterrupt] = None
        try:  # asked inside the try: an interrupt that comes once the ranks were signalled is caught below
            if kill:
                self._kill_requested = True
            else:
                self._stop_requested = True
            if threading.current_thread() is self._monitor_thread:
                return
            self._join(None)
        except KeyboardInterrupt as first:
            interrupt = first
        while interrupt is not None and not self._finished:
            self._kill_requested = True  # Ctrl-C while the ranks get grace_s to go: kill them now
            try:
                self._join(None)
            except KeyboardInterrupt:
                pass  # the same request again, while the ranks are being killed; the first is re-raised
        if interrupt is not None:
            raise interrupt

    def __repr__(self) -> str:
        states = ", ".join(f"{r.rank}:{r.state}" for r in self._ranks)
        return f"Job(world_size={self.world_size}, backend={self.backend!r}, ranks=[{states}])"


def start(fn: Callable[..., Any], world_size: int = 1, *args: Any, kwargs: Optional[Mapping[str, Any]] = None,
          backend: Optional[str] = None, num_threads: Optional[int] = None, timeout_s: Optional[float] = None,
          idle_timeout_s: Optional[float] = None, straggler_timeout_s: Optional[float] = STRAGGLER_TIMEOUT_S,
          collective_timeout_s: float = 120.0, grace_s: float = 3.0,
          on_metrics: Optional[Callable[[Dict[str, Any]], None]] = None, env: Optional[Mapping[str, str]] = None,
          echo_output: bool = True, cpu_binding: CpuBinding = "none") -> Job:
    """Start `fn(ctx, *args, **kwargs)` on `world_size` local processes; return a `Job` at once.

    - `backend`: "gloo" or "nccl"; default nccl when `world_size` GPUs are visible, gloo otherwise.
    - `num_threads`: torch threads per worker (default: cores // world_size, at least 1).
    - `timeout_s`: the whole job's time limit (default: none); `idle_timeout_s`: limit on a rank's silence
      (no `ctx.report`; default: none), counted from its last report or from when its function started: a rank
      still starting (Python, torch, unpickling fn, the rendezvous) is not idle; its peers' rendezvous waits for
      it up to `collective_timeout_s`.
    - `straggler_timeout_s`: once one rank has returned, how long the others get to return too (default
      120 s, None: no limit); a rank still running then is reported (a LaunchTimeout naming it and where
      its main thread is) and the job stopped.
    - `collective_timeout_s`: the process group's timeout, so a collective that never completes raises; the
      error then names the rank that never arrived, not only the ranks that waited.
    - `grace_s`: how long a stopped worker gets after SIGTERM before SIGKILL.
    - `on_metrics(metrics)`: called in the job's monitor thread for each report (widgets); metrics are also
      kept in `job.history` and streamed by `job.metrics()`.
    - `env`: extra environment variables for the workers; `echo_output`: print worker output as "[rank r] ..."
      as it arrives, a progress bar's line (tqdm's "\\r 10%|...") included: its latest state, a few times a second
      (see `rectoolkit.launch.output`).
    - `cpu_binding`: which cores each rank runs on (`job.cpus`, `ctx.cpus`): "none" (default) leaves it to the
      scheduler, "auto" gives each rank its own even share of the cores this process may use when there are at
      least as many cores as ranks (and binds nothing otherwise), or one list of cores per rank. Which is faster
      depends on the work: rectoolkit.launch.affinity says what was measured.
    """
    return Job(fn, world_size, args, kwargs or {}, backend, num_threads, timeout_s, idle_timeout_s,
               straggler_timeout_s, collective_timeout_s, grace_s, on_metrics, env, echo_output, cpu_binding)


def launch(fn: Callable[..., Any], world_size: int = 1, *args: Any, kwargs: Optional[Mapping[str, Any]] = None,
           backend: Optional[str] = None, num_threads: Optional[int] = None, timeout_s: Optional[float] = None,
           idle_timeout_s: Optional[float] = None, straggler_timeout_s: Optional[float] = STRAGGLER_TIMEOUT_S,
           collective_timeout_s: float = 120.0, grace_s: float = 3.0,
           on_metrics: Optional[Callable[[Dict[str, Any]], None]] = None, env: Optional[Mapping[str, str]] = None,
           echo_output: bool = True, cpu_binding: CpuBinding = "none") -> List[Any]:
    """Run `fn(ctx, *args, **kwargs)` on `world_size` local processes and return each rank's return value.

    Blocks; `on_metrics` is called in the caller's thread for each report as it arrives. A worker that raises
    or dies ends the job with a WorkerError naming that rank (with its traceback, or the signal that killed
    it) after every other worker was stopped; an interrupt (Ctrl-C, Jupyter's stop button) stops every
    worker, and everything they started, and re-raises. Arguments as in `start`.
    """
    job = start(fn, world_size, *args, kwargs=kwargs, backend=backend, num_threads=num_threads,
                timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, straggler_timeout_s=straggler_timeout_s,
                collective_timeout_s=collective_timeout_s, grace_s=grace_s, env=env, echo_output=echo_output,
                cpu_binding=cpu_binding)
    try:
        for metrics in job.metrics():
            if on_metrics is not None:
                on_metrics(metrics)
        return job.wait()
    except KeyboardInterrupt as interrupt:
        try:  # a job already stopping (a rank failed, a timeout) is killed: its ranks had their SIGTERM
            job.kill() if job._stop_reason is not None else job.stop()
        finally:
            _keep_the_failure(interrupt, job)
        raise
    except BaseException:
        job.stop()
        raise


def _keep_the_failure(interrupt: KeyboardInterrupt, job: Job) -> None:
    """An interrupt that came after the job had failed keeps that failure: as its __context__ (so the
    traceback shows the rank's error above the interrupt) and in a note that says what had happened."""
    error = job.error
    if error is None or isinstance(error, JobStopped):
        return
    if interrupt.__context__ is None:
        interrupt.__context__ = error
    what = (f"rank {error.rank} had already failed ({error.exc_type}: {error.exc_message})"
            if isinstance(error, WorkerError) else f"the job had already failed ({str(error).splitlines()[0]})")
    interrupt.add_note(f"launch was interrupted after {what:.1000}; any rank still running was killed at once. "
                       f"The error is shown above and kept in job.error.")


@atexit.register
def _stop_live_jobs() -> None:
    for job in list(_LIVE_JOBS):
        job.stop()
