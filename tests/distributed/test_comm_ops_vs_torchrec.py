"""TorchRec's collective building blocks (torchrec.distributed.comm_ops, dist_data) against TorchRec 1.8 on 2 gloo
ranks: the same KJTs out of KJTAllToAll, the same outputs and input gradients out of the embeddings' collectives
(dist_comm_ops_workers.py). Also the refusals and the recat order."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.distributed import all_to_one, comm_ops, dist_data
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


@pytest.mark.parametrize("module", [comm_ops, dist_data, all_to_one])
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


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_custom_all_to_all_and_all_to_all_single_match_torchrec():
    _torchrec_dist_data()
    from dist_comm_ops_workers import custom_comm_worker

    run_workers(custom_comm_worker, 2)


# ------------------------------------------------------------------------------------------------ one process
def _forward_and_grads(module, tensors, loss_seed):
    """(outputs, input gradients) under a fixed random loss; gradients None where the module has no backward
    (TorchRec 1.8's fbgemm merge on CPU)."""
    leaves = [tensor.clone().requires_grad_(True) for tensor in tensors]
    try:
        out = module(leaves)
    except RuntimeError as error:
        assert "don't support automatic differentiation" in str(error), error
        out = module([tensor.clone() for tensor in tensors])
        return [o for o in (out if isinstance(out, list) else [out])], None
    outs = out if isinstance(out, list) else [out]
    g = torch.Generator().manual_seed(loss_seed)
    sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs).backward()
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves]


def _same_or_checked(ours, theirs, module, tensors):
    """Forward outputs equal; gradients equal TorchRec's, or where TorchRec has none, pass autograd's numerical
    gradient check."""
    assert len(ours[0]) == len(theirs[0]) and all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0]))
    if theirs[1] is not None:
        assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))
    else:
        doubles = [tensor.double().requires_grad_(True) for tensor in tensors]
        assert torch.autograd.gradcheck(lambda *ts: module(list(ts)), doubles)


@pytest.mark.parametrize("name,args,shapes", [
    ("EmbeddingsAllToOne", (2, 1), [(3, 2), (3, 4)]),
    ("EmbeddingsAllToOne", (2, 0), [(2, 3), (4, 3)]),
    ("EmbeddingsAllToOne", (1, 1), [(3, 2)]),
    ("EmbeddingsAllToOneReduce", (2,), [(3, 2), (3, 2)]),
    ("SeqEmbeddingsAllToOne", (2,), [(2, 3), (4, 3)]),
])
def test_all_to_one_modules_match_torchrec(name, args, shapes):
    theirs_module = _torchrec_dist_data()
    g = torch.Generator().manual_seed(len(shapes))
    tensors = [torch.randn(shape, generator=g) for shape in shapes]
    cpu = torch.device("cpu")
    module = getattr(dist_data, name)(cpu, *args)
    ours = _forward_and_grads(module, tensors, 1)
    theirs = _forward_and_grads(getattr(theirs_module, name)(cpu, *args), tensors, 1)
    _same_or_checked(ours, theirs, module, tensors)


@pytest.mark.parametrize("cat_dim", [0, 1])
def test_merge_pooled_embeddings_module_matches_torchrec(cat_dim):
    theirs_module = _torchrec_dist_data()
    tensors = [torch.randn(2, 2), torch.randn(2, 2)]
    module = dist_data.MergePooledEmbeddingsModule(torch.device("meta"))
    module.set_device("cpu")
    ours = _forward_and_grads(lambda ts: module(ts, cat_dim), tensors, 2)
    their = theirs_module.MergePooledEmbeddingsModule(torch.device("cpu"))
    theirs = _forward_and_grads(lambda ts: their(ts, cat_dim), tensors, 2)
    _same_or_checked(ours, theirs, lambda ts: module(ts, cat_dim), tensors)


def test_all_to_one_refuses_tensors_of_another_world_size():
    with pytest.raises(ValueError, match="got 1 tensors for world_size=2"):
        dist_data.SeqEmbeddingsAllToOne(torch.device("cpu"), 2)([torch.zeros(1)])


def test_kjt_one_to_all_matches_torchrec_with_device_propagation():
    theirs_module = _torchrec_dist_data()
    import torchrec
    from torchrec.distributed import global_settings

    import rectoolkit
    from dist_comm_ops_workers import assert_same_kjt

    values, lengths = torch.arange(6), torch.tensor([1, 0, 2, 1, 1, 1])
    before = global_settings.get_propogate_device()
    global_settings.set_propogate_device(True)  # TorchRec 1.8 otherwise sends a CPU device's blocks to CUDA
    try:
        theirs = theirs_module.KJTOneToAll([2, 1], 2, torch.device("cpu"))(
            torchrec.KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths))
    finally:
        global_settings.set_propogate_device(before)
    ours = dist_data.KJTOneToAll([2, 1], 2, torch.device("cpu"))(
        rectoolkit.KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths))
    assert isinstance(ours, dist_data.KJTList) and len(ours) == len(theirs) == 2
    for mine, other in zip(ours, theirs):
        assert_same_kjt(mine, other, "KJTOneToAll")
    with pytest.raises(ValueError, match="splits=\\[2, 1\\] has 2 entries for world_size=3"):
        dist_data.KJTOneToAll([2, 1], 3)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_tensor_and_jagged_tensor_all_to_alls_match_torchrec():
    _torchrec_dist_data()
    from dist_comm_ops_workers import tensor_all_to_all_worker

    run_workers(tensor_all_to_all_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_variable_batch_reduce_scatter_matches_torchrec():
    _torchrec_dist_data()
    from dist_comm_ops_workers import variable_batch_reduce_scatter_worker

    run_workers(variable_batch_reduce_scatter_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_wrong_arguments_are_refused_on_every_rank_naming_what_is_wrong():
    from dist_comm_ops_workers import refusals_worker

    run_workers(refusals_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_table_wise_sequence_module_written_the_torchrec_way_equals_the_unsharded_collection():
    _torchrec_dist_data()
    from dist_custom_sharded_workers import custom_sequence_sharded_worker

    run_workers(custom_sequence_sharded_worker, 2)


@pytest.mark.parametrize("switch,getter", [("GRADIENT_DIVISION", "get_gradient_division"),
                                           ("USE_SYNC_COLLECTIVES", "get_use_sync_collectives")])
def test_module_globals_read_and_set_the_switches_as_torchrecs(switch, getter):
    theirs = pytest.importorskip("torchrec.distributed.comm_ops")
    assert getattr(comm_ops, switch) == getattr(theirs, switch)
    before = getattr(comm_ops, switch)
    try:
        for value in (not before, before):
            setattr(comm_ops, switch, value)
            setattr(theirs, switch, value)
            assert getattr(comm_ops, getter)() == getattr(theirs, getter)() == value
    finally:
        setattr(comm_ops, switch, before)
        setattr(theirs, switch, before)
