"""torchrec.distributed.sharding_plan: the same shards as TorchRec 1.8's generators on the same tables.

Every generator (table_wise, row_wise, column_wise, table_row_wise, grid_shard, data_parallel), with their options,
on tables of awkward shapes, for several world and host sizes and both device types: sharding type, compute
kernel, ranks, and each shard's offsets, sizes and placement equal TorchRec's ParameterSharding. TorchRec keeps no
shards for DATA_PARALLEL; rectoolkit lists one full replica per rank (checked against the table shape).
"""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import sharding_plan as ours
from rectoolkit.plan.types import ShardingPlan

# (name, rows, dim): rows that do not divide, dims with and without a multiple-of-4 divisor, one wide table
TABLES = [("a", 10, 8), ("b", 5, 12), ("c", 37, 10), ("d", 64, 256), ("e", 3, 4)]


def _generators(lib, world_size: int, local_size: int):
    """Per case: table -> generator, built with `lib`'s functions (ours or TorchRec's)."""
    last = world_size - 1
    hosts = world_size // local_size
    return {
        "table_wise": {"a": lib.table_wise(rank=last), "b": lib.table_wise(rank=0), "c": lib.table_wise(rank=1 % world_size),
                       "d": lib.table_wise(rank=last, compute_kernel="fused"), "e": lib.table_wise(rank=0)},
        "table_wise_device": {"a": lib.table_wise(rank=1, device="cuda"), "b": lib.table_wise(rank=1, device="cpu"),
                              "c": lib.table_wise(rank=0, device="cuda"), "d": lib.table_wise(rank=0),
                              "e": lib.table_wise(rank=1, device="cpu")},
        "row_wise": {name: lib.row_wise() for name, _, _ in TABLES},
        "row_wise_options": {"a": lib.row_wise(([4, 4, 4], ["cuda", "cpu", "cuda"])), "b": lib.row_wise(([2, 2, 1], "cpu")),
                             "c": lib.row_wise(([20, 30], ["cuda", "cuda"])), "d": lib.row_wise(num_buckets=16),
                             "e": lib.row_wise(compute_kernel="fused")},
        "column_wise": {"a": lib.column_wise(ranks=[0, 1]), "b": lib.column_wise(ranks=[1, 0, 1]),
                        "c": lib.column_wise(ranks=[0, 1]), "d": lib.column_wise(ranks=[last, 0, 1, last]),
                        "e": lib.column_wise(ranks=[0])},
        "column_wise_sizes": {"a": lib.column_wise(size_per_rank=[3, 5]), "b": lib.column_wise(size_per_rank=[4, 4, 8]),
                              "c": lib.column_wise(size_per_rank=[10]),
                              "d": lib.column_wise(size_per_rank=[128, 128], device_types=["cuda", "cpu"]),
                              "e": lib.column_wise(ranks=[1], device_types=["cuda"])},
        "table_row_wise": {name: lib.table_row_wise(host_index=i % hosts) for i, (name, _, _) in enumerate(TABLES)},
        "grid_and_dp": {"a": lib.data_parallel(), "b": lib.data_parallel(), "c": lib.table_row_wise(host_index=hosts - 1),
                        "d": lib.grid_shard(host_indexes=[hosts - 1, 0]), "e": lib.data_parallel()},
    }


def _torchrec_ebc(torchrec, device="meta"):
    return torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name=n, num_embeddings=r, embedding_dim=d, feature_names=[n]) for n, r, d in TABLES], device=torch.device(device))


def _our_ebc(device="meta"):
    return rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(
        name=n, num_embeddings=r, embedding_dim=d, feature_names=[n]) for n, r, d in TABLES], device=torch.device(device))


def _summary(ps):
    spec = ps.sharding_spec if ps.sharding_type != "data_parallel" else None
    shards = None if spec is None else [(list(s.shard_offsets), list(s.shard_sizes), str(s.placement)) for s in spec.shards]
    return ps.sharding_type, ps.compute_kernel, list(ps.ranks), shards


@pytest.mark.torchrec
@pytest.mark.parametrize("world_size,local_size", [(2, 2), (4, 2), (8, 4)])
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_the_same_shards_as_torchrecs(world_size, local_size, device_type):
    torchrec = pytest.importorskip("torchrec")
    from torchrec.distributed import sharding_plan as theirs

    mine, reference = _generators(ours, world_size, local_size), _generators(theirs, world_size, local_size)
    for case in mine:
        got = ours.construct_module_sharding_plan(_our_ebc(), mine[case], local_size=local_size,
                                                  world_size=world_size, device_type=device_type)
        expected = theirs.construct_module_sharding_plan(_torchrec_ebc(torchrec), reference[case],
                                                         local_size=local_size, world_size=world_size,
                                                         device_type=device_type)
        assert list(got) == list(expected), case
        for table in expected:
            assert _summary(got[table]) == _summary(expected[table]), (case, table)
            if got[table].sharding_type == "data_parallel":
                rows, dim = next((r, d) for n, r, d in TABLES if n == table)
                assert [(s.rank, s.shard_sizes) for s in got[table].shards] == [(r, [rows, dim]) for r in range(world_size)]



@pytest.mark.torchrec
def test_fused_weights_get_the_fused_kernel_and_sequences_plan_alike():
    """TorchRec's default kernel: "fused" once an optimizer is applied in backward, else "dense"; and the
    EmbeddingCollection's tables (its sharder's shardable parameters) plan the same way."""
    torchrec = pytest.importorskip("torchrec")
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed import sharding_plan as theirs

    their_ebc, my_ebc = _torchrec_ebc(torchrec, "cpu"), _our_ebc("cpu")
    for ebc in (their_ebc, my_ebc):
        _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
    expected = theirs.construct_module_sharding_plan(their_ebc, theirs.apply_to_all(their_ebc, theirs.row_wise()),
                                                     local_size=2, world_size=2, device_type="cpu")
    got = ours.construct_module_sharding_plan(my_ebc, ours.apply_to_all(my_ebc, ours.row_wise()),
                                              local_size=2, world_size=2, device_type="cpu")
    assert {t: _summary(ps) for t, ps in got.items()} == {t: _summary(ps) for t, ps in expected.items()}
    assert {ps.compute_kernel for ps in got.values()} == {"fused"}

    their_ec, my_ec = (lib.EmbeddingCollection(tables=[lib.EmbeddingConfig(  # one dim: TorchRec requires it
        name=n, num_embeddings=r, embedding_dim=8, feature_names=[n]) for n, r, _ in TABLES], device=torch.device("meta"))
        for lib in (torchrec, rtk))

    def per_table(lib):
        return {"a": lib.column_wise(ranks=[1, 0]), "b": lib.table_wise(rank=1), "c": lib.row_wise(),
                "d": lib.data_parallel(), "e": lib.table_wise(rank=0)}

    expected = theirs.construct_module_sharding_plan(their_ec, per_table(theirs), local_size=2, world_size=2,
                                                     device_type="cuda")
    got = ours.construct_module_sharding_plan(my_ec, per_table(ours), local_size=2, world_size=2, device_type="cuda")
    assert {t: _summary(ps) for t, ps in got.items()} == {t: _summary(ps) for t, ps in expected.items()}
    assert type(ours.get_module_to_default_sharders()[rtk.EmbeddingCollection]).__name__ == "EmbeddingCollectionSharder"


def test_refusals_name_the_table_and_the_fix():
    ebc = _our_ebc()
    with pytest.raises(ValueError, match=r"missing \['e'\], not tables \['z'\]"):
        ours.construct_module_sharding_plan(ebc, {**{n: ours.row_wise() for n, _, _ in TABLES[:4]}, "z": ours.row_wise()},
                                            world_size=2, device_type="cpu")
    with pytest.raises(ValueError, match=r"10 columns do not divide evenly across 3 ranks"):
        ours.column_wise(ranks=[0, 1, 2])(torch.empty(4, 10), 2, 2, "cpu", None)
    with pytest.raises(ValueError, match=r"1 column block\(s\).*fewer than the 2 hosts"):
        ours.grid_shard(host_indexes=[0, 1])(torch.empty(4, 64), 2, 4, "cpu", None)
    with pytest.raises(ValueError, match=r"cover 5 of the table's 9 rows"):
        ours.row_wise(([2, 3], "cpu"))(torch.empty(9, 2), 2, 2, "cpu", None)
    with pytest.raises(ValueError, match=r"no default sharder for a Linear"):
        ours.construct_module_sharding_plan(torch.nn.Linear(2, 2), {}, world_size=2)
    with pytest.raises(RuntimeError, match=r"pass world_size="):
        ours.construct_module_sharding_plan(ebc, ours.apply_to_all(ebc, ours.row_wise()), device_type="cpu")


def test_the_plan_is_rectoolkits_and_prints_like_torchrecs():
    ebc = _our_ebc()
    plan = ShardingPlan({"": ours.construct_module_sharding_plan(
        ebc, {"a": ours.table_wise(rank=0), "b": ours.row_wise(), "c": ours.column_wise(ranks=[0, 1]),
              "d": ours.data_parallel(), "e": ours.table_wise(rank=1)}, world_size=2, local_size=2, device_type="cpu")})
    rtk.plan.validation.validate_plan(plan, {("", n): (r, d) for n, r, d in TABLES})
    assert "rank:1/cpu" in str(plan) and plan.plan[""]["c"].ranks == [0]  # 10 columns make one block


@pytest.mark.torchrec
@pytest.mark.parametrize("world_size,local_world_size", [(4, 2), (6, 3), (2, 2), (8, 4)])
def test_shard_sizes_and_offsets_are_torchrecs(world_size, local_world_size):
    theirs = pytest.importorskip("torchrec.distributed.sharding_plan")
    cases = [(kind, {}) for kind in ("data_parallel", "table_wise", "row_wise", "table_row_wise", "column_wise",
                                     "table_column_wise", "grid_shard")]
    cases += [("column_wise", {"col_wise_shard_dim": 4}), ("grid_shard", {"col_wise_shard_dim": 8}),
              ("row_wise", {"num_buckets": 2 * world_size}),
              ("row_wise", {"device_memory_sizes": [3 + rank for rank in range(world_size)]}),
              ("row_wise", {"device_memory_sizes": [1] * world_size, "num_buckets": world_size})]
    for name, rows, dim in TABLES + [("f", 48, 512)]:
        for kind, options in cases:
            if "num_buckets" in options and rows % options["num_buckets"]:
                continue  # TorchRec asserts; ours refuses by name (below)
            tensor = torch.empty(rows, dim)
            expected = theirs.calculate_shard_sizes_and_offsets(tensor, world_size, local_world_size, kind, **options)
            got = ours.calculate_shard_sizes_and_offsets(tensor, world_size, local_world_size, kind, **options)
            assert got == tuple(expected), (name, kind, options)


def test_shard_sizes_and_offsets_refuse_what_cannot_be_split():
    tensor = torch.empty(10, 8)
    with pytest.raises(ValueError, match=r"num_buckets \(2\) must be >= the number of ranks \(4\)"):
        ours.calculate_shard_sizes_and_offsets(tensor, 4, 2, "row_wise", num_buckets=2)
    with pytest.raises(ValueError, match="device_memory_sizes has 3 entries for 4 ranks"):
        ours.calculate_shard_sizes_and_offsets(tensor, 4, 2, "row_wise", device_memory_sizes=[1, 1, 1])
    with pytest.raises(ValueError, match="unknown sharding type 'rows'"):
        ours.calculate_shard_sizes_and_offsets(tensor, 4, 2, "rows")
