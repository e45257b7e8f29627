"""TorchRec's quantization preparation (torchrec.quant.embedding_modules): quantize_state_dict gives TorchRec 1.8's
(weight, scale_shift) bytes for every data type, pruned and on meta; the quant_prep marks set TorchRec's attributes
and from_float reads them (row alignment honoured as TorchRec's, split scale / bias refused by name)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.inference.modules import quantize_inference_model
from rectoolkit.modules.configs import DataType
from rectoolkit.quant import embedding_modules as ours

torchrec = pytest.importorskip("torchrec")
from torchrec.modules.embedding_configs import DataType as TheirDataType  # noqa: E402
from torchrec.quant import embedding_modules as theirs  # noqa: E402

pytestmark = pytest.mark.torchrec


def _ebc(lib, device="cpu"):
    torch.manual_seed(0)
    return lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name="a", num_embeddings=9, embedding_dim=8, feature_names=["fa"]),
        lib.EmbeddingBagConfig(name="b", num_embeddings=7, embedding_dim=16, feature_names=["fb"])],
        device=torch.device(device))


@pytest.mark.parametrize("data_type", ["INT8", "INT4", "INT2", "FP16", "FP32"])
@pytest.mark.parametrize("pruned", [None, {"a": 5}])
def test_quantize_state_dict_gives_torchrecs_bytes(data_type, pruned):
    float_ebc = _ebc(rtk)
    mine, reference = {}, {}
    assert ours.quantize_state_dict(float_ebc, mine, {"a": DataType[data_type], "b": DataType[data_type]},
                                    pruned) == torch.device("cpu")
    theirs.quantize_state_dict(float_ebc, reference, {"a": TheirDataType[data_type], "b": TheirDataType[data_type]},
                               pruned)
    assert sorted(mine) == sorted(reference) == ["a", "b"]
    for table, (weight, scale_shift) in mine.items():
        their_weight, their_scale_shift = reference[table]
        assert weight.dtype == their_weight.dtype == torch.uint8
        assert torch.equal(weight, their_weight), table
        assert (scale_shift is None) == (their_scale_shift is None)
        if scale_shift is not None:
            assert torch.equal(scale_shift, their_scale_shift), table
    assert mine["a"][0].shape[0] == (5 if pruned else 9)


def test_quantize_state_dict_of_a_meta_collection_gives_meta_tensors_of_torchrecs_shapes():
    mine, reference = {}, {}
    ours.quantize_state_dict(_ebc(rtk, "meta"), mine, {"a": DataType.INT4, "b": DataType.FP16})
    theirs.quantize_state_dict(_ebc(rtk, "meta"), reference, {"a": TheirDataType.INT4, "b": TheirDataType.FP16})
    for table, (weight, scale_shift) in mine.items():
        assert weight.is_meta and weight.shape == reference[table][0].shape
        assert (scale_shift is None and reference[table][1] is None) or scale_shift.shape == reference[table][1].shape


def test_the_marks_are_torchrecs_and_from_float_reads_them():
    for name in ("MODULE_ATTR_REGISTER_TBES_BOOL", "MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS",
                 "MODULE_ATTR_ROW_ALIGNMENT_INT", "MODULE_ATTR_CACHE_FEATURES_ORDER"):
        assert getattr(ours, name) == getattr(theirs, name), name
    mine, reference = torch.nn.Sequential(_ebc(rtk)), torch.nn.Sequential(_ebc(torchrec))
    reference.load_state_dict(mine.state_dict())
    ours.quant_prep_customize_row_alignment(mine, [rtk.EmbeddingBagCollection], 32)
    theirs.quant_prep_customize_row_alignment(reference, [torchrec.EmbeddingBagCollection], 32)
    ours.quant_prep_enable_register_tbes(mine, [rtk.EmbeddingBagCollection])
    from torchrec.inference.modules import quantize_inference_model as their_quantize

    mine, reference = quantize_inference_model(mine), their_quantize(reference)
    their_state = reference[0].state_dict()
    for key, value in mine[0].state_dict().items():  # rows padded to 32 bytes, as TorchRec's
        assert value.shape == their_state[key].shape and value.shape[1] == 32, key
        assert torch.equal(value, their_state[key]), key
    kjt = dict(keys=["fa", "fb"], values=torch.tensor([1, 2, 3, 6]), lengths=torch.tensor([2, 1, 0, 1]))
    torch.testing.assert_close(mine[0](rtk.KeyedJaggedTensor(**kjt)).values(),
                               reference[0](torchrec.KeyedJaggedTensor(**kjt)).values())


def test_marks_on_every_module_of_a_type_and_the_split_layout_refused_by_name():
    model = torch.nn.Sequential(_ebc(rtk), torch.nn.Linear(2, 2), _ebc(rtk))
    seen = []
    ours.for_each_module_of_type_do(model, [rtk.EmbeddingBagCollection], seen.append)
    assert seen == [model[0], model[2]]
    ours.quant_prep_enable_quant_state_dict_split_scale_bias_for_types(model, [rtk.EmbeddingBagCollection])
    with pytest.raises(NotImplementedError, match="quant_state_dict_split_scale_bias=True is not supported"):
        quantize_inference_model(model)
    with pytest.raises(ValueError, match="row_alignment=0; give a positive int"):
        ours.quant_prep_customize_row_alignment(model, [rtk.EmbeddingBagCollection], 0)
