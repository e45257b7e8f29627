"""A quantized collection sharded for inference has a state_dict (it had none: saving one lost every table): each
held table's stored rows under the unsharded module's key, loadable from the same layout or from the unsharded
quantized module's state_dict (rectoolkit.quant.sharded_state)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from rectoolkit.quant.sharding import shard_quant_embedding_bag_collection, shard_quant_embedding_collection

ON = rtk.ShardMetadata.on_rank
PLAN = {"t0": rtk.ParameterSharding("table_wise", ranks=[0], shards=[ON(0, 0, 0, 20, 8)]),
        "t1": rtk.ParameterSharding("row_wise", ranks=[0, 0], shards=[ON(0, 0, 0, 12, 8), ON(0, 12, 0, 8, 8)]),
        "t2": rtk.ParameterSharding("column_wise", ranks=[0, 0], shards=[ON(0, 0, 0, 20, 4), ON(0, 0, 4, 20, 4)])}


def _quantized(seed: int, sequence: bool = False):
    torch.manual_seed(seed)
    if sequence:
        tables = [rtk.EmbeddingConfig(name=f"t{i}", num_embeddings=20, embedding_dim=8, feature_names=[f"f{i}"])
                  for i in range(3)]
        return QuantEmbeddingCollection.from_float(rtk.EmbeddingCollection(tables), dtype=torch.int8)
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=20, embedding_dim=8, feature_names=[f"f{i}"])
              for i in range(3)]
    return QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(tables), dtype=torch.int8)


def _shard(quantized, plan=PLAN):
    shard = shard_quant_embedding_collection if isinstance(quantized, QuantEmbeddingCollection) \
        else shard_quant_embedding_bag_collection
    return shard(quantized, plan, ShardingEnv.local())


def _kjt():
    return rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1", "f2"], torch.tensor([1, 5, 19, 3, 7, 2, 0, 13, 11]),
                                                   torch.tensor([2, 1, 1, 2, 2, 1]))


def _outputs(module):
    out = module(_kjt())
    return out.values() if hasattr(out, "values") and callable(out.values) and not isinstance(out, dict) \
        else torch.cat([jt.values() for jt in out.values()])


@pytest.mark.parametrize("sequence", [False, True])
def test_the_state_dict_holds_every_table_and_loads_back_into_another_model(sequence):
    source = _quantized(0, sequence)
    sharded, other = _shard(source), _shard(_quantized(1, sequence))
    prefix = "embeddings." if sequence else "embedding_bags."
    state = sharded.state_dict()
    assert list(state) == [f"{prefix}t{i}.weight" for i in range(3)]
    whole = source.state_dict()
    # the table-wise table: the unsharded module's stored rows themselves; the row-wise one: its blocks as shards
    assert torch.equal(state[f"{prefix}t0.weight"], whole[f"{prefix}t0.weight"])
    blocks = {tuple(s.metadata.shard_offsets): s.tensor for s in state[f"{prefix}t1.weight"].local_shards()}
    assert sorted(blocks) == [(0, 0), (12, 0)]
    assert torch.equal(blocks[(12, 0)], whole[f"{prefix}t1.weight"][12:])
    assert not torch.equal(_outputs(sharded), _outputs(other))
    assert not other.load_state_dict(state).missing_keys
    assert torch.equal(_outputs(sharded), _outputs(other))


@pytest.mark.parametrize("sequence", [False, True])
def test_the_unsharded_modules_state_dict_loads_into_every_kind_of_shard(sequence):
    source = _quantized(0, sequence)
    sharded = _shard(_quantized(1, sequence))
    result = sharded.load_state_dict(source.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(_outputs(sharded), _outputs(source))  # (row blocks pool in another order)


def test_rows_of_another_shape_and_a_shard_of_another_plan_are_named():
    sharded = _shard(_quantized(1))
    before = _outputs(sharded)
    bad = {key: value[:, :-4] if "t2" in key else value for key, value in _quantized(0).state_dict().items()}
    with pytest.raises(RuntimeError, match=r"table 't2': got torch.uint8 rows of shape \[20, 12\]; the table's stored "
                                           r"rows are torch.uint8, 16 bytes each"):
        sharded.load_state_dict(bad)
    assert torch.equal(_outputs(sharded), before)  # t0 and t1 were fine, yet nothing was copied
    other_plan = {**PLAN, "t1": rtk.ParameterSharding("row_wise", ranks=[0, 0],
                                                       shards=[ON(0, 0, 0, 10, 8), ON(0, 10, 0, 10, 8)])}
    saved = _shard(_quantized(0), other_plan).state_dict()
    with pytest.raises(RuntimeError, match=r"table 't1': the saved ShardedTensor has no shard at \(row, byte\) \[12, 0\]"):
        sharded.load_state_dict(saved)
    missing = sharded.load_state_dict({k: v for k, v in saved.items() if "t1" not in k and "t2" not in k},
                                      strict=False).missing_keys
    assert missing == ["embedding_bags.t1.weight", "embedding_bags.t2.weight"]


def test_the_one_process_sharded_model_of_several_ranks_has_the_same_state_dict():
    from rectoolkit.quant.one_process import shard_quant_in_one_process

    plan = {"t0": rtk.ParameterSharding("table_wise", ranks=[1], shards=[ON(1, 0, 0, 20, 8)]),
            "t1": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=[ON(0, 0, 0, 12, 8), ON(1, 12, 0, 8, 8)]),
            "t2": rtk.ParameterSharding("column_wise", ranks=[0, 1], shards=[ON(0, 0, 0, 20, 4), ON(1, 0, 4, 20, 4)])}
    source = _quantized(0)
    sharded = shard_quant_in_one_process(source, plan, world_size=2)
    other = shard_quant_in_one_process(_quantized(1), plan, world_size=2)
    state = sharded.state_dict()
    assert list(state) == [f"embedding_bags.t{i}.weight" for i in range(3)]
    assert torch.equal(state["embedding_bags.t0.weight"], source.state_dict()["embedding_bags.t0.weight"])
    assert [(s.metadata.shard_offsets, s.metadata.placement.rank()) for s in state["embedding_bags.t1.weight"].local_shards()] \
        == [([0, 0], 0), ([12, 0], 1)]
    assert not torch.equal(_outputs(sharded), _outputs(other))
    other.load_state_dict(state)
    assert torch.equal(_outputs(sharded), _outputs(other))
    source = _quantized(2)
    other.load_state_dict(source.state_dict())  # whole rows: every rank's shards take their part
    torch.testing.assert_close(_outputs(other), _outputs(source))
