"""Quantized communication (TorchRec's torchrec.distributed.fbgemm_qcomm_codec): the registry's objects and refusals,
the codec's rounding against fbgemm's, the traffic model's bytes, and 2 gloo ranks against the unsharded
collection rounded by hand (dist_qcomm_workers.py)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from rectoolkit.distributed.comm import ShardingEnv, all_to_all_with_grad
from rectoolkit.distributed.fbgemm_qcomm_codec import (CommOp, CommType, QCommsConfig, QuantizedCommCodec,
                                                       get_qcomm_codecs_registry)
from rectoolkit.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from rectoolkit.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
from rectoolkit.plan.traffic import step_traffic
from dist_harness import row_wise, run_workers, table_wise
from dist_qcomm_workers import qcomm_dmp_worker, qcomm_vbe_worker, qcomm_worker

FP16_BF16 = QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)


def _torchrec():
    return pytest.importorskip("torchrec.distributed.fbgemm_qcomm_codec")


# ------------------------------------------------------------------------------------------------ TorchRec's shapes
def test_comm_types_and_config_fields_are_torchrecs():
    theirs = _torchrec()
    assert [(t.name, t.value) for t in CommType] == [(t.name, t.value) for t in theirs.CommType]
    assert str(CommType.FP16) == str(theirs.CommType.FP16) == "fp16"
    def fields(config_class):  # (an enum default by its value: the two CommType enums are different classes)
        return [(f.name, getattr(f.default, "value", f.default)) for f in config_class.__dataclass_fields__.values()]

    assert fields(QCommsConfig) == fields(theirs.QCommsConfig)
    from torchrec.distributed.types import CommOp as TheirCommOp

    assert [(op.name, op.value) for op in CommOp] == [(op.name, op.value) for op in TheirCommOp]


@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
@pytest.mark.parametrize("forward,backward", [("FP16", "BF16"), ("BF16", "FP32"), ("FP32", "FP16")])
def test_registry_is_torchrecs(forward, backward, device):
    theirs = _torchrec()
    ours = get_qcomm_codecs_registry(QCommsConfig(CommType[forward], CommType[backward]),
                                     device=None if device is None else torch.device(device))
    their = theirs.get_qcomm_codecs_registry(theirs.QCommsConfig(theirs.CommType[forward], theirs.CommType[backward]),
                                             device=None if device is None else torch.device(device))
    assert sorted(ours) == sorted(their)
    for key, codecs in ours.items():
        for direction in ("forward", "backward"):
            mine, other = getattr(codecs, direction), getattr(their[key], direction)
            assert mine.comm_precision.value == other._comm_precision.value, (key, direction)
            assert mine.quantized_dtype == other.quantized_dtype


def test_registry_of_chosen_ops_and_all_fp32_as_torchrecs():
    registry = get_qcomm_codecs_registry(FP16_BF16, comm_ops=[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER])
    assert list(registry) == ["POOLED_EMBEDDINGS_REDUCE_SCATTER"]
    assert get_qcomm_codecs_registry(QCommsConfig()) is None


@pytest.mark.parametrize("precision", ["FP16", "BF16"])
def test_codec_rounds_as_fbgemms(precision):
    fbgemm = pytest.importorskip("fbgemm_gpu.quantize_comm")
    from fbgemm_gpu.split_embedding_configs import SparseType

    values = torch.cat([torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3,
                        torch.tensor([1e6, -1e6, 1e-9, 70000.0, -70000.0, 1 / 3])])
    theirs = fbgemm.QuantizedCommCodec(SparseType[precision])
    ours = QuantizedCommCodec(CommType[precision])
    assert torch.equal(ours.encode(values), theirs.encode(values))
    assert torch.equal(ours.decode(ours.encode(values)), theirs.decode(theirs.encode(values)))
    by_hand = values.to(torch.float16 if precision == "FP16" else torch.bfloat16).to(torch.float32)
    in_range = values.abs() < 60000
    assert torch.equal(ours.decode(ours.encode(values))[in_range], by_hand[in_range])


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("field,value", [("forward_precision", CommType.FP8), ("backward_precision", CommType.INT8),
                                         ("forward_precision", CommType.MX4)])
def test_config_refuses_precisions_it_cannot_send(field, value):
    with pytest.raises(NotImplementedError, match=f"{field}=CommType.{value.name}"):
        QCommsConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("forward_loss_scale", 128.0), ("backward_loss_scale", 2.0),
                                         ("fp8_quantize_dim", 32), ("fp8_bwd_uses_143", True),
                                         ("mx4_quantize_dim", 32), ("output_dtype", "fp16")])
def test_config_refuses_options_it_does_not_do(field, value):
    with pytest.raises(NotImplementedError, match=f"{field}={value!r}"):
        QCommsConfig(forward_precision=CommType.FP16, **{field: value})


def test_config_refuses_a_string_precision():
    with pytest.raises(TypeError, match="forward_precision='fp16'.*pass a CommType"):
        QCommsConfig(forward_precision="fp16")


def test_registry_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="pass a QCommsConfig"):
        get_qcomm_codecs_registry({"forward_precision": CommType.FP16})
    with pytest.raises(TypeError, match="not CommOp members"):
        get_qcomm_codecs_registry(FP16_BF16, comm_ops=["POOLED_EMBEDDINGS_ALL_TO_ALL"])
    with pytest.raises(NotImplementedError, match="pass ctx=None"):
        QuantizedCommCodec(CommType.FP16).encode(torch.ones(2), ctx=object())


@pytest.mark.parametrize("sharder", [EmbeddingBagCollectionSharder, EmbeddingCollectionSharder,
                                     ManagedCollisionEmbeddingBagCollectionSharder,
                                     FeatureProcessedEmbeddingBagCollectionSharder])
def test_sharders_take_a_registry_and_refuse_anything_else(sharder):
    registry = get_qcomm_codecs_registry(FP16_BF16)
    assert sharder(qcomm_codecs_registry=registry).qcomm_codecs_registry == registry
    assert sharder().qcomm_codecs_registry is None
    with pytest.raises(ValueError, match=r"keys \['forward'\] are not CommOp names"):
        sharder(qcomm_codecs_registry={"forward": None})
    with pytest.raises(TypeError, match="not a dict"):
        sharder(qcomm_codecs_registry=FP16_BF16)
    with pytest.raises(TypeError, match=r"codecs of \['POOLED_EMBEDDINGS_ALL_TO_ALL'\] are not rectoolkit's"):
        sharder(qcomm_codecs_registry={"POOLED_EMBEDDINGS_ALL_TO_ALL": object()})


def test_sharders_refuse_torchrecs_registry():
    theirs = _torchrec()
    registry = theirs.get_qcomm_codecs_registry(theirs.QCommsConfig(theirs.CommType.FP16, theirs.CommType.BF16))
    with pytest.raises(TypeError, match="TorchRec's or fbgemm's objects are not run here"):
        EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)


def test_feature_processed_sharder_passes_its_registry_and_refuses_two():
    registry = get_qcomm_codecs_registry(FP16_BF16)
    assert FeatureProcessedEmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)._ebc_sharder \
        .qcomm_codecs_registry == registry
    inner = EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)
    assert FeatureProcessedEmbeddingBagCollectionSharder(inner).qcomm_codecs_registry == registry
    with pytest.raises(ValueError, match="pass the registry to EmbeddingBagCollectionSharder"):
        FeatureProcessedEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder(), qcomm_codecs_registry=registry)


# ------------------------------------------------------------------------------------------------ one process
def test_exchange_rounds_forward_and_backward_and_counts_two_bytes():
    env = ShardingEnv.local()
    codecs = get_qcomm_codecs_registry(FP16_BF16)["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    x = torch.tensor([1 / 3, 2 / 3, 1e-3], requires_grad=True)
    out = all_to_all_with_grad(env, x, [3], [3], "output_dist", codecs)
    assert torch.equal(out, x.detach().half().float())
    upstream = torch.tensor([1 / 7, 3 / 7, 5 / 7])
    out.backward(upstream)
    assert torch.equal(x.grad, upstream.bfloat16().float())
    assert env.stats.bytes_sent["output_dist"].tolist() == [6]
    assert env.stats.bytes_sent["output_dist_backward"].tolist() == [6]


def test_traffic_counts_the_wire_width_per_collective():
    tables = [rtk.EmbeddingBagConfig(name="a", num_embeddings=8, embedding_dim=4, feature_names=["fa"]),
              rtk.EmbeddingBagConfig(name="b", num_embeddings=8, embedding_dim=2, feature_names=["fb"])]
    plan = {"a": table_wise(1, 8, 4), "b": row_wise([0, 1], 8, 2)}

    def traffic(registry):
        return step_traffic(plan, tables, 2, 2, [3, 3], lambda rank, f, lo, hi: 1,
                            qcomm_codecs_registry=registry)

    fp32 = traffic(None)
    # by hand: rank 1 sends each rank [3, 4] of "a" (4 bytes a value); both ranks send each rank [3, 2] of "b"
    assert fp32["output_dist"].tolist() == [[24, 24], [72, 72]]
    assert fp32["output_dist_backward"].tolist() == [[24, 72], [24, 72]]
    # FP16 forward / BF16 backward: 2 bytes both ways
    half = traffic(get_qcomm_codecs_registry(FP16_BF16))
    assert half["output_dist"].tolist() == [[12, 12], [36, 36]]
    assert half["output_dist_backward"].tolist() == [[12, 36], [12, 36]]
    assert (half["input_dist"] == fp32["input_dist"]).all()
    # only the reduce-scatter entry: row-wise "b" at 2 bytes, table-wise "a" at 4
    only_rs = traffic(get_qcomm_codecs_registry(FP16_BF16, comm_ops=[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER]))
    assert only_rs["output_dist"].tolist() == [[12, 12], [60, 60]]


# ------------------------------------------------------------------------------------------------ 2 ranks
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_fp16_forward_bf16_backward_round_as_the_codec():
    run_workers(qcomm_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_dmp_takes_each_collections_registry_from_its_sharder():
    run_workers(qcomm_dmp_worker, 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_two_ranks_variable_batch_rounds_the_compact_rows_on_the_wire():
    run_workers(qcomm_vbe_worker, 2)
