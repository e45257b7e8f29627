"""TorchRec's collective building blocks (torchrec.distributed.comm_ops, dist_data) against TorchRec 1.8 on 2 gloo
ranks: the same KJTs out of KJTAllToAll, the same outputs and input gradients out of the embeddings' collectives
(dist_comm_ops_workers.py). Also the refusals and the recat order."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.distributed import comm_ops, dist_data
from dist_harness import run_workers
from dist_comm_ops_workers import kjt_all_to_all_worker, pooled_all_to_all_worker, reduce_scatter_all_gather_worker


def _torchrec_dist_data():
    pytest.importorskip("fbgemm_gpu")
    return pytest.importorskip("torchrec.distributed.dist_data")


@pytest.mark.parametrize("local_split,num_splits,stagger,batch_size_per_rank",
                         [(2, 4, 1, None), (2, 4, 2, None), (0, 4, 2, None), (3, 2, 1, [2, 2]), (1, 2, 1, [1, 3]),
                          (2, 4, 2, [1, 2, 3, 1])])
def test_recat_is_torchrecs(local_split, num_splits, stagger, batch_size_per_rank):
    theirs = _torchrec_dist_data()._get_recat(local_split, num_splits, stagger, torch.device("cpu"),
                                              batch_size_per_rank)
    ours = dist_data.kjt_recat(local_split, num_splits, stagger, torch.device("cpu"), batch_size_per_rank)
    assert (ours is None) == (theirs is None)
    if ours is not None:
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_sync_collectives_switch_and_context():
    assert comm_ops.get_use_sync_collectives() is False
    with comm_ops.torchrec_use_sync_collectives():
        assert comm_ops.get_use_sync_collectives() is True
    assert comm_ops.get_use_sync_collectives() is False


def test_request_waited_without_a_collective_says_where_requests_come_from():
    with pytest.raises(RuntimeError, match="no collective was started"):
        comm_ops.Request(None, torch.device("cpu")).wait()


def test_info_dataclasses_have_torchrecs_fields():
    theirs = pytest.importorskip("torchrec.distributed.comm_ops")
    import dataclasses

    for name in ("All2AllPooledInfo", "VariableBatchAll2AllPooledInfo", "All2AllSequenceInfo", "All2AllVInfo",
                 "ReduceScatterInfo", "ReduceScatterBaseInfo", "AllGatherBaseInfo", "ReduceScatterVInfo",
                 "All2AllDenseInfo"):
        assert [(f.name, f.default) for f in dataclasses.fields(getattr(comm_ops, name))] == \
            [(f.name, f.default) for f in dataclasses.fields(getattr(theirs, name))], name


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_kjt_all_to_all_matches_torchrec():
    _torchrec_dist_data()
    run_workers(kjt_all_to_all_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_pooled_all_to_all_outputs_and_gradients_match_torchrec():
    _torchrec_dist_data()
    run_workers(pooled_all_to_all_worker, 2)


@pytest.mark.parametrize("module", [comm_ops, dist_data])
def test_docstring_examples(module):
    import doctest

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0, result


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_reduce_scatter_and_all_gather_outputs_and_gradients_match_torchrec():
    _torchrec_dist_data()
    run_workers(reduce_scatter_all_gather_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_table_wise_sharded_module_written_the_torchrec_way_equals_the_unsharded_collection():
    _torchrec_dist_data()
    from dist_custom_sharded_workers import custom_sharded_worker

    run_workers(custom_sharded_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_sequence_all_to_all_outputs_and_gradients_match_torchrec():
    _torchrec_dist_data()
    from dist_comm_ops_workers import sequence_all_to_all_worker

    run_workers(sequence_all_to_all_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_variable_batch_pooled_all_to_all_outputs_and_gradients_match_torchrec():
    _torchrec_dist_data()
    from dist_comm_ops_workers import variable_batch_worker

    run_workers(variable_batch_worker, 2)
