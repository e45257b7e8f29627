"""Starting one rank: its keeper process (which starts the worker, see `_keeper`), in a session and process group
of its own, with the rank's environment (torchrun's variables, the job's tag that `_reap` finds its helpers by)
and a socket pair to the caller, over which the worker gets its spec (`_worker.main` reads it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Mapping, Optional

import cloudpickle

from rectoolkit.launch._reap import TAG_VARIABLE
from rectoolkit.launch.rank import RankState
from rectoolkit.launch.shipping import notebook_sources

KEEPER = str(Path(__file__).with_name("_keeper.py"))  # run by its path: see _keeper


def start_rank(rank: int, world_size: int, store_port: int, num_threads: int, tag: str,
               env: Optional[Mapping[str, str]]) -> RankState:
    """Start rank `rank`'s keeper: its processes tagged `tag`.<rank>, with `env` added to the caller's environment.
    Its output is a pipe for the caller to read (`process.stdout`, stderr included). Send it its spec next
    (`send_spec`); record it first, so that an interrupt in between leaves nothing unknown behind."""
    parent_end, child_end = socket.socketpair()
    worker_env = dict(os.environ)
    worker_env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store_port),
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(num_threads), TAG_VARIABLE: f"{tag}.{rank}",
    })
    worker_env.update({str(k): str(v) for k, v in (env or {}).items()})
    try:
        process = subprocess.Popen(  # the rank's keeper, which starts its worker (see _keeper)
            [sys.executable, KEEPER, str(child_end.fileno())],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=worker_env, start_new_session=True,
        )
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()
    return RankState(rank=rank, process=process, conn=Connection(parent_end.detach()),
                     last_message_s=time.monotonic())


def send_spec(state: RankState, job_spec: Mapping[str, Any], cpus: Optional[list]) -> None:
    """Send a started rank what its worker needs: `job_spec` (what every rank gets: world_size, backend,
    store_port, collective_timeout_s, num_threads, payload), its own rank and cores, the caller's sys.path and the
    notebook cells' source."""
    spec = dict(job_spec, rank=state.rank, local_rank=state.rank, store_host="127.0.0.1", cpus=cpus,
                sys_path=[p for p in sys.path if p], linecache=notebook_sources())
    state.conn.send_bytes(cloudpickle.dumps(spec))
