"""Sharded collections and DistributedModelParallel with their shards on the GPU, for every sharding type:
world size 1 on NCCL, 2 ranks sharing the one GPU over gloo (which carries CUDA tensors), and 2 ranks on NCCL
where there are 2 GPUs. Outputs, gradients and fused updates equal the unsharded collection on the CPU, and
the bytes every collective sent equal rectoolkit.plan.traffic's count (tests/distributed/dist_workers.py)."""

from __future__ import annotations

import json

import pytest

from gpu_helpers import dry_run, needs_cuda_itself, needs_gpus
from dist_harness import run_workers
from dist_workers import equivalence_worker
from gpu_workers import dmp_device_worker, quant_sharded_worker, vbe_device_worker

pytestmark = pytest.mark.gpu

ALL_TYPES = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "grid_shard"]
NCCL = "gloo" if dry_run() else "nccl"  # the dry run checks the test code on the CPU, where there is no NCCL
ONE_GPU = "cpu" if dry_run() else "cuda:0"
GPU_PER_RANK = "cpu" if dry_run() else "cuda:{rank}"


def _equivalence(tmp_path, W, cases, device, backend):
    result_file = tmp_path / "results.jsonl"
    run_workers(equivalence_worker, W, cases, str(result_file), device, backend=backend)
    rows = [json.loads(line) for line in open(result_file)]
    assert len(rows) == len(cases) * 5  # ebc dense, ebc dense weighted, ebc fused, ec dense, ec fused
    assert {r["case"] for r in rows} == {case for case, _ in cases}
    assert all(r["bytes_equal_traffic_py"] and r["world_size"] == W for r in rows)
    return rows


@pytest.mark.timeout(300)
def test_every_sharding_type_on_one_gpu_with_nccl(tmp_path):
    _equivalence(tmp_path, 1, [(kind, 1) for kind in ALL_TYPES + ["mixed_a", "mixed_b"]], ONE_GPU, NCCL)


@pytest.mark.timeout(300)
def test_every_sharding_type_two_ranks_sharing_the_gpu_over_gloo(tmp_path):
    cases = [(kind, 2) for kind in ALL_TYPES + ["mixed_a"]] + [("table_row_wise", 1), ("grid_shard", 1),
                                                                ("mixed_b", 1)]
    rows = _equivalence(tmp_path, 2, cases, ONE_GPU, "gloo")
    assert all(len(set(r["batch_sizes"])) == 2 for r in rows if r["case"].startswith("mixed"))


@pytest.mark.timeout(300)
def test_every_sharding_type_two_ranks_on_nccl(tmp_path):
    needs_gpus(2, "NCCL refuses two ranks on one GPU")
    _equivalence(tmp_path, 2, [(kind, 2) for kind in ALL_TYPES + ["mixed_a"]] + [("mixed_b", 1)], GPU_PER_RANK,
                 NCCL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size, backend", [(1, NCCL), (2, "gloo")], ids=["1-rank-nccl", "2-ranks-gloo"])
def test_dmp_trains_on_the_gpu_like_the_unsharded_model(tmp_path, world_size, backend):
    result_file = tmp_path / "dmp.json"
    run_workers(dmp_device_worker, world_size, ONE_GPU, str(result_file), backend=backend)
    rows = json.loads(result_file.read_text())
    assert [r["case"] for r in rows] == ["mixed_a", "mixed_b"]
    if not dry_run():
        assert all(r["device"] == "cuda:0" and r["cuda_max_allocated"] > 0 for r in rows), rows


@pytest.mark.timeout(300)
def test_sharded_quantized_inference_two_ranks_sharing_the_gpu(tmp_path):
    result_file = tmp_path / "quant.json"
    run_workers(quant_sharded_worker, 2, ONE_GPU, str(result_file), backend="gloo")  # the plan is for 2 ranks
    rows = json.loads(result_file.read_text())
    assert [r["dtype"] for r in rows] == ["torch.int8", "torch.quint4x2"]


@pytest.mark.parametrize("kernel", ["fused_uvm", "fused_uvm_caching"])
def test_uvm_kernels_are_refused_for_gpu_shards(kernel):
    needs_cuda_itself("the refusal is about shards in GPU memory")
    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection

    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4,
                                                             feature_names=["f"])], optimizer="sgd", lr=0.1)
    plan = {"t": rtk.ParameterSharding("table_wise", compute_kernel=kernel, ranks=[0],
                                       shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 10, 4)])}
    with pytest.raises(ValueError, match=rf"table 't'.*{kernel}.*rank 0 \(cuda:0\).*plan compute_kernel 'fused'"):
        shard_embedding_bag_collection(ebc, plan, ShardingEnv.local("cuda:0"))
    # planned 'fused', the same table shards onto the GPU
    plan["t"] = rtk.ParameterSharding("table_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 10, 4)])
    sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local("cuda:0"))
    assert sharded.memory_bytes()["device"] == 10 * 4 * 4 and sharded.memory_bytes()["host"] == 0


@pytest.mark.timeout(300)
def test_variable_batch_sharded_on_the_gpu_two_ranks_over_gloo(tmp_path):
    """Issue 16's VBE path with the shards on the GPU: each feature at its own batch size through every sharding
    type but data-parallel (one and two hosts), outputs and the fused update equal the CPU collection's."""
    cases = [(kind, 2) for kind in ALL_TYPES if kind != "data_parallel"] + [("table_row_wise", 1), ("grid_shard", 1)]
    result_file = tmp_path / "vbe.json"
    run_workers(vbe_device_worker, 2, ONE_GPU, cases, str(result_file), backend="gloo")
    rows = json.loads(result_file.read_text())
    assert [r["case"] for r in rows] == [case for case, _ in cases]
    assert all(r["max_output_diff"] <= 1e-5 and r["max_update_diff"] <= 1e-5 for r in rows), rows
