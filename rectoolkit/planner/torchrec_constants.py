"""TorchRec's planner constants (torchrec.distributed.planner.constants) with TorchRec's values, and its
`kernel_bw_lookup`, for code that reads them; path: rectoolkit.distributed.planner.constants.

rectoolkit's own planner does not use them: its cost model takes its terms from a calibration profile of the machine
at hand (rectoolkit.planner.profile, docs/cost_model.md). Bandwidths are in bytes per millisecond, as TorchRec's.

    >>> HBM_CAP // 1024**3, BATCH_SIZE
    (32, 512)
    >>> kernel_bw_lookup("cuda", "fused_uvm", HBM_MEM_BW, DDR_MEM_BW, HBM_TO_DDR_MEM_BW) == HBM_TO_DDR_MEM_BW / 10
    True
"""

from typing import Optional

GIB = 1024 * 1024 * 1024

MAX_SIZE: int = (1 << 63) - 1
INTRA_NODE_BANDWIDTH: float = 600 * GIB / 1000  # bytes/ms
CROSS_NODE_BANDWIDTH: float = 12.5 * GIB / 1000  # bytes/ms
MIN_CW_DIM: int = 128
POOLING_FACTOR: float = 1.0
NUM_POOLINGS: float = 1.0
BIGINT_DTYPE: int = 8
HBM_CAP: int = 32 * GIB
DDR_CAP: int = 128 * GIB
SSD_CAP: int = 2 * 1024 * GIB
DDR_MEM_BW: float = 51 * GIB / 1000  # bytes/ms
HBM_MEM_BW: float = 897 * GIB / 1000  # bytes/ms
SSD_MEM_BW: float = 100 * 1024 * 1024 / 1000  # bytes/ms
HBM_TO_DDR_MEM_BW: float = 32 * GIB / 1000  # bytes/ms
UVM_CACHING_RATIO: float = 0.2
KV_CACHING_RATIO: float = 0.2
BATCH_SIZE: int = 512
# TorchRec's empirical factors of its GPU kernels
BATCHED_COPY_PERF_FACTOR: float = 2.455
FULL_BLOCK_EMB_DIM: int = 128
HALF_BLOCK_PENALTY: float = 1.15
QUARTER_BLOCK_PENALTY: float = 1.75
BWD_COMPUTE_MULTIPLIER: float = 2
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER: float = 1
WEIGHTED_KERNEL_MULTIPLIER: float = 1.1
DP_ELEMENTWISE_KERNELS_PERF_FACTOR: float = 9.22
HUNDRED_GB = 100 * GIB
DEFAULT_PERF_ESTIMATOR: str = "default_estimator"

del GIB

__all__ = [name for name in dir() if name.isupper()] + ["kernel_bw_lookup"]


def kernel_bw_lookup(compute_device: str, compute_kernel: str, hbm_mem_bw: float, ddr_mem_bw: float,
                     hbm_to_ddr_mem_bw: float, caching_ratio: Optional[float] = None, prefetch_pipeline: bool = False,
                     ssd_mem_bw: float = SSD_MEM_BW) -> Optional[float]:
    """TorchRec's lookup bandwidth (bytes/ms) of a compute kernel on a device ("cpu", "mtia", "cuda"), from the
    memory bandwidths; None for a pair TorchRec has no value for. A UVM-caching kernel mixes HBM and the host link
    by `caching_ratio` (default UVM_CACHING_RATIO); with `prefetch_pipeline` on CUDA it counts as "fused"."""
    ratio = UVM_CACHING_RATIO if caching_ratio is None else caching_ratio
    if prefetch_pipeline and compute_device == "cuda" and compute_kernel == "fused_uvm_caching":
        compute_kernel = "fused"
    if compute_device in ("cpu", "mtia"):
        memory_bw = ddr_mem_bw if compute_device == "cpu" else hbm_mem_bw
        return {"dense": 0.5 * memory_bw, "fused": memory_bw, "quant": memory_bw}.get(compute_kernel)
    if compute_device != "cuda":
        return None
    uvm = hbm_to_ddr_mem_bw / 10
    uvm_caching = (ratio * hbm_mem_bw + (1 - ratio) * hbm_to_ddr_mem_bw) / 10
    return {"dense": 0.5 * hbm_mem_bw, "fused": hbm_mem_bw, "fused_triton": hbm_mem_bw, "fused_uvm": uvm,
            "fused_uvm_caching": uvm_caching, "quant": hbm_mem_bw, "quant_uvm": uvm, "quant_uvm_caching": uvm_caching,
            "key_value": ssd_mem_bw, "ssd_virtual_table": hbm_to_ddr_mem_bw, "dram_virtual_table": hbm_to_ddr_mem_bw,
            "dram_ssd_virtual_table": hbm_to_ddr_mem_bw}.get(compute_kernel)
