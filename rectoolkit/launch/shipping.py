"""How a worker function travels to the workers: by value (cloudpickle), with its code's file names kept, and
the notebook cells' source lines beside it, so that a worker's traceback shows the cell's lines.

    >>> import pickle
    >>> def double(x):
    ...     return 2 * x
    >>> pickle.loads(dumps_keeping_file_names(double))(21)
    42
"""

from __future__ import annotations

import io
import linecache
import marshal
import os
import pickle
import types
from typing import Any, Dict

import cloudpickle


class FileNamePickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects keep their file names. cloudpickle 3.1.3 and later write every
    function's file as "<dynamic-code>", which leaves a worker's traceback without the notebook cell's lines
    (notebook_sources sends them under the cell's name). The workers run this same interpreter
    (sys.executable), so the code objects travel in marshal's format, file names included."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            return marshal.loads, (marshal.dumps(obj),)
        return super().reducer_override(obj)


def dumps_keeping_file_names(obj: Any) -> bytes:
    """`cloudpickle.dumps(obj)`, with the code objects' file names kept (see FileNamePickler)."""
    buffer = io.BytesIO()
    FileNamePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def notebook_sources(max_bytes: int = 4_000_000) -> Dict[str, tuple]:
    """Source lines the interpreter knows only in memory (notebook cells), so worker tracebacks show them."""
    sources, total = {}, 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) != 4 or os.path.exists(filename):
            continue
        size, _, lines, fullname = entry
        total += size
        if total > max_bytes:
            break
        sources[filename] = (size, None, lines, fullname)
    return sources
