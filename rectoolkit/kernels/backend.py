"""Which kernel backend is in use: fbgemm-gpu when it imports, pure torch otherwise (rectoolkit.fbgemm_probe).

Set RECTOOLKIT_DISABLE_FBGEMM=1 to run everything on the pure-torch path even where fbgemm is installed.
"""

from rectoolkit.fbgemm_probe import fbgemm_available, fbgemm_disabled_by_env

__all__ = ["fbgemm_available", "fbgemm_disabled_by_env"]
