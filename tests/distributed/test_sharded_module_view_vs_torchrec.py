"""A sharded collection's own module view beside TorchRec 1.8's, on 2 gloo ranks: `dmp.module.ebc` (and the
sequence `dmp.module.ec`) list their parameters as "embedding_bags.<table>.weight" ("embeddings." for sequences),
with TorchRec's empty placeholder of shape (0,) for a table with no shard on the rank, in `named_parameters()`,
`parameters()`, DistributedModelParallel's `named_parameters()` and `in_backward_optimizer_filter`; no buffers; the
state_dict of TorchRec's: keys, shapes, dtypes, a ShardedTensor per sharded table with TorchRec's global shards
(offsets, sizes, placements) and this rank's local shards, and, after both load the same whole tables, the same
local shard values. Then rectoolkit alone: `full_state_dict` holds the unsharded tables, load_state_dict round-trips
whole tables and ShardedTensors of the same plan (on the module and on the model holding it, strict errors named),
refuses a ShardedTensor of another plan by name, and a torch optimizer built from `module.parameters()` trains the
shards as the same optimizer trains the unsharded collection.
"""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_workers

torchrec = pytest.importorskip("torchrec")


def _model(lib):
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=6 + i, embedding_dim=8, feature_names=[f"f{i}"])
        for i in range(4)], device=torch.device("cpu"))
    model.ec = lib.EmbeddingCollection(tables=[
        lib.EmbeddingConfig(name=f"e{i}", num_embeddings=5 + i, embedding_dim=4, feature_names=[f"g{i}"])
        for i in range(3)], device=torch.device("cpu"))
    return model


def _plans(sp, model, world_size):
    bags = sp.construct_module_sharding_plan(model.ebc, {
        "t0": sp.table_wise(rank=1, compute_kernel="fused"), "t1": sp.row_wise(compute_kernel="fused"),
        "t2": sp.column_wise(ranks=[0, 1], compute_kernel="fused"), "t3": sp.table_wise(rank=0)},
        world_size=world_size, device_type="cpu")
    sequences = sp.construct_module_sharding_plan(model.ec, {
        "e0": sp.table_wise(rank=0, compute_kernel="fused"), "e1": sp.row_wise(compute_kernel="fused"),
        "e2": sp.table_wise(rank=1)}, world_size=world_size, device_type="cpu")
    return {"ebc": bags, "ec": sequences}


def _described(value):
    """A state_dict value's kind and layout: a ShardedTensor's global and local shards, a tensor's shape."""
    if type(value).__name__ == "ShardedTensor":
        metadata = value.metadata()
        return ("ShardedTensor", list(metadata.size), str(metadata.tensor_properties.dtype),
                [(list(s.shard_offsets), list(s.shard_sizes), str(s.placement)) for s in metadata.shards_metadata],
                [(list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)) for s in value.local_shards()])
    return ("Tensor", list(value.shape), str(value.dtype))


def _local_values(state):
    """Each state_dict value as this rank holds it: a ShardedTensor's local shards, a tensor itself."""
    return {k: ([s.tensor for s in v.local_shards()] if type(v).__name__ == "ShardedTensor" else [v])
            for k, v in state.items()}


def _whole_tables(model):
    """Random whole tables for every table of _model (the same on every rank)."""
    generator = torch.Generator().manual_seed(7)
    return {f"{path}.{kind}.{name}.weight": torch.rand(config.num_embeddings, config.embedding_dim,
                                                        generator=generator)
            for path, kind, configs in (("ebc", "embedding_bags", model.ebc.embedding_bag_configs()),
                                        ("ec", "embeddings", model.ec.embedding_configs()))
            for config in configs for name in [config.name]}


def _seen(dmp, in_backward_optimizer_filter):
    seen = {}
    for path in ("ebc", "ec"):
        module = getattr(dmp.module, path)
        seen[path + " named_parameters"] = [(n, list(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
        seen[path + " parameters"] = [list(p.shape) for p in module.parameters()]
        seen[path + " named_buffers"] = [n for n, _ in module.named_buffers()]
        seen[path + " not fused"] = [n for n, _ in in_backward_optimizer_filter(module.named_parameters())]
        state = module.state_dict()
        seen[path + " state_dict"] = {k: _described(v) for k, v in state.items()}
    seen["dmp named_parameters"] = [(n, list(p.shape), str(p.dtype)) for n, p in dmp.named_parameters()]
    return seen


def view_worker(rank: int, world_size: int) -> None:
    import torch.distributed as dist
    from torchrec.distributed import model_parallel as their_mp
    from torchrec.distributed import sharding_plan as their_sp
    from torchrec.optim.optimizers import in_backward_optimizer_filter as their_filter

    import rectoolkit as rtk
    from rectoolkit.distributed import model_parallel as our_mp
    from rectoolkit.distributed import sharding_plan as our_sp
    from rectoolkit.optim.optimizers import in_backward_optimizer_filter as our_filter

    seen, values = [], []
    for lib, mp, sp, in_backward in ((torchrec, their_mp, their_sp, their_filter), (rtk, our_mp, our_sp, our_filter)):
        model = _model(lib)
        whole = _whole_tables(model)
        dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"),
                                          plan=mp.ShardingPlan(_plans(sp, model, world_size)))
        seen.append(_seen(dmp, in_backward))
        dmp.load_state_dict(whole)  # whole tables: each rank takes its slices, in both
        values.append(_local_values(dmp.state_dict()))
    theirs, ours = seen
    assert sorted(values[0]) == sorted(values[1]) == sorted(whole)
    for key, tensors in values[0].items():
        assert len(values[1][key]) == len(tensors) and all(
            torch.equal(a, b) for a, b in zip(values[1][key], tensors)), f"rank {rank} {key}"
    for key in theirs:
        assert ours[key] == theirs[key], f"rank {rank} {key}:\n ours   {ours[key]}\n theirs {theirs[key]}"
    # hand-checked: rank 0 holds no shard of t0 (table-wise on rank 1): TorchRec's placeholder
    placeholder = ("embedding_bags.t0.weight", [0], "torch.float32")
    assert (placeholder in ours["ebc named_parameters"]) == (rank == 0)
    dist.barrier()


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_sharded_modules_own_view_matches_torchrec():
    run_workers(view_worker, 2)


def _every_type(lib):
    torch.manual_seed(0)
    return lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=name, num_embeddings=10 + i, embedding_dim=256 if name == "grid" else 8,
                               feature_names=[f"f_{name}"])  # (TorchRec's grid blocks are 128 columns at least)
        for i, name in enumerate(("tw", "rw", "cw", "twrw", "grid", "dp"))], device=torch.device("cpu"))


def layout_worker(rank: int, world_size: int) -> None:
    """Every sharding type TorchRec's plan constructors make, in one DMP on 2 hosts of 2 ranks: the same state_dict
    layout as TorchRec's, the same local shard values after both load the same whole tables."""
    from torchrec.distributed import model_parallel as their_mp
    from torchrec.distributed import sharding_plan as their_sp

    import rectoolkit as rtk
    from rectoolkit.distributed import full_state_dict
    from rectoolkit.distributed import model_parallel as our_mp
    from rectoolkit.distributed import sharding_plan as our_sp

    import os

    os.environ.update(LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank % 2))  # 2 hosts, as torchrun would say (both read it)
    generator = torch.Generator().manual_seed(3)
    whole = {f"embedding_bags.{c.name}.weight": torch.rand(c.num_embeddings, c.embedding_dim, generator=generator)
             for c in _every_type(rtk).embedding_bag_configs()}
    seen, values = [], []
    for lib, mp, sp in ((torchrec, their_mp, their_sp), (rtk, our_mp, our_sp)):
        ebc = _every_type(lib)
        plan = sp.construct_module_sharding_plan(ebc, {
            "tw": sp.table_wise(rank=1), "rw": sp.row_wise(), "cw": sp.column_wise(ranks=[1, 0]),
            "twrw": sp.table_row_wise(host_index=1), "grid": sp.grid_shard(host_indexes=[0, 1]),
            "dp": sp.data_parallel()}, local_size=2, world_size=world_size, device_type="cpu")
        dmp = mp.DistributedModelParallel(ebc, device=torch.device("cpu"), plan=mp.ShardingPlan({"": plan}))
        dmp.load_state_dict(whole)
        state = dmp.state_dict()
        seen.append({k: _described(v) for k, v in state.items()})
        values.append(_local_values(state))
    theirs, ours = seen
    assert list(ours) == list(theirs) == sorted(whole)
    for key in theirs:
        assert ours[key] == theirs[key], f"rank {rank} {key}:\n ours   {ours[key]}\n theirs {theirs[key]}"
        assert all(torch.equal(a, b) for a, b in zip(values[0][key], values[1][key])), f"rank {rank} {key}"
    assert ours["embedding_bags.dp.weight"][0] == "Tensor"  # a replica, plain in both
    assert sum(ours[key][0] == "ShardedTensor" for key in ours) == 5
    gathered = full_state_dict(dmp)  # rectoolkit's whole tables: the loaded ones, bit for bit
    assert all(torch.equal(gathered[key], tensor) for key, tensor in whole.items())


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_every_sharding_types_state_dict_layout_matches_torchrec():
    run_workers(layout_worker, 4)


def _batch(lib, rank, step):
    generator = torch.Generator().manual_seed(100 * step + rank)
    lengths = torch.randint(0, 3, (8,), generator=generator)
    values = torch.cat([torch.randint(0, 6 + i, (int(lengths[2 * i:2 * i + 2].sum()),), generator=generator)
                        for i in range(4)])
    return lib.KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(4)], values=values, lengths=lengths)


def state_worker(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv, full_state_dict, shard_embedding_bag_collection
    from rectoolkit.distributed import sharding_plan as sp

    reference = _model(rtk).ebc
    plan = _plans(sp, _model(rtk), world_size)["ebc"]
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = shard_embedding_bag_collection(reference, plan, env)  # no optimizer: plain gradients everywhere
    state = full_state_dict(sharded)
    assert list(state) == [f"embedding_bags.t{i}.weight" for i in range(4)]
    for key, value in reference.state_dict().items():
        assert torch.equal(state[key], value), key
    # load_state_dict of other whole tables, on the module and on a model holding it: each rank takes its slices
    other = {key: value + 1.0 for key, value in state.items()}
    result = sharded.load_state_dict(other)
    assert result.missing_keys == [] and result.unexpected_keys == []
    whole = full_state_dict(sharded)  # (a collective: once, outside the all())
    assert all(torch.equal(whole[k], v) for k, v in other.items())
    holder = torch.nn.Module()
    holder.ebc = sharded
    holder.load_state_dict({"ebc." + key: value for key, value in state.items()})
    assert all(torch.equal(full_state_dict(holder)["ebc." + k], v) for k, v in state.items())
    # its own state_dict (ShardedTensors: this rank's shards, copies here) loads back under the same plan
    mine = {k: v for k, v in sharded.state_dict().items()}
    for value in mine.values():
        for shard in value.local_shards():
            shard.tensor = shard.tensor.clone()
    sharded.load_state_dict(other)
    sharded.load_state_dict(mine)
    whole = full_state_dict(sharded)  # (a collective: once, outside the all())
    assert all(torch.equal(whole[k], v) for k, v in state.items())
    # ... and not under another (t1 row-wise there, column-wise here): named, nothing half loaded
    other_plan = sp.construct_module_sharding_plan(_model(rtk).ebc, {
        "t0": sp.table_wise(rank=1), "t1": sp.column_wise(ranks=[0, 1]), "t2": sp.column_wise(ranks=[0, 1]),
        "t3": sp.table_wise(rank=0)}, world_size=world_size, device_type="cpu")
    moved = shard_embedding_bag_collection(_model(rtk).ebc, other_plan, env)
    with pytest.raises(RuntimeError, match=r"embedding_bags\.t1\.weight: table 't1': the saved ShardedTensor .*"
                                           r"saved under another plan.*full_state_dict"):
        moved.load_state_dict(mine)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*embedding_bags\.t3\.weight"):
        sharded.load_state_dict({k: v for k, v in state.items() if k != "embedding_bags.t3.weight"})
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*embedding_bags\.t3\.bias"):
        sharded.load_state_dict({**state, "embedding_bags.t3.bias": torch.zeros(1)})
    with pytest.raises(RuntimeError, match=r"embedding_bags\.t1\.weight.*table 't1'.*shape \(3, 8\)"):
        sharded.load_state_dict({**state, "embedding_bags.t1.weight": torch.zeros(3, 8)})
    # a torch optimizer over module.parameters() trains the shards as it trains the unsharded collection
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(2):
        out = sharded(_batch(rtk, rank, step)).wait().values()
        (out * torch.arange(float(out.numel())).view_as(out) / out.numel()).sum().backward()
        for r in range(world_size):  # every rank's batch, each loss divided by the world size (TorchRec's)
            expected = reference(_batch(rtk, r, step)).values()
            ((expected * torch.arange(float(expected.numel())).view_as(expected) / expected.numel()) / world_size
             ).sum().backward()
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    trained = full_state_dict(sharded)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(trained[key], value, msg=lambda m: f"rank {rank} {key}: {m}")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sharded_modules_state_dict_round_trips_and_trains_with_its_parameters():
    run_workers(state_worker, 2)


def test_docstring_examples():
    import doctest

    from rectoolkit.distributed import table_view

    result = doctest.testmod(table_view)
    assert result.attempted > 0 and result.failed == 0, result
