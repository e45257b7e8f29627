"""Workers of tests/distributed/test_collective_utils_vs_torchrec.py (importable by spawned processes): each runs
TorchRec 1.8's collective_utils and rectoolkit's on the same calls in the same gloo worker, in the same order on
every rank, and compares what comes back."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rectoolkit.distributed import collective_utils as ours


def _describe(rank: int, tag: str, calls: list) -> dict:
    calls.append(rank)  # a side effect: the function runs only on the chosen rank
    return {"ran_on": rank, "tag": tag, "tensor": torch.arange(3) * (rank + 1)}


def broadcast_worker(rank: int, world_size: int) -> None:
    from torchrec.distributed import collective_utils as theirs

    pg = dist.group.WORLD
    for leader in (0, 1, 2):
        assert ours.is_leader(pg, leader) == theirs.is_leader(pg, leader), (rank, leader)
        assert ours.is_leader(None, leader) == theirs.is_leader(None, leader), leader
    assert ours.is_leader(pg) == theirs.is_leader(pg)
    for source in range(world_size):
        seen = []
        for lib in (ours, theirs):
            calls: list = []
            result = lib.invoke_on_rank_and_broadcast_result(pg, source, _describe, rank, tag="t", calls=calls)
            seen.append((result["ran_on"], result["tag"], result["tensor"].tolist(), calls))
            leader_calls: list = []

            @lib.run_on_leader(pg, source)
            def allocate(base: int) -> int:
                """doc"""
                leader_calls.append(rank)
                return base + 10 * rank

            seen.append((allocate(5), leader_calls, allocate.__name__, allocate.__doc__))
        assert seen[0] == seen[2] and seen[1] == seen[3], (rank, source, seen)
        assert seen[0][0] == source and seen[0][3] == ([rank] if rank == source else []), seen


def _make(rank: int):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * rank
    return {"table": base, "none": None, "column": base[:, 1], "ids": torch.tensor([7, 8], dtype=torch.int64)}


def _extract(made):
    return [made["table"], made["none"], made["column"], made["ids"]]


def _construct(tensors):
    return {"table": tensors[0], "none": tensors[1], "column": tensors[2], "ids": tensors[3]}


def share_worker(rank: int, world_size: int) -> None:
    from torchrec.distributed import collective_utils as theirs

    pg = dist.group.WORLD
    for source in range(world_size):
        seen = []
        for lib in (ours, theirs):
            made = lib.create_on_rank_and_share_result(pg, source, _make, _extract, _construct, source)
            values = {key: None if value is None else (value.tolist(), value.dtype, value.shape, value.stride())
                      for key, value in made.items()}
            dist.barrier()
            if rank != source:  # a write on a mapping rank is seen by the creator: the memory is one
                made["column"].add_(1000)
            dist.barrier()
            seen.append((values, made["table"].tolist(), made["column"].data_ptr() == made["table"].data_ptr() + 4))
            dist.barrier()
        assert seen[0] == seen[1], (rank, source, seen)
        assert seen[0][0]["table"][0][0][0] == 100 * source and seen[0][1][0][1] == 100 * source + 1001, seen


def bad_rank_worker(rank: int, world_size: int) -> None:
    pg = dist.group.WORLD
    for function, args in ((ours.invoke_on_rank_and_broadcast_result, (len, [1])),
                           (ours.create_on_rank_and_share_result, (_make, _extract, _construct, 0))):
        try:
            function(pg, world_size, *args)
        except ValueError as error:
            assert f"rank={world_size} is not in the process group (ranks 0..{world_size - 1}" in str(error), error
        else:
            raise AssertionError(f"{function.__name__} accepted rank {world_size} of a group of {world_size}")
