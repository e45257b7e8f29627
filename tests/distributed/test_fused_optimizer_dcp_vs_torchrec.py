"""The fused optimizer's state through torch.distributed.checkpoint (DCP), beside TorchRec 1.8's, on 2 gloo ranks.

Each table of `dmp.fused_optimizer` is a ShardedTensor param and each of its states a ShardedTensor in TorchRec's
layout (a bag collection's table-wise, row-wise, column-wise (two column shards on each rank: one param of two local
shards, as TorchRec's) and table-row-wise tables and a sequence collection's
table-wise and row-wise ones; row-wise Adagrad's one value per row, Adagrad's one per element, Adam's two moments),
so that:
- the state_dict has TorchRec's keys, sizes, global shards (offsets, sizes, placements) and local shards, and
  after the same two training steps the same values;
- `dcp.save(dmp.fused_optimizer.state_dict())` keeps every rank's state (saved as plain tensors under one key, DCP
  kept one rank's and loaded it on both: rank 1's row-wise state was lost);
- a DCP checkpoint of either library's optimizer loads into the other's, under the plan it was saved with and under
  another one (DCP reshards): every loaded local shard equals the saved state's slice, the saved state assembled
  from every rank's local shards (all_gather_object), independently of DCP;
- the model's state_dict (whole tables here, ShardedTensors in TorchRec) goes through DCP both ways too.
"""

from __future__ import annotations

import os

import pytest
import torch

from dist_harness import load_torchrec_shards, run_workers

torchrec = pytest.importorskip("torchrec")

ROWS = [6, 7, 8, 9]  # the bag collection's tables t0..t3
SEQUENCE_ROWS = [5, 7]  # the sequence collection's e0, e1


def _model(lib):
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"f{i}"])
        for i, rows in enumerate(ROWS)], device=torch.device("cpu"))
    model.ec = lib.EmbeddingCollection(tables=[
        lib.EmbeddingConfig(name=f"e{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"g{i}"])
        for i, rows in enumerate(SEQUENCE_ROWS)], device=torch.device("cpu"))
    return model


def _weights():
    """Every table's starting weights, by table name."""
    return {f"{prefix}{i}": torch.randn(rows, 8, generator=torch.Generator().manual_seed(10 * k + i))
            for k, (prefix, tables) in enumerate((("t", ROWS), ("e", SEQUENCE_ROWS))) for i, rows in enumerate(tables)}


def _plan(sp, model, world_size, which, sharder):
    fused = dict(compute_kernel="fused")
    tables = {
        "A": {"t0": sp.table_wise(rank=1, **fused), "t1": sp.row_wise(**fused),
              "t2": sp.column_wise(ranks=[0, 1, 1, 0], **fused), "t3": sp.table_row_wise(host_index=0)},
        "B": {"t0": sp.row_wise(**fused), "t1": sp.table_wise(rank=0, **fused),
              "t2": sp.column_wise(ranks=[1, 0, 0, 1], **fused), "t3": sp.table_wise(rank=1, **fused)},
    }[which]
    sequences = {"A": {"e0": sp.table_wise(rank=0, **fused), "e1": sp.row_wise(**fused)},
                 "B": {"e0": sp.row_wise(**fused), "e1": sp.table_wise(rank=1, **fused)}}[which]
    plan = sp.construct_module_sharding_plan(model.ebc, tables, world_size=world_size, device_type="cpu",
                                             sharder=sharder[0])
    plan["t3"].compute_kernel = "fused"  # (table_row_wise takes no kernel: the sharder's first, dense on CPU)
    return {"ebc": plan, "ec": sp.construct_module_sharding_plan(model.ec, sequences, world_size=world_size,
                                                                 device_type="cpu", sharder=sharder[1])}


def _batch(lib, rank, step, prefix="f", tables=ROWS):
    generator = torch.Generator().manual_seed(10 * step + rank + (0 if prefix == "f" else 5000))
    lengths = torch.randint(0, 4, (2 * len(tables),), generator=generator)
    values = torch.cat([torch.randint(0, rows, (int(lengths[2 * i:2 * i + 2].sum()),), generator=generator)
                        for i, rows in enumerate(tables)])
    return lib.KeyedJaggedTensor.from_lengths_sync(keys=[f"{prefix}{i}" for i in range(len(tables))], values=values,
                                                   lengths=lengths)


def _train_step(lib, dmp, rank, step):
    """Forward and backward of both collections (their fused optimizers update them)."""
    pooled = dmp.module.ebc(_batch(lib, rank, step)).wait().values().sum()
    sequences = dmp.module.ec(_batch(lib, rank, step, "g", SEQUENCE_ROWS)).wait()
    (pooled + sum(jt.values().sum() for jt in sequences.values())).backward()


def _build(lib_name, optimizer, world_size, which, weights):
    if lib_name == "torchrec":
        from torchrec.distributed import model_parallel as mp
        from torchrec.distributed import sharding_plan as sp
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        lib = torchrec
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel as mp
        from rectoolkit.distributed import sharding_plan as sp
        from rectoolkit.distributed.embedding import EmbeddingCollectionSharder
        from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    fused = {"optimizer": optimizer, "learning_rate": 0.1}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]
    model = _model(lib)
    dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"), sharders=sharders,
                                      plan=mp.ShardingPlan(_plan(sp, model, world_size, which, sharders)))
    if lib_name == "torchrec":
        load_torchrec_shards(dmp, weights)
    else:
        dmp.load_state_dict({(f"ebc.embedding_bags.{t}.weight" if t.startswith("t") else f"ec.embeddings.{t}.weight"): w
                             for t, w in weights.items()})
    return lib, dmp


def _states(dmp):
    """{(param key, state name): ShardedTensor} of the fused optimizer's state_dict."""
    return {(key, name): value for key, states in dmp.fused_optimizer.state_dict()["state"].items()
            for name, value in states.items()}


def _layout(value):
    metadata = value.metadata()
    return {"size": list(value.size()), "dtype": str(metadata.tensor_properties.dtype),
            "global": [(m.shard_offsets, m.shard_sizes, str(m.placement)) for m in metadata.shards_metadata],
            "local": [(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in value.local_shards()]}


def _assembled(sharded):
    """{key: the whole tensor} put together from every rank's local shards of `sharded` ({key: ShardedTensor}; a
    rank may lack a key whose table it holds no shard of) by all_gather_object, without DCP."""
    import torch.distributed as dist

    mine = {key: (list(value.size()), [(s.metadata.shard_offsets, s.tensor.detach().clone())
                                       for s in value.local_shards()]) for key, value in sharded.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    whole = {}
    for pieces in gathered:
        for key, (size, shards) in pieces.items():
            whole.setdefault(key, torch.full(size, float("nan")))
            for offsets, tensor in shards:
                whole[key][tuple(slice(o, o + n) for o, n in zip(offsets, tensor.shape))] = tensor
    for key, value in whole.items():
        assert not value.isnan().any(), f"{key}: the global shards do not cover it"
    return whole


def dcp_worker(rank: int, world_size: int, optimizer_name: str, out_dir: str) -> None:
    import torch.distributed.checkpoint as dcp
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    optimizer = getattr(EmbOptimType, optimizer_name)
    weights = _weights()
    libraries = ("rectoolkit",) if optimizer_name == "ADAM" else ("torchrec", "rectoolkit")  # (fbgemm's CPU: no Adam)
    trained, whole, tables, params = {}, {}, {}, {}
    for lib_name in libraries:
        lib, dmp = _build(lib_name, optimizer, world_size, "A", weights)
        for step in range(2):
            _train_step(lib, dmp, rank, step)
        states = _states(dmp)
        trained[lib_name] = states
        params[lib_name] = dict(dmp.fused_optimizer.params)
        whole[lib_name] = _assembled(states)
        model_state = dmp.state_dict()
        tables[lib_name] = {key: value.detach().clone() for key, value in model_state.items()
                            if not hasattr(value, "local_shards")}
        tables[lib_name].update(_assembled({k: v for k, v in model_state.items() if hasattr(v, "local_shards")}))
        dcp.save({"optim": dmp.fused_optimizer.state_dict(), "model": dmp.state_dict()},
                 checkpoint_id=os.path.join(out_dir, lib_name))

    ours = trained["rectoolkit"]
    expected_names = {"EXACT_ROWWISE_ADAGRAD": {"momentum1"}, "EXACT_ADAGRAD": {"momentum1"},
                      "ADAM": {"momentum1", "exp_avg_sq"}}[optimizer_name]
    assert {name.split(".", 1)[1] for _, name in ours} == expected_names
    assert {key.split(".")[0] for key, _ in ours} == {"ebc", "ec"}, sorted(ours)  # both collections on every rank
    for key, value in ours.items():
        assert type(value).__name__ == "ShardedTensor", key
        assert whole["rectoolkit"][key].abs().sum() > 0, key  # trained: a load of zeros would not pass below
        if optimizer_name != "EXACT_ROWWISE_ADAGRAD":  # pointwise: laid out as the table (hand-checked rule)
            assert {**_layout(value), "dtype": None} == {**_layout(params["rectoolkit"][key[0]]), "dtype": None}, key
    if "torchrec" in trained:
        theirs = trained["torchrec"]
        assert sorted(ours) == sorted(theirs), (rank, sorted(ours), sorted(theirs))
        for key in theirs:  # the tables with a shard on this rank
            assert _layout(ours[key]) == _layout(theirs[key]), (rank, key, _layout(ours[key]), _layout(theirs[key]))
            assert _layout(params["rectoolkit"][key[0]]) == _layout(params["torchrec"][key[0]]), (rank, key)
            torch.testing.assert_close(whole["rectoolkit"][key], whole["torchrec"][key], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} {key}: {m}")

    for source in libraries:
        for target in libraries:
            for which in ("A", "B"):
                _, dmp = _build(target, optimizer, world_size, which, {t: w * 0 for t, w in weights.items()})
                state = {"optim": dmp.fused_optimizer.state_dict(), "model": dmp.state_dict()}
                dcp.load(state, checkpoint_id=os.path.join(out_dir, source))
                dmp.fused_optimizer.load_state_dict(state["optim"])
                dmp.load_state_dict(state["model"])
                for key, value in _states(dmp).items():
                    for shard in value.local_shards():
                        index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets,
                                                                        shard.metadata.shard_sizes))
                        assert torch.equal(shard.tensor, whole[source][key][index]), (rank, source, target, which, key)
                _check_tables(dmp, tables[source], (rank, source, target, which))


def _check_tables(dmp, tables, where):
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
                assert torch.equal(shard.tensor, tables[key][index]), (where, key)
        else:
            assert torch.equal(value, tables[key]), (where, key)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.fbgemm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer_name", ["EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM"])
def test_fused_optimizer_state_through_dcp_as_torchrecs(tmp_path, optimizer_name):
    run_workers(dcp_worker, 2, optimizer_name, str(tmp_path))


def copy_worker(rank: int, world_size: int) -> None:
    """sharded_model_copy of a DMP whose fused optimizer holds ShardedTensors: the copy's optimizer state is the
    copy's kernel state (it follows the copy's training), and the original's stays as it was."""
    import copy

    from rectoolkit.distributed.utils import sharded_model_copy

    weights = _weights()
    lib, dmp = _build("rectoolkit", "row_wise_adagrad", world_size, "A", weights)
    with sharded_model_copy(torch.device("cpu")):
        twin = copy.deepcopy(dmp)
    _train_step(lib, twin, rank, 0)
    original, copied = _states(dmp), _states(twin)
    assert sorted(original) == sorted(copied)
    assert sum(s.tensor.abs().sum() for value in copied.values() for s in value.local_shards()) > 0  # trained
    for key in original:
        assert all(s.tensor.abs().sum() == 0 for s in original[key].local_shards()), key  # untouched
        trained = [s.tensor for s in copied[key].local_shards()]
        collection = twin.module.ebc if key[0].startswith("ebc.") else twin.module.ec
        kernel_states = [state for table, _, _, state in collection.local_shards() if table == key[1][:2]]
        assert [t.data_ptr() for t in trained] == [s["momentum1"].data_ptr() for s in kernel_states], key


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sharded_model_copy_keeps_the_copy_optimizer_state_its_own():
    run_workers(copy_worker, 2)


def load_worker(rank: int, world_size: int) -> None:
    """load_state_dict without DCP: whole tensors load into any plan (each rank takes its slices); a ShardedTensor
    saved under another plan, or a tensor of neither shape, is refused naming the state."""
    weights = _weights()
    lib, trained = _build("rectoolkit", "row_wise_adagrad", world_size, "A", weights)
    _train_step(lib, trained, rank, 0)
    saved = trained.fused_optimizer.state_dict()
    whole = _assembled(_states(trained))
    _, other = _build("rectoolkit", "row_wise_adagrad", world_size, "B", weights)
    wanted = other.fused_optimizer.state_dict()
    as_whole = {"state": {key: {name: whole[(key, name)] for name in states} for key, states in wanted["state"].items()}}
    other.fused_optimizer.load_state_dict(as_whole)
    for key, value in _states(other).items():
        for shard in value.local_shards():
            index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
            assert torch.equal(shard.tensor, whole[key][index]), (rank, key)
    # t1: row-wise in plan A, table-wise on rank 0 in plan B: rank 0's saved shard holds only its rows
    t1 = "ebc.embedding_bags.t1.weight"
    if t1 in wanted["state"]:
        with pytest.raises(ValueError, match=r"optimizer 'ebc'.*embedding_bags\.t1\.weight' 't1\.momentum1'.*another plan"):
            other.fused_optimizer.load_state_dict({"state": {**as_whole["state"], t1: saved["state"][t1]}})
        with pytest.raises(ValueError, match=r"'t1\.momentum1'.*shape \[3\] fits neither the whole state \[7\]"):
            other.fused_optimizer.load_state_dict({"state": {**as_whole["state"], t1: {"t1.momentum1": torch.ones(3)}}})


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_fused_optimizer_loads_whole_tensors_and_names_what_does_not_fit():
    run_workers(load_worker, 2)
