"""TorchRec's torchrec.distributed.fbgemm_qcomm_codec: quantized communication of the embeddings' outputs.

The sharded collections' output all-to-all (pooled rows, row-wise partial sums, sequence rows) can travel in a
narrower float: each value is cast to the forward precision before the exchange and back to float32 after it,
and its gradient to the backward precision on the way back. FP16 and BF16 halve those bytes (and the bytes
counted by env.stats). rectoolkit's codec does exactly what fbgemm's does for these precisions: clamp to the
narrow type's range, cast, and cast back (`x.clamp(finfo.min, finfo.max).half().float()`).

    sharder = EmbeddingBagCollectionSharder(qcomm_codecs_registry=get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)))

Which collective uses which entry of the registry (TorchRec's choice): POOLED_EMBEDDINGS_ALL_TO_ALL for the pooled
output of TABLE_WISE, COLUMN_WISE, TABLE_COLUMN_WISE and the inter-host level of TABLE_ROW_WISE / GRID_SHARD;
POOLED_EMBEDDINGS_REDUCE_SCATTER for ROW_WISE's partial sums and the intra-host level of the two-level types;
SEQUENCE_EMBEDDINGS_ALL_TO_ALL for every EmbeddingCollection output. Partial sums are rounded one by one and
added in float32 by the receiver (TorchRec on NCCL adds them in the narrow type, rounding the sum once more).
MEAN pooling divides after the exchange, so the rounded value is the sum. DATA_PARALLEL moves no embeddings.

    >>> registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16,
    ...                                                   backward_precision=CommType.BF16))
    >>> sorted(registry)
    ['POOLED_EMBEDDINGS_ALL_TO_ALL', 'POOLED_EMBEDDINGS_REDUCE_SCATTER', 'SEQUENCE_EMBEDDINGS_ALL_TO_ALL']
    >>> codecs = registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    >>> codecs.forward.encode(torch.tensor([1 / 3])).dtype, codecs.backward.quantized_dtype
    (torch.float16, torch.bfloat16)
    >>> get_qcomm_codecs_registry(QCommsConfig()) is None  # all FP32: nothing to do, as TorchRec
    True
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any, Dict, List, Optional

import torch

logger = logging.getLogger(__name__)


@unique
class CommType(Enum):
    """A wire precision, TorchRec's names and values. rectoolkit sends FP32, FP16 and BF16 (QCommsConfig refuses
    the others)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    MX4 = "mx4"

    def __str__(self) -> str:
        return self.value


@unique
class CommOp(Enum):
    """The output collectives a registry has codecs for (TorchRec's torchrec.distributed.types.CommOp); a registry
    is keyed by their names."""

    POOLED_EMBEDDINGS_ALL_TO_ALL = "pooled_embeddings_all_to_all"
    POOLED_EMBEDDINGS_REDUCE_SCATTER = "pooled_embeddings_reduce_scatter"
    SEQUENCE_EMBEDDINGS_ALL_TO_ALL = "sequence_embeddings_all_to_all"


_WIRE_DTYPES = {CommType.FP32: torch.float32, CommType.FP16: torch.float16, CommType.BF16: torch.bfloat16}


@dataclass
class QCommsConfig:
    """TorchRec's quantized-communication settings: the precision of the output exchange forward and of its
    gradient backward. Only TorchRec's defaults are accepted for the FP8/MX4 and loss-scale fields.

        >>> QCommsConfig(forward_precision=CommType.FP8)
        Traceback (most recent call last):
        ...
        NotImplementedError: QCommsConfig(forward_precision=CommType.FP8): rectoolkit sends FP32, FP16 or BF16; choose one of those
    """

    forward_precision: CommType = CommType.FP32
    backward_precision: CommType = CommType.FP32
    forward_loss_scale: Optional[float] = None
    backward_loss_scale: Optional[float] = None
    fp8_quantize_dim: Optional[int] = None
    fp8_quantize_dim_bwd: Optional[int] = None
    fp8_bwd_uses_143: Optional[bool] = False
    fp8_output_dtype: Any = None
    mx4_quantize_dim: Optional[int] = None
    mx4_quantize_dim_bwd: Optional[int] = None
    mx4_rounding_mode: Any = None
    output_dtype: Any = None

    def __post_init__(self) -> None:
        for name in ("forward_precision", "backward_precision"):
            value = getattr(self, name)
            if not isinstance(value, CommType):
                raise TypeError(f"QCommsConfig({name}={value!r}): pass a CommType (e.g. CommType.FP16) from "
                                "rectoolkit.distributed.fbgemm_qcomm_codec")
            if value not in _WIRE_DTYPES:
                raise NotImplementedError(f"QCommsConfig({name}=CommType.{value.name}): rectoolkit sends FP32, FP16 "
                                          "or BF16; choose one of those")
        for extra in dataclasses.fields(self)[2:]:
            if getattr(self, extra.name) not in (extra.default, None):  # (TorchRec reads None as the default)
                raise NotImplementedError(f"QCommsConfig({extra.name}={getattr(self, extra.name)!r}): not "
                                          f"implemented in rectoolkit; leave it {extra.default!r}")


class QuantizedCommCodec:
    """fbgemm's codec (fbgemm_gpu.quantize_comm.QuantizedCommCodec) for FP32, FP16 and BF16: encode clamps to the
    wire type's range and casts; decode casts back to float32.

        >>> codec = QuantizedCommCodec(CommType.BF16)
        >>> codec.decode(codec.encode(torch.tensor([1 / 3]))).item() == torch.tensor(1 / 3).bfloat16().item()
        True
    """

    def __init__(self, comm_precision: CommType) -> None:
        if comm_precision not in _WIRE_DTYPES:
            raise NotImplementedError(f"QuantizedCommCodec({comm_precision!r}): rectoolkit sends FP32, FP16 or BF16")
        self.comm_precision = comm_precision

    @property
    def quantized_dtype(self) -> torch.dtype:
        """The dtype on the wire."""
        return _WIRE_DTYPES[self.comm_precision]

    def encode(self, input_tensor: torch.Tensor, ctx: None = None) -> torch.Tensor:
        _no_context(ctx)
        if self.comm_precision == CommType.FP32:
            return input_tensor
        info = torch.finfo(self.quantized_dtype)
        return torch.clamp(input_tensor, info.min, info.max).to(self.quantized_dtype)

    def decode(self, input_tensor: torch.Tensor, ctx: None = None) -> torch.Tensor:
        _no_context(ctx)
        return input_tensor.float()

    def calc_quantized_size(self, input_len: int, ctx: None = None) -> int:
        """Elements on the wire for `input_len` values (the same number: only their width changes)."""
        _no_context(ctx)
        return input_len

    def create_context(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"QuantizedCommCodec(comm_precision=CommType.{self.comm_precision.name})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantizedCommCodec) and other.comm_precision == self.comm_precision

    def __hash__(self) -> int:
        return hash(self.comm_precision)


class NoOpQuantizedCommCodec:
    """TorchRec's default codec: sends tensors as they are (encode and decode return their input; quantized dtype
    float32; as many elements on the wire as given; no context)."""

    def encode(self, input_tensor: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        return input_tensor

    def decode(self, input_grad: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        return input_grad

    def quantized_dtype(self) -> torch.dtype:
        return torch.float

    def calc_quantized_size(self, input_len: int, ctx: Optional[Any] = None) -> int:
        return input_len

    def create_context(self) -> None:
        return None


def _no_context(ctx: Any) -> None:
    if ctx is not None:
        raise NotImplementedError("QuantizedCommCodec: a QuantizationContext is for FP8/INT8/MX4, which rectoolkit "
                                  "does not send; pass ctx=None")


@dataclass
class QuantizedCommCodecs:
    """The codecs of one collective: `forward` for the values, `backward` for their gradients (TorchRec's
    torchrec.distributed.types.QuantizedCommCodecs; FP32 both by default)."""

    forward: QuantizedCommCodec = field(default_factory=lambda: QuantizedCommCodec(CommType.FP32))
    backward: QuantizedCommCodec = field(default_factory=lambda: QuantizedCommCodec(CommType.FP32))


def get_qcomm_codecs(qcomms_config: Optional[QCommsConfig]) -> QuantizedCommCodecs:
    """The forward and backward codecs of a config (FP32 both for None)."""
    if qcomms_config is None:
        return QuantizedCommCodecs()
    return QuantizedCommCodecs(QuantizedCommCodec(qcomms_config.forward_precision),
                               QuantizedCommCodec(qcomms_config.backward_precision))


def get_qcomm_codecs_registry(qcomms_config: QCommsConfig, comm_ops: Optional[List[CommOp]] = None,
                              device: Optional[torch.device] = None) -> Optional[Dict[str, QuantizedCommCodecs]]:
    """TorchRec's registry: CommOp name -> QuantizedCommCodecs, for `comm_ops` (default: all three), or None when
    both precisions are FP32. As in TorchRec, `device` None means CUDA, and on a "cpu" device BF16 falls back to
    FP16 (with a warning); pass the sharded collections' device (gloo sends BF16 here too, but TorchRec would not).
    """
    if not isinstance(qcomms_config, QCommsConfig):
        raise TypeError(f"get_qcomm_codecs_registry: got a {type(qcomms_config).__name__}; pass a QCommsConfig from "
                        "rectoolkit.distributed.fbgemm_qcomm_codec")
    if qcomms_config.forward_precision == CommType.FP32 and qcomms_config.backward_precision == CommType.FP32:
        return None
    device = torch.device("cuda") if device is None else torch.device(device)
    ops = list(CommOp) if comm_ops is None else list(comm_ops)
    wrong = [op for op in ops if not isinstance(op, CommOp)]
    if wrong:
        raise TypeError(f"get_qcomm_codecs_registry(comm_ops=...): {wrong!r} are not CommOp members; use "
                        f"rectoolkit.distributed.fbgemm_qcomm_codec.CommOp ({[op.name for op in CommOp]})")
    config = copy.deepcopy(qcomms_config)
    if device.type == "cpu":
        for name in ("forward_precision", "backward_precision"):
            if getattr(config, name) == CommType.BF16:
                logger.warning(f"BF16 {name} is not supported on GLOO (TorchRec's rule) - falling back to FP16.")
                setattr(config, name, CommType.FP16)
    return {op.name: get_qcomm_codecs(config) for op in ops}


def check_qcomm_codecs_registry(registry: Any, subject: str) -> Optional[Dict[str, QuantizedCommCodecs]]:
    """`registry` if it is None or made by get_qcomm_codecs_registry (CommOp name -> QuantizedCommCodecs);
    otherwise an error naming what is wrong, `subject` first.

        >>> check_qcomm_codecs_registry({"forward": None}, "EmbeddingBagCollectionSharder")
        Traceback (most recent call last):
        ...
        ValueError: EmbeddingBagCollectionSharder(qcomm_codecs_registry=...): keys ['forward'] are not CommOp names (POOLED_EMBEDDINGS_ALL_TO_ALL, POOLED_EMBEDDINGS_REDUCE_SCATTER, SEQUENCE_EMBEDDINGS_ALL_TO_ALL); make it with rectoolkit.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry
    """
    if registry is None:
        return None
    how = "make it with rectoolkit.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry"
    where = f"{subject}(qcomm_codecs_registry=...)"
    if not isinstance(registry, dict):
        raise TypeError(f"{where}: got a {type(registry).__name__}, not a dict; {how}")
    unknown = sorted(str(key) for key in registry if key not in CommOp.__members__)
    if unknown:
        raise ValueError(f"{where}: keys {unknown} are not CommOp names ({', '.join(CommOp.__members__)}); {how}")
    foreign = sorted(key for key, codecs in registry.items() if not isinstance(codecs, QuantizedCommCodecs)
                     or not isinstance(codecs.forward, QuantizedCommCodec)
                     or not isinstance(codecs.backward, QuantizedCommCodec))
    if foreign:
        raise TypeError(f"{where}: the codecs of {foreign} are not rectoolkit's QuantizedCommCodecs (TorchRec's or "
                        f"fbgemm's objects are not run here); {how}")
    return dict(registry)


def codecs_for(registry: Optional[Dict[str, QuantizedCommCodecs]], op: CommOp) -> Optional[QuantizedCommCodecs]:
    """The codecs of collective `op` in a registry (None: it travels in float32), as TorchRec's shardings look it
    up."""
    return None if registry is None else registry.get(op.name)
