"""How much quantization costs: pooled-output error and memory per storage type, and a model's AUC delta.

    >>> import torch, rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=64)])
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["t"], values=torch.arange(20), lengths=torch.tensor([10, 10]))
    >>> report = quantization_report(ebc, [kjt], data_types=["FP32", "INT8"])
    >>> report[["data_type", "bytes", "fraction_of_fp32"]].to_dict("records")
    [{'data_type': 'FP32', 'bytes': 25600, 'fraction_of_fp32': 1.0}, {'data_type': 'INT8', 'bytes': 8000, 'fraction_of_fp32': 0.3125}]

`relative_error` is ||quantized - float|| / ||float|| over all pooled outputs (Frobenius norms);
`max_abs_error` is the largest single difference. Each pooled value's error is at most the sum, over the
bag's ids, of half a quantization step of their rows (rowwise.max_abs_error_bound).
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union

import pandas as pd
import torch
from torch import nn

from rectoolkit.modules.configs import DataType
from rectoolkit.quant.config import weight_data_type
from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, quantize_embeddings
from rectoolkit.quant.sizes import SERVING_DATA_TYPES
from rectoolkit.sparse import KeyedJaggedTensor


@torch.no_grad()
def quantization_report(ebc: nn.Module, batches: Sequence[KeyedJaggedTensor],
                        data_types: Iterable[Union[DataType, str, torch.dtype]] = SERVING_DATA_TYPES,
                        row_alignment: int = 16, backend: str = "auto") -> pd.DataFrame:
    """One row per storage type: bytes, fraction of fp32 bytes, and the pooled-output error on `batches`."""
    float_outputs = [ebc(kjt).values() for kjt in batches]
    fp32_bytes = sum(t.num_embeddings * t.embedding_dim * 4 for t in ebc.embedding_bag_configs())
    rows = []
    for data_type in [weight_data_type(d) for d in data_types]:
        quantized = QuantEmbeddingBagCollection.from_float(ebc, dtype=data_type, backend=backend,
                                                           row_alignment=row_alignment)
        diffs = [quantized(kjt).values() - reference for kjt, reference in zip(batches, float_outputs)]
        diff = torch.cat([d.flatten() for d in diffs])
        reference = torch.cat([r.flatten() for r in float_outputs])
        rows.append({
            "data_type": data_type.value,
            "bytes": quantized.storage_bytes(),
            "fraction_of_fp32": quantized.storage_bytes() / fp32_bytes,
            "max_abs_error": float(diff.abs().max()) if diff.numel() else 0.0,
            "mean_abs_error": float(diff.abs().mean()) if diff.numel() else 0.0,
            "relative_error": float(diff.norm() / reference.norm().clamp(min=1e-30)),
        })
    return pd.DataFrame(rows)


def binary_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (probability that a random positive scores above a random negative; ties 1/2).

    >>> binary_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    0.75
    """
    scores = scores.flatten().to(torch.float64)
    labels = labels.flatten().to(torch.bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUC needs both classes; got {positives} positives and {negatives} negatives")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    # average ranks of tied scores
    unique, inverse, counts = torch.unique(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    average = ends - (counts.to(torch.float64) - 1) / 2
    ranks[order] = average[inverse]
    rank_sum = ranks[labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2) / (positives * negatives))


@torch.no_grad()
def prediction_report(model: nn.Module, batches: Sequence, data_types: Iterable[Union[DataType, str, torch.dtype]] =
                      SERVING_DATA_TYPES, backend: str = "auto") -> pd.DataFrame:
    """AUC of a model's predictions with every EmbeddingBagCollection quantized, per storage type.

    `model(dense, sparse)` gives logits; `batches` are (dense, sparse, labels) tuples (rectoolkit.train's
    Batch). Columns: data_type, auc, auc_delta (vs the float model), max_abs_probability_delta.
    """
    model = model.eval()
    labels = torch.cat([b[2] for b in batches])
    float_probs = torch.cat([torch.sigmoid(model(b[0], b[1]).flatten()) for b in batches])
    float_auc = binary_auc(float_probs, labels)
    rows = [{"data_type": "float", "auc": float_auc, "auc_delta": 0.0, "max_abs_probability_delta": 0.0}]
    for data_type in [weight_data_type(d) for d in data_types]:
        quantized = quantize_embeddings(model, dtype=data_type, backend=backend)
        probs = torch.cat([torch.sigmoid(quantized(b[0], b[1]).flatten()) for b in batches])
        auc = binary_auc(probs, labels)
        rows.append({"data_type": data_type.value, "auc": auc, "auc_delta": auc - float_auc,
                     "max_abs_probability_delta": float((probs - float_probs).abs().max())})
    return pd.DataFrame(rows)
