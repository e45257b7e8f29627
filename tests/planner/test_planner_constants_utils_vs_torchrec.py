"""TorchRec's planner constants and helpers at torchrec.distributed.planner.constants / .utils, against TorchRec
1.8's on the same inputs."""

from __future__ import annotations

import doctest

import pytest

import rectoolkit.planner.torchrec_constants as constants_module
import rectoolkit.planner.torchrec_utils as utils_module
from rectoolkit.distributed.planner import constants as ours_constants
from rectoolkit.distributed.planner import utils as ours_utils
from rectoolkit.distributed.planner.types import Storage

their_constants = pytest.importorskip("torchrec.distributed.planner.constants")
their_utils = pytest.importorskip("torchrec.distributed.planner.utils")
pytestmark = pytest.mark.torchrec


def test_docstring_examples():
    assert doctest.testmod(constants_module).failed == 0
    assert doctest.testmod(utils_module).failed == 0


def test_every_constant_of_torchrecs_with_its_value():
    theirs = {name: getattr(their_constants, name) for name in dir(their_constants) if name.isupper()}
    ours = {name: getattr(ours_constants, name) for name in ours_constants.__all__ if name.isupper()}
    assert ours == theirs
    assert all(type(ours[name]) is type(theirs[name]) for name in theirs)


DEVICES = ["cpu", "cuda", "mtia", "tpu"]
KERNELS = ["dense", "fused", "fused_uvm", "fused_uvm_caching", "quant", "quant_uvm", "quant_uvm_caching", "key_value",
           "customized_kernel", "ssd_virtual_table", "dram_virtual_table", "dram_ssd_virtual_table", "fused_triton",
           "unknown"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("caching_ratio", [None, 0.0, 0.35, 1.0])
@pytest.mark.parametrize("prefetch_pipeline", [False, True])
def test_kernel_bw_lookup(device, kernel, caching_ratio, prefetch_pipeline):
    args = (device, kernel, 1.1e6, 3.7e4, 2.9e4, caching_ratio, prefetch_pipeline)
    assert ours_constants.kernel_bw_lookup(*args) == their_constants.kernel_bw_lookup(*args)
    assert ours_constants.kernel_bw_lookup(*args, ssd_mem_bw=17.0) == \
        their_constants.kernel_bw_lookup(*args, ssd_mem_bw=17.0)
    defaults = (device, kernel, their_constants.HBM_MEM_BW, their_constants.DDR_MEM_BW,
                their_constants.HBM_TO_DDR_MEM_BW)
    assert ours_constants.kernel_bw_lookup(*defaults) == their_constants.kernel_bw_lookup(*defaults)


@pytest.mark.parametrize("value", [0, 1, 1023, 1024**2, 3.5 * 1024**3, 7 * 1024**3 + 5, 2.25, 10**13])
def test_unit_conversions(value):
    for name in ("bytes_to_gb", "bytes_to_mb", "gb_to_bytes", "mb_to_bytes"):
        mine, reference = getattr(ours_utils, name)(value), getattr(their_utils, name)(value)
        assert mine == reference and type(mine) is type(reference), name


@pytest.mark.parametrize("items", [[], [3], [2, 3, 4], (5, 0, 2), range(1, 8)])
def test_prod(items):
    assert ours_utils.prod(items) == their_utils.prod(items)


def test_sharder_name():
    from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder

    for cls in (EmbeddingBagCollectionSharder, Storage, int):
        assert ours_utils.sharder_name(cls) == their_utils.sharder_name(cls)


@pytest.mark.parametrize("device", ["cuda", "mtia", "cpu"])
@pytest.mark.parametrize("rank,local_size", [(0, 1), (5, 4), (7, 8), (9, 2)])
def test_placement(device, rank, local_size):
    assert ours_utils.placement(device, rank, local_size) == their_utils.placement(device, rank, local_size)


def test_storage_repr_in_gb():
    from torchrec.distributed.planner.types import Storage as TheirStorage

    for hbm, ddr in [(0, 0), (1536 * 1024**2, 3), (123456789012, 98765)]:
        assert ours_utils.storage_repr_in_gb(Storage(hbm=hbm, ddr=ddr)) == \
            their_utils.storage_repr_in_gb(TheirStorage(hbm=hbm, ddr=ddr))
    assert ours_utils.storage_repr_in_gb(None) == their_utils.storage_repr_in_gb(None)


@pytest.mark.parametrize("low,high,tolerance", [(0, 100, 1), (10, 10, 0), (0, 1000, 20), (5, 3, 1)])
@pytest.mark.parametrize("threshold", [-1, 0, 37, 500, 2000])
def test_binary_search_predicate_probes_the_same_values(low, high, tolerance, threshold):
    probes = []
    for module in (ours_utils, their_utils):
        search, seen, result = module.BinarySearchPredicate(low, high, tolerance), [], True
        for _ in range(100):
            value = search.next(result)
            if value is None:
                break
            seen.append(value)
            result = value <= threshold
        probes.append(seen)
    assert probes[0] == probes[1]
