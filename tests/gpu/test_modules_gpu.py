"""EmbeddingBagCollection, EmbeddingCollection and the quantized collections on CUDA equal the same modules on
the CPU; a meta-device collection materializes on the GPU (to_empty + reset_parameters, or a loaded state)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection

pytestmark = pytest.mark.gpu

BAG_TABLES = [
    rtk.EmbeddingBagConfig(name="t_user", num_embeddings=30, embedding_dim=16, feature_names=["user"]),
    rtk.EmbeddingBagConfig(name="t_item", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"],
                           pooling=rtk.PoolingType.MEAN),
]
SEQ_TABLES = [rtk.EmbeddingConfig(name="e_user", num_embeddings=30, embedding_dim=8, feature_names=["user"]),
              rtk.EmbeddingConfig(name="e_item", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"])]
ROWS = {"user": 30, "item": 50, "seen": 50}


def _kjt(seed=0, batch=4, weighted=False):
    g = torch.Generator().manual_seed(seed)
    keys = list(ROWS)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    values = torch.cat([torch.randint(0, ROWS[k], (int(lengths[i * batch:(i + 1) * batch].sum()),), generator=g)
                        for i, k in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return rtk.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def _close(on_gpu: torch.Tensor, on_cpu: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(on_gpu.detach().cpu(), on_cpu.detach(), atol=1e-5, rtol=1e-5, msg=what)


@pytest.mark.parametrize("optimizer", [None, "sgd", "adagrad", "row_wise_adagrad", "adam"])
@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_on_cuda_trains_like_the_cpu_one(optimizer, weighted, device):
    opt = dict(optimizer=optimizer, lr=0.1) if optimizer else {}
    torch.manual_seed(0)
    cpu = rtk.EmbeddingBagCollection(BAG_TABLES, is_weighted=weighted, **opt)
    gpu = rtk.EmbeddingBagCollection(BAG_TABLES, is_weighted=weighted, device=device, **opt)
    gpu.load_state_dict(cpu.state_dict())
    assert all(p.device == device for p in gpu.parameters())
    for step in range(3):
        kjt = _kjt(step, weighted=weighted)
        out_cpu, out_gpu = cpu(kjt), gpu(kjt.to(device))
        assert out_gpu.values().device == device and out_gpu.keys() == ["user", "item", "seen"]
        _close(out_gpu.values(), out_cpu.values(), f"step {step}: pooled output")
        grad = torch.randn(out_cpu.values().shape, generator=torch.Generator().manual_seed(step))
        (out_cpu.values() * grad).sum().backward()
        (out_gpu.values() * grad.to(device)).sum().backward()
        if optimizer is None:
            for name, p_cpu in cpu.named_parameters():
                _close(dict(gpu.named_parameters())[name].grad, p_cpu.grad, f"{name}.grad")
            break
    for key, value in cpu.state_dict().items():
        _close(gpu.state_dict()[key], value, f"{key} after 3 fused {optimizer} steps")


@pytest.mark.parametrize("optimizer", [None, "adagrad"])
def test_ec_on_cuda_equals_the_cpu_one(optimizer, device):
    opt = dict(optimizer=optimizer, lr=0.1) if optimizer else {}
    torch.manual_seed(0)
    cpu = rtk.EmbeddingCollection(SEQ_TABLES, **opt)
    gpu = rtk.EmbeddingCollection(SEQ_TABLES, device=device, **opt)
    gpu.load_state_dict(cpu.state_dict())
    kjt = _kjt(4)
    out_cpu, out_gpu = cpu(kjt), gpu(kjt.to(device))
    assert list(out_gpu) == list(out_cpu) == ["user", "item", "seen"]
    loss_cpu = loss_gpu = 0.0
    for name in out_cpu:
        assert out_gpu[name].values().device == device
        _close(out_gpu[name].values(), out_cpu[name].values(), f"feature {name}: rows")
        assert out_gpu[name].lengths().tolist() == out_cpu[name].lengths().tolist()
        loss_cpu = loss_cpu + out_cpu[name].values().sum() * (1 + len(name))
        loss_gpu = loss_gpu + out_gpu[name].values().sum() * (1 + len(name))
    loss_cpu.backward()
    loss_gpu.backward()
    for name, p_cpu in cpu.named_parameters():
        p_gpu = dict(gpu.named_parameters())[name]
        _close(p_gpu if optimizer else p_gpu.grad, p_cpu if optimizer else p_cpu.grad, name)


def test_meta_collection_materializes_on_cuda(device):
    ebc = rtk.EmbeddingBagCollection(BAG_TABLES, device="meta", optimizer="adagrad", lr=0.1)
    assert all(p.is_meta for p in ebc.parameters())
    ebc = ebc.to_empty(device=device)
    with torch.no_grad():
        for p in ebc.parameters():
            p.fill_(float("nan"))  # to_empty leaves garbage; reset_parameters must overwrite all of it
    ebc.reset_parameters()
    assert all(p.device == device and not p.isnan().any() for p in ebc.parameters())
    # the same values on the CPU: the GPU collection's weights loaded into a CPU one
    cpu = rtk.EmbeddingBagCollection(BAG_TABLES, optimizer="adagrad", lr=0.1)
    cpu.load_state_dict({k: v.cpu() for k, v in ebc.state_dict().items()})
    kjt = _kjt(5)
    out_gpu, out_cpu = ebc(kjt.to(device)).values(), cpu(kjt).values()
    _close(out_gpu, out_cpu, "materialized collection")
    out_gpu.sum().backward()
    out_cpu.sum().backward()  # the fused Adagrad state lives on the GPU too
    for key, value in cpu.state_dict().items():
        _close(ebc.state_dict()[key], value, f"{key} after one fused step")


@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
@pytest.mark.parametrize("weighted", [False, True])
def test_quantized_bag_collection_on_cuda_equals_cpu(dtype, weighted, device):
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(BAG_TABLES, is_weighted=weighted)
    cpu = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend="torch")
    moved = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend="torch").to(device)
    built_there = QuantEmbeddingBagCollection.from_float(
        rtk.EmbeddingBagCollection(BAG_TABLES, is_weighted=weighted, device=device).to(device), dtype=dtype,
        backend="torch")
    built_there.load_state_dict(cpu.state_dict())
    kjt = _kjt(6, weighted=weighted)
    expected = cpu(kjt).values()
    for name, module in (("moved with .to()", moved), ("quantized from a GPU module", built_there)):
        assert module.device == device and all(b.device == device for b in module.state_dict().values())
        out = module(kjt.to(device)).values()
        assert out.device == device
        _close(out, expected, name)


def test_quantized_sequence_collection_on_cuda_equals_cpu(device):
    ec = rtk.EmbeddingCollection(SEQ_TABLES, need_indices=True)
    cpu = QuantEmbeddingCollection.from_float(ec, dtype=torch.int8, backend="torch")
    gpu = QuantEmbeddingCollection.from_float(ec, dtype=torch.int8, backend="torch").to(device)
    kjt = _kjt(7)
    out_cpu, out_gpu = cpu(kjt), gpu(kjt.to(device))
    for name in out_cpu:
        _close(out_gpu[name].values(), out_cpu[name].values(), f"feature {name}")
        assert out_gpu[name].weights().tolist() == kjt[name].values().tolist()  # need_indices
