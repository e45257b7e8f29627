"""JaggedTensor, KeyedJaggedTensor and KeyedTensor on CUDA tensors: `to`, `pin_memory`, `record_stream`, and
their operations give on the GPU what they give on the CPU (hand-worked values below)."""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import needs_cuda_itself
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

pytestmark = pytest.mark.gpu


def _kjt(weights=True):
    # user: [1, 2], [3]; item: [], [4, 5, 6]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item"], values=torch.tensor([1, 2, 3, 4, 5, 6]), lengths=torch.tensor([2, 1, 0, 3]),
        weights=torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]) if weights else None)


def test_kjt_to_cuda_and_back_keeps_every_part(device):
    kjt = _kjt().to(device)
    assert kjt.device() == device
    assert all(t.device == device for t in (kjt.values(), kjt.weights(), kjt.lengths(), kjt.offsets()))
    assert kjt.offsets().tolist() == [0, 2, 3, 3, 6] and kjt.stride() == 2
    assert kjt.length_per_key() == [3, 3] and kjt.offset_per_key() == [0, 3, 6]
    back = kjt.to(torch.device("cpu"))
    assert back.values().device.type == "cpu" and back.values().tolist() == [1, 2, 3, 4, 5, 6]


def test_kjt_operations_on_cuda(device):
    kjt = _kjt().to(device)
    item = kjt["item"]
    assert item.values().device == device and item.values().tolist() == [4, 5, 6]
    assert item.lengths().tolist() == [0, 3] and item.weights().tolist() == [2.0, 2.5, 3.0]
    swapped = kjt.permute([1, 0])
    assert swapped.keys() == ["item", "user"] and swapped.values().device == device
    assert swapped.values().tolist() == [4, 5, 6, 1, 2, 3] and swapped.lengths().tolist() == [0, 3, 2, 1]
    first, second = kjt.split([1, 1])
    assert first.keys() == ["user"] and first.values().tolist() == [1, 2, 3] and first.values().device == device
    assert second.lengths().tolist() == [0, 3]
    as_dict = kjt.to_dict()
    assert [t.tolist() for t in as_dict["user"].to_dense()] == [[1, 2], [3]]
    assert all(t.device == device for t in as_dict["user"].to_dense())
    built = KeyedJaggedTensor.from_lengths_sync(["a"], torch.tensor([7, 8], device=device),
                                                torch.tensor([1, 1], device=device))
    assert built.offsets().device == device and built.offsets().tolist() == [0, 1, 2]


def test_jagged_tensor_on_cuda(device):
    jt = JaggedTensor(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([2, 0, 1])).to(device)
    assert jt.values().device == device and jt.offsets().tolist() == [0, 2, 2, 3]
    padded = jt.to_padded_dense(desired_length=2, padding_value=-1.0)
    assert padded.device == device and padded.tolist() == [[1.0, 2.0], [-1.0, -1.0], [3.0, -1.0]]
    dense = JaggedTensor.from_dense([torch.tensor([4, 5], device=device), torch.tensor([6], device=device)])
    assert dense.lengths().tolist() == [2, 1] and dense.values().device == device


def test_keyed_tensor_regroup_on_cuda_with_gradient(device):
    values = torch.arange(12.0, device=device).view(2, 6).requires_grad_()
    kt = KeyedTensor(keys=["a", "b", "c"], length_per_key=[1, 2, 3], values=values)
    assert kt.to_dict()["b"].tolist() == [[1.0, 2.0], [7.0, 8.0]]
    grouped = KeyedTensor.regroup([kt], [["c", "a"], ["b"]])
    assert grouped[0].device == device and grouped[0].tolist() == [[3.0, 4.0, 5.0, 0.0], [9.0, 10.0, 11.0, 6.0]]
    grouped[0].sum().backward()
    assert values.grad.tolist() == [[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]] * 2
    assert kt.to(torch.device("cpu")).values().device.type == "cpu"


def test_pin_memory_then_non_blocking_copy_to_cuda():
    needs_cuda_itself("pinned host memory")
    pinned = _kjt().pin_memory()
    assert all(t.is_pinned() for t in (pinned.values(), pinned.weights(), pinned.lengths(), pinned.offsets()))
    on_gpu = pinned.to(torch.device("cuda"), non_blocking=True)
    torch.cuda.synchronize()
    assert on_gpu.values().is_cuda and on_gpu.values().tolist() == [1, 2, 3, 4, 5, 6]
    assert on_gpu.weights().tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


def test_record_stream_keeps_tensors_used_on_a_side_stream():
    needs_cuda_itself("CUDA streams")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # copy on a side stream, as a prefetching data loader does
        kjt = _kjt().to(torch.device("cuda"), non_blocking=True)
        jt = JaggedTensor(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([1, 1])).to(torch.device("cuda"))
        kt = KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(3, 2)).to(torch.device("cuda"))
    torch.cuda.current_stream().wait_stream(side)
    for value in (kjt, jt, kt):
        value.record_stream(torch.cuda.current_stream())  # the allocator now waits for this stream's use
    total = kjt.values().sum() + jt.values().sum() + kt.values().sum()
    torch.cuda.synchronize()
    assert total.item() == 21 + 3.0 + 6.0
