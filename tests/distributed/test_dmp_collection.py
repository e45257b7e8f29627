"""DMPCollection (TorchRec's 2D parallelism) on 4 gloo ranks, sharding groups of 2: the groups and the plan on
global ranks as TorchRec lays them out, one step of each sharding group against an unsharded model trained on that
group's batches (the embeddings diverge between the groups, the dense part is averaged over all 4 ranks), sync()
against the mean of the groups' weights and optimizer states gathered before it, state_dict and DCP, and the errors."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import DMPCollection, full_state_dict
from rectoolkit.distributed.interfaces import ShardingStrategy
from rectoolkit.plan.traffic import peer_matrix, sync_traffic

sys.path.insert(0, os.path.dirname(__file__))
from dist_harness import column_wise, data_parallel, make_batch, row_wise, run_workers, table_wise  # noqa: E402

LR = 0.5
ROWS = {"t0": 30, "t1": 40, "t2": 24, "t3": 16, "t4": 20}
DIM = 8


def _tables():
    return [rtk.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=DIM, feature_names=[f"f{name}"])
            for name, rows in ROWS.items()]


class Model(torch.nn.Module):
    def __init__(self, optimizer: str = "sgd"):
        super().__init__()
        fused = {"optimizer": optimizer, "lr": LR} if optimizer else {}  # (None: plain gradients, the reference)
        self.ebc = rtk.EmbeddingBagCollection(_tables(), **fused)
        self.linear = torch.nn.Linear(DIM * len(ROWS), 1)

    def forward(self, kjt):
        return self.linear(self.ebc(kjt).values())


def _group_plan() -> rtk.ShardingPlan:
    """A plan for a sharding group of 2 ranks."""
    return rtk.ShardingPlan({"ebc": {"t0": table_wise(1, ROWS["t0"], DIM), "t1": row_wise([0, 1], ROWS["t1"], DIM),
                                     "t2": column_wise([(0, 4), (1, 4)], ROWS["t2"]),
                                     "t3": data_parallel(2, ROWS["t3"], DIM),
                                     "t4": row_wise([0, 1], ROWS["t4"], DIM, kind="table_row_wise")}})


def _batch(rank: int) -> rtk.KeyedJaggedTensor:
    return make_batch({f"f{name}": rows for name, rows in ROWS.items()}, 5, seed=11 * rank + 3)


def _reference_step(model: Model, batches, world_batches) -> Model:
    """One unsharded step: the embeddings on `batches` (one sharding group's ranks' batches) with the gradient
    divided by the group's size, as TorchRec's sharded backward divides it; the dense part on all 4 ranks' batches,
    averaged as DDP averages. SGD both."""
    embeddings, dense = copy.deepcopy(model), copy.deepcopy(model)
    sum(embeddings(b).sum() for b in batches).div(len(batches)).backward()
    sum(dense(b).sum() for b in world_batches).div(len(world_batches)).backward()
    with torch.no_grad():
        for name, bag in embeddings.ebc.embedding_bags.items():
            bag.weight -= LR * bag.weight.grad
        for p, g in zip(embeddings.linear.parameters(), dense.linear.parameters()):
            p.copy_(p - LR * g.grad)
            p.grad = None
    return embeddings


def _tables_of(model: Model):
    return {f"ebc.embedding_bags.{name}.weight": bag.weight.detach() for name, bag in model.ebc.embedding_bags.items()}


def _layout_and_training_worker(rank: int, world_size: int, path: str) -> None:
    torch.manual_seed(0)
    model = Model()
    start = Model(None)
    start.load_state_dict(model.state_dict())
    plan = _group_plan()
    dmp = DMPCollection(model, torch.device("cpu"), plan, world_size=4, sharding_group_size=2,
                        global_pg=dist.group.WORLD)
    group, position = rank % 2, rank // 2  # strided: sharding groups [0, 2] and [1, 3], replica groups [0, 1], [2, 3]
    env = dmp.env
    assert (env.world_size, env.rank, env.global_rank, env.global_world_size) == (2, position, rank, 4)
    assert env.num_sharding_groups() == 2 and env.process_group is dist.group.WORLD
    assert env.local_world_size == 2  # (one host of 4 ranks: each group's 2 ranks on it, for table-row-wise t4)
    assert dist.get_process_group_ranks(env.sharding_pg) == [group, group + 2]
    assert dist.get_process_group_ranks(env.replica_pg) == [2 * position, 2 * position + 1]
    assert dmp.device_mesh.mesh.tolist() == [[0, 2], [1, 3]]
    assert [env.remap_rank(r, "table_wise") for r in range(4)] == [0, 0, 1, 1]  # each rank's place in its group
    # the plan on global ranks (the caller's, in place, as TorchRec's); group_plan as given
    ranks = [group, group + 2]
    assert dmp.plan is not None and plan.plan["ebc"]["t0"].shards[0].rank == ranks[1]
    assert [s.rank for s in dmp.plan.plan["ebc"]["t1"].shards] == ranks
    assert dmp.plan.plan["ebc"]["t1"].ranks == ranks
    assert [s.rank for s in dmp.group_plan.plan["ebc"]["t2"].shards] == [0, 1]

    # one step: each sharding group trains on its own ranks' batches
    batches = [_batch(r) for r in range(4)]
    optimizer = torch.optim.SGD(dmp.dense_parameters(), lr=LR)
    dmp(batches[rank]).sum().backward()
    optimizer.step()
    expected = {g: _tables_of(_reference_step(start, [batches[g], batches[g + 2]], batches)) for g in (0, 1)}
    got = full_state_dict(dmp)
    for key, tensor in expected[group].items():
        torch.testing.assert_close(got[key], tensor, msg=key)
    assert not torch.allclose(expected[0]["ebc.embedding_bags.t1.weight"], expected[1]["ebc.embedding_bags.t1.weight"])
    reference = _reference_step(start, [batches[group], batches[group + 2]], batches)
    torch.testing.assert_close(dmp.module.linear.weight, reference.linear.weight)  # the same on all 4 ranks

    # rectoolkit's checkpoint holds one copy of the model: refused while the groups differ, on every rank
    from rectoolkit.distributed import CheckpointError, load_checkpoint, save_checkpoint

    with pytest.raises(CheckpointError, match=r"hold different weights \(ebc\.t.*call dmp\.sync\(\) before saving"):
        save_checkpoint(dmp, f"{path}_ckpt")
    assert not os.path.exists(f"{path}_ckpt/metadata.json")

    # sync(): every table is the mean of the two groups' (DATA_PARALLEL t3 too)
    dmp.sync()
    assert torch.equal(_sync_matrix(dmp), torch.tensor(sync_traffic(_group_plan().plan["ebc"], _tables(), 4, 2)))
    got = full_state_dict(dmp)
    for key in expected[0]:
        torch.testing.assert_close(got[key], (expected[0][key] + expected[1][key]) / 2, msg=key)

    # state_dict: this rank's shards as ShardedTensors on the sharding group, placed by global rank
    t1 = dmp.state_dict()["ebc.embedding_bags.t1.weight"]
    assert t1._process_group is env.sharding_pg
    assert [s.placement.rank() for s in t1.metadata().shards_metadata] == ranks
    assert [s.metadata.placement.rank() for s in t1.local_shards()] == [rank]

    # DCP saves one copy of each (equal) shard and loads it into both groups
    import torch.distributed.checkpoint as dcp

    saved = full_state_dict(dmp)
    dcp.save(dmp.state_dict(), checkpoint_id=path)
    with torch.no_grad():
        for _, _, weight, _ in dmp.sharded_modules["ebc"].local_shards():
            weight.zero_()
    state = dmp.state_dict()
    dcp.load(state, checkpoint_id=path)
    dmp.load_state_dict(state)
    restored = full_state_dict(dmp)
    for key in expected[0]:
        assert torch.equal(restored[key], saved[key]), key
    # after sync, the first sharding group saves; every group loads it back
    save_checkpoint(dmp, f"{path}_ckpt", dense_optimizer=optimizer)
    with torch.no_grad():
        for _, _, weight, _ in dmp.sharded_modules["ebc"].local_shards():
            weight.fill_(float(rank))
    load_checkpoint(dmp, f"{path}_ckpt", dense_optimizer=optimizer)
    restored = full_state_dict(dmp)
    for key in expected[0]:
        assert torch.equal(restored[key], saved[key]), key


def test_dmp_collection_trains_each_sharding_group_and_sync_averages_the_replicas(tmp_path):
    run_workers(_layout_and_training_worker, 4, str(tmp_path / "dcp"))


def _sync_matrix(dmp) -> torch.Tensor:
    """The bytes sync() sent, [source, destination] over global ranks, gathered from every rank's count."""
    replicas = dist.get_process_group_ranks(dmp.env.replica_pg)
    row = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    for position, count in enumerate(dmp.sync_env.stats.bytes_sent["sync_allreduce"]):
        row[replicas[position]] = int(count)
    rows = [torch.zeros_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    return torch.stack(rows)


def _optimizer_state_worker(rank: int, world_size: int) -> None:
    torch.manual_seed(0)
    plan = _group_plan()
    plan.plan["ebc"]["t3"] = table_wise(0, ROWS["t3"], DIM)
    dmp = DMPCollection(Model("row_wise_adagrad"), torch.device("cpu"), plan, world_size=4, sharding_group_size=2,
                        global_pg=dist.group.WORLD, use_inter_host_allreduce=True)
    env = dmp.env  # contiguous: sharding groups [0, 1], [2, 3]; replica groups [0, 2], [1, 3]
    assert dist.get_process_group_ranks(env.sharding_pg) == [rank // 2 * 2, rank // 2 * 2 + 1]
    assert dist.get_process_group_ranks(env.replica_pg) == [rank % 2, rank % 2 + 2]
    assert [env.remap_rank(r) for r in range(4)] == [0, 1, 0, 1]
    dmp(_batch(rank)).sum().backward()

    def states():
        return {name: [s.tensor.detach().clone() for s in value.local_shards()]
                for name, value in _flat_states(dmp.fused_optimizer.state_dict()["state"]).items()}

    def weights():
        return [w.detach().clone() for _, _, w, _ in dmp.sharded_modules["ebc"].local_shards()]

    before_states, before_weights = states(), weights()
    assert before_states and any(float(t.abs().sum()) > 0 for v in before_states.values() for t in v)
    replicas = [None, None]
    dist.all_gather_object(replicas, (before_states, before_weights), group=env.replica_pg)
    # the two replicas trained on other batches: their weights and states differ before sync
    assert any(not torch.equal(a, b) for a, b in zip(replicas[0][1], replicas[1][1]))
    assert any(not torch.equal(a, b) for name in before_states for a, b in zip(replicas[0][0][name], replicas[1][0][name]))
    # without the optimizer state: the weights are averaged, the state stays this rank's own
    dmp.sync(include_optimizer_state=False)
    for mine, a, b in zip(weights(), replicas[0][1], replicas[1][1]):
        torch.testing.assert_close(mine, (a + b) / 2)
    for name, shards in states().items():
        for mine, own in zip(shards, before_states[name]):
            assert torch.equal(mine, own), name
    dmp.sync_env.stats.reset()
    dmp.sync()
    # a ring all-reduce of 2 ranks sends the other replica as many bytes as this rank syncs (half in each phase)
    synced = sum(t.numel() * t.element_size() for t in weights()) + \
        sum(t.numel() * t.element_size() for shards in states().values() for t in shards)
    other = 1 - dist.get_rank(env.replica_pg)
    assert int(dmp.sync_env.stats.bytes_sent["sync_allreduce"][other]) == synced
    expected = sync_traffic(dmp.group_plan.plan["ebc"], _tables(), 4, 2, use_inter_host_allreduce=True,
                            optimizer="row_wise_adagrad")
    assert torch.equal(_sync_matrix(dmp), torch.tensor(expected))
    for name, shards in states().items():
        for mine, a, b in zip(shards, replicas[0][0][name], replicas[1][0][name]):
            torch.testing.assert_close(mine, (a + b) / 2, msg=name)
    # a custom all-reduce replaces the averaging: called once per dtype with every weight and state of this rank
    calls = []

    def zero_them(tensors):
        calls.append(len(tensors))
        for tensor in tensors:
            tensor.zero_()

    dmp.set_all_reduce_hook(zero_them)
    dmp.sync()
    assert calls == [len(weights()) + sum(len(shards) for shards in states().values())]
    assert all(float(w.abs().sum()) == 0 for w in weights())
    with pytest.warns(RuntimeWarning, match="replacing the custom all-reduce"):
        dmp.set_all_reduce_hook(zero_them)


def _flat_states(state):
    """{"<param>.<state name>": ShardedTensor} of a fused optimizer's state_dict()["state"]."""
    out = {}
    for param, named in state.items():
        for name, value in named.items():
            if hasattr(value, "local_shards"):
                out[f"{param}.{name}"] = value
    return out


def test_dmp_collection_sync_averages_the_fused_optimizer_state_unless_told_not_to():
    run_workers(_optimizer_state_worker, 4)


def _errors_worker(rank: int, world_size: int) -> None:
    world_plan = _group_plan()
    world_plan.plan["ebc"]["t0"] = table_wise(3, ROWS["t0"], DIM)  # a rank of the world, not of a group of 2
    with pytest.raises(ValueError, match=r"places table 't0' \(module 'ebc'\) on rank\(s\) \[3\].*Topology\(world_si"
                                         r"ze=2"):
        DMPCollection(Model(), torch.device("cpu"), world_plan, 4, 2, dist.group.WORLD)
    with pytest.raises(ValueError, match=r"sharding_group_size=3 does not divide the world size 4"):
        DMPCollection(Model(), torch.device("cpu"), None, 4, 3, dist.group.WORLD)
    with pytest.raises(ValueError, match=r"world_size=8, but the global group has 4 ranks"):
        DMPCollection(Model(), torch.device("cpu"), _group_plan(), 8, 2, dist.group.WORLD)
    with pytest.raises(NotImplementedError, match=r"FULLY_SHARDED"):
        DMPCollection(Model(), torch.device("cpu"), _group_plan(), 4, 2, dist.group.WORLD,
                      sharding_strategy=ShardingStrategy.FULLY_SHARDED)
    # without a plan each sharding group plans for its 2 ranks: the same plan in both, on their own global ranks
    dmp = DMPCollection(Model(), torch.device("cpu"), None, 4, 2, dist.group.WORLD)
    layouts = [None] * 4
    mine = {name: (ps.sharding_type, [(s.shard_offsets, s.shard_sizes, s.rank) for s in ps.shards])
            for name, ps in dmp.group_plan.plan["ebc"].items()}
    dist.all_gather_object(layouts, mine)
    assert all(layout == layouts[0] for layout in layouts), layouts
    group = dist.get_process_group_ranks(dmp.env.sharding_pg)
    assert {s.rank for ps in dmp.plan.plan["ebc"].values() for s in ps.shards} <= set(group)
    # TorchRec's own flow (its 2D tests): a model on meta, the group's plan by collective_plan over the global group,
    # keyword arguments, the sharders; then the weights initialized by apply()
    from rectoolkit.distributed import EmbeddingBagCollectionSharder

    with torch.device("meta"):
        on_meta = Model()
    sharder = EmbeddingBagCollectionSharder()
    planner = rtk.EmbeddingShardingPlanner(topology=rtk.Topology(world_size=2, compute_device="cpu"))
    plan = planner.collective_plan(on_meta, [sharder], dist.group.WORLD)
    dmp = DMPCollection(module=on_meta, device=torch.device("cpu"), plan=plan, sharding_group_size=2, world_size=4,
                        global_pg=dist.group.WORLD, sharders=[sharder])

    @torch.no_grad()
    def init_weights(module):
        if isinstance(module, torch.nn.Linear):
            module.weight.fill_(1.0)

    dmp.apply(init_weights)
    dmp(_batch(rank)).sum().backward()
    dmp.sync()
    assert torch.equal(dmp.module.linear.weight, torch.ones_like(dmp.module.linear.weight))
    # a plan given as a plain dict of modules, as DistributedModelParallel takes it
    as_dict = DMPCollection(Model(), torch.device("cpu"), dict(_group_plan().plan), 4, 2)
    assert [s.rank for s in as_dict.plan.plan["ebc"]["t1"].shards] == dist.get_process_group_ranks(as_dict.env.sharding_pg)
    # copy() shares the groups: the copy syncs over the same replica group
    undivided = DMPCollection(Model(), torch.device("cpu"), _group_plan(), 4, 2, init_data_parallel=False)
    twin = undivided.copy(torch.device("cpu"))
    assert twin.env.replica_pg is undivided.env.replica_pg and twin.device_mesh is undivided.device_mesh
    with torch.no_grad():
        for _, _, weight, _ in twin.sharded_modules["ebc"].local_shards():
            weight.fill_(float(rank))
    twin.sync()
    replica = dist.get_process_group_ranks(twin.env.replica_pg)
    for _, _, weight, _ in twin.sharded_modules["ebc"].local_shards():
        assert torch.equal(weight, torch.full_like(weight, sum(replica) / 2))


def test_dmp_collection_refuses_a_plan_for_the_world_and_sizes_that_do_not_fit():
    run_workers(_errors_worker, 4)


def test_peer_matrix_is_torchrecs_layout():
    assert peer_matrix(8, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert peer_matrix(8, 2, use_inter_host_allreduce=True) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert peer_matrix(4, 4) == [[0, 1, 2, 3]]


class WithLoss(torch.nn.Module):
    """The pipelines' model contract: forward(batch) -> (loss, output)."""

    def __init__(self):
        super().__init__()
        self.model = Model()

    def forward(self, batch):
        loss = self.model(batch.sparse_features).square().mean()
        return loss, loss.detach()


def _pipeline_run(rank: int, pipelined: bool, interval):
    from rectoolkit.distributed.train_pipeline import TrainPipelineSparseDist
    from rectoolkit.train.data import Batch

    torch.manual_seed(0)
    plan = rtk.ShardingPlan({"model.ebc": _group_plan().plan["ebc"]})
    dmp = DMPCollection(WithLoss(), torch.device("cpu"), plan, world_size=4, sharding_group_size=2)
    optimizer = torch.optim.SGD(dmp.dense_parameters(), lr=0.1)
    data = [Batch(torch.zeros(5, 1), _batch(10 * step + rank), torch.zeros(5)) for step in range(5)]
    losses = []
    if pipelined:
        pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"),
                                           dmp_collection_sync_interval_batches=interval)
        feed = iter(data)
        for _ in data:
            losses.append(pipeline.progress(feed))
    else:
        for index, batch in enumerate(data):
            optimizer.zero_grad()
            loss, _ = dmp(batch)
            loss.backward()
            if interval is not None and index % interval == 0:
                dmp.sync()
            optimizer.step()
            losses.append(loss.detach())
    return losses, full_state_dict(dmp), dmp.env.replica_pg


def _pipeline_worker(rank: int, world_size: int) -> None:
    plain_losses, plain, _ = _pipeline_run(rank, False, 2)
    piped_losses, piped, replica_pg = _pipeline_run(rank, True, 2)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, piped_losses)), (plain_losses, piped_losses)
    for key, value in plain.items():
        assert torch.equal(value, piped[key]), key
    # batch 4 (index 4) was synced after its backward, which updated the fused tables: those are equal on the
    # replicas (the DATA_PARALLEL t3 is updated by the dense optimizer after the sync); without syncing they are not
    tables = [key for key in piped if ".ebc." in key and ".t3." not in key]
    replicas = [None, None]
    dist.all_gather_object(replicas, {key: piped[key] for key in tables}, group=replica_pg)
    assert all(torch.equal(replicas[0][key], replicas[1][key]) for key in tables)
    _, unsynced, _ = _pipeline_run(rank, True, None)
    dist.all_gather_object(replicas, {key: unsynced[key] for key in tables}, group=replica_pg)
    assert not all(torch.equal(replicas[0][key], replicas[1][key]) for key in tables)


def test_the_train_pipeline_syncs_a_dmp_collection_every_interval_as_the_plain_loop_does():
    run_workers(_pipeline_worker, 4)


def _sequence_worker(rank: int, world_size: int) -> None:
    """A sequence EmbeddingCollection (one row per id) in a DMPCollection: each group's step equals the unsharded
    collection's on the group's batches, and sync() leaves the mean of the two groups' tables."""
    tables = [rtk.EmbeddingConfig(name=name, num_embeddings=rows, embedding_dim=DIM, feature_names=[f"f{name}"])
              for name, rows in list(ROWS.items())[:3]]
    torch.manual_seed(0)
    ec = rtk.EmbeddingCollection(tables, optimizer="sgd", lr=LR)
    start = rtk.EmbeddingCollection(tables)
    start.load_state_dict(ec.state_dict())
    plan = rtk.ShardingPlan({"": {"t0": table_wise(1, ROWS["t0"], DIM), "t1": row_wise([0, 1], ROWS["t1"], DIM),
                                  "t2": column_wise([(0, 4), (1, 4)], ROWS["t2"])}})
    dmp = DMPCollection(ec, torch.device("cpu"), plan, world_size=4, sharding_group_size=2)
    features = {f"f{name}": rows for name, rows in list(ROWS.items())[:3]}
    batches = [make_batch(features, 4, seed=7 * r + 1) for r in range(4)]

    def loss(module, batch):
        return sum(jt.values().sum() for jt in module(batch).values())

    loss(dmp, batches[rank]).backward()
    expected = {}
    for group in (0, 1):
        model = copy.deepcopy(start)
        sum(loss(model, batches[r]) for r in (group, group + 2)).div(2).backward()
        with torch.no_grad():
            expected[group] = {f"embeddings.{name}.weight": (w.weight - LR * w.weight.grad).detach()
                               for name, w in model.embeddings.items()}
    got = full_state_dict(dmp)
    for key, tensor in expected[rank % 2].items():
        torch.testing.assert_close(got[key], tensor, msg=key)
    dmp.sync()
    got = full_state_dict(dmp)
    for key in expected[0]:
        torch.testing.assert_close(got[key], (expected[0][key] + expected[1][key]) / 2, msg=key)


def test_a_sequence_collection_trains_per_group_and_syncs():
    run_workers(_sequence_worker, 4)
