"""Workers of test_node_groups: each rank reports its place among the hosts and its groups' members, from
rectoolkit and from TorchRec, to a file the test reads."""

from __future__ import annotations

import json
import os

import torch.distributed as dist


def node_groups_worker(rank: int, world_size: int, out_dir: str) -> None:
    from rectoolkit.distributed import comm

    intra, cross = comm.intra_and_cross_node_pg()
    assert comm.intra_and_cross_node_pg() == (intra, cross)  # created once per process
    report = {"local_size": comm.get_local_size(), "local_rank": comm.get_local_rank(),
              "group_rank": comm.get_group_rank(), "num_groups": comm.get_num_groups(),
              "intra": dist.get_process_group_ranks(intra), "cross": dist.get_process_group_ranks(cross)}
    try:
        import torchrec.distributed.comm as theirs
    except ImportError:
        theirs = None
    if theirs is not None:
        t_intra, t_cross = theirs.intra_and_cross_node_pg()
        report["torchrec"] = {
            "local_size": theirs.get_local_size(), "local_rank": theirs.get_local_rank(),
            "group_rank": theirs.get_group_rank(), "num_groups": theirs.get_num_groups(),
            "intra": dist.get_process_group_ranks(t_intra), "cross": dist.get_process_group_ranks(t_cross)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
