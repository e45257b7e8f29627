"""rectoolkit.distributed.comm's host helpers (node_groups.py): ranks per host, local and group rank, and the
intra-host / cross-host process groups, on 4 gloo ranks as 2 hosts of 2, against TorchRec's on the same ranks."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dist_harness import run_workers
from dist_node_group_workers import node_groups_worker


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_four_ranks_as_two_hosts_get_torchrecs_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # so each rank falls back to rank % 2, as TorchRec
    run_workers(node_groups_worker, 4, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    for rank, report in enumerate(reports):
        host, local = divmod(rank, 2)
        expected = {"local_size": 2, "local_rank": local, "group_rank": host, "num_groups": 2,
                    "intra": [2 * host, 2 * host + 1], "cross": [local, local + 2]}
        assert {k: v for k, v in report.items() if k != "torchrec"} == expected, f"rank {rank}"
        if importlib.util.find_spec("torchrec") is not None:
            assert report["torchrec"] == expected, f"rank {rank}"


def test_a_meta_device_gets_no_groups_and_a_missing_process_group_is_named(monkeypatch):
    import torch

    from rectoolkit.distributed import comm

    assert comm.intra_and_cross_node_pg(torch.device("meta")) == (None, None)
    with pytest.raises(RuntimeError, match="no default process group; call torch.distributed.init_process_group"):
        comm.intra_and_cross_node_pg()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two' is not an integer"):
        comm.get_local_size(4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert comm.get_local_size(4) == 4  # 3 does not divide 4: the whole world, as TorchRec
