"""rectoolkit.launch.affinity: which cores each local rank gets, the errors for bad bindings, and launch binding
every thread of a worker (gloo's included) to its rank's cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rectoolkit.launch import launch
from rectoolkit.launch.affinity import all_rank_cpus, available_cpus, can_bind, rank_cpus


def test_auto_splits_the_cores_evenly_and_the_last_rank_keeps_the_remainder():
    cores = [0, 1, 2, 3, 4, 5, 6]
    assert [rank_cpus(r, 3, "auto", available=cores) for r in range(3)] == [[0, 1], [2, 3], [4, 5, 6]]
    assert [rank_cpus(r, 2, "auto", available=[3, 5]) for r in range(2)] == [[3], [5]]


def test_auto_binds_nothing_when_ranks_outnumber_cores():
    assert [rank_cpus(r, 4, "auto", available=[0, 1]) for r in range(4)] == [None] * 4


@pytest.mark.parametrize("binding", ["none", None])
def test_none_binds_nothing(binding):
    assert rank_cpus(0, 2, binding, available=[0, 1]) is None


@pytest.mark.skipif(not can_bind(), reason="this platform has no os.sched_setaffinity")
def test_explicit_lists_are_taken_as_given():
    assert rank_cpus(1, 2, [[0], [1, 0]], available=[0, 1]) == [0, 1]


@pytest.mark.parametrize("binding, message", [
    ("spread", "cpu_binding must be one of"),
    ([[0]], "1 core lists but there are 2 local ranks"),
    ([[0], []], r"cpu_binding\[1\] is empty"),
    ([[0], [7]], r"cpu_binding\[1\] names core\(s\) \[7\]"),
])
def test_bad_bindings_name_what_is_wrong(binding, message):
    with pytest.raises(ValueError, match=message):
        for rank in range(2):
            rank_cpus(rank, 2, binding, available=[0, 1])


def test_local_rank_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"local_rank must be in \[0, 2\), got 2"):
        rank_cpus(2, 2, "auto", available=[0, 1])


def test_launch_refuses_a_bad_binding_before_it_spawns():
    with pytest.raises(ValueError, match="core lists but there are 2 local ranks"):
        launch(_thread_cores, 2, cpu_binding=[[0]])
    with pytest.raises(ValueError, match="must be one of"):
        all_rank_cpus("compact", 2)


def _thread_cores(ctx):
    """The process's mask, ctx.cpus, and every thread's allowed cores (gloo's threads exist: a collective ran)."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        status = (task / "status").read_text()
        allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list:"))
        name = (task / "comm").read_text().strip()
        threads[f"{task.name} {name}"] = _parse_list(allowed.split(":", 1)[1].strip())
    return {"mask": sorted(os.sched_getaffinity(0)), "cpus": ctx.cpus, "threads": threads}


def _parse_list(text: str) -> list:
    """'0-2,5' -> [0, 1, 2, 5] (the kernel's cpu list format)."""
    cores = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cores += range(int(low), int(high or low) + 1)
    return cores



@pytest.mark.multiprocess
@pytest.mark.timeout(90)
@pytest.mark.skipif(not can_bind() or not Path("/proc/self/task").exists(), reason="needs Linux affinity and /proc")
@pytest.mark.skipif(len(available_cpus()) < 2, reason="binding 2 ranks apart needs 2 cores")
def test_auto_binds_every_thread_of_each_rank_to_cores_of_its_own():
    results = launch(_thread_cores, 2, cpu_binding="auto", echo_output=False)
    masks = [set(result["mask"]) for result in results]
    assert all(masks), masks
    assert masks[0].isdisjoint(masks[1]), masks
    assert masks[0] | masks[1] == set(available_cpus())
    for rank, result in enumerate(results):
        assert set(result["cpus"]) == masks[rank]
        assert len(result["threads"]) > 1, result["threads"]  # the main thread and gloo's, at least
        for thread, cores in result["threads"].items():
            assert set(cores) <= masks[rank], f"rank {rank} thread {thread} may run on {cores}, not only {masks[rank]}"


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_unbound_ranks_keep_the_parents_cores():
    results = launch(_thread_cores, 2, echo_output=False)
    assert [result["cpus"] for result in results] == [None, None]
    assert all(result["mask"] == available_cpus() for result in results)
