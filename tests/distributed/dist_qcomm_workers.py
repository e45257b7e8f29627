"""Worker of the quantized-communication test (importable by spawned processes).

An EmbeddingBagCollection sharded by a sharder with TorchRec's registry (FP16 forward, BF16 backward) on 2 ranks,
one table per sharding type (TABLE_WISE, ROW_WISE, COLUMN_WISE, TABLE_ROW_WISE on one host of 2 ranks), against
values worked out here from the UNSHARDED tables:

- forward: a table whose pooled rows cross the wire whole (TABLE_WISE, COLUMN_WISE) gives fp16(pooled); a ROW_WISE
  table gives the sum of its row blocks' partial sums, each rounded to fp16 on its way; TABLE_ROW_WISE rounds the
  partial sums (intra-host level), adds them, and rounds the sum again (inter-host level).
- backward: the output gradient C / W (TorchRec's gradient division) travels as bf16, so after one fused SGD step
  a table is w - lr * (the embedding_bag gradient of bf16(C / W)).

Weights are multiples of 2^-20 below 1/2 and C multiples of 2^-10 below 1: every sum here is exact in float32, so
only the codec's rounding can move a value and the comparisons are exact (torch.equal). The bytes: output_dist
and its backward are exactly half of the float32 run's, and equal step_traffic's with the registry.
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F

import rectoolkit as rtk
from rectoolkit.distributed import EmbeddingBagCollectionSharder, ShardingEnv
from rectoolkit.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from rectoolkit.distributed.state import gather_table
from rectoolkit.plan.traffic import batch_id_counter, step_traffic
from dist_harness import column_wise, global_batch, make_batch, row_wise, table_wise

BATCH = 5
LR = 0.5
# name, rows, dim, plan on 2 ranks
TABLES = {"t_tw": (10, 4, lambda: table_wise(1, 10, 4)),
          "t_rw": (12, 4, lambda: row_wise([0, 1], 12, 4)),
          "t_cw": (9, 6, lambda: column_wise([(0, 2), (1, 4)], 9)),
          "t_twrw": (8, 2, lambda: row_wise([0, 1], 8, 2, kind="table_row_wise"))}


def fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)


def _collection() -> rtk.EmbeddingBagCollection:
    configs = [rtk.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f_{name}"])
               for name, (rows, dim, _) in TABLES.items()]
    ebc = rtk.EmbeddingBagCollection(configs)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, (rows, dim, _) in TABLES.items():
            ebc.embedding_bags[name].weight.copy_(torch.randint(-2 ** 19, 2 ** 19, (rows, dim), generator=g) / 2 ** 20)
    return ebc


def _pool(weight: torch.Tensor, jt) -> torch.Tensor:
    """Plain sum pooling of one feature: [samples, dim]."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), jt.lengths().cumsum(0)])
    return F.embedding_bag(jt.values(), weight, offsets[:-1], mode="sum")


def _expected_pooled(ebc, name: str, jt) -> torch.Tensor:
    """What the sharded collection must give for one feature's bags `jt`, by the codec's rounding per sharding type."""
    rows = TABLES[name][0]
    weight = ebc.embedding_bags[name].weight.detach()
    if name in ("t_tw", "t_cw"):
        return fp16(_pool(weight, jt))
    partials = []
    for start, end in ((0, rows // 2), (rows // 2, rows)):  # the two row blocks (row_wise's cut, even rows)
        block = torch.zeros_like(weight)
        block[start:end] = weight[start:end]
        partials.append(fp16(_pool(block, jt)))
    summed = partials[0] + partials[1]
    return summed if name == "t_rw" else fp16(summed)


def _expected_output(ebc, batch) -> torch.Tensor:
    """What the sharded collection must give for `batch`: every feature's rounded pooled rows, side by side."""
    return torch.cat([_expected_pooled(ebc, name, batch[f"f_{name}"]) for name in TABLES], dim=1)


def _expected_tables(ebc, batch, upstream: torch.Tensor, W: int) -> Dict[str, torch.Tensor]:
    """Every table after one SGD step with lr LR, its output gradient upstream / W rounded to bf16."""
    grad = bf16(upstream / W)
    out, col = {}, 0
    for name, (_, dim, _) in TABLES.items():
        weight = ebc.embedding_bags[name].weight.detach().clone().requires_grad_(True)
        (_pool(weight, batch[f"f_{name}"]) * grad[:, col:col + dim]).sum().backward()
        out[name] = weight.detach() - LR * weight.grad
        col += dim
    return out


def _run(rank: int, W: int, registry, kjts: List, upstream: torch.Tensor):
    """One step of the sharded collection: (its output, tables after the fused SGD step, env)."""
    env = ShardingEnv.from_process_group(local_world_size=2)
    plan = {name: make_plan() for name, (_, _, make_plan) in TABLES.items()}
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": LR},
                                            qcomm_codecs_registry=registry)
    sharded = sharder.shard(_collection(), plan, env)
    out = sharded(kjts[rank]).wait().values()
    (out * upstream[rank * BATCH:(rank + 1) * BATCH]).sum().backward()
    tables = {name: gather_table(sharded, name) for name in TABLES}
    return out.detach(), tables, env, plan


def qcomm_worker(rank: int, W: int) -> None:
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16,
                                                      backward_precision=CommType.BF16))
    features = {f"f_{name}": rows for name, (rows, _, _) in TABLES.items()}
    kjts = [make_batch(features, BATCH, seed=100 + r) for r in range(W)]
    batch = global_batch(kjts)
    width = sum(dim for _, dim, _ in TABLES.values())
    upstream = torch.randint(1, 2 ** 10, (W * BATCH, width), generator=torch.Generator().manual_seed(3)) / 2 ** 10
    reference = _collection()

    out, tables, env, plan = _run(rank, W, registry, kjts, upstream)
    expected = _expected_output(reference, batch)[rank * BATCH:(rank + 1) * BATCH]
    assert not torch.equal(expected, reference(batch).values()[rank * BATCH:(rank + 1) * BATCH]), \
        "the weights must need rounding, or the test shows nothing"
    assert torch.equal(out, expected), f"rank {rank}: output differs by {(out - expected).abs().max()}"
    for name, table in _expected_tables(reference, batch, upstream, W).items():
        assert torch.equal(tables[name], table), f"rank {rank}, {name}: differs by {(tables[name] - table).abs().max()}"

    measured = env.gathered_bytes()
    estimate = step_traffic(plan, reference.embedding_bag_configs(), W, 2, [BATCH] * W, batch_id_counter(kjts),
                            qcomm_codecs_registry=registry)
    for name, matrix in estimate.items():
        if matrix.any() or name in measured:
            assert (measured[name] == matrix).all(), f"{name}: measured {measured[name]} != estimate {matrix}"

    _, _, env32, _ = _run(rank, W, None, kjts, upstream)
    measured32 = env32.gathered_bytes()
    for name in ("output_dist", "output_dist_backward", "output_dist_intra", "output_dist_intra_backward",
                 "output_dist_inter", "output_dist_inter_backward"):
        assert measured32[name].sum() > 0 and (2 * measured[name] == measured32[name]).all(), \
            f"{name}: {measured[name]} is not half of float32's {measured32[name]}"
    assert (measured["input_dist"] == measured32["input_dist"]).all(), "ids and lengths travel as they are"


class _TwoCollections(torch.nn.Module):
    """An EmbeddingBagCollection ("bags", its table t_tw) and an EmbeddingCollection ("seq", table s_rw)."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t_tw", num_embeddings=10, embedding_dim=4,
                                                                       feature_names=["f_t_tw"])])
        self.seq = rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="s_rw", num_embeddings=12, embedding_dim=4,
                                                                feature_names=["f_s_rw"])])
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for weight in (self.bags.embedding_bags["t_tw"].weight, self.seq.embeddings["s_rw"].weight):
                weight.copy_(torch.randint(-2 ** 19, 2 ** 19, weight.shape, generator=g) / 2 ** 20)

    def forward(self, kjt):
        return self.bags(kjt).values(), self.seq(kjt)["f_s_rw"].values()


def qcomm_dmp_worker(rank: int, W: int) -> None:
    """DistributedModelParallel takes each collection's registry from the sharder of its type: the bags' from
    EmbeddingBagCollectionSharder (FP16 forward), the sequences' from EmbeddingCollectionSharder (BF16 forward):
    pooled rows come back fp16-rounded, sequence rows bf16-rounded, at 2 bytes a value, as step_traffic says."""
    from rectoolkit.distributed import DistributedModelParallel, EmbeddingCollectionSharder
    from rectoolkit.plan.types import ShardingPlan

    bags_registry = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16))
    seq_registry = get_qcomm_codecs_registry(QCommsConfig(CommType.BF16, CommType.FP16))
    plan = ShardingPlan({"bags": {"t_tw": table_wise(1, 10, 4)}, "seq": {"s_rw": row_wise([0, 1], 12, 4)}})
    reference = _TwoCollections()
    dmp = DistributedModelParallel(_TwoCollections(), plan=plan, local_world_size=W, sharders=[
        EmbeddingBagCollectionSharder(qcomm_codecs_registry=bags_registry),
        EmbeddingCollectionSharder(qcomm_codecs_registry=seq_registry)])
    kjts = [make_batch({"f_t_tw": 10, "f_s_rw": 12}, BATCH, seed=200 + r) for r in range(W)]
    pooled, rows = dmp(kjts[rank])
    ids = kjts[rank]["f_s_rw"].values()
    expected_rows = bf16(reference.seq.embeddings["s_rw"].weight.detach()[ids])
    expected_pooled = fp16(_pool(reference.bags.embedding_bags["t_tw"].weight.detach(), kjts[rank]["f_t_tw"]))
    assert not torch.equal(expected_rows, reference.seq.embeddings["s_rw"].weight.detach()[ids])
    assert torch.equal(rows, expected_rows), f"rank {rank}: sequence rows differ by {(rows - expected_rows).abs().max()}"
    assert torch.equal(pooled, expected_pooled), f"rank {rank}: pooled rows differ by {(pooled - expected_pooled).abs().max()}"
    (pooled.sum() + rows.sum()).backward()
    measured = dmp.env.gathered_bytes()
    counter = batch_id_counter(kjts)
    estimate = {name: step_traffic(plan.plan["bags"], reference.bags.embedding_bag_configs(), W, W, [BATCH] * W,
                                   counter, qcomm_codecs_registry=bags_registry)[name]
                + step_traffic(plan.plan["seq"], reference.seq.embedding_configs(), W, W, [BATCH] * W, counter,
                               qcomm_codecs_registry=seq_registry)[name]
                for name in ("input_dist", "output_dist", "output_dist_backward")}
    for name, matrix in estimate.items():
        assert (measured[name] == matrix).all(), f"{name}: measured {measured[name]} != estimate {matrix}"


# a batch size per feature (VBE): t_tw and t_rw once per user (2 users of BATCH samples), the others per sample
USER_TABLES = ("t_tw", "t_rw")
USERS = 2
INVERSE = torch.tensor([0, 0, 1, 1, 1])  # sample -> its user


def _vbe_batch(seed: int):
    """(VBE KJT of one rank, {table: its feature's bags as a JaggedTensor at the feature's own batch size})."""
    g = torch.Generator().manual_seed(seed)
    keys, lengths, values, bags = [], [], [], {}
    for name, (rows, _, _) in TABLES.items():
        count = USERS if name in USER_TABLES else BATCH
        L = torch.randint(1, 4, (count,), generator=g)
        v = torch.randint(0, rows, (int(L.sum()),), generator=g)
        keys.append(f"f_{name}")
        lengths.append(L)
        values.append(v)
        bags[name] = rtk.JaggedTensor(values=v, lengths=L)
    inverse = torch.stack([INVERSE if name in USER_TABLES else torch.arange(BATCH) for name in TABLES])
    kjt = rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths),
                                stride_per_key_per_rank=[[USERS if n in USER_TABLES else BATCH] for n in TABLES],
                                inverse_indices=(keys, inverse))
    return kjt, bags


def qcomm_vbe_worker(rank: int, W: int) -> None:
    """The registry on a batch with a batch size per feature: the user features' pooled rows cross the wire once per
    user (rounded there), then are expanded to the samples; their gradient is summed over each user's samples
    before it crosses back as bf16, so a table steps by the bf16 of that sum. Output bytes half of float32's."""
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16,
                                                      backward_precision=CommType.BF16))
    batches = [_vbe_batch(300 + r) for r in range(W)]
    width = sum(dim for _, dim, _ in TABLES.values())
    upstream = torch.randint(1, 2 ** 10, (W * BATCH, width), generator=torch.Generator().manual_seed(5)) / 2 ** 10
    reference = _collection()
    expand = {name: INVERSE if name in USER_TABLES else torch.arange(BATCH) for name in TABLES}

    out, tables, env, _ = _run(rank, W, registry, [kjt for kjt, _ in batches], upstream)
    bags = batches[rank][1]
    expected = torch.cat([_expected_pooled(reference, name, bags[name])[expand[name]] for name in TABLES], dim=1)
    assert torch.equal(out, expected), f"rank {rank}: VBE output differs by {(out - expected).abs().max()}"

    col = 0
    for name, (_, dim, _) in TABLES.items():
        weight = reference.embedding_bags[name].weight.detach().clone().requires_grad_(True)
        for r, (_, rank_bags) in enumerate(batches):
            grad = upstream[r * BATCH:(r + 1) * BATCH, col:col + dim] / W
            compact = torch.zeros(len(rank_bags[name].lengths()), dim).index_add_(0, expand[name], grad)
            (_pool(weight, rank_bags[name]) * bf16(compact)).sum().backward()
        want = weight.detach() - LR * weight.grad
        assert torch.equal(tables[name], want), f"rank {rank}, {name}: VBE step differs by {(tables[name] - want).abs().max()}"
        col += dim

    _, _, env32, _ = _run(rank, W, None, [kjt for kjt, _ in batches], upstream)
    measured, measured32 = env.gathered_bytes(), env32.gathered_bytes()
    for name in ("output_dist", "output_dist_backward"):
        assert measured32[name].sum() > 0 and (2 * measured[name] == measured32[name]).all(), \
            f"VBE {name}: {measured[name]} is not half of float32's {measured32[name]}"
