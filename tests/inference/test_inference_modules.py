"""TorchRec's inference flow (torchrec.inference.modules) in rectoolkit: quantize_inference_model ->
shard_quant_model (one rank, or several held in this process) -> rectoolkit.fx.symbolic_trace, against the
unsharded quantized model and against TorchRec 1.8 on the same weights (where TorchRec runs on CPU)."""

import copy

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.fx import symbolic_trace
from rectoolkit.inference.modules import (
    quantize_dense,
    quantize_embeddings,
    quantize_feature,
    quantize_inference_model,
    shard_quant_model,
    trim_torch_package_prefix_from_typename,
)


def _model(lib):
    """Bags (two tables, one a MEAN pool), sequences (one table) and a dense layer on the pooled bags."""
    torch.manual_seed(0)

    class Ranker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = lib.EmbeddingBagCollection(tables=[
                lib.EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=10, feature_names=["f1"]),
                lib.EmbeddingBagConfig(name="t2", embedding_dim=16, num_embeddings=12, feature_names=["f2"],
                                       pooling=lib.PoolingType.MEAN)], device=torch.device("cpu"))
            self.ec = lib.EmbeddingCollection(tables=[
                lib.EmbeddingConfig(name="s1", embedding_dim=8, num_embeddings=10, feature_names=["g1"])],
                device=torch.device("cpu"))
            self.dense = torch.nn.Linear(24, 4)

        def forward(self, bags: lib.KeyedJaggedTensor, sequences: lib.KeyedJaggedTensor):
            return self.dense(self.ebc(bags).values()), self.ec(sequences)["g1"].values()

    return Ranker()


def _batch(lib, batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    bag_lengths = torch.randint(0, 4, (2 * batch_size,), generator=g)
    bag_ids = torch.cat([torch.randint(0, 10, (int(bag_lengths[:batch_size].sum()),), generator=g),
                         torch.randint(0, 12, (int(bag_lengths[batch_size:].sum()),), generator=g)])
    seq_lengths = torch.randint(0, 4, (batch_size,), generator=g)
    seq_ids = torch.randint(0, 10, (int(seq_lengths.sum()),), generator=g)
    return (lib.KeyedJaggedTensor.from_lengths_sync(["f1", "f2"], bag_ids, bag_lengths),
            lib.KeyedJaggedTensor.from_lengths_sync(["g1"], seq_ids, seq_lengths))


BATCH_SIZES = [1, 3, 6, 1]


@pytest.fixture(scope="module")
def quantized():
    return quantize_inference_model(_model(rtk))


def test_quantize_inference_model_swaps_both_collections_in_place():
    model = _model(rtk)
    out = quantize_inference_model(model, per_table_weight_dtype={"t2": torch.quint4x2})
    assert out is model
    assert type(model.ebc).__name__ == "QuantEmbeddingBagCollection"
    assert type(model.ec).__name__ == "QuantEmbeddingCollection"
    assert [c.data_type.value for c in model.ebc.embedding_bag_configs()] == ["INT8", "INT4"]
    assert [c.data_type.value for c in model.ec.embedding_configs()] == ["INT8"]


@pytest.mark.torchrec
def test_quantized_model_matches_torchrec_on_the_same_weights():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.inference.modules import quantize_inference_model as torchrec_quantize

    ours, theirs = _model(rtk), _model(torchrec)
    theirs.load_state_dict(ours.state_dict())
    ours, theirs = quantize_inference_model(ours), torchrec_quantize(theirs)
    for batch_size in BATCH_SIZES:
        (dense, rows), (dense_t, rows_t) = ours(*_batch(rtk, batch_size, 1)), theirs(*_batch(torchrec, batch_size, 1))
        torch.testing.assert_close(dense, dense_t)
        assert torch.equal(rows, rows_t)


@pytest.mark.parametrize("world_size", [1, 2])
def test_sharded_and_traced_model_equals_the_quantized_one(quantized, world_size):
    sharded, plan = shard_quant_model(copy.deepcopy(quantized), world_size=world_size, compute_device="cpu",
                                      sharding_device="cpu")
    assert set(plan.plan) == {"ebc", "ec"}
    assert {ps.sharding_type for ps in plan.get_plan_for_module("ebc").values()} == {"table_wise"}  # the default
    assert {r for ps in plan.get_plan_for_module("ebc").values() for r in ps.ranks} == set(range(world_size))
    assert type(sharded.ebc).__name__ == ("ShardedQuantEmbeddingBagCollection" if world_size == 1 else
                                          "OneProcessShardedQuantEmbeddingBagCollection")
    traced = symbolic_trace(sharded)
    assert {n.target for n in traced.graph.nodes if n.op == "call_module"} >= (
        {"ebc._run_groups", "ec._run_groups"} if world_size == 1 else {"ebc", "ec"})
    for i, batch_size in enumerate(BATCH_SIZES):
        expected = quantized(*_batch(rtk, batch_size, i))
        for model in (sharded, traced):
            dense, rows = model(*_batch(rtk, batch_size, i))
            assert torch.equal(dense, expected[0]) and torch.equal(rows, expected[1]), (batch_size, model)


@pytest.mark.torchrec
def test_two_rank_plan_is_torchrecs(quantized):
    """TorchRec plans a quantized model on CPU (it cannot shard one there except onto meta): the bag tables get the
    same types and rank counts (the sequence table is left to each planner's cost model, which differ)."""
    torchrec = pytest.importorskip("torchrec")
    from torchrec.inference.modules import quantize_inference_model as torchrec_quantize
    from torchrec.inference.modules import shard_quant_model as torchrec_shard

    _, theirs = torchrec_shard(torchrec_quantize(_model(torchrec)), world_size=2, compute_device="cpu",
                               sharding_device="meta")
    _, ours = shard_quant_model(copy.deepcopy(quantized), world_size=2, compute_device="cpu", sharding_device="cpu")
    for module in ("ebc",):
        assert {t: ps.sharding_type for t, ps in ours.get_plan_for_module(module).items()} == \
            {t: ps.sharding_type for t, ps in theirs.plan[module].items()}, module
        assert {t: len(ps.ranks) for t, ps in ours.get_plan_for_module(module).items()} == \
            {t: len(ps.ranks) for t, ps in theirs.plan[module].items()}, module


def test_a_given_sharding_plan_is_used(quantized):
    on = rtk.ShardMetadata.on_rank
    plan = rtk.ShardingPlan({"ebc": {
        "t1": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=[on(0, 0, 0, 5, 8), on(1, 5, 0, 5, 8)],
                                    compute_kernel="quant"),
        "t2": rtk.ParameterSharding("column_wise", ranks=[1, 0], shards=[on(1, 0, 0, 12, 8), on(0, 0, 8, 12, 8)],
                                    compute_kernel="quant")}})
    sharded, returned = shard_quant_model(copy.deepcopy(quantized), world_size=2, compute_device="cpu",
                                          sharding_device="cpu", sharding_plan=plan)
    assert returned is plan and type(sharded.ec).__name__ == "QuantEmbeddingCollection"  # not in the plan: kept
    batch = _batch(rtk, 5, 7)
    torch.testing.assert_close(sharded(*batch)[0], quantized(*batch)[0])  # row-wise: float sums in another order


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's refusal")
def test_cuda_compute_device_without_a_gpu_is_refused(quantized):
    with pytest.raises(ValueError, match=r"compute_device='cuda'.*compute_device='cpu'"):
        shard_quant_model(copy.deepcopy(quantized), sharding_device="cpu")


def test_meta_sharding_device_is_refused(quantized):
    with pytest.raises(ValueError, match=r"sharding_device='meta'.*sharding_device='cpu'"):
        shard_quant_model(copy.deepcopy(quantized), compute_device="cpu")


def test_sharders_beyond_the_quantized_collections_are_refused_for_several_ranks(quantized):
    from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder

    with pytest.raises(NotImplementedError, match="EmbeddingBagCollectionSharder"):
        shard_quant_model(copy.deepcopy(quantized), world_size=2, compute_device="cpu", sharding_device="cpu",
                          sharders=[EmbeddingBagCollectionSharder()])


def test_quantization_mapping_entries_that_cannot_be_honoured_are_refused():
    key = torch.typename(rtk.EmbeddingBagCollection)
    with pytest.raises(TypeError, match=rf"quantization_mapping\['{key}'\] = .*Linear.*from_float"):
        quantize_inference_model(_model(rtk), quantization_mapping={key: torch.nn.Linear})
    with pytest.raises(ValueError, match=r"per_table_weight_dtype names tables \['nope'\]"):
        quantize_inference_model(_model(rtk), per_table_weight_dtype={"nope": torch.int8})


def test_torchrec_spelled_mapping_keys_and_feature_processed_collections():
    from rectoolkit.modules.feature_processor_ import PositionWeightedModule
    from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
    from rectoolkit.quant import QuantEmbeddingBagCollection

    model = quantize_inference_model(_model(rtk), quantization_mapping={
        "torchrec.modules.embedding_modules.EmbeddingBagCollection": QuantEmbeddingBagCollection})
    assert type(model.ebc).__name__ == "QuantEmbeddingBagCollection"
    assert type(model.ec).__name__ == "EmbeddingCollection"  # not in this mapping, as in TorchRec
    holder = torch.nn.Module()
    holder.fp = FeatureProcessedEmbeddingBagCollection(rtk.EmbeddingBagCollection(
        tables=[rtk.EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5, feature_names=["f"])],
        is_weighted=True), {"f": PositionWeightedModule(max_feature_length=4)})
    quantized = quantize_inference_model(holder)  # (rectoolkit's quantized form: tests/quant/test_quant_feature_processed.py)
    assert type(quantized.fp).__name__ == "QuantFeatureProcessedEmbeddingBagCollection"


# ------------------------------------------------------------------------------------------------ helpers
def test_quantize_embeddings_swaps_bags_only_unless_told_as_torchrec():
    model = quantize_embeddings(_model(rtk), torch.int8, inplace=False)
    assert type(model.ebc).__name__ == "QuantEmbeddingBagCollection" and type(model.ec).__name__ == "EmbeddingCollection"


def test_quantize_dense_and_quantize_feature():
    class Predict:
        def __init__(self, module):
            self.predict_module = module

    model = _model(rtk)
    quantize_dense(Predict(model), torch.half)
    assert model.dense.weight.dtype == torch.float16 and model.ebc.embedding_bags["t1"].weight.dtype == torch.float32
    assert model.dense(torch.ones(2, 24)).dtype == torch.float16  # the pre-hook casts the float input
    with pytest.raises(NotImplementedError, match="only torch.half"):
        quantize_dense(Predict(_model(rtk)), torch.int8)
    assert quantize_feature(None, (torch.ones(1, dtype=torch.float64), 3))[0].dtype == torch.float16
    assert trim_torch_package_prefix_from_typename("<torch_package_3>.a.B") == "a.B"
    assert trim_torch_package_prefix_from_typename("a.B") == "a.B"


# ------------------------------------------------------------------------------------------------ TorchScript
@pytest.mark.xfail(strict=True, raises=(RuntimeError, ValueError, torch.jit.frontend.NotSupportedError),
                   reason="rectoolkit's KeyedJaggedTensor is not a TorchScript class (TorchRec's is), so a scripted "
                          "forward cannot take one, and the unsharded collections' kernels do not script")
@pytest.mark.parametrize("what", ["float", "quantized", "sharded over 2"])
def test_jit_script_of_the_traced_model(quantized, what):
    """TorchRec 1.8 scripts all three on CPU (the sharded one only on meta tensors: it cannot shard onto CPU)."""
    model = {"float": lambda: _model(rtk), "quantized": lambda: quantized,
             "sharded over 2": lambda: shard_quant_model(copy.deepcopy(quantized), world_size=2, compute_device="cpu",
                                                         sharding_device="cpu")[0]}[what]()
    scripted = torch.jit.script(symbolic_trace(model))
    batch = _batch(rtk, 3, 0)
    dense, rows = scripted(*batch)
    assert torch.equal(dense, model(*batch)[0]) and torch.equal(rows, model(*batch)[1])


@pytest.mark.torchrec
def test_our_traced_quantized_model_equals_torchrecs_scripted_one():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.fx import symbolic_trace as torchrec_trace
    from torchrec.inference.modules import quantize_inference_model as torchrec_quantize

    ours, theirs = _model(rtk), _model(torchrec)
    theirs.load_state_dict(ours.state_dict())
    traced = symbolic_trace(quantize_inference_model(ours))
    scripted = torch.jit.script(torchrec_trace(torchrec_quantize(theirs)))
    for batch_size in BATCH_SIZES:
        (dense, rows), (dense_t, rows_t) = traced(*_batch(rtk, batch_size, 2)), scripted(*_batch(torchrec, batch_size, 2))
        torch.testing.assert_close(dense, dense_t)
        assert torch.equal(rows, rows_t)


# ------------------------------------------------------------------------------------------------ serving interfaces
def _ranker_predict_module(lib, base):
    class RankerPredictModule(base):
        """The server's dict of tensors -> the Ranker's KJTs -> its outputs, as a TorchRec user writes it."""

        def predict_forward(self, batch):
            bags = lib.KeyedJaggedTensor.from_lengths_sync(["f1", "f2"], batch["bag_ids"], batch["bag_lengths"])
            sequences = lib.KeyedJaggedTensor.from_lengths_sync(["g1"], batch["seq_ids"], batch["seq_lengths"])
            dense, rows = self.predict_module(bags, sequences)
            return {"dense": dense, "rows": rows}

    return RankerPredictModule


def _serving_batch(batch_size):
    bags, sequences = _batch(rtk, batch_size, 5)
    return {"bag_ids": bags.values(), "bag_lengths": bags.lengths(), "seq_ids": sequences.values(),
            "seq_lengths": sequences.lengths()}


@pytest.mark.torchrec
def test_a_predict_module_written_for_torchrec_serves_the_same_results():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.inference import modules as theirs_modules
    from torchrec.inference.modules import quantize_inference_model as torchrec_quantize

    from rectoolkit.inference import modules as our_modules

    ours, theirs = _model(rtk), _model(torchrec)
    theirs.load_state_dict(ours.state_dict())
    ours = _ranker_predict_module(rtk, our_modules.PredictModule)(quantize_inference_model(ours), device="cpu")
    theirs = _ranker_predict_module(torchrec, theirs_modules.PredictModule)(torchrec_quantize(theirs), device="cpu")
    assert not ours.predict_module.training and not theirs.predict_module.training
    assert list(ours.state_dict()) == list(ours.predict_module.state_dict())  # no "_module." prefix, as TorchRec's
    assert list(theirs.state_dict()) == list(theirs.predict_module.state_dict())
    for batch_size in BATCH_SIZES:
        got, expected = ours(_serving_batch(batch_size)), theirs(_serving_batch(batch_size))
        torch.testing.assert_close(got["dense"], expected["dense"])
        assert torch.equal(got["rows"], expected["rows"]) and not got["dense"].requires_grad
    assert quantize_dense(ours, torch.half) is ours and ours.predict_module.dense.weight.dtype == torch.float16
    lazy = _ranker_predict_module(rtk, our_modules.PredictModule)(quantize_inference_model(_model(rtk)))
    lazy(_serving_batch(2))  # device=None: the current CUDA device, or the CPU on a machine without CUDA
    assert lazy._device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(TypeError, match="wraps an nn.Module.*got a dict"):
        our_modules.PredictModule({})


@pytest.mark.torchrec
def test_a_predict_factory_written_for_torchrec_describes_itself_as_torchrecs():
    pytest.importorskip("torchrec")
    from torchrec.inference import modules as theirs_modules

    from rectoolkit.inference import modules as our_modules

    def factory(lib_modules):
        class RankerFactory(lib_modules.PredictFactory):
            def create_predict_module(self):
                return _model(rtk)

            def batching_metadata(self):
                return {"bag_ids": lib_modules.BatchingMetadata(type="sparse", device="cpu", pinned=["lengths"]),
                        "dense": lib_modules.BatchingMetadata(type="dense", device="cuda", pinned=[""])}

            def result_metadata(self):
                return "dict_of_tensor"

            def run_weights_independent_tranformations(self, predict_module):
                return predict_module

            def run_weights_dependent_transformations(self, predict_module):
                return predict_module

            def qualname_metadata(self):
                return {"forward": lib_modules.QualNameMetadata(need_preproc=True)}

        return RankerFactory()

    ours, theirs = factory(our_modules), factory(theirs_modules)
    assert ours.batching_metadata_json() == theirs.batching_metadata_json()
    assert ours.qualname_metadata_json() == theirs.qualname_metadata_json() == '{"forward": {"need_preproc": true}}'
    assert ours.model_inputs_data() == theirs.model_inputs_data() == {}
    with pytest.raises(TypeError, match="abstract"):
        our_modules.PredictFactory()
