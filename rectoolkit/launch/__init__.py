"""Run functions on spawned local workers with torch.distributed, stream their metrics, surface failures.

    import rectoolkit as rtk
    def work(ctx):
        ctx.report(step=0, rank=ctx.rank)
        return ctx.rank
    rtk.launch(work, 2)          # -> [0, 1]

The package is callable: `rectoolkit.launch(fn, 2)` is `rectoolkit.launch.launch(fn, 2)`.
"""

import sys

from rectoolkit.launch.context import WorkerContext
from rectoolkit.launch.errors import JobStopped, LaunchError, LaunchTimeout, WorkerError
from rectoolkit.launch.job import CallableModule, Job, default_backend, default_num_threads, launch, start
from rectoolkit.launch.torchrun import torchrun_context

__all__ = [
    "Job",
    "JobStopped",
    "LaunchError",
    "LaunchTimeout",
    "WorkerContext",
    "WorkerError",
    "default_backend",
    "default_num_threads",
    "launch",
    "start",
    "torchrun_context",
]

sys.modules[__name__].__class__ = CallableModule
