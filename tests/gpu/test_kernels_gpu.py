"""The pure-torch batched embedding kernel and every fused optimizer on CUDA equal the same kernel on CPU
(which tests/kernels checks against an independent reference loop): outputs, per-sample-weight gradients,
updated weights and optimizer state over several steps with duplicate ids; dense gradients; id errors."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.kernels import FusedOptimizerConfig, TableSpec, make_batched_embedding

pytestmark = pytest.mark.gpu

TABLES = [TableSpec(50, 8, "a"), TableSpec(30, 8, "b"), TableSpec(20, 4, "c")]
FEATURE_TABLE_MAP = [0, 1, 1, 2]  # two features read table b
OPTIMIZERS = [None, "sgd", "adagrad", "row_wise_adagrad", "adam"]


def _batch(seed: int, tables, feature_table_map, batch_size=5, weighted=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(feature_table_map) * batch_size,), generator=g)
    ids = torch.cat([torch.randint(0, tables[t].num_embeddings, (int(n),), generator=g)
                     for f, t in enumerate(feature_table_map)
                     for n in [lengths[f * batch_size:(f + 1) * batch_size].sum()]])
    smallest = min(t.num_embeddings for t in tables)
    ids[: len(ids) // 3] = ids[0] % smallest  # duplicate ids: their gradients are summed before one update
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(ids.numel(), generator=g) if weighted else None
    return ids, offsets, weights


def _pair(tables, feature_table_map, pooling, optimizer, device):
    kernels = []
    for where in ("cpu", device):
        config = FusedOptimizerConfig(optimizer, lr=0.1) if optimizer else None
        kernels.append(make_batched_embedding(tables, feature_table_map, pooling, config, device=where,
                                              backend="torch"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for cpu_weight, gpu_weight in zip(kernels[0].table_weights, kernels[1].table_weights):
            value = torch.randn(cpu_weight.shape, generator=g)
            cpu_weight.copy_(value)
            gpu_weight.copy_(value.to(device))
    return kernels


def _close(gpu_tensor, cpu_tensor, what):
    assert gpu_tensor.device.type == torch.device(gpu_tensor.device).type
    torch.testing.assert_close(gpu_tensor.detach().cpu(), cpu_tensor.detach(), atol=1e-5, rtol=1e-5, msg=what)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_lookup_and_fused_update_on_cuda_equal_cpu(optimizer, weighted, device):
    cpu, gpu = _pair(TABLES, FEATURE_TABLE_MAP, "sum", optimizer, device)
    assert all(w.device == device for w in gpu.table_weights)
    for step in range(3):
        ids, offsets, weights = _batch(step, TABLES, FEATURE_TABLE_MAP, weighted=weighted)
        gpu_weights = weights.to(device, copy=True).requires_grad_() if weighted else None
        cpu_weights = weights.clone().requires_grad_() if weighted else None
        out_cpu = cpu(ids, offsets, cpu_weights)
        out_gpu = gpu(ids.to(device), offsets.to(device), gpu_weights)
        assert out_gpu.device == device and out_gpu.shape == out_cpu.shape == (5, 8 + 8 + 8 + 4)
        _close(out_gpu, out_cpu, f"step {step}: pooled outputs")
        grad = torch.randn(out_cpu.shape, generator=torch.Generator().manual_seed(10 + step))
        (out_cpu * grad).sum().backward()
        (out_gpu * grad.to(device)).sum().backward()
        if weighted:
            _close(gpu_weights.grad, cpu_weights.grad, f"step {step}: per-sample-weight gradients")
    for t, (w_cpu, w_gpu) in enumerate(zip(cpu.table_weights, gpu.table_weights)):
        if optimizer is None:
            _close(w_gpu.grad, w_cpu.grad, f"table {t}: dense gradients")
        else:
            _close(w_gpu, w_cpu, f"table {t}: weights after 3 fused {optimizer} updates")
    for t, (s_cpu, s_gpu) in enumerate(zip(cpu.split_optimizer_states(), gpu.split_optimizer_states())):
        assert sorted(s_cpu) == sorted(s_gpu)
        for name in s_cpu:
            _close(s_gpu[name], s_cpu[name], f"table {t}: optimizer state {name}")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_unpooled_lookup_on_cuda_equals_cpu(optimizer, device):
    tables, feature_table_map = TABLES[:2], [0, 1, 1]
    cpu, gpu = _pair(tables, feature_table_map, "none", optimizer, device)
    ids, offsets, _ = _batch(7, tables, feature_table_map)
    out_cpu, out_gpu = cpu(ids, offsets), gpu(ids.to(device), offsets.to(device))
    _close(out_gpu, out_cpu, "one row per id")
    grad = torch.randn(out_cpu.shape, generator=torch.Generator().manual_seed(1))
    (out_cpu * grad).sum().backward()
    (out_gpu * grad.to(device)).sum().backward()
    for w_cpu, w_gpu in zip(cpu.table_weights, gpu.table_weights):
        _close(w_gpu.grad if optimizer is None else w_gpu, w_cpu.grad if optimizer is None else w_cpu, "update")


def test_out_of_range_id_on_cuda_names_feature_and_table_and_hash_mode_matches_cpu(device):
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, device=device, backend="torch",
                                    feature_names=["fa", "fb", "fb2", "fc"])
    ids = torch.tensor([1, 2, 31, 3], device=device)  # 31 is past table b's 30 rows, read by feature fb2
    offsets = torch.tensor([0, 1, 2, 3, 4], device=device)
    with pytest.raises(ValueError, match=r"id 31 of feature 'fb2' .*is out of range for table 'b'.*num_embeddings=30"):
        kernel(ids, offsets)
    cpu, gpu = _pair(TABLES, FEATURE_TABLE_MAP, "sum", None, device)
    cpu.ids_out_of_range = gpu.ids_out_of_range = "hash"
    _close(gpu(ids, offsets), cpu(ids.cpu(), offsets.cpu()), "hashed ids")


@pytest.mark.parametrize("optimizer", [None, "sgd", "adagrad", "row_wise_adagrad"])
@pytest.mark.parametrize("weighted", [False, True])
def test_variable_batch_lookup_and_fused_update_on_cuda_equal_cpu(optimizer, weighted, device):
    """The kernels' VBE mode (`batch_size_per_feature`: each feature at its own bags, a flat output)."""
    cpu, gpu = _pair(TABLES, FEATURE_TABLE_MAP, "sum", optimizer, device)
    bags = [1, 5, 3, 2]
    for step in range(3):
        g = torch.Generator().manual_seed(20 + step)
        lengths = torch.randint(0, 4, (sum(bags),), generator=g)
        feature_of_bag = torch.repeat_interleave(torch.arange(len(bags)), torch.tensor(bags))
        ids = torch.cat([torch.randint(0, TABLES[FEATURE_TABLE_MAP[int(f)]].num_embeddings, (int(n),), generator=g)
                         for f, n in zip(feature_of_bag, lengths)])
        ids[: ids.numel() // 3] = ids[0] % 20  # duplicates: summed before one update
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        weights = torch.rand(ids.numel(), generator=g) if weighted else None
        cpu_weights = weights.clone().requires_grad_() if weighted else None
        gpu_weights = weights.to(device, copy=True).requires_grad_() if weighted else None
        out_cpu = cpu(ids, offsets, cpu_weights, batch_size_per_feature=bags)
        out_gpu = gpu(ids.to(device), offsets.to(device), gpu_weights, batch_size_per_feature=bags)
        assert out_gpu.device == device and out_gpu.shape == out_cpu.shape == (1 * 8 + 5 * 8 + 3 * 8 + 2 * 4,)
        _close(out_gpu, out_cpu, f"step {step}: flat VBE outputs")
        grad = torch.randn(out_cpu.shape, generator=g)
        (out_cpu * grad).sum().backward()
        (out_gpu * grad.to(device)).sum().backward()
        if weighted:
            _close(gpu_weights.grad, cpu_weights.grad, f"step {step}: per-sample-weight gradients")
    for t, (w_cpu, w_gpu) in enumerate(zip(cpu.table_weights, gpu.table_weights)):
        _close(w_gpu.grad if optimizer is None else w_gpu, w_cpu.grad if optimizer is None else w_cpu,
               f"table {t}: after 3 VBE steps ({optimizer})")
