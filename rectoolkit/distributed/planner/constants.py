"""TorchRec's module path torchrec.distributed.planner.constants (a path module: re-exports only; see
rectoolkit.compat). TorchRec's planner constants, with its values, and kernel_bw_lookup; they live in
rectoolkit.planner.torchrec_constants, and rectoolkit's own cost model does not read them."""

from rectoolkit.planner.torchrec_constants import *  # noqa: F403
from rectoolkit.planner.torchrec_constants import __all__  # noqa: F401
