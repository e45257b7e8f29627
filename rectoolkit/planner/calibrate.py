"""Measure this machine's memory and collective bandwidth, so estimated times compare with local runs.

    >>> bw = measure_memory_bandwidth(seconds=0.1)  # bytes per millisecond
    >>> bw > 0
    True
"""

from __future__ import annotations

import os
import socket
import time

import torch


def measure_memory_bandwidth(seconds: float = 1.0, rows: int = 1 << 18, dim: int = 64) -> float:
    """Bytes/ms read by a random-row gather (an embedding lookup's access pattern), single thread."""
    table = torch.randn(rows, dim)
    ids = torch.randint(0, rows, (1 << 16,))
    bytes_per_call = ids.numel() * dim * 4 * 2  # rows read + output written
    torch.index_select(table, 0, ids)  # warm up
    calls, start = 0, time.perf_counter()
    while True:
        torch.index_select(table, 0, ids)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 3:
            break
    return bytes_per_call * calls / (elapsed * 1000.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alltoall_worker(rank: int, world_size: int, port: int, seconds: float, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        per_peer = 1 << 18  # floats to each peer
        send = torch.randn(world_size * per_peer)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # warm up
        calls, start = 0, time.perf_counter()
        deadline = torch.tensor([0])
        while True:
            dist.all_to_all_single(recv, send)
            calls += 1
            deadline[0] = int(time.perf_counter() - start >= seconds)
            dist.all_reduce(deadline, op=dist.ReduceOp.MIN)  # all ranks stop on the same call
            if deadline.item():
                break
        elapsed = time.perf_counter() - start
        moved = 2 * (world_size - 1) * per_peer * 4 * calls  # sent + received, off-diagonal
        if rank == 0:
            queue.put(moved / (elapsed * 1000.0))
    finally:
        dist.destroy_process_group()


def measure_collective_bandwidth(world_size: int = 2, seconds: float = 2.0, timeout_s: float = 60.0) -> float:
    """Bytes/ms (sent + received) one rank moves in gloo all-to-alls among `world_size` local processes."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_alltoall_worker, args=(r, world_size, port, seconds, queue)) for r in range(world_size)]
    for proc in procs:
        proc.start()
    try:
        result = queue.get(timeout=timeout_s)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return float(result)
