"""A DistributedModelParallel on a process group of part of the world (4 ranks as two pairs, each on its own group,
as a 2D layout has them): its dense part's DDP group is made of the pair's ranks (it was made of ranks 0..1 of the
world on every rank, so the second pair failed in DDP), shared by every DMP on those ranks; the train pipeline, whose
input_dists ahead would need a second group of the same ranks, is refused by name."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.distributed.train_pipeline import TrainPipelineSparseDist

sys.path.insert(0, os.path.dirname(__file__))
from dist_harness import run_workers  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=50, embedding_dim=4,
                                                                      feature_names=["f"])])
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, kjt):
        return self.linear(self.ebc(kjt).values())


def _batch(rank: int) -> rtk.KeyedJaggedTensor:
    g = torch.Generator().manual_seed(rank)
    return rtk.KeyedJaggedTensor(keys=["f"], values=torch.randint(0, 50, (6,), generator=g),
                                 lengths=torch.tensor([1, 2, 3]))


def _pairs_worker(rank: int, world_size: int) -> None:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # (every rank makes every group)
    pair = pairs[rank // 2]
    env = ShardingEnv.from_process_group(pair)
    for _ in range(2):  # a second DMP on the same ranks shares the first one's dense group
        torch.manual_seed(0)
        dmp = DistributedModelParallel(Model(), env=env)
        plain = Model()
        plain.linear.load_state_dict(dmp.module.linear.state_dict())
        plain.ebc.load_state_dict({k[len("ebc."):]: v for k, v in dmp.state_dict().items() if k.startswith("ebc.")})
        dmp(_batch(rank)).sum().backward()
        plain(_batch(rank)).sum().backward()
        grads = [None, None]
        dist.all_gather_object(grads, plain.linear.weight.grad, group=pair)
        # DDP averaged the pair's gradients of the dense part (and only the pair's)
        torch.testing.assert_close(dmp.module.linear.weight.grad, (grads[0] + grads[1]) / 2)
    with pytest.raises(NotImplementedError, match=r"TrainPipelineSparseDist on a process group of part of the world"):
        TrainPipelineSparseDist(dmp, torch.optim.SGD(dmp.dense_parameters(), lr=0.1), torch.device("cpu"))


def test_dmps_on_groups_of_part_of_the_world_average_their_dense_part_within_the_group():
    run_workers(_pairs_worker, 4)
