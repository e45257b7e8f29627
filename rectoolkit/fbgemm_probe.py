"""Is fbgemm-gpu usable here? The bottom layer of rectoolkit: it imports nothing of ours.

fbgemm-gpu is optional. `fbgemm_available()` is True when its ops load and the environment variable
RECTOOLKIT_DISABLE_FBGEMM is not set ("1", "true" or "yes" run everything on the pure-torch path even where fbgemm
is installed; the test suite does this to check that both paths give the same numbers). The variable is read at
every call, and the answer is kept per raw value, so callers on hot paths (jagged offsets: ~20 us) may ask
every time.

    >>> import os
    >>> os.environ[DISABLE_ENV] = "1"
    >>> fbgemm_available()
    False
    >>> del os.environ[DISABLE_ENV]
"""

from __future__ import annotations

import functools
import os
from typing import Dict, Optional

DISABLE_ENV = "RECTOOLKIT_DISABLE_FBGEMM"


@functools.lru_cache(maxsize=None)
def fbgemm_imports() -> bool:
    """True when fbgemm_gpu imports and its ops library really loaded (whatever the environment says)."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torch

        torch.ops.fbgemm.asynchronous_complete_cumsum  # the ops library really loaded
    except Exception:  # any failure to load (missing wheel, ABI mismatch) means: no fbgemm
        return False
    return True


def fbgemm_disabled_by_env(raw: Optional[str] = None) -> bool:
    raw = os.environ.get(DISABLE_ENV, "") if raw is None else raw
    return raw.strip().lower() in {"1", "true", "yes"}


_answer_by_raw_value: Dict[Optional[str], bool] = {}


def fbgemm_available() -> bool:
    """True when fbgemm-gpu's ops load and RECTOOLKIT_DISABLE_FBGEMM is not set."""
    raw = os.environ.get(DISABLE_ENV)
    answer = _answer_by_raw_value.get(raw)
    if answer is None:
        answer = _answer_by_raw_value[raw] = not fbgemm_disabled_by_env(raw or "") and fbgemm_imports()
    return answer
