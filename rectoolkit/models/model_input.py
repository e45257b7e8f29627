"""What the `*Wrapper` models share: a forward over one batch object (TorchRec's ``ModelInput``: any object with
``float_features``, ``idlist_features`` and ``label``) that returns (BCE-with-logits loss, prediction) in training
and the prediction in eval."""

from __future__ import annotations

from typing import Any, Tuple, Union

import torch
from torch import nn

FIELDS = ("float_features", "idlist_features", "label")


def dense_and_sparse(model_input: Any, model: str) -> Tuple[torch.Tensor, Any]:
    """(float_features, idlist_features) of `model_input`, a missing field or absent sparse features named."""
    for field in FIELDS:
        if not hasattr(model_input, field):
            raise TypeError(f"{model}: the model input ({type(model_input).__name__}) has no {field!r}; pass an "
                            "object with float_features, idlist_features (a KeyedJaggedTensor) and label, like "
                            "TorchRec's ModelInput")
    if model_input.idlist_features is None:
        raise ValueError(f"{model}: model_input.idlist_features is None; the model needs the sparse features as a "
                         "KeyedJaggedTensor")
    return model_input.float_features, model_input.idlist_features


def loss_and_prediction(module: nn.Module, prediction: torch.Tensor, model_input: Any
                        ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """In training (loss of the squeezed prediction as logits against the label, prediction); else prediction."""
    if module.training:
        return nn.functional.binary_cross_entropy_with_logits(prediction.squeeze(), model_input.label), prediction
    return prediction
