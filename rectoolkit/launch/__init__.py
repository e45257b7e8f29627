"""Run functions on spawned local workers with torch.distributed, stream their metrics, surface failures.

    import rectoolkit as rtk
    def work(ctx):
        ctx.report(step=0, rank=ctx.rank)
        return ctx.rank
    rtk.launch(work, 2)          # -> [0, 1]

The package is callable: `rectoolkit.launch(fn, 2)` is `rectoolkit.launch.launch(fn, 2)`.
"""

import sys
import types
from typing import Any, Callable, List

from rectoolkit.launch.context import WorkerContext
from rectoolkit.launch.errors import JobStopped, LaunchError, LaunchTimeout, WorkerError
from rectoolkit.launch.job import Job, default_backend, default_num_threads, launch, start
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


class CallableModule(types.ModuleType):
    """Lets the package itself be called: `rectoolkit.launch(fn, 2)` is `rectoolkit.launch.launch(fn, 2)`,
    while `rectoolkit.launch.start`, `import rectoolkit.launch as L` etc. keep working."""

    def __call__(self, fn: Callable[..., Any], world_size: int = 1, *args: Any, **kwargs: Any) -> List[Any]:
        return launch(fn, world_size, *args, **kwargs)


sys.modules[__name__].__class__ = CallableModule
