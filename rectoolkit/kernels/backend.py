"""Which kernel backend is in use: fbgemm-gpu when it imports, pure torch otherwise.

Set RECTOOLKIT_DISABLE_FBGEMM=1 to run everything on the pure-torch path even where fbgemm is installed
(the test suite does this to check that both paths give the same numbers).
"""

from __future__ import annotations

import functools
import os


def fbgemm_disabled_by_env() -> bool:
    return os.environ.get("RECTOOLKIT_DISABLE_FBGEMM", "").strip().lower() in {"1", "true", "yes"}


@functools.lru_cache(maxsize=None)
def _fbgemm_imports() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
        import torch

        torch.ops.fbgemm.asynchronous_complete_cumsum  # the ops library really loaded
    except Exception:  # any failure to load (missing wheel, ABI mismatch) means: no fbgemm
        return False
    return True


def fbgemm_available() -> bool:
    """True when fbgemm-gpu's ops load and RECTOOLKIT_DISABLE_FBGEMM is not set."""
    return not fbgemm_disabled_by_env() and _fbgemm_imports()
