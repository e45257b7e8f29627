"""The float collections off the usual path, against TorchRec 1.8: converted to other dtypes (.double(),
.bfloat16(), ...), built with tables=[], and fed what their lookups cannot take (the error TorchRec's raises is
the error raised here, with the feature and table named)."""

import importlib

import pytest
import torch

import rectoolkit as rtk

torchrec = pytest.importorskip("torchrec")

pytestmark = pytest.mark.torchrec


def _ebc(lib, weighted=False):
    torch.manual_seed(0)
    return lib.EmbeddingBagCollection(is_weighted=weighted, tables=[
        lib.EmbeddingBagConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a"]),
        lib.EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=10, feature_names=["b"],
                               pooling=lib.PoolingType.SUM if weighted else lib.PoolingType.MEAN)])


def _ec(lib, weighted=False):
    torch.manual_seed(0)
    return lib.EmbeddingCollection(tables=[
        lib.EmbeddingConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a", "b"])])


def _kjt(lib, values=(1, 2, 3, 4), weighted=False, keys=("a", "b"), lengths=(1, 1, 2, 0), weights_dtype=None):
    weights = {"weights": torch.tensor([0.5, 2.0, 1.5, 0.25], dtype=weights_dtype)} if weighted else {}
    return lib.KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values), lengths=torch.tensor(lengths), **weights)


def _outputs(output):
    if isinstance(output, dict):
        return [output[key].values() for key in sorted(output)]
    return [output.values()]


CONVERSIONS = {
    "double": lambda m: m.double(),
    "bfloat16": lambda m: m.bfloat16(),
    "half": lambda m: m.half(),
    "to(float64)": lambda m: m.to(torch.float64),
    "double, then float": lambda m: m.double().float(),
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("build", [_ebc, _ec], ids=["EmbeddingBagCollection", "EmbeddingCollection"])
@pytest.mark.parametrize("conversion", list(CONVERSIONS))
def test_a_converted_collection_keeps_its_tables_in_that_dtype_and_matches_torchrec(conversion, build, weighted):
    if weighted and build is _ec:
        pytest.skip("a sequence collection takes no weights")
    results = []
    for lib in (rtk, torchrec):
        module = CONVERSIONS[conversion](build(lib, weighted))
        # TorchRec's nn.EmbeddingBag needs per-id weights in the tables' dtype; rectoolkit takes float32 ones too
        weights_dtype = next(module.parameters()).dtype if lib is torchrec else None
        outputs = _outputs(module(_kjt(lib, weighted=weighted, weights_dtype=weights_dtype)))
        sum(o.sum() for o in outputs).backward()
        results.append(({k: v.dtype for k, v in module.state_dict().items()}, outputs,
                        [p.grad for p in module.parameters()]))
    (mine_dtypes, mine_outputs, mine_grads), (their_dtypes, their_outputs, their_grads) = results
    assert mine_dtypes == their_dtypes
    for mine, theirs in zip(mine_outputs + mine_grads, their_outputs + their_grads):
        assert mine.dtype == theirs.dtype  # outputs float32 (TorchRec's .float()), gradients in the tables' dtype
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_a_converted_collection_trains_with_a_fused_optimizer_in_that_dtype():
    module = rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5)],
                                        optimizer="sgd", lr=0.5).double()
    before = module.embedding_bags.t.weight.detach().clone()
    module(rtk.KeyedJaggedTensor(keys=["t"], values=torch.tensor([1, 1]), lengths=torch.tensor([2]))).values().sum().backward()
    after = module.embedding_bags.t.weight.detach()
    assert after.dtype == torch.float64
    expected = before.clone()
    expected[1] -= 0.5 * 2  # two ids of row 1 in one bag, gradient 1 each
    torch.testing.assert_close(after, expected, rtol=0, atol=0)


def test_a_collection_refuses_a_dtype_torch_cannot_look_up_by_name():
    module = _ebc(rtk)
    with pytest.raises(TypeError, match=r"not torch.float8_e4m3fn.*tables with .float\(\)"):
        module.to(torch.float8_e4m3fn)(_kjt(rtk))


@pytest.mark.parametrize("lib", [rtk, torchrec], ids=["rectoolkit", "torchrec"])
def test_collections_with_no_tables_build_as_torchrecs(lib):
    ebc = lib.EmbeddingBagCollection(tables=[], is_weighted=True)
    assert (ebc.embedding_bag_configs(), list(ebc.state_dict()), list(ebc.parameters()), ebc.is_weighted()) == ([], [], [], True)
    assert str(ebc) == "EmbeddingBagCollection(\n  (embedding_bags): ModuleDict()\n)"
    assert lib.EmbeddingBagCollection(tables=[], device=torch.device("meta")).device.type == "meta"
    ec = lib.EmbeddingCollection(tables=[], need_indices=True)
    assert (ec.embedding_configs(), list(ec.state_dict()), ec.embedding_dim(), ec.need_indices()) == ([], [], -1, True)
    assert ec(_kjt(lib)) == {} and ec(lib.KeyedJaggedTensor.empty()) == {}
    with pytest.raises(ValueError):  # TorchRec's: torch.cat of no pooled outputs
        ebc(_kjt(lib))


def test_a_bag_collection_with_no_tables_says_why_it_cannot_pool_and_refuses_an_optimizer():
    with pytest.raises(ValueError, match=r"tables=\[\]\) has no tables.*at least one EmbeddingBagConfig"):
        rtk.EmbeddingBagCollection(tables=[])(_kjt(rtk))
    with pytest.raises(ValueError, match=r"no tables to fuse the optimizer 'adagrad' into"):
        rtk.EmbeddingBagCollection(tables=[], optimizer="adagrad")


@pytest.mark.parametrize("build", [_ebc, _ec], ids=["EmbeddingBagCollection", "EmbeddingCollection"])
@pytest.mark.parametrize("case, kjt_arguments, message", [
    ("missing feature", {"keys": ("a",), "lengths": (1, 1), "values": (1, 2)}, r"no feature\(s\) \['b'\]"),
    ("float ids", {"values": (1.0, 2.0, 3.0, 4.0)}, r"torch.float32; ids must be integers"),
    ("id past the table", {"values": (1, 2, 30, 4)}, r"id 30 of feature 'b' \(sample 0\) is out of range for table"),
    ("negative id", {"values": (1, 2, -3, 4)}, r"id -3 of feature 'b'"),
])
def test_bad_input_raises_torchrecs_error_type_with_the_feature_named(build, case, kjt_arguments, message):
    with pytest.raises(Exception) as theirs:
        build(torchrec)(_kjt(torchrec, **kjt_arguments))
    with pytest.raises(type(theirs.value), match=message) as mine:
        build(rtk)(_kjt(rtk, **kjt_arguments))
    assert isinstance(mine.value, ValueError)  # and rectoolkit's own type for it


def _mixed(lib, kind, weighted=False):
    data_type = importlib.import_module(f"{lib.__name__}.modules.embedding_configs").DataType
    torch.manual_seed(0)
    if kind == "EmbeddingBagCollection":
        return lib.EmbeddingBagCollection(is_weighted=weighted, tables=[
            lib.EmbeddingBagConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a"]),
            lib.EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=10, feature_names=["b", "a"],
                                   data_type=data_type.FP16),
            lib.EmbeddingBagConfig(name="t2", embedding_dim=4, num_embeddings=10, feature_names=["c"],
                                   pooling=lib.PoolingType.SUM if weighted else lib.PoolingType.MEAN)])
    return lib.EmbeddingCollection(need_indices=True, tables=[
        lib.EmbeddingConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a"], data_type=data_type.FP16),
        lib.EmbeddingConfig(name="t1", embedding_dim=2, num_embeddings=10, feature_names=["b", "a"]),
        lib.EmbeddingConfig(name="t2", embedding_dim=2, num_embeddings=10, feature_names=["c"], data_type=data_type.FP16)])


@pytest.mark.parametrize("kind, weighted", [("EmbeddingBagCollection", False), ("EmbeddingBagCollection", True),
                                            ("EmbeddingCollection", False)])
@pytest.mark.parametrize("conversion", [None, "half", "float"])
def test_tables_of_fp32_and_fp16_in_one_collection_keep_their_types_as_torchrecs(kind, weighted, conversion):
    results = []
    for lib in (rtk, torchrec):
        module = _mixed(lib, kind, weighted)
        if conversion is not None:
            module = getattr(module, conversion)()
        # TorchRec's fp16 bags take per-id weights in float16; rectoolkit takes them in float32 too
        weights = {"weights": torch.tensor([0.5, 2.0, 1.5, 0.25, 1.0, 0.75],
                                           dtype=torch.float16 if lib is torchrec and conversion == "half" else None)}
        kjt = lib.KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
                                    lengths=torch.tensor([1, 1, 2, 0, 1, 1]), **(weights if weighted else {}))
        if weighted and conversion is None and lib is torchrec:  # its fp16 table needs fp16 weights: not comparable
            pytest.skip("TorchRec's weighted bag of an FP16 table fails on float32 per-id weights")
        output = module(kjt)
        keys = list(output) if isinstance(output, dict) else output.keys()
        outputs = _outputs(output)
        sum(o.sum() for o in outputs).backward()
        indices = [output[k].weights() for k in sorted(output)] if isinstance(output, dict) else []
        results.append(({k: v.dtype for k, v in module.state_dict().items()}, keys, outputs + indices,
                        [p.grad for p in module.parameters()]))
    (mine_dtypes, mine_keys, mine_outputs, mine_grads), (their_dtypes, their_keys, their_outputs, their_grads) = results
    assert mine_dtypes == their_dtypes and mine_keys == their_keys
    for mine, theirs in zip(mine_outputs + mine_grads, their_outputs + their_grads):
        assert mine.dtype == theirs.dtype
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_a_collection_of_mixed_types_refuses_a_fused_optimizer_naming_the_types():
    data_type = importlib.import_module("rectoolkit.modules.embedding_configs").DataType
    tables = [rtk.EmbeddingBagConfig(name="t0", embedding_dim=2, num_embeddings=10),
              rtk.EmbeddingBagConfig(name="t1", embedding_dim=2, num_embeddings=10, data_type=data_type.FP16)]
    with pytest.raises(NotImplementedError, match=r"\{'t0': 'FP32', 't1': 'FP16'\}; give them one data_type"):
        rtk.EmbeddingBagCollection(tables=tables, optimizer="sgd", lr=0.1)
    mixed = rtk.EmbeddingBagCollection(tables=tables)
    with pytest.raises(NotImplementedError, match="fuse_optimizer needs the tables in one data type"):
        mixed.fuse_optimizer("sgd", lr=0.1)
    assert mixed.kernel.optimizer is None and mixed.fused_optimizer is None  # what the sharders read


@pytest.mark.parametrize("lib", [rtk, torchrec], ids=["rectoolkit", "torchrec"])
def test_a_weighted_collection_fed_no_weights_raises_an_assertion_error_as_torchrecs(lib):
    with pytest.raises(AssertionError):
        _ebc(lib, weighted=True)(_kjt(lib))


@pytest.mark.parametrize("lib", [rtk, torchrec], ids=["rectoolkit", "torchrec"])
def test_an_unknown_key_is_a_key_error_whose_message_is_not_quoted(lib):
    with pytest.raises(KeyError) as error:
        _kjt(lib)["z"]
    assert "z" in str(error.value)
    if lib is rtk:
        assert str(error.value) == "KeyedJaggedTensor: unknown key 'z'; the keys are ['a', 'b']"
