"""The keeper: the process the launcher spawns for a rank; it starts the worker and outlives it by a moment.

A worker that is SIGKILLed (the OOM killer, `kill -9`) or crashes in native code runs none of its own clean-up,
and a helper it started that left its process group and its environment (`subprocess.Popen(...,
start_new_session=True, env=...)`) carries nothing the launcher could find it by: the moment the worker dies, the
kernel re-parents that helper to the nearest child subreaper above it, or to init. So each rank is a keeper and
its worker: the keeper makes itself a child subreaper, starts the worker (`python -m rectoolkit.launch._worker
FD KEEPER_PID`, in the keeper's process group and session), waits for it, and when the worker has exited,
however it exited, kills every descendant left (the worker's helpers, now the keeper's), then ends the way the
worker did (its exit code, or the signal that killed it), so the launcher sees the worker's own end. The
launcher's signals to the group reach both; the keeper ignores SIGTERM and SIGINT (it goes when the worker has
gone), not SIGKILL. A worker whose keeper is gone kills its helpers and itself (`_worker._watch_parent`); a
keeper whose launcher is gone kills its worker and everything below it, even when the launcher's socket stays
open in a process it forked (a multiprocessing pool of the notebook).

The launcher runs this file by its path, `python .../_keeper.py FD`, not with `-m`: importing the rectoolkit
package (torch) would cost every rank seconds of start-up and hundreds of MB for a process that only waits.
So it uses the standard library and its sibling `_reap` (which is standard library only), loaded by path.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import select
import signal
import subprocess
import sys
from pathlib import Path


def _load_reap():
    spec = importlib.util.spec_from_file_location("_rectoolkit_launch_reap", Path(__file__).with_name("_reap.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keep(fd: int) -> None:
    """Start the worker (handing it the launcher's socket `fd`), wait for it, kill what it left, end as it did."""
    reap = _load_reap()
    reap.become_subreaper()
    worker = subprocess.Popen([sys.executable, "-m", "rectoolkit.launch._worker", str(fd), str(os.getpid())],
                              pass_fds=(fd,))
    for sig in (signal.SIGTERM, signal.SIGINT):  # set after the start: the worker keeps the default actions
        signal.signal(sig, signal.SIG_IGN)
    os.close(fd)  # only the worker holds it now, so the launcher sees it close when the worker is gone
    returncode = _wait_watching_the_launcher(worker, reap)
    reap.kill_descendants(os.getpid())
    _end_like(returncode)


def _wait_watching_the_launcher(worker: subprocess.Popen, reap) -> int:
    """Wait for the worker; if the launcher (this keeper's parent) dies first, kill the worker and its helpers."""
    launcher_pid = os.getppid()
    try:
        pidfd = os.pidfd_open(worker.pid)  # readable once the worker has exited (Linux 5.3 and later)
    except (AttributeError, OSError):
        return worker.wait()  # elsewhere the worker watches the launcher's socket alone
    try:
        while not select.select([pidfd], [], [], 0.5)[0]:
            if os.getppid() != launcher_pid:
                reap.kill_descendants(os.getpid())
    finally:
        os.close(pidfd)
    return worker.wait()


def _end_like(returncode: int) -> None:
    """Exit with `returncode` (>= 0), or die of signal -`returncode`, as the worker did."""
    if returncode >= 0:
        os._exit(returncode)
    number = -returncode
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no 2nd core
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)  # a signal whose default action does not end a process


if __name__ == "__main__":
    keep(int(sys.argv[1]))
