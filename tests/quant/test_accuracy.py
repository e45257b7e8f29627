"""Accuracy per storage type on dlrm26's tables (rows capped), memory per type, and a DLRM's AUC delta."""

from __future__ import annotations

import copy

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.accuracy import binary_auc, prediction_report, quantization_report
from rectoolkit.train.data import SyntheticData
from rectoolkit.train.model import DLRM

# Stated tolerances: relative L2 error of pooled outputs (tables initialized U(-1/sqrt(rows), 1/sqrt(rows)),
# the worst case for row-wise quantization: values spread evenly over each row's range).
RELATIVE_ERROR_LIMIT = {"FP32": 0.0, "FP16": 1e-3, "INT8": 1e-2, "INT4": 0.1, "INT2": 0.5}
BYTES_PER_ROW_AT_DIM_64 = {"FP32": 256, "FP16": 128, "INT8": 80, "INT4": 48, "INT2": 32}
BITS = {"INT8": 8, "INT4": 4, "INT2": 2}


@pytest.fixture(scope="module")
def dlrm26_small():
    workload = rtk.load_workload("dlrm26")
    tables = copy.deepcopy(workload.tables)
    for table in tables:
        table.num_embeddings = min(table.num_embeddings, 2000)
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables)
    data = SyntheticData(tables, workload.pooling_factors, batch_size=128, dense_features=0, seed=1)
    return ebc, [data.batch(step).sparse_features for step in range(2)]


def test_memory_and_error_per_data_type(dlrm26_small):
    ebc, batches = dlrm26_small
    report = quantization_report(ebc, batches).set_index("data_type")
    rows = sum(t.num_embeddings for t in ebc.embedding_bag_configs())
    for data_type, row_bytes in BYTES_PER_ROW_AT_DIM_64.items():
        assert report.loc[data_type, "bytes"] == rows * row_bytes
        assert report.loc[data_type, "fraction_of_fp32"] == pytest.approx(row_bytes / 256)
        assert report.loc[data_type, "relative_error"] <= RELATIVE_ERROR_LIMIT[data_type]
    assert list(report["relative_error"]) == sorted(report["relative_error"])  # fewer bits, more error


@pytest.mark.parametrize("data_type", ["INT8", "INT4", "INT2"])
def test_each_bag_is_within_its_ids_half_steps(dlrm26_small, data_type):
    ebc, batches = dlrm26_small
    qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=data_type)
    kjt = batches[0]
    diff = (qebc(kjt).values() - ebc(kjt).values()).abs()
    levels = (1 << BITS[data_type]) - 1
    columns = []
    for table in ebc.embedding_bag_configs():
        w = ebc.embedding_bags[table.name].weight.detach()
        span = w.amax(1) - w.amin(1)
        # half a step per row, plus fp16 rounding of scale and bias (relative 2^-10 with margin) and fp32 sums
        per_row = span / levels / 2 + (span + w.amin(1).abs()) * 2.0 ** -10 + 1e-6
        for feature in table.feature_names:
            jt = kjt[feature]
            columns.append(torch.stack([per_row[ids].sum() for ids in jt.to_dense()]))
    bound = torch.stack(columns, dim=1).repeat_interleave(64, dim=1)
    assert (diff <= bound).all()


def test_binary_auc_matches_pair_counting():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 20, (200,), generator=g).float()  # many ties
    labels = torch.rand(200, generator=g) < 0.4
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]).double().sum() + 0.5 * (pos[:, None] == neg[None, :]).double().sum()
    assert binary_auc(scores, labels) == pytest.approx(float(pairs / (len(pos) * len(neg))))


@pytest.mark.timeout(120)
def test_dlrm_auc_delta_per_data_type():
    torch.manual_seed(0)
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=16, feature_names=[f"f{i}"])
              for i, n in enumerate([1000, 500, 2000, 100])]
    data = SyntheticData(tables, {"f0": 3.0, "f2": 5.0}, batch_size=256, dense_features=4, seed=0)
    model = DLRM(rtk.EmbeddingBagCollection(tables, optimizer="adagrad", lr=0.1), 4, [16, 16], [16, 1])
    dense_params = [p for n, p in model.named_parameters() if "embedding_bag_collection" not in n]
    optimizer = torch.optim.Adagrad(dense_params, lr=0.05)
    for step in range(40):
        dense, sparse, labels = data.batch(step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, sparse).flatten(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    report = prediction_report(model, [data.batch(10_000 + i) for i in range(4)]).set_index("data_type")
    assert report.loc["float", "auc"] > 0.7  # the model learned something
    assert report.loc["FP32", "auc_delta"] == 0.0
    assert abs(report.loc["FP16", "auc_delta"]) <= 1e-3
    assert abs(report.loc["INT8", "auc_delta"]) <= 2e-3
    assert abs(report.loc["INT4", "auc_delta"]) <= 1e-2
    assert abs(report.loc["INT2", "auc_delta"]) <= 5e-2
