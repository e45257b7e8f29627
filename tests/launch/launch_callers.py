"""Caller scripts for the launch fault tests, forked from a process that has already imported rectoolkit.launch.

Each fault case is a caller script run in a process of its own (`test_faults.run_case`). Started as
`python case.py`, every one of them first imported torch and rectoolkit (about half of a case's time on 2 cores).
So the first case starts this file as a server that imports them once; each case is then a fork of it that runs
the script as `__main__` (`runpy.run_path`: functions defined in it pickle by value, as in a notebook or a script),
in a session of its own, with the case's environment, its stdout and stderr going to files, and ends as Python ends
a script: non-daemon threads joined, atexit handlers run, stdio flushed, the exit code of its SystemExit (1 for an
exception; killed by SIGINT for an uncaught KeyboardInterrupt). The server only imports: it runs no torch op,
starts no Python thread and joins no process group, so every case starts clean (the distributed tests' forkserver
does the same, see tests/distributed/dist_harness.py). The server ends when its stdin closes (the test session
ends, or `close()`).

Protocol, one JSON line each way: {"script", "env", "stdout", "stderr"} -> {"pid"} at the fork, {"pid", "code"}
when the case process has exited (`code` as Popen's returncode: negative for a signal).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

PRELOAD = ("json", "os", "signal", "subprocess", "sys", "threading", "time", "pathlib", "rectoolkit.launch")


def _run_script(script: str, env: dict, stdout: str, stderr: str) -> None:
    """In the forked child: run `script` as a fresh `python script` would, then leave as the interpreter does."""
    import atexit
    import runpy
    import threading
    import traceback

    os.setsid()
    for number, path, mode in ((0, os.devnull, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                               (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        fd = os.open(path, mode, 0o644)
        os.dup2(fd, number)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script]
    sys.path[0] = str(Path(script).parent)  # as `python script` puts the script's folder first
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exiting:
        if exiting.code is None or isinstance(exiting.code, int):
            code = exiting.code or 0
        else:
            print(exiting.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT  # as Python ends on an uncaught KeyboardInterrupt: killed by SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # as the interpreter's exit: wait for non-daemon threads, then atexit handlers
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def serve() -> None:
    """The server: import PRELOAD, then fork one case per request line until stdin closes."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    reply = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_script(request["script"], request["env"], request["stdout"], request["stderr"])
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
        reply.flush()


_server: Optional[subprocess.Popen] = None
_unread = b""  # what was read from the server's stdout beyond the last reply line


def _started_server() -> subprocess.Popen:
    global _server, _unread
    if _server is None or _server.poll() is not None:
        _unread = b""
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    return _server


def _reply(server: subprocess.Popen, timeout_s: Optional[float]) -> Optional[dict]:
    """The server's next reply line, or None once `timeout_s` has passed without one. Read from the pipe's file
    descriptor with a buffer of our own: a line already read ahead must not wait for the pipe to be readable."""
    global _unread
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while b"\n" not in _unread:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([server.stdout], [], [], left)[0]:
            return None
        chunk = os.read(server.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError("the launch test caller server exited (see its stderr above)")
        _unread += chunk
    line, _unread = _unread.split(b"\n", 1)
    return json.loads(line)


def run(script: Path, env: dict, timeout_s: float) -> Tuple[Optional[int], str, str]:
    """Run `script` as a caller process (a fork of the server); return (exit code, stdout, stderr). Past
    `timeout_s`, its session is SIGKILLed and the exit code is None."""
    global _server
    server = _started_server()
    out_path, err_path = script.with_suffix(".stdout"), script.with_suffix(".stderr")
    server.stdin.write(json.dumps({"script": str(script), "env": env, "stdout": str(out_path),
                                   "stderr": str(err_path)}) + "\n")
    server.stdin.flush()
    pid = _reply(server, None)["pid"]  # the server imported PRELOAD before it reads the request
    try:
        done = _reply(server, timeout_s)
    except BaseException:  # pytest-timeout, Ctrl-C: end the case, and the server, whose next reply is this case's
        _kill_session(pid)
        server.kill()
        server.wait()
        _server = None
        raise
    if done is None:
        _kill_session(pid)
        _reply(server, None)
    code = None if done is None else done["code"]
    return code, out_path.read_text(), err_path.read_text()


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the case is the leader of a session and process group of its own
    except ProcessLookupError:
        pass


def close() -> None:
    """End the server (its stdin closes; it exits after the case it runs, if any)."""
    global _server
    if _server is not None:
        _server.stdin.close()
        _server.wait(timeout=60)
        _server.stdout.close()
        _server = None


if __name__ == "__main__":
    serve()
