"""Worker of the end-to-end test of the collective building blocks: a table-wise sharded EmbeddingBagCollection
written the TorchRec way (a ShardedModule subclass: input_dist by KJTAllToAll, compute by a local
EmbeddingBagCollection, output_dist by PooledEmbeddingsAllToAll), built from `torchrec` - TorchRec 1.8 itself, or
rectoolkit under that name - and compared with the unsharded EmbeddingBagCollection: the pooled outputs, and each
table's gradient against the unsharded one's averaged over the ranks (TorchRec's gradient division)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import rectoolkit

TABLES = {"t0": (7, 3, 0), "t1": (5, 2, 0), "t2": (6, 4, 1)}  # name: (rows, dim, owner rank)
BATCH = 3


def table_wise_class(torchrec):
    """The sharded module, as a TorchRec user writes it (only `torchrec` names)."""
    from torchrec.distributed.dist_data import KJTAllToAll, PooledEmbeddingsAllToAll
    from torchrec.distributed.types import LazyAwaitable, ShardedModule
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedTensor

    class PooledOutput(LazyAwaitable[KeyedTensor]):
        def __init__(self, pooled, keys, dims) -> None:
            super().__init__()
            self._pooled, self._keys, self._dims = pooled, keys, dims

        def _wait_impl(self) -> KeyedTensor:
            return KeyedTensor(keys=self._keys, length_per_key=self._dims, values=self._pooled.wait())

    class TableWiseEmbeddingBagCollection(ShardedModule):
        def __init__(self, unsharded, owners, pg) -> None:
            super().__init__()
            world_size, rank = pg.size(), pg.rank()
            configs = unsharded.embedding_bag_configs()
            by_rank = [[c for c in configs if owners[c.name] == r] for r in range(world_size)]
            self._features = [f for tables in by_rank for c in tables for f in c.feature_names]
            self._dims = [c.embedding_dim for tables in by_rank for c in tables for _ in c.feature_names]
            self._local = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
                name=c.name, embedding_dim=c.embedding_dim, num_embeddings=c.num_embeddings,
                feature_names=c.feature_names) for c in by_rank[rank]])
            with torch.no_grad():
                for c in by_rank[rank]:
                    self._local.embedding_bags[c.name].weight.copy_(unsharded.embedding_bags[c.name].weight)
            self._input_a2a = KJTAllToAll(pg, [sum(len(c.feature_names) for c in tables) for tables in by_rank])
            self._output_a2a = PooledEmbeddingsAllToAll(
                pg, [sum(c.embedding_dim * len(c.feature_names) for c in tables) for tables in by_rank])

        def create_context(self):
            return None

        def input_dist(self, ctx, features):
            return self._input_a2a(features.permute([features.keys().index(f) for f in self._features]))

        def compute(self, ctx, dist_input):
            return self._local(dist_input).values()

        def output_dist(self, ctx, output):
            return PooledOutput(self._output_a2a(output), self._features, self._dims)

        def unsharded_module_type(self):
            return EmbeddingBagCollection

    return TableWiseEmbeddingBagCollection


def _unsharded(torchrec):
    configs = [torchrec.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim,
                                           feature_names=[f"f_{name}"]) for name, (rows, dim, _) in TABLES.items()]
    ebc = torchrec.EmbeddingBagCollection(tables=configs)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, (rows, dim, _) in TABLES.items():
            ebc.embedding_bags[name].weight.copy_(torch.randn(rows, dim, generator=g))
    return ebc


def _batch(torchrec, rank):
    g = torch.Generator().manual_seed(40 + rank)
    keys = ["f_t2", "f_t0", "f_t1"]  # not in the tables' order: input_dist permutes
    lengths = torch.randint(0, 3, (BATCH * len(keys),), generator=g)
    values = torch.cat([torch.randint(0, TABLES[key[2:]][0], (int(n),), generator=g)
                        for key, n in zip(keys, lengths.view(len(keys), BATCH).sum(1))])
    return torchrec.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


def custom_sharded_worker(rank: int, world_size: int) -> None:
    import torchrec as real_torchrec

    pg = dist.group.WORLD
    owners = {name: owner for name, (_, _, owner) in TABLES.items()}
    for torchrec in (rectoolkit, real_torchrec):
        unsharded = _unsharded(torchrec)
        sharded = table_wise_class(torchrec)(unsharded, owners, pg)
        out = sharded(_batch(torchrec, rank)).wait()
        expected = unsharded(_batch(torchrec, rank))
        assert out.keys() == ["f_t0", "f_t1", "f_t2"], (torchrec.__name__, out.keys())
        for key in out.keys():
            assert torch.equal(out[key], expected[key]), (torchrec.__name__, rank, key)
        loss_weights = torch.randn(out.values().shape, generator=torch.Generator().manual_seed(9 + rank))
        (out.values() * loss_weights).sum().backward()
        (expected.values() * loss_weights).sum().backward()
        for name, (_, _, owner) in TABLES.items():
            reference = unsharded.embedding_bags[name].weight.grad.clone()
            dist.all_reduce(reference)
            if owner == rank:
                grad = sharded._local.embedding_bags[name].weight.grad
                torch.testing.assert_close(grad, reference / world_size, rtol=0, atol=1e-6,
                                           msg=lambda m: f"{torchrec.__name__}, table {name}: {m}")
