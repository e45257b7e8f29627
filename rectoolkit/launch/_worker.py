"""The bootstrap every launched worker runs: `python -m rectoolkit.launch._worker FD KEEPER_PID`.

Its parent is the rank's keeper (`_keeper`), which kills what the worker started once the worker has gone, even
when it was SIGKILLed. The worker reads its spec from the socket FD that the launcher passed it (rank, world
size, the rendezvous store's address, the cloudpickled worker function), sets up torch.distributed, calls
`fn(ctx, *args)`, and sends back metrics, the return value or the formatted traceback. The function travels by value
(cloudpickle), so a function defined in a notebook cell or a `__main__` script works. A watcher thread
answers the launcher's requests (stop, "where are you?") and, as soon as the launcher goes away, kills
this worker with its whole process group and everything carrying its tag, so nothing outlives its caller; it
does the same when its keeper dies.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Dict

import cloudpickle

from rectoolkit.launch._reap import TAG_VARIABLE, become_subreaper, kill_descendants, kill_group, kill_tagged
from rectoolkit.launch.affinity import bind_this_process
from rectoolkit.launch.errors import exception_text


_DYING = threading.Lock()


def _die_with_helpers() -> None:
    """The launcher is gone: kill what this worker started (its tag, its group), then the worker itself.

    The watcher thread and the main thread's exit may both get here; the lock makes the second wait for the
    first to finish (its os._exit ends the process), so no exit cuts a sweep short."""
    with _DYING:
        kill_descendants(os.getpid())
        kill_tagged(os.environ.get(TAG_VARIABLE, f"no-tag-{os.getpid()}"))
        kill_group(os.getpgrp(), signal.SIGKILL)
        os._exit(3)


def _error_payload(exc: BaseException) -> Dict[str, Any]:
    """What the caller gets of a rank's exception: plain strings only, so that shipping it cannot fail however odd
    the exception is (a __reduce__, __str__ or __getattr__ that raises)."""
    try:  # raised because another rank failed (e.g. a checkpoint's CheckpointPeerError)
        peer_failure = bool(getattr(exc, "peer_failure", False))
    except BaseException:
        peer_failure = False
    return {"exc_type": type(exc).__name__, "message": exception_text(exc), "traceback": traceback.format_exc(),
            "time": time.time(), "peer_failure": peer_failure}


def _sharded_tensor_at(value: Any, path: str = "the return value") -> str:
    """Where in `value` (dicts, lists and tuples searched) a torch ShardedTensor is, or "". None can exist unless
    torch's module for it was imported, so nothing is searched then."""
    module = sys.modules.get("torch.distributed._shard.sharded_tensor")
    if module is None:
        return ""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, module.ShardedTensor):
            return where
        if isinstance(item, dict):
            stack.extend((v, f"{where}[{k!r}]") for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return ""


def _pickled_result(rank: int, result: Any) -> bytes:
    """The "result" message, or a TypeError that names the rank and the value's type when it cannot be pickled:
    whatever its __reduce__ raises, an Exception or a BaseException (KeyboardInterrupt, SystemExit, one of the
    caller's own), which would otherwise pass for the rank's own failure. A ShardedTensor pickles here but cannot
    be unpickled outside the workers' process group: refused here, naming where it is."""
    where = _sharded_tensor_at(result)
    if where:
        raise TypeError(f"rank {rank}: {where} is a torch ShardedTensor (a sharded model's state_dict() holds each "
                        "rank's shards as ShardedTensors, as TorchRec's), which the caller cannot unpickle outside the "
                        "workers' process group; return whole tensors: rectoolkit.distributed.full_state_dict(model) "
                        "(a collective: every rank calls it), or this rank's pieces "
                        "([shard.tensor for shard in value.local_shards()])")
    try:
        return cloudpickle.dumps(("result", result))
    except BaseException as exc:
        raise TypeError(f"rank {rank}'s return value of type {type(result).__name__} cannot be pickled back to the "
                        f"caller ({type(exc).__name__}: {exception_text(exc)}); return plain values (numbers, "
                        f"strings, lists, dicts, tensors) or give its class a __reduce__ that works") from exc


def _wait_for_every_rank(store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
    """Return once every rank's process group is up. gloo's start-up can return on one rank while a peer is still
    connecting to it: a rank whose function then returns at once (or raises) and exits would break that peer's
    start-up ("Connection closed by peer"), which would be blamed on the peer."""
    store.set(f"rectoolkit.launch/up/{rank}", "1")
    store.wait([f"rectoolkit.launch/up/{peer}" for peer in range(world_size)], timeout)


def _where_main_thread_is() -> str:
    """The main thread's current stack, for the launcher's "which rank hangs, and where?" question."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(main thread not found)"


def _watch_parent(conn: Connection, keeper_pid: int, stop_event: threading.Event, send) -> None:
    """Answer the launcher's requests; die at once when the launcher dies (socket closed) or the keeper does."""
    while True:
        if os.getppid() != keeper_pid:
            _die_with_helpers()
        try:
            if conn.poll(0.5):
                kind, _ = cloudpickle.loads(conn.recv_bytes())
                if kind == "stop":
                    stop_event.set()
                elif kind == "where":
                    send("where", _where_main_thread_is())
        except (EOFError, OSError):
            _die_with_helpers()


def _pick_device(backend: str, local_rank: int):
    import torch

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def main(fd: int, keeper_pid: int) -> None:
    conn = Connection(fd)
    faulthandler.enable(all_threads=False)  # a crash in native code (SIGSEGV, SIGABRT) prints the Python stack
    become_subreaper()  # what this worker starts stays its descendant, so that it can be killed with it
    spec: Dict[str, Any] = cloudpickle.loads(conn.recv_bytes())
    bind_this_process(spec["cpus"])  # first: every thread started from here on (gloo's too) inherits the cores
    for path in reversed(spec["sys_path"]):
        if path not in sys.path:
            sys.path.insert(0, path)
    linecache.cache.update(spec["linecache"])  # notebook cells' source, for readable tracebacks
    send_lock = threading.Lock()

    def send_bytes(data: bytes) -> None:
        with send_lock:
            conn.send_bytes(data)

    def send(kind: str, payload: Any) -> None:
        send_bytes(cloudpickle.dumps((kind, payload)))

    stop_event = threading.Event()
    threading.Thread(target=_watch_parent, args=(conn, keeper_pid, stop_event, send), daemon=True).start()

    rank = spec["rank"]
    exit_code = 0
    import torch
    import torch.distributed as dist

    from rectoolkit.launch.context import WorkerContext

    try:
        torch.set_num_threads(spec["num_threads"])
        fn, args, kwargs = cloudpickle.loads(spec["payload"])
        device = _pick_device(spec["backend"], spec["local_rank"])
        timeout = timedelta(seconds=spec["collective_timeout_s"])
        store = dist.TCPStore(spec["store_host"], spec["store_port"], is_master=False, timeout=timeout)
        dist.init_process_group(spec["backend"], store=store, rank=rank, world_size=spec["world_size"],
                                timeout=timeout)
        _wait_for_every_rank(store, rank, spec["world_size"], timeout)
        ctx = WorkerContext(rank=rank, world_size=spec["world_size"], local_rank=spec["local_rank"],
                            local_world_size=spec["world_size"], device=device, backend=spec["backend"],
                            cpus=spec["cpus"],
                            _send=lambda metrics: send("metrics", metrics), _stop_event=stop_event)
        send("started", {"pid": os.getpid()})
        try:
            result = fn(ctx, *args, **kwargs)
        except SystemExit as exiting:  # sys.exit() / sys.exit(0): a rank that ends cleanly, as torchrun counts it
            if exiting.code not in (None, 0):
                raise
            result = None
        send_bytes(_pickled_result(rank, result))  # an unpicklable return value is the worker's error
    except BaseException as exc:  # ship every failure home, with its traceback
        exit_code = 1
        try:
            send("error", _error_payload(exc))
        except OSError:  # the launcher is gone
            exit_code = 3
    if exit_code == 0 and dist.is_initialized():
        dist.destroy_process_group()  # only on success: after a failure a peer may be gone, so just exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # fn closed or replaced it: what it printed is gone already
            pass
    conn.close()
    launcher_gone = exit_code == 3 or os.getppid() != keeper_pid
    if launcher_gone:  # nobody else will kill what this worker started
        _die_with_helpers()
    kill_descendants(os.getpid())  # a helper that left this worker's group and tag: nothing outlives the job
    os._exit(exit_code)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
