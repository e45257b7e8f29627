"""Position-weighted feature processors and FeatureProcessedEmbeddingBagCollection: a hand loop, clear errors,
and TorchRec 1.8 with the same weights (outputs and state_dict keys equal)."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

KEYS = ["hist", "user"]
MAX_LENGTHS = {"hist": 4, "user": 3}


def _tables(lib):
    return [lib.EmbeddingBagConfig(name="t_hist", num_embeddings=10, embedding_dim=3, feature_names=["hist"]),
            lib.EmbeddingBagConfig(name="t_user", num_embeddings=6, embedding_dim=2, feature_names=["user"])]


def _inputs():
    lengths = torch.tensor([3, 0, 4, 1, 2, 3])  # batch 3: hist [3, 0, 4], user [1, 2, 3]
    values = torch.tensor([7, 3, 9, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4])
    return dict(keys=KEYS, values=values, lengths=lengths)


def _random_position_weights(module):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)


@pytest.mark.parametrize("name", ["rectoolkit.modules.feature_processor_", "rectoolkit.modules.fp_embedding_modules"])
def test_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


@pytest.mark.parametrize("form", ["collection", "dict"])
def test_pooled_is_the_position_weighted_sum_by_a_hand_loop(form):
    ebc = rtk.EmbeddingBagCollection(_tables(rtk), is_weighted=True)
    processors = (PositionWeightedModuleCollection(MAX_LENGTHS) if form == "collection"
                  else {key: PositionWeightedModule(length) for key, length in MAX_LENGTHS.items()})
    fp_ebc = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    _random_position_weights(fp_ebc._feature_processors)
    pooled = fp_ebc(rtk.KeyedJaggedTensor(**_inputs())).to_dict()
    state = fp_ebc.state_dict()
    inputs, start = _inputs(), 0
    for index, length in enumerate(inputs["lengths"].tolist()):
        key, sample = KEYS[index // 3], index % 3
        table = state[f"_embedding_bag_collection.embedding_bags.t_{key}.weight"]
        position_weight = (state[f"_feature_processors.position_weights.{key}"] if form == "collection"
                           else state[f"_feature_processors.{key}.position_weight"])
        expected = sum((position_weight[j] * table[inputs["values"][start + j]] for j in range(length)),
                       torch.zeros(table.shape[1]))
        torch.testing.assert_close(pooled[key][sample], expected)
        start += length


def test_features_without_position_weights_get_weight_one():
    kjt = rtk.KeyedJaggedTensor(**_inputs())
    weights = PositionWeightedModuleCollection({"hist": 4})(kjt).weights()
    torch.testing.assert_close(weights[7:], torch.ones(6))


def test_bad_input_names_the_feature_and_numbers():
    kjt = rtk.KeyedJaggedTensor(**_inputs())
    with pytest.raises(ValueError, match="feature 'hist' has a bag of 4 ids but its max_feature_length is 3"):
        PositionWeightedModuleCollection({"hist": 3, "user": 3})(kjt)
    with pytest.raises(ValueError, match=r"max_feature_lengths \{'user': 0\} must be positive"):
        PositionWeightedModuleCollection({"hist": 3, "user": 0})
    with pytest.raises(ValueError, match="is not weighted; build it with is_weighted=True"):
        FeatureProcessedEmbeddingBagCollection(rtk.EmbeddingBagCollection(_tables(rtk)),
                                               PositionWeightedModuleCollection(MAX_LENGTHS))
    with pytest.raises(ValueError, match=r"missing \['user'\], not a feature \['item'\]"):
        FeatureProcessedEmbeddingBagCollection(rtk.EmbeddingBagCollection(_tables(rtk), is_weighted=True),
                                               {"hist": PositionWeightedModule(4), "item": PositionWeightedModule(4)})


def _build(lib, form):
    fp_module = importlib.import_module(f"{lib.__name__}.modules.feature_processor_")
    fp_ebc_module = importlib.import_module(f"{lib.__name__}.modules.fp_embedding_modules")
    processors = (fp_module.PositionWeightedModuleCollection(MAX_LENGTHS) if form == "collection"
                  else {key: fp_module.PositionWeightedModule(length) for key, length in MAX_LENGTHS.items()})
    ebc = lib.EmbeddingBagCollection(tables=_tables(lib), is_weighted=True)
    return fp_ebc_module.FeatureProcessedEmbeddingBagCollection(ebc, processors)


def _ours_and_torchrecs(form):
    """Our FeatureProcessedEmbeddingBagCollection and TorchRec's with the same (random) weights, and torchrec."""
    torchrec = pytest.importorskip("torchrec")
    ours, theirs = _build(rtk, form), _build(torchrec, form)
    _random_position_weights(ours._feature_processors)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs, torchrec


@pytest.mark.torchrec
@pytest.mark.parametrize("form", ["collection", "dict"])
def test_same_keys_and_outputs_as_torchrec(form):
    ours, theirs, torchrec = _ours_and_torchrecs(form)
    a, b = ours(rtk.KeyedJaggedTensor(**_inputs())), theirs(torchrec.KeyedJaggedTensor(**_inputs()))
    assert a.keys() == b.keys()
    torch.testing.assert_close(a.values(), b.values())


@pytest.mark.torchrec
def test_position_weights_learn_the_same_gradient_as_torchrec():
    torchrec = pytest.importorskip("torchrec")
    ours, theirs = _build(rtk, "collection"), _build(torchrec, "collection")
    theirs.load_state_dict(ours.state_dict())
    ours(rtk.KeyedJaggedTensor(**_inputs())).values().pow(2).sum().backward()
    theirs(torchrec.KeyedJaggedTensor(**_inputs())).values().pow(2).sum().backward()
    for key in KEYS:
        gradient = ours._feature_processors.position_weights[key].grad
        assert gradient is not None and gradient.abs().sum() > 0
        torch.testing.assert_close(gradient, theirs._feature_processors.position_weights[key].grad)


def _vbe_inputs():
    """hist has 2 samples, user 3; the batch of 4 reads them through inverse indices."""
    return dict(keys=KEYS, values=torch.tensor([7, 3, 9, 1, 2, 1, 3, 4, 5]), lengths=torch.tensor([3, 2, 1, 0, 3]),
                stride_per_key_per_rank=[[2], [3]], inverse_indices=(KEYS, torch.tensor([[1, 0, 0, 1], [2, 2, 0, 1]])))


def _expanded(lib, vbe):
    """The VBE batch written out as a fixed batch of 4 (sample b of key k is the key's sample inverse[k][b])."""
    lengths_per_key = torch.split(vbe["lengths"], [2, 3])
    values_per_key = torch.split(vbe["values"], [int(lengths.sum()) for lengths in lengths_per_key])
    values, lengths = [], []
    for key_lengths, key_values, rows in zip(lengths_per_key, values_per_key, vbe["inverse_indices"][1].tolist()):
        bags = torch.split(key_values, key_lengths.tolist())
        values += [bags[row] for row in rows]
        lengths += [len(bags[row]) for row in rows]
    return lib.KeyedJaggedTensor(keys=KEYS, values=torch.cat(values), lengths=torch.tensor(lengths))


@pytest.mark.torchrec
@pytest.mark.parametrize("form", ["collection", "dict"])
def test_variable_batch_with_inverse_indices_equals_torchrec_on_the_expanded_batch(form):
    # TorchRec 1.8 itself drops the inverse indices here (PositionWeightedModuleCollection) or reads the VBE
    # lengths as a fixed batch (the dict form): its answer on the written-out batch is the reference
    ours, theirs, torchrec = _ours_and_torchrecs(form)
    got = ours(rtk.KeyedJaggedTensor(**_vbe_inputs()))
    expected = theirs(_expanded(torchrec, _vbe_inputs()))
    assert got.keys() == expected.keys() and got.values().shape == (4, 5)
    torch.testing.assert_close(got.values(), expected.values())


@pytest.mark.torchrec
def test_pre_process_input_writes_positions_and_forward_reads_them_as_torchrec():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.modules import feature_processor_ as theirs_module

    ours, theirs = PositionWeightedModuleCollection(MAX_LENGTHS), theirs_module.PositionWeightedModuleCollection(
        MAX_LENGTHS)
    _random_position_weights(ours)
    theirs.load_state_dict(ours.state_dict())
    our_kjt = rtk.KeyedJaggedTensor(**_inputs(), weights=torch.zeros(13))
    their_kjt = torchrec.KeyedJaggedTensor(**_inputs(), weights=torch.zeros(13))
    ours.pre_process_input(our_kjt)
    theirs.pre_process_input(their_kjt)
    assert our_kjt.weights().tolist() == their_kjt.weights().tolist()
    torch.testing.assert_close(ours(our_kjt).weights(), theirs(their_kjt).weights())
    assert sorted(ours.position_weights_dict) == sorted(theirs.position_weights_dict) == KEYS
    one, one_theirs = PositionWeightedModule(4), theirs_module.PositionWeightedModule(4)
    _random_position_weights(one)
    one_theirs.load_state_dict(one.state_dict())
    jagged = rtk.JaggedTensor(values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]), weights=torch.zeros(3))
    jagged_theirs = torchrec.JaggedTensor(values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]),
                                          weights=torch.zeros(3))
    one.pre_process_input(jagged)
    one_theirs.pre_process_input(jagged_theirs)
    torch.testing.assert_close(one(jagged).weights(), one_theirs(jagged_theirs).weights())
    with pytest.raises(ValueError, match="has no weights to write the positions into"):
        ours.pre_process_input(rtk.KeyedJaggedTensor(**_inputs()))


@pytest.mark.torchrec
def test_torch_fx_traces_the_collection_form_as_torchrecs():
    import torch.fx

    ours, theirs, torchrec = _ours_and_torchrecs("collection")
    got = torch.fx.symbolic_trace(ours)(rtk.KeyedJaggedTensor(**_inputs()))
    expected = torch.fx.symbolic_trace(theirs)(torchrec.KeyedJaggedTensor(**_inputs()))
    assert got.keys() == expected.keys()
    torch.testing.assert_close(got.values(), expected.values())


@pytest.mark.torchrec
def test_keys_keep_the_given_order_and_only_weighted_features_are_bound_by_a_max_length_as_torchrec():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.modules import feature_processor_ as theirs_module

    lengths = {"user": 3, "hist": 2}  # not sorted: TorchRec keeps this order
    ours, theirs = PositionWeightedModuleCollection(lengths), theirs_module.PositionWeightedModuleCollection(lengths)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["position_weights.user", "position_weights.hist"]
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    assert list(ours.position_weights_dict) == list(theirs.position_weights_dict) == ["user", "hist"]
    _random_position_weights(ours)
    theirs.load_state_dict(ours.state_dict())
    # "other" has no position weights: its bag of 5 ids is no bag too long (weight 1 for each id, as TorchRec's)
    inputs = dict(keys=["hist", "other"], values=torch.arange(8), lengths=torch.tensor([2, 1, 5, 0]))
    our_kjt = rtk.KeyedJaggedTensor(**inputs, weights=torch.zeros(8))
    their_kjt = torchrec.KeyedJaggedTensor(**inputs, weights=torch.zeros(8))
    ours.pre_process_input(our_kjt)
    theirs.pre_process_input(their_kjt)
    assert our_kjt.weights().tolist() == their_kjt.weights().tolist() == [0, 1, 0, 0, 1, 2, 3, 4]
    torch.testing.assert_close(ours(our_kjt).weights(), theirs(their_kjt).weights())
    assert ours(our_kjt).weights()[3:].tolist() == [1.0] * 5
    too_long = rtk.KeyedJaggedTensor(keys=["hist"], values=torch.arange(3), lengths=torch.tensor([3]),
                                     weights=torch.zeros(3))
    with pytest.raises(ValueError, match="feature 'hist' has a bag of 3 ids but its max_feature_length is 2"):
        ours.pre_process_input(too_long)
