"""measured_resources: comm_bytes_sent counts exactly the data collectives that rectoolkit.plan.traffic prices;
the input_dist "metadata" control messages are reported apart."""

import torch

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.launch import WorkerContext
from rectoolkit.plan.traffic import batch_id_counter, step_traffic
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectoolkit.train.loop import measured_resources


def test_comm_bytes_sent_equals_the_priced_traffic_and_control_bytes_are_apart():
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=50, embedding_dim=8, feature_names=[f"f{i}"])
              for i in range(3)]
    constraints = {"t0": ParameterConstraints(sharding_types=["row_wise"]),
                   "t1": ParameterConstraints(sharding_types=["table_wise"]),
                   "t2": ParameterConstraints(sharding_types=["data_parallel"])}
    plan = EmbeddingShardingPlanner(Topology(world_size=1, compute_device="cpu", batch_size=4),
                                    constraints=constraints).plan(tables)
    model = DistributedModelParallel(rtk.EmbeddingBagCollection(tables), env=ShardingEnv.local(), plan=plan)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1", "f2"], values=torch.tensor([1, 2, 40, 3, 4, 5, 6]),
                                                  lengths=torch.tensor([2, 1, 1, 0, 2, 1]))
    model(kjt).values().sum().backward()

    measured = measured_resources(model, WorkerContext.single_process())
    expected = step_traffic(plan.plan[""], tables, world_size=1, local_world_size=1, batch_sizes=[2],
                            count_ids=batch_id_counter([kjt]))
    assert measured["comm_bytes_sent"] == sum(int(m.sum()) for m in expected.values()) > 0
    # one metadata message (two int64) per sharding-type group that distributes ids: row-wise and table-wise
    assert measured["control_bytes_sent"] == 2 * 16
    assert sum(sum(row) for row in measured["bytes_sent_by_collective"].values()) == \
        measured["comm_bytes_sent"] + measured["control_bytes_sent"]
