"""Workers of the collective building blocks' tests (importable by spawned processes): each runs TorchRec 1.8's
module or op and rectoolkit's on the same tensors in the same gloo worker, in the same order on every rank, and
compares what comes out: the KJTs, the forward tensors, and the input gradients of one loss."""

from __future__ import annotations

import torch

import rectoolkit as rtk
from rectoolkit.distributed import comm_ops as our_ops
from rectoolkit.distributed import dist_data as our_data


def torchrec_modules():
    import torchrec
    from torchrec.distributed import comm_ops as their_ops
    from torchrec.distributed import dist_data as their_data

    return torchrec, their_ops, their_data


def assert_same_kjt(ours, theirs, where: str) -> None:
    assert ours.keys() == theirs.keys(), (where, ours.keys(), theirs.keys())
    assert ours.stride() == theirs.stride(), (where, ours.stride(), theirs.stride())
    assert ours.stride_per_key_per_rank() == theirs.stride_per_key_per_rank(), where
    for name in ("lengths", "values"):
        mine, other = getattr(ours, name)(), getattr(theirs, name)()
        assert torch.equal(mine, other.to(mine.dtype)), (where, name, mine, other)
    assert (ours.weights_or_none() is None) == (theirs.weights_or_none() is None), where
    if ours.weights_or_none() is not None:
        assert torch.equal(ours.weights(), theirs.weights()), (where, "weights")


def _kjt(lib, rank: int, batch: int, keys, weighted: bool, seed: int):
    g = torch.Generator().manual_seed(seed + 10 * rank)
    lengths = torch.randint(0, 3, (batch * len(keys),), generator=g)
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return lib.KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths, weights=weights)


def _vbe_kjt(lib, rank: int, keys):
    # a batch that varies per key: key k has 1 + (k + rank) % 3 samples on this rank
    g = torch.Generator().manual_seed(77 + rank)
    strides = [1 + (k + rank) % 3 for k in range(len(keys))]
    lengths = torch.randint(0, 3, (sum(strides),), generator=g)
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=g)
    return lib.KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths,
                                 stride_per_key_per_rank=[[s] for s in strides])


def kjt_all_to_all_worker(rank: int, world_size: int) -> None:
    """KJTAllToAll and KJEAllToAll, both waits, over fixed and per-rank batches, weights, stagger, an empty block and a batch that
    varies per key, against TorchRec's."""
    torchrec, _, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    keys = ["a", "b", "c"]
    cases = [  # (name, splits, stagger, kjt maker)
        ("fixed batch", [2, 1], 1, lambda lib: _kjt(lib, rank, 3, keys, False, 0)),
        ("batch per rank", [1, 2], 1, lambda lib: _kjt(lib, rank, 2 + rank, keys, False, 1)),
        ("weighted", [2, 1], 1, lambda lib: _kjt(lib, rank, 2, keys, True, 2)),
        ("stagger 2", [1, 2], 2, lambda lib: _kjt(lib, rank, 2, keys, True, 3)),
        ("stagger 2, batch per rank", [2, 1], 2, lambda lib: _kjt(lib, rank, 1 + 2 * rank, keys, False, 4)),
        ("empty block", [3, 0], 1, lambda lib: _kjt(lib, rank, 2, keys, False, 5)),
        ("batch per key", [2, 1], 1, lambda lib: _vbe_kjt(lib, rank, keys)),
    ]
    for module in ("KJTAllToAll", "KJEAllToAll"):  # KJE: the same exchange under TorchRec's embedding-update name
        for name, splits, stagger, make in cases:
            their_first = getattr(their_data, module)(pg, splits, stagger=stagger)(make(torchrec))
            our_first = getattr(our_data, module)(pg, splits, stagger=stagger)(make(rtk))
            their_second, our_second = their_first.wait(), our_first.wait()
            assert isinstance(our_first, our_data.KJTAllToAllSplitsAwaitable), (module, name)
            assert isinstance(our_second, our_data.KJTAllToAllTensorsAwaitable), (module, name)
            assert_same_kjt(our_second.wait(), their_second.wait(), f"rank {rank}, {module}, {name}")
    # the inputs can be freed once the exchange has arrived; the KJT still comes out whole
    their_second = their_data.KJTAllToAll(pg, [2, 1])(_kjt(torchrec, rank, 3, keys, True, 6)).wait()
    our_second = our_data.KJTAllToAll(pg, [2, 1])(_kjt(rtk, rank, 3, keys, True, 6)).wait()
    assert our_second.clear_inputs() == their_second.clear_inputs() > 0
    assert_same_kjt(our_second.wait(), their_second.wait(), f"rank {rank}, after clear_inputs")
    # the sizes' all-to-all alone
    sizes = [torch.tensor([rank, 10 + rank]), torch.tensor([5 * rank, 7])]
    assert our_data.SplitsAllToAllAwaitable(sizes, pg).wait() == their_data.SplitsAllToAllAwaitable(sizes, pg).wait()


def _grad_of(run, source: torch.Tensor, loss_weights_seed: int):
    """(output, input gradient) of run(leaf) under the loss sum(output * fixed random weights)."""
    leaf = source.clone().requires_grad_(True)
    out = run(leaf)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(loss_weights_seed))
    (out * weights).sum().backward()
    return out.detach(), leaf.grad


def _same(ours, theirs, where: str) -> None:
    assert ours[0].shape == theirs[0].shape, (where, ours[0].shape, theirs[0].shape)
    assert torch.equal(ours[0], theirs[0]), (where, "forward", ours[0], theirs[0])
    assert theirs[1] is not None, (where, "TorchRec gave no input gradient")
    assert torch.equal(ours[1], theirs[1]), (where, "input gradient", ours[1], theirs[1])


def pooled_all_to_all_worker(rank: int, world_size: int) -> None:
    """PooledEmbeddingsAllToAll and comm_ops.alltoall_pooled: forward and input gradients equal TorchRec's, with
    even and uneven batches, gradient division on and off, sync collectives on and off, FP16/BF16 codecs and
    callbacks."""
    _, their_ops, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    dims = [3, 2]
    g = torch.Generator().manual_seed(rank)
    for division in (True, False):
        for sync in (False, True):
            for batch_size_per_rank in (None, [1, 3]):
                where = f"rank {rank}, division={division}, sync={sync}, batches={batch_size_per_rank}"
                source = torch.randn(4, dims[rank], generator=g)
                results = []
                for ops, data in ((their_ops, their_data), (our_ops, our_data)):
                    ops.set_gradient_division(division)
                    ops.set_use_sync_collectives(sync)
                    a2a = data.PooledEmbeddingsAllToAll(pg, dims)
                    results.append(_grad_of(lambda x: a2a(x, batch_size_per_rank).wait(), source, 1))
                    ops.set_gradient_division(True)
                    ops.set_use_sync_collectives(False)
                _same(results[1], results[0], where)
    # the function itself, and callbacks applied to the result
    source = torch.randn(4, dims[rank], generator=g)
    theirs = _grad_of(lambda x: their_ops.alltoall_pooled(x, [2, 2], dims, group=pg).wait(), source, 2)
    ours = _grad_of(lambda x: our_ops.alltoall_pooled(x, [2, 2], dims, group=pg).wait(), source, 2)
    _same(ours, theirs, f"rank {rank}, alltoall_pooled")
    request = our_ops.alltoall_pooled(source, [2, 2], dims, group=pg)
    assert isinstance(request, our_ops.Request) and request.wait() is request.wait()
    theirs = _grad_of(lambda x: their_data.PooledEmbeddingsAllToAll(pg, dims, callbacks=[torch.tanh])(x).wait(),
                      source, 3)
    ours = _grad_of(lambda x: our_data.PooledEmbeddingsAllToAll(pg, dims, callbacks=[torch.tanh])(x).wait(),
                    source, 3)
    _same(ours, theirs, f"rank {rank}, callbacks")
    _codecs_match(rank, pg, dims, their_data, source)


def codec_pair():
    """(TorchRec's, rectoolkit's) codecs: FP16 forward, BF16 backward."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.quantize_comm import QuantizedCommCodec as FbgemmCodec
    from torchrec.distributed.types import QuantizedCommCodecs as TheirCodecs

    from rectoolkit.distributed.fbgemm_qcomm_codec import CommType, QuantizedCommCodec, QuantizedCommCodecs

    return (TheirCodecs(FbgemmCodec(SparseType.FP16), FbgemmCodec(SparseType.BF16)),
            QuantizedCommCodecs(QuantizedCommCodec(CommType.FP16), QuantizedCommCodec(CommType.BF16)))


def _codecs_match(rank, pg, dims, their_data, source) -> None:
    their_codecs, our_codecs = codec_pair()
    theirs = _grad_of(lambda x: their_data.PooledEmbeddingsAllToAll(pg, dims, codecs=their_codecs)(x).wait(),
                      source, 4)
    ours = _grad_of(lambda x: our_data.PooledEmbeddingsAllToAll(pg, dims, codecs=our_codecs)(x).wait(), source, 4)
    _same(ours, theirs, f"rank {rank}, FP16/BF16 codecs")
    try:
        our_data.PooledEmbeddingsAllToAll(pg, dims, codecs=their_codecs)(source)
    except TypeError as error:
        assert "rectoolkit's QuantizedCommCodecs" in str(error), error
    else:
        raise AssertionError("TorchRec's codecs were accepted by rectoolkit's PooledEmbeddingsAllToAll")


def reduce_scatter_all_gather_worker(rank: int, world_size: int) -> None:
    """PooledEmbeddingsReduceScatter / AllGather and the comm_ops behind them: forward and input gradients equal
    TorchRec's, gradient division on and off, sync collectives on and off. Uneven reduce-scatter-v splits are
    compared with TorchRec's sync path (its async one does not run on gloo) and ours runs both ways."""
    _, their_ops, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    g = torch.Generator().manual_seed(10 + rank)
    cases = [  # name, input shape, run(ops, data, leaf)
        ("PooledEmbeddingsReduceScatter", (4, 3), lambda ops, data, x: data.PooledEmbeddingsReduceScatter(pg)(x).wait()),
        ("PooledEmbeddingsReduceScatter, equal input_splits", (4, 3),
         lambda ops, data, x: data.PooledEmbeddingsReduceScatter(pg)(x, [2, 2]).wait()),
        ("reduce_scatter_base_pooled", (6, 2), lambda ops, data, x: ops.reduce_scatter_base_pooled(x, pg).wait()),
        ("reduce_scatter_pooled", (5, 2),
         lambda ops, data, x: ops.reduce_scatter_pooled([x[:2], x[2:4] * 3 + x[4:5]], pg).wait()),
        ("all_gather_base_pooled", (2, 3), lambda ops, data, x: ops.all_gather_base_pooled(x, pg).wait()),
        ("PooledEmbeddingsAllGather", (3, 2), lambda ops, data, x: data.PooledEmbeddingsAllGather(pg)(x).wait()),
    ]
    for division in (True, False):
        for sync in (False, True):
            for name, shape, run in cases:
                where = f"rank {rank}, {name}, division={division}, sync={sync}"
                source = torch.randn(shape, generator=g)
                results = []
                for ops, data in ((their_ops, their_data), (our_ops, our_data)):
                    ops.set_gradient_division(division)
                    ops.set_use_sync_collectives(sync)
                    results.append(_grad_of(lambda x: run(ops, data, x), source, 5))
                    ops.set_gradient_division(True)
                    ops.set_use_sync_collectives(False)
                _same(results[1], results[0], where)
            # uneven splits: TorchRec's sync path against ours, both ways
            source = torch.randn(4, 2, generator=g)
            their_ops.set_gradient_division(division)
            their_ops.set_use_sync_collectives(True)
            theirs = _grad_of(lambda x: their_data.PooledEmbeddingsReduceScatter(pg)(x, [1, 3]).wait(), source, 6)
            their_ops.set_gradient_division(True)
            their_ops.set_use_sync_collectives(False)
            our_ops.set_gradient_division(division)
            our_ops.set_use_sync_collectives(sync)
            ours = _grad_of(lambda x: our_data.PooledEmbeddingsReduceScatter(pg)(x, [1, 3]).wait(), source, 6)
            our_ops.set_gradient_division(True)
            our_ops.set_use_sync_collectives(False)
            _same(ours, theirs, f"rank {rank}, uneven reduce-scatter-v, division={division}, sync={sync}")
    # TorchRec's custom ops, called as functions: the division is their argument, not the switch
    name = their_ops.pg_name(pg)
    assert our_ops.pg_name(pg) == name
    for division in (True, False):
        our_ops.set_gradient_division(not division)
        their_ops.set_gradient_division(not division)
        for op, shape, args in (("reduce_scatter_tensor", (4, 3), ("sum", 2, name, division)),
                                ("all_gather_into_tensor", (2, 3), (0, 2, name, division))):
            source = torch.randn(shape, generator=g)
            theirs = _grad_of(lambda x: getattr(their_ops, op)(x, *args), source, 12)
            ours = _grad_of(lambda x: getattr(our_ops, op)(x, *args), source, 12)
            _same(ours, theirs, f"rank {rank}, {op}, gradient_division={division}")
        our_ops.set_gradient_division(True)
        their_ops.set_gradient_division(True)


def _sequence_inputs(rank: int, world_size: int, splits, batch_per_rank):
    """What a sequence sharding has after its KJT all-to-all (TorchRec's KJTAllToAll, fixed or per-rank batches):
    the received KJT's lengths, the ids sent to and received from each rank, and the KJT's recat."""
    import torchrec
    from torchrec.distributed.dist_data import KJTAllToAll, _get_recat

    keys = ["a", "b", "c"]
    kjt = _kjt(torchrec, rank, batch_per_rank[rank], keys, False, 20)
    received = KJTAllToAll(torch.distributed.group.WORLD, splits)(kjt).wait().wait()
    sent = torch.tensor(kjt.dist_splits(splits)[1])
    came = torch.empty_like(sent)
    torch.distributed.all_to_all_single(came, sent)
    lengths = received.lengths().view(len(received.keys()), -1)
    recat = _get_recat(splits[rank], world_size, 1, torch.device("cpu"), batch_per_rank)
    return lengths, sent.tolist(), came.tolist(), recat


def sequence_all_to_all_worker(rank: int, world_size: int) -> None:
    """SequenceEmbeddingsAllToAll / alltoall_sequence: forward and input gradients equal TorchRec's, fixed and
    per-rank batches, gradient division and sync collectives on and off, an unbucketize permutation."""
    _, their_ops, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    g = torch.Generator().manual_seed(30 + rank)
    splits = [2, 1]
    for batch_per_rank in ([2, 2], [1, 3]):
        lengths, sent, came, recat = _sequence_inputs(rank, world_size, splits, batch_per_rank)
        variable = len(set(batch_per_rank)) > 1
        for division in (True, False):
            source = torch.randn(sum(came), 3, generator=g)
            unbucketize = torch.randperm(sum(sent), generator=g)
            their_async_grad = None
            for sync in (False, True):
                where = f"rank {rank}, batches={batch_per_rank}, division={division}, sync={sync}"
                results = []
                for ops, data in ((their_ops, their_data), (our_ops, our_data)):
                    ops.set_gradient_division(division)
                    ops.set_use_sync_collectives(sync)
                    a2a = data.SequenceEmbeddingsAllToAll(pg, splits)
                    results.append(_grad_of(lambda x: a2a(
                        x, lengths.view(-1) if variable else lengths, sent, came, unbucketize,
                        batch_size_per_rank=batch_per_rank, sparse_features_recat=recat if variable else None
                    ).wait(), source, 7))
                    ops.set_gradient_division(True)
                    ops.set_use_sync_collectives(False)
                if sync and variable:  # TorchRec 1.8's sync path loses the gradient here (fbgemm's CPU permute)
                    assert results[0][1] is None, where
                    results[0] = (results[0][0], their_async_grad)
                their_async_grad = results[0][1]
                _same(results[1], results[0], where)
    # FP16 forward, BF16 backward
    lengths, sent, came, _ = _sequence_inputs(rank, world_size, splits, [2, 2])
    source = torch.randn(sum(came), 3, generator=g)
    results = [_grad_of(lambda x: data.SequenceEmbeddingsAllToAll(pg, splits, codecs=codecs)(x, lengths, sent, came)
                        .wait(), source, 13) for data, codecs in zip((their_data, our_data), codec_pair())]
    _same(results[1], results[0], f"rank {rank}, sequence with FP16/BF16 codecs")
    # the function, and its refusal of a backward recat that does not invert the forward one
    lengths, sent, came, _ = _sequence_inputs(rank, world_size, splits, [2, 2])
    a2a = their_data.SequenceEmbeddingsAllToAll(pg, splits)
    forward, backward = a2a._forward_recat_tensor, a2a._backward_recat_tensor
    source = torch.randn(sum(came), 2, generator=g)
    theirs = _grad_of(lambda x: their_ops.alltoall_sequence(x, forward, backward, lengths, sent, came).wait(),
                      source, 8)
    ours = _grad_of(lambda x: our_ops.alltoall_sequence(x, forward, backward, lengths, sent, came).wait(), source, 8)
    _same(ours, theirs, f"rank {rank}, alltoall_sequence")
    if forward.numel() > 1:
        try:
            our_ops.alltoall_sequence(source, forward, forward.flip(0), lengths, sent, came)
        except ValueError as error:
            assert "not the inverse of forward_recat_tensor" in str(error), error
        else:
            raise AssertionError("a backward recat that does not invert the forward one was accepted")


def variable_batch_worker(rank: int, world_size: int) -> None:
    """VariableBatchPooledEmbeddingsAllToAll / variable_batch_alltoall_pooled (TorchRec's docstring layout: rank 0
    one feature of dimension 2, rank 1 two of dimension 3, batches per feature and rank): forward and input
    gradients equal TorchRec's, gradient division and sync collectives on and off, with a callback."""
    _, their_ops, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    dims = [[2], [3, 3]]
    per_rank_per_feature = [[[2], [1]], [[1, 3], [2, 2]]][rank]
    pre_a2a = [[2, 1, 3], [1, 2, 2]][rank]
    g = torch.Generator().manual_seed(50 + rank)
    for division in (True, False):
        for sync in (False, True):
            source = torch.randn([6, 24][rank], generator=g)
            results = []
            for ops, data in ((their_ops, their_data), (our_ops, our_data)):
                ops.set_gradient_division(division)
                ops.set_use_sync_collectives(sync)
                a2a = data.VariableBatchPooledEmbeddingsAllToAll(pg, dims, callbacks=[lambda t: t * 2])
                results.append(_grad_of(lambda x: a2a(x, per_rank_per_feature, pre_a2a).wait(), source, 9))
                ops.set_gradient_division(True)
                ops.set_use_sync_collectives(False)
            _same(results[1], results[0], f"rank {rank}, division={division}, sync={sync}")
    source = torch.randn([6, 24][rank], generator=g)
    theirs = _grad_of(lambda x: their_ops.variable_batch_alltoall_pooled(x, per_rank_per_feature, pre_a2a, dims,
                                                                         group=pg).wait(), source, 10)
    ours = _grad_of(lambda x: our_ops.variable_batch_alltoall_pooled(x, per_rank_per_feature, pre_a2a, dims,
                                                                     group=pg).wait(), source, 10)
    _same(ours, theirs, f"rank {rank}, variable_batch_alltoall_pooled")
    results = [_grad_of(lambda x: data.VariableBatchPooledEmbeddingsAllToAll(pg, dims, codecs=codecs)(
        x, per_rank_per_feature, pre_a2a).wait(), source, 14) for data, codecs in zip((their_data, our_data),
                                                                                   codec_pair())]
    _same(results[1], results[0], f"rank {rank}, variable batch with FP16/BF16 codecs")


def tensor_all_to_all_worker(rank: int, world_size: int) -> None:
    """TensorAllToAll (both waits), TensorValuesAllToAll and JaggedTensorAllToAll give what TorchRec's give, for 1-D
    and 2-D rows, uneven counts, weights, and a rank that sends nothing."""
    torchrec, _, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    g = torch.Generator().manual_seed(60 + rank)
    for shape, sends in (((3,), [[1, 2], [2, 1]]), ((4, 2), [[3, 1], [0, 4]])):  # sends[source][destination]
        source = torch.randn(shape, generator=g)
        counts = torch.tensor(sends[rank], dtype=torch.int)
        their_first = their_data.TensorAllToAll(pg)(source, counts)
        our_first = our_data.TensorAllToAll(pg)(source, counts)
        their_values, our_values = their_first.wait(), our_first.wait()
        theirs, ours = their_values.wait(), our_values.wait()
        assert torch.equal(ours, theirs), (rank, shape, ours, theirs)
        received = torch.tensor(sends)[:, rank].int()
        theirs = their_data.TensorValuesAllToAll(pg)(source, counts, received).wait()
        ours = our_data.TensorValuesAllToAll(pg)(source, counts, received).wait()
        assert torch.equal(ours, theirs), (rank, shape, "values", ours, theirs)
    for weighted in (False, True):
        lengths = torch.tensor([[2, 0, 1], [1, 3, 0]][rank])
        values = torch.arange(int(lengths.sum())) + 100 * rank
        weights = torch.rand(values.numel(), generator=g) if weighted else None
        send = torch.tensor([[1, 2], [2, 1]][rank])
        receive = torch.tensor([[1, 2], [2, 1]])[:, rank]
        theirs = their_data.JaggedTensorAllToAll(torchrec.JaggedTensor(values=values, lengths=lengths, weights=weights),
                                                 send, receive, pg).wait()
        ours = our_data.JaggedTensorAllToAll(rtk.JaggedTensor(values=values, lengths=lengths, weights=weights),
                                             send, receive, pg).wait()
        assert torch.equal(ours.lengths(), theirs.lengths()) and torch.equal(ours.values(), theirs.values()), rank
        assert (ours.weights_or_none() is None) == (theirs.weights_or_none() is None)
        if weighted:
            assert torch.equal(ours.weights(), theirs.weights()), rank


def variable_batch_reduce_scatter_worker(rank: int, world_size: int) -> None:
    """VariableBatchPooledEmbeddingsReduceScatter / reduce_scatter_v_per_feature_pooled (TorchRec's docstring
    layout: batches [[1, 3], [2, 2]] per rank and feature, dimensions [4, 8]): forward and input gradients equal
    TorchRec's sync path (its async one does not run on gloo), ours async and sync, gradient division on and off."""
    _, their_ops, their_data = torchrec_modules()
    pg = torch.distributed.group.WORLD
    batches, dims = [[1, 3], [2, 2]], [4, 8]
    g = torch.Generator().manual_seed(70 + rank)
    for division in (True, False):
        source = torch.randn(52, generator=g)
        their_ops.set_gradient_division(division)
        their_ops.set_use_sync_collectives(True)
        theirs = _grad_of(lambda x: their_data.VariableBatchPooledEmbeddingsReduceScatter(pg)(x, batches, dims).wait(),
                          source, 11)
        their_ops.set_gradient_division(True)
        their_ops.set_use_sync_collectives(False)
        for sync in (False, True):
            our_ops.set_gradient_division(division)
            our_ops.set_use_sync_collectives(sync)
            ours = _grad_of(lambda x: our_data.VariableBatchPooledEmbeddingsReduceScatter(pg)(x, batches, dims).wait(),
                            source, 11)
            our_ops.set_gradient_division(True)
            our_ops.set_use_sync_collectives(False)
            _same(ours, theirs, f"rank {rank}, division={division}, sync={sync}")


def _raises(error_type, words: str, run) -> None:
    try:
        run()
    except error_type as error:
        assert words in str(error), (words, str(error))
    else:
        raise AssertionError(f"no {error_type.__name__} saying {words!r}")


def refusals_worker(rank: int, world_size: int) -> None:
    """Wrong arguments are refused on every rank before any collective starts, naming what is wrong."""
    pg = torch.distributed.group.WORLD
    kjt = _kjt(rtk, rank, 2, ["a", "b", "c"], False, 0)
    _raises(ValueError, "has 3 keys ['a', 'b', 'c'] but splits=[1, 1] sum to 2",
            lambda: our_data.KJTAllToAll(pg, [1, 1])(kjt))
    _raises(ValueError, "splits=[3] has 1 entries but the process group has 2 ranks",
            lambda: our_data.KJTAllToAll(pg, [3]))
    _raises(ValueError, "stagger=3 must be >= 1 and divide the 2 ranks", lambda: our_data.KJTAllToAll(pg, [2, 1], 3))
    _raises(NotImplementedError, "collective validation",
            lambda: our_data.SplitsAllToAllAwaitable([torch.tensor([1, 1])], pg, collective_tag=5))
    embs = torch.zeros(4, [3, 2][rank])
    _raises(ValueError, f"rank {rank}'s embeddings are [4, {[3, 2][rank]}]",
            lambda: our_ops.alltoall_pooled(embs, [2, 2], [1, 1]))
    _raises(TypeError, "all_to_all_single_comm=object): pass None or an All2AllSingle",
            lambda: our_ops.alltoall_pooled(embs, [2, 2], [3, 2], all_to_all_single_comm=object()))
    _raises(ValueError, "do not split evenly over 2 ranks", lambda: our_data.PooledEmbeddingsAllToAll(pg, [3, 2])(
        torch.zeros(3, [3, 2][rank])))
    _raises(ValueError, "does not split into 2 equal chunks",
            lambda: our_ops.reduce_scatter_base_pooled(torch.zeros(3, 2), pg))
    _raises(ValueError, "they must sum to its dim 0", lambda: our_ops.reduce_scatter_v_pooled(torch.zeros(3), [1, 1]))
    _raises(TypeError, "pass None or rectoolkit's QuantizedCommCodecs",
            lambda: our_ops.all_gather_base_pooled(torch.zeros(2), pg, codecs="fp16"))
    name = our_ops.pg_name(pg)
    _raises(NotImplementedError, 'reduces by "sum" only',
            lambda: our_ops.reduce_scatter_tensor(torch.zeros(2), "max", 2, name, True))
    _raises(NotImplementedError, "gathers along dim 0 whatever gather_dim says",
            lambda: our_ops.all_gather_into_tensor(torch.zeros(2, 2), 1, 2, name, True))
    _raises(ValueError, "group_size=3 but group", lambda: our_ops.all_gather_into_tensor(torch.zeros(2), 0, 3, name, True))
    _raises(ValueError, "no process group is named 'nowhere'",
            lambda: our_ops.reduce_scatter_tensor(torch.zeros(2), "sum", 2, "nowhere", True))


def _counting_comm(base):
    """An instance of a subclass of `base` (a library's DefaultAll2AllSingle) that records its calls."""

    class Counting(base):
        def __init__(self) -> None:
            super().__init__()
            self.calls = []

        def allocate(self, size, *, dtype, device):
            self.calls.append(("allocate", tuple(size), str(dtype)))
            return super().allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                     async_op=False):
            self.calls.append(("call", list(output_split_sizes), list(input_split_sizes), async_op))
            return super().__call__(output_tensor, input_tensor, output_split_sizes, input_split_sizes, group=group,
                                    async_op=async_op)

    return Counting()


def custom_comm_worker(rank: int, world_size: int) -> None:
    """A custom all-to-all (TorchRec's All2AllSingle interface) runs the forward exchange of alltoall_pooled and
    variable_batch_alltoall_pooled: outputs and input gradients equal TorchRec's with its own, and each library's
    comm sees the same calls (buffer sizes, splits); TorchRec's DefaultAll2AllSingle object runs rectoolkit's op;
    AllToAllSingle, the autograd function, equals TorchRec's with gradient division on and off."""
    _, their_ops, _ = torchrec_modules()
    pg = torch.distributed.group.WORLD
    dims = [3, 2]
    g = torch.Generator().manual_seed(300 + rank)
    source = torch.randn(4, dims[rank], generator=g)
    results, calls = [], []
    for ops in (their_ops, our_ops):
        comm = _counting_comm(ops.DefaultAll2AllSingle)
        results.append(_grad_of(lambda x: ops.alltoall_pooled(x, [1, 3], dims, group=pg,
                                                              all_to_all_single_comm=comm).wait(), source, 31))
        calls.append(comm.calls)
    _same(results[1], results[0], f"rank {rank}, alltoall_pooled through a custom comm")
    assert calls[1] == calls[0] and [c[0] for c in calls[1]] == ["allocate", "allocate", "call"], (rank, calls)
    theirs = _grad_of(lambda x: their_ops.alltoall_pooled(x, [1, 3], dims, group=pg).wait(), source, 31)
    ours = _grad_of(lambda x: our_ops.alltoall_pooled(
        x, [1, 3], dims, group=pg, all_to_all_single_comm=their_ops.DefaultAll2AllSingle()).wait(), source, 31)
    _same(ours, theirs, f"rank {rank}, TorchRec's DefaultAll2AllSingle in rectoolkit's op")

    vb_dims = [[2], [3, 3]]
    per_rank_per_feature = [[[2], [1]], [[1, 3], [2, 2]]][rank]
    pre_a2a = [[2, 1, 3], [1, 2, 2]][rank]
    source = torch.randn([6, 24][rank], generator=g)
    results, calls = [], []
    for ops in (their_ops, our_ops):
        comm = _counting_comm(ops.DefaultAll2AllSingle)
        results.append(_grad_of(lambda x: ops.variable_batch_alltoall_pooled(
            x, per_rank_per_feature, pre_a2a, vb_dims, group=pg, all_to_all_single_comm=comm).wait(), source, 32))
        calls.append(comm.calls)
    _same(results[1], results[0], f"rank {rank}, variable_batch_alltoall_pooled through a custom comm")
    assert calls[1] == calls[0], (rank, calls)

    in_splits = [[1, 2], [2, 1]]  # rows rank i sends to rank j
    out_splits = [in_splits[i][rank] for i in range(world_size)]
    rows = torch.randn(sum(in_splits[rank]), 4, generator=g)
    for division in (True, False):
        results = [_grad_of(lambda x: ops.AllToAllSingle.apply(x, out_splits, in_splits[rank], ops.pg_name(pg),
                                                              world_size, division), rows, 33)
                   for ops in (their_ops, our_ops)]
        results[0] = (results[0][0].clone(), results[0][1])  # (TorchRec's output: a functional collective's tensor)
        _same(results[1], results[0], f"rank {rank}, AllToAllSingle, gradient_division={division}")
