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

How it works: every worker is a fresh `python -m rectoolkit.launch._worker` process (in its own process
group) talking to the caller over a socket pair. The worker function travels by value with cloudpickle, so
functions defined in a notebook cell or a `__main__` script work. The caller hosts the rendezvous
TCPStore (so the port is free by construction). A monitor thread reads metrics, results and tracebacks;
on the first failure, a timeout or `stop()`, it sends SIGTERM to every worker's process group and SIGKILL
after `grace_s`. Workers exit by themselves when the caller goes away.
"""

from __future__ import annotations

import atexit
import linecache
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence

import cloudpickle
import torch
import torch.distributed as dist

from rectoolkit.launch.errors import JobStopped, LaunchError, LaunchTimeout, WorkerError

_END = object()
_POLL_S = 0.1
_LIVE_JOBS: "weakref.WeakSet[Job]" = weakref.WeakSet()


def default_backend(world_size: int) -> str:
    """"nccl" when at least `world_size` GPUs are visible (and NCCL is built in), else "gloo"."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def default_num_threads(world_size: int) -> int:
    """CPU threads per worker: the machine's cores shared evenly, at least 1."""
    return max(1, (os.cpu_count() or 1) // world_size)


def _notebook_sources(max_bytes: int = 4_000_000) -> Dict[str, tuple]:
    """Source lines the interpreter knows only in memory (notebook cells), so worker tracebacks show them."""
    sources, total = {}, 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) != 4 or os.path.exists(filename):
            continue
        size, _, lines, fullname = entry
        total += size
        if total > max_bytes:
            break
        sources[filename] = (size, None, lines, fullname)
    return sources


@dataclass
class _Rank:
    """What the monitor knows about one worker."""

    rank: int
    process: subprocess.Popen
    conn: Optional[Connection]
    last_message_s: float
    output: Deque[str] = field(default_factory=lambda: deque(maxlen=200))
    started: bool = False
    has_result: bool = False
    result: Any = None
    error: Optional[WorkerError] = None
    error_time: float = 0.0
    last_step: Any = None
    exited_s: Optional[float] = None

    @property
    def state(self) -> str:
        if self.error is not None:
            return "failed"
        if self.has_result:
            return "finished" if self.process.returncode is not None else "finishing"
        if self.process.returncode is not None:
            return "stopped"
        return "running" if self.started else "starting"


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class Job:
    """A running (or finished) launch: live metrics, per-rank status, results, stop.

    Create it with `start(...)`. Thread-safe to poll from a widget: `status()`, `history`, `done`.
    """

    def __init__(self, fn: Callable[..., Any], world_size: int, args: Sequence[Any], kwargs: Mapping[str, Any],
                 backend: Optional[str], num_threads: Optional[int], timeout_s: Optional[float],
                 idle_timeout_s: Optional[float], collective_timeout_s: float, grace_s: float,
                 on_metrics: Optional[Callable[[Dict[str, Any]], None]], env: Optional[Mapping[str, str]],
                 echo_output: bool) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        backend = backend or default_backend(world_size)
        if backend == "nccl" and torch.cuda.device_count() < world_size:
            raise ValueError(f"backend='nccl' needs {world_size} visible GPUs but {torch.cuda.device_count()} "
                             f"are visible; use backend='gloo' or a smaller world_size")
        try:
            payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
        except Exception as exc:
            raise TypeError(f"cannot send the worker function {getattr(fn, '__name__', fn)!r} and its arguments "
                            f"to the workers (cloudpickle failed: {exc}); pass picklable arguments and create "
                            f"locks, files and sockets inside the function") from exc
        self.world_size = world_size
        self.backend = backend
        self.num_threads = num_threads or default_num_threads(world_size)
        self.history: List[Dict[str, Any]] = []
        self._timeout_s = timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._grace_s = grace_s
        self._on_metrics = on_metrics
        self._echo_output = echo_output
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._lock = threading.Lock()
        self._stop_reason: Optional[str] = None
        self._kill_deadline: Optional[float] = None
        self._error: Optional[LaunchError] = None
        self._callback_error: Optional[BaseException] = None
        self._done = threading.Event()
        self._start_monotonic = time.monotonic()
        self._start_wall = time.time()
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self._ranks: List[_Rank] = []
        self._output_threads: List[threading.Thread] = []
        try:
            for rank in range(world_size):
                self._ranks.append(self._spawn(rank, payload, collective_timeout_s, env))
        except BaseException:
            self._terminate_all(signal.SIGKILL)
            raise
        _LIVE_JOBS.add(self)
        self._monitor_thread = threading.Thread(target=self._monitor, name="rectoolkit-launch-monitor", daemon=True)
        self._monitor_thread.start()

    # ---------------------------------------------------------------- spawning
    def _spawn(self, rank: int, payload: bytes, collective_timeout_s: float,
               env: Optional[Mapping[str, str]]) -> _Rank:
        parent_end, child_end = socket.socketpair()
        worker_env = dict(os.environ)
        worker_env.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self._store.port), "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(self.num_threads),
        })
        worker_env.update({str(k): str(v) for k, v in (env or {}).items()})
        process = subprocess.Popen(
            [sys.executable, "-m", "rectoolkit.launch._worker", str(child_end.fileno())],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=worker_env, start_new_session=True,
        )
        child_end.close()
        conn = Connection(parent_end.detach())
        state = _Rank(rank=rank, process=process, conn=conn, last_message_s=time.monotonic())
        spec = {
            "rank": rank, "world_size": self.world_size, "local_rank": rank, "backend": self.backend,
            "store_host": "127.0.0.1", "store_port": self._store.port, "collective_timeout_s": collective_timeout_s,
            "num_threads": self.num_threads, "sys_path": [p for p in sys.path if p], "payload": payload,
            "parent_pid": os.getpid(), "linecache": _notebook_sources(),
        }
        conn.send_bytes(cloudpickle.dumps(spec))
        reader = threading.Thread(target=self._read_output, args=(state,), daemon=True,
                                  name=f"rectoolkit-launch-output-{rank}")
        reader.start()
        self._output_threads.append(reader)
        return state

    def _read_output(self, state: _Rank) -> None:
        for raw in iter(state.process.stdout.readline, b""):
            line = raw.decode(errors="replace")
            state.output.append(line)
            if self._echo_output:
                sys.stdout.write(f"[rank {state.rank}] {line}")
        state.process.stdout.close()

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
                self._check_processes()
                self._check_timeouts()
                self._escalate()
        except BaseException as exc:  # a bug here must not leave workers behind
            self._error = LaunchError(f"the launch monitor failed: {exc!r}")
            self._terminate_all(signal.SIGKILL)
        finally:
            self._finish()

    def _receive(self, state: _Rank) -> None:
        try:
            kind, payload = cloudpickle.loads(state.conn.recv_bytes())
        except (EOFError, OSError):
            state.conn.close()
            state.conn = None
            return
        except Exception as exc:  # e.g. a result whose class the caller cannot import
            kind, payload = "error", {"exc_type": type(exc).__name__, "time": time.time(), "traceback": "",
                                      "message": f"the caller could not unpickle a message from rank "
                                                 f"{state.rank}: {exc}"}
        state.last_message_s = time.monotonic()
        if kind == "started":
            state.started = True
        elif kind == "metrics":
            metrics = {"rank": state.rank, "time_s": round(time.time() - self._start_wall, 4), **payload}
            state.last_step = payload.get("step", state.last_step)
            self.history.append(metrics)
            self._queue.put(metrics)
            if self._on_metrics is not None and self._callback_error is None:
                try:
                    self._on_metrics(metrics)
                except Exception as exc:  # keep the job running; the error is re-raised by wait()
                    self._callback_error = exc
        elif kind == "result":
            state.has_result, state.result = True, payload
        elif kind == "error":
            message = payload["message"]
            if "Timed out" in message or "timed out" in message:
                message += (" (a collective did not complete within collective_timeout_s: did every rank call "
                            "the same collectives in the same order?)")
            self._set_error(state, WorkerError(state.rank, payload["exc_type"], message, payload["traceback"]),
                            payload["time"])

    def _set_error(self, state: _Rank, error: WorkerError, when: float) -> None:
        if state.error is None:
            state.error, state.error_time = error, when
        self._begin_stop("failure")

    def _check_processes(self) -> None:
        now = time.monotonic()
        for state in self._ranks:
            if state.exited_s is None and state.process.poll() is not None:
                state.exited_s = now
            if state.exited_s is None or state.has_result or state.error is not None:
                continue
            # exited without a result or an error message: wait for its socket to drain, then blame it,
            # unless we stopped it ourselves
            if self._stop_reason is None and (state.conn is None or now - state.exited_s > 1.0):
                tail = "".join(list(state.output)[-20:])
                message = (f"the worker process {_describe_exit(state.process.returncode)} without reporting a "
                           f"result or an exception (killed by the OS for memory? a crash in native code?)")
                self._set_error(state, WorkerError(state.rank, "WorkerDied", message,
                                                   f"last output of rank {state.rank}:\n{tail}" if tail else ""),
                                time.time() - (now - state.exited_s) - _POLL_S)

    def _unfinished_ranks(self) -> List[int]:
        return [r.rank for r in self._ranks if not r.has_result and r.error is None]

    def _last_steps(self, ranks: Sequence[int]) -> str:
        return ", ".join(f"rank {r}: {self._ranks[r].last_step if self._ranks[r].last_step is not None else 'none'}"
                         for r in ranks)

    def _check_timeouts(self) -> None:
        if self._stop_reason is not None:
            return
        now = time.monotonic()
        unfinished = self._unfinished_ranks()
        if self._timeout_s is not None and now - self._start_monotonic > self._timeout_s and unfinished:
            self._error = LaunchTimeout(
                f"the job did not finish within timeout_s={self._timeout_s:g}: rank(s) {unfinished} were still "
                f"running (last reported step: {self._last_steps(unfinished)}). A rank waiting in a collective "
                f"that another rank never entered looks like this; otherwise raise timeout_s.", unfinished)
            self._begin_stop("timeout")
            return
        if self._idle_timeout_s is not None:
            idle = [r.rank for r in self._ranks if r.rank in unfinished
                    and now - r.last_message_s > self._idle_timeout_s]
            if idle:
                self._error = LaunchTimeout(
                    f"rank(s) {idle} sent nothing for idle_timeout_s={self._idle_timeout_s:g} s (last reported "
                    f"step: {self._last_steps(idle)}); they look hung, e.g. in a collective that another rank "
                    f"never entered. Report metrics more often or raise idle_timeout_s.", idle)
                self._begin_stop("timeout")

    def _begin_stop(self, reason: str) -> None:
        with self._lock:
            if self._stop_reason is not None:
                return
            self._stop_reason = reason
            self._kill_deadline = time.monotonic() + self._grace_s
        self._terminate_all(signal.SIGTERM)

    def _escalate(self) -> None:
        if self._kill_deadline is not None and time.monotonic() > self._kill_deadline:
            self._terminate_all(signal.SIGKILL)

    def _terminate_all(self, sig: int) -> None:
        for state in self._ranks:
            if state.process.poll() is None:
                try:
                    os.killpg(state.process.pid, sig)  # the worker and anything it started
                except ProcessLookupError:
                    pass

    def _all_exited_and_drained(self) -> bool:
        now = time.monotonic()
        for state in self._ranks:
            if state.process.poll() is None:
                return False
            if state.exited_s is None:
                state.exited_s = now
            if state.conn is not None and now - state.exited_s < 1.0:
                return False  # give its last messages a moment to arrive
        return True

    def _finish(self) -> None:
        for state in self._ranks:
            if state.process.poll() is None:  # only reached when the monitor itself failed
                state.process.kill()
            state.process.wait()
            if state.conn is not None:
                state.conn.close()
                state.conn = None
        for thread in self._output_threads:
            thread.join(timeout=1.0)
        # the earliest error is the cause; later ones are usually peers losing their connection to it
        errors = sorted((r for r in self._ranks if r.error is not None), key=lambda r: r.error_time)
        if self._stop_reason == "failure" and errors:
            first = errors[0].error
            self._error = WorkerError(first.rank, first.exc_type, first.exc_message, first.traceback,
                                      [r.error for r in errors[1:]])
        elif self._stop_reason == "user" and self._error is None:
            self._error = JobStopped(f"the job was stopped before rank(s) {self._unfinished_ranks()} finished")
        del self._store
        _LIVE_JOBS.discard(self)
        self._done.set()
        self._queue.put(_END)

    # ---------------------------------------------------------------- public API
    @property
    def done(self) -> bool:
        """True once every worker has exited (successfully or not)."""
        return self._done.is_set()

    @property
    def error(self) -> Optional[LaunchError]:
        """The job's error once done (WorkerError, LaunchTimeout, JobStopped), else None."""
        return self._error if self.done else None

    @property
    def pids(self) -> List[int]:
        """The worker process ids, by rank."""
        return [r.process.pid for r in self._ranks]

    def status(self) -> List[Dict[str, Any]]:
        """One row per rank: rank, pid, state (starting/running/finishing/finished/failed/stopped), last step."""
        return [{"rank": r.rank, "pid": r.process.pid, "state": r.state, "last_step": r.last_step,
                 "returncode": r.process.returncode} for r in self._ranks]

    def output(self, rank: int) -> str:
        """The last lines (up to 200) that rank printed."""
        return "".join(self._ranks[rank].output)

    def metrics(self, raise_on_error: bool = True) -> Iterator[Dict[str, Any]]:
        """Yield every metrics dict as it arrives (rank, time_s and what the worker reported), until the job ends.

        Ends by raising the job's error (WorkerError / LaunchTimeout) unless `raise_on_error=False`.
        """
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                self._queue.put(_END)  # let other consumers end too
                break
            yield item
        if raise_on_error and self._error is not None and not isinstance(self._error, JobStopped):
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> List[Any]:
        """Block until every worker has exited; return each rank's return value (index = rank).

        Raises the WorkerError / LaunchTimeout / JobStopped that ended the job, or TimeoutError when `timeout`
        (seconds, for this call only) passes first.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the job is still running after {timeout} s (ranks {self._unfinished_ranks()})")
        if self._error is not None:
            raise self._error
        if self._callback_error is not None:
            raise self._callback_error
        return [r.result for r in self._ranks]

    results = wait

    def request_stop(self) -> None:
        """Ask the workers to stop cooperatively: `ctx.stop_requested()` becomes True in each of them."""
        for state in self._ranks:
            conn = state.conn
            if conn is not None:
                try:
                    conn.send_bytes(cloudpickle.dumps(("stop", None)))
                except OSError:
                    pass

    def stop(self) -> None:
        """Stop every worker now (SIGTERM, SIGKILL after `grace_s`) and wait until all have exited."""
        if not self.done:
            self._begin_stop("user")
        self._done.wait()

    def __repr__(self) -> str:
        states = ", ".join(f"{r.rank}:{r.state}" for r in self._ranks)
        return f"Job(world_size={self.world_size}, backend={self.backend!r}, ranks=[{states}])"


def start(fn: Callable[..., Any], world_size: int = 1, *args: Any, kwargs: Optional[Mapping[str, Any]] = None,
          backend: Optional[str] = None, num_threads: Optional[int] = None, timeout_s: Optional[float] = None,
          idle_timeout_s: Optional[float] = None, collective_timeout_s: float = 120.0, grace_s: float = 3.0,
          on_metrics: Optional[Callable[[Dict[str, Any]], None]] = None, env: Optional[Mapping[str, str]] = None,
          echo_output: bool = True) -> Job:
    """Start `fn(ctx, *args, **kwargs)` on `world_size` local processes; return a `Job` at once.

    - `backend`: "gloo" or "nccl"; default nccl when `world_size` GPUs are visible, gloo otherwise.
    - `num_threads`: torch threads per worker (default: cores // world_size, at least 1).
    - `timeout_s`: the whole job's time limit; `idle_timeout_s`: limit on a rank's silence (no report);
      `collective_timeout_s`: the process group's timeout, so a collective that never completes raises.
    - `grace_s`: how long a stopped worker gets after SIGTERM before SIGKILL.
    - `on_metrics(metrics)`: called in the job's monitor thread for each report (widgets); metrics are also
      kept in `job.history` and streamed by `job.metrics()`.
    - `env`: extra environment variables for the workers; `echo_output`: print worker output as "[rank r] ...".
    """
    return Job(fn, world_size, args, kwargs or {}, backend, num_threads, timeout_s, idle_timeout_s,
               collective_timeout_s, grace_s, on_metrics, env, echo_output)


def launch(fn: Callable[..., Any], world_size: int = 1, *args: Any, kwargs: Optional[Mapping[str, Any]] = None,
           backend: Optional[str] = None, num_threads: Optional[int] = None, timeout_s: Optional[float] = None,
           idle_timeout_s: Optional[float] = None, collective_timeout_s: float = 120.0, grace_s: float = 3.0,
           on_metrics: Optional[Callable[[Dict[str, Any]], None]] = None, env: Optional[Mapping[str, str]] = None,
           echo_output: bool = True) -> List[Any]:
    """Run `fn(ctx, *args, **kwargs)` on `world_size` local processes and return each rank's return value.

    Blocks; `on_metrics` is called in the caller's thread for each report as it arrives. A worker that raises
    ends the job with a WorkerError naming its rank (with its traceback) after every other worker was
    stopped; an interrupt (Ctrl-C, Jupyter's stop button) stops every worker and re-raises. Arguments as in
    `start`.
    """
    job = start(fn, world_size, *args, kwargs=kwargs, backend=backend, num_threads=num_threads,
                timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, collective_timeout_s=collective_timeout_s,
                grace_s=grace_s, env=env, echo_output=echo_output)
    try:
        for metrics in job.metrics():
            if on_metrics is not None:
                on_metrics(metrics)
        return job.wait()
    except BaseException:
        job.stop()
        raise


@atexit.register
def _stop_live_jobs() -> None:
    for job in list(_LIVE_JOBS):
        job.stop()


class CallableModule(types.ModuleType):
    """Lets the package itself be called: `rectoolkit.launch(fn, 2)` is `rectoolkit.launch.launch(fn, 2)`,
    while `rectoolkit.launch.start`, `import rectoolkit.launch as L` etc. keep working."""

    def __call__(self, fn: Callable[..., Any], world_size: int = 1, *args: Any, **kwargs: Any) -> List[Any]:
        return launch(fn, world_size, *args, **kwargs)
