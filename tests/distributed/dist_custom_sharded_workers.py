"""Workers of the end-to-end tests of the collective building blocks: table-wise sharded collections written the
TorchRec way (ShardedModule subclasses: input_dist by KJTAllToAll, compute by a local collection, output_dist by
PooledEmbeddingsAllToAll for an EmbeddingBagCollection, SequenceEmbeddingsAllToAll for an EmbeddingCollection),
built from `torchrec` - TorchRec 1.8 itself, or rectoolkit under that name - and compared with the unsharded
collection: the outputs, and each table's gradient against the unsharded one's averaged over the ranks (TorchRec's
gradient division)."""

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


def _each_library(rank: int, make_unsharded, make_sharded_class):
    """For rectoolkit, then TorchRec 1.8: (library, unsharded, sharded, sharded output, unsharded output) of this
    rank's batch."""
    import torchrec as real_torchrec

    owners = {name: owner for name, (_, _, owner) in TABLES.items()}
    for torchrec in (rectoolkit, real_torchrec):
        unsharded = make_unsharded(torchrec)
        sharded = make_sharded_class(torchrec)(unsharded, owners, dist.group.WORLD)
        yield torchrec, unsharded, sharded, sharded(_batch(torchrec, rank)).wait(), unsharded(_batch(torchrec, rank))


def _check_table_grads(torchrec, unsharded_tables, local_tables, rank: int, world_size: int) -> None:
    """Each table's gradient on its owner equals the unsharded table's averaged over the ranks."""
    for name, (_, _, owner) in TABLES.items():
        reference = unsharded_tables[name].weight.grad.clone()
        dist.all_reduce(reference)
        if owner == rank:
            torch.testing.assert_close(local_tables[name].weight.grad, reference / world_size, rtol=0, atol=1e-6,
                                       msg=lambda m: f"{torchrec.__name__}, table {name}: {m}")


def custom_sharded_worker(rank: int, world_size: int) -> None:
    for torchrec, unsharded, sharded, out, expected in _each_library(rank, _unsharded, table_wise_class):
        assert out.keys() == ["f_t0", "f_t1", "f_t2"], (torchrec.__name__, out.keys())
        for key in out.keys():
            assert torch.equal(out[key], expected[key]), (torchrec.__name__, rank, key)
        loss_weights = torch.randn(out.values().shape, generator=torch.Generator().manual_seed(9 + rank))
        (out.values() * loss_weights).sum().backward()
        (expected.values() * loss_weights).sum().backward()
        _check_table_grads(torchrec, unsharded.embedding_bags, sharded._local.embedding_bags, rank, world_size)


def table_wise_sequence_class(torchrec):
    """The sequence (EmbeddingCollection) form, as a TorchRec user writes it; the ids' splits are read from the
    input all-to-all's awaitable, as TorchRec's own sequence shardings do."""
    from torchrec.distributed.dist_data import KJTAllToAll, SequenceEmbeddingsAllToAll
    from torchrec.distributed.types import LazyAwaitable, ShardedModule
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection
    from torchrec.sparse.jagged_tensor import JaggedTensor

    class SequenceContext:
        def __init__(self) -> None:
            self.features = None
            self.input_splits = self.output_splits = self.lengths = None

    class SequenceOutput(LazyAwaitable[dict]):
        def __init__(self, rows, features) -> None:
            super().__init__()
            self._rows, self._features = rows, features

        def _wait_impl(self):
            rows = self._rows.wait().split(self._features.length_per_key())
            return {key: JaggedTensor(values=part, lengths=self._features[key].lengths())
                    for key, part in zip(self._features.keys(), rows)}

    class TableWiseEmbeddingCollection(ShardedModule):
        def __init__(self, unsharded, owners, pg) -> None:
            super().__init__()
            world_size, rank = pg.size(), pg.rank()
            configs = unsharded.embedding_configs()
            by_rank = [[c for c in configs if owners[c.name] == r] for r in range(world_size)]
            self._features = [f for tables in by_rank for c in tables for f in c.feature_names]
            self._local = EmbeddingCollection(tables=[EmbeddingConfig(
                name=c.name, embedding_dim=c.embedding_dim, num_embeddings=c.num_embeddings,
                feature_names=c.feature_names) for c in by_rank[rank]])
            with torch.no_grad():
                for c in by_rank[rank]:
                    self._local.embeddings[c.name].weight.copy_(unsharded.embeddings[c.name].weight)
            features_per_rank = [sum(len(c.feature_names) for c in tables) for tables in by_rank]
            self._input_a2a = KJTAllToAll(pg, features_per_rank)
            self._output_a2a = SequenceEmbeddingsAllToAll(pg, features_per_rank)

        def create_context(self):
            return SequenceContext()

        def input_dist(self, ctx, features):
            ctx.features = features.permute([features.keys().index(f) for f in self._features])
            awaitable = self._input_a2a(ctx.features)

            def keep_splits(tensors_awaitable):  # the ids sent to and received from each rank
                ctx.input_splits = tensors_awaitable._input_splits["values"]
                ctx.output_splits = tensors_awaitable._output_splits["values"]
                return tensors_awaitable

            awaitable.callbacks.append(keep_splits)
            return awaitable

        def compute(self, ctx, dist_input):
            ctx.lengths = dist_input.lengths().view(len(dist_input.keys()), -1)
            embeddings = self._local(dist_input)
            return torch.cat([embeddings[key].values() for key in dist_input.keys()])

        def output_dist(self, ctx, output):
            return SequenceOutput(self._output_a2a(output, ctx.lengths, ctx.input_splits, ctx.output_splits),
                                  ctx.features)

        def unsharded_module_type(self):
            return EmbeddingCollection

    return TableWiseEmbeddingCollection


def _unsharded_sequence(torchrec):
    configs = [torchrec.EmbeddingConfig(name=name, num_embeddings=rows, embedding_dim=4, feature_names=[f"f_{name}"])
               for name, (rows, _, _) in TABLES.items()]
    ec = torchrec.EmbeddingCollection(tables=configs)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, (rows, _, _) in TABLES.items():
            ec.embeddings[name].weight.copy_(torch.randn(rows, 4, generator=g))
    return ec


def custom_sequence_sharded_worker(rank: int, world_size: int) -> None:
    for torchrec, unsharded, sharded, out, expected in _each_library(rank, _unsharded_sequence,
                                                                      table_wise_sequence_class):
        assert sorted(out) == sorted(expected), (torchrec.__name__, sorted(out))
        g = torch.Generator().manual_seed(19 + rank)
        loss_weights = {key: torch.randn(expected[key].values().shape, generator=g) for key in sorted(expected)}
        for key in sorted(expected):
            assert torch.equal(out[key].lengths(), expected[key].lengths()), (torchrec.__name__, rank, key)
            assert torch.equal(out[key].values(), expected[key].values()), (torchrec.__name__, rank, key)
        sum((out[key].values() * loss_weights[key]).sum() for key in sorted(out)).backward()
        sum((expected[key].values() * loss_weights[key]).sum() for key in sorted(expected)).backward()
        _check_table_grads(torchrec, unsharded.embeddings, sharded._local.embeddings, rank, world_size)
