"""Values that cannot travel: a return value, a metric or an exception whose pickling (or unpickling in the
caller) raises, an Exception or a BaseException (KeyboardInterrupt, SystemExit, a class of the user's own). The
job must report it as that rank's error, with the hint that names the rank and the type, never as a dead
worker, a failed launcher or a hang."""

from __future__ import annotations

import pytest
import torch
from test_launch import _notebook_function

from rectoolkit.launch import WorkerError, launch
from rectoolkit.launch.context import WorkerContext

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

ODD_VALUES = """
    import os

    class Fatal(BaseException):
        pass

    RAISES = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit, "Fatal": Fatal,
              "ValueError": ValueError}

    class Odd:
        def __init__(self, raises):
            self.raises = raises
        def __reduce__(self):
            raise RAISES[self.raises]("no pickling for Odd")

    def work(ctx, raises):
        return Odd(raises) if ctx.rank == 1 else "plain"
"""


@pytest.mark.parametrize("raises", ["KeyboardInterrupt", "SystemExit", "Fatal", "ValueError"])
def test_a_return_value_whose_reduce_raises_anything_is_named_with_the_hint(raises):
    work = _notebook_function(ODD_VALUES, "work")
    with pytest.raises(WorkerError) as info:
        launch(work, 2, raises, echo_output=False)
    error = info.value
    assert error.rank == 1 and error.exc_type == "TypeError", str(error)
    assert "rank 1's return value of type Odd cannot be pickled back to the caller" in error.exc_message, str(error)
    assert f"{raises}: no pickling for Odd" in error.exc_message, error.exc_message
    assert "__reduce__" in error.traceback  # the original raise is kept, as the cause


def test_an_exception_whose_str_raises_a_base_exception_is_still_reported():
    work = _notebook_function("""
        class Unprintable(Exception):
            def __str__(self):
                raise KeyboardInterrupt("no text either")
            def __reduce__(self):
                raise KeyboardInterrupt("no pickling either")

        def work(ctx):
            if ctx.rank == 1:
                raise Unprintable()
            return "plain"
    """, "work")
    with pytest.raises(WorkerError) as info:
        launch(work, 2, echo_output=False)
    error = info.value
    assert error.rank == 1 and error.exc_type == "Unprintable", str(error)  # not a worker that died
    assert "str() of this Unprintable raised KeyboardInterrupt: no text either" in error.exc_message
    assert "raise Unprintable()" in error.traceback


def test_a_return_value_whose_unpickling_raises_a_base_exception_in_the_caller_is_that_ranks_error():
    work = _notebook_function("""
        import os
        CALLER = os.getpid()

        class Fatal(BaseException):
            pass

        def rebuild():
            if os.getpid() == CALLER:
                raise Fatal("cannot be rebuilt in the caller")
            return "rebuilt"

        class OnlyInWorkers:
            def __reduce__(self):
                return rebuild, ()

        def work(ctx):
            return OnlyInWorkers() if ctx.rank == 1 else "plain"
    """, "work")
    with pytest.raises(WorkerError) as info:  # not the LaunchError of a failed launch monitor
        launch(work, 2, echo_output=False)
    error = info.value
    assert error.rank == 1 and error.exc_type == "Fatal", str(error)
    assert "could not unpickle a message from rank 1" in error.exc_message, error.exc_message
    assert "Fatal: cannot be rebuilt in the caller" in error.exc_message, error.exc_message
    assert "cannot be pickled back to the caller" in error.exc_message, error.exc_message


def test_a_metric_whose_reduce_raises_a_base_exception_is_named_by_its_key():
    class Fatal(BaseException):
        pass

    class Odd:
        def __reduce__(self):
            raise Fatal("no pickling for Odd")

    import cloudpickle

    ctx = WorkerContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"),
                        backend="gloo", _send=lambda metrics: cloudpickle.dumps(metrics))
    with pytest.raises(TypeError, match=r"ctx.report: metric\(s\) \['odd'\] cannot be pickled .*Fatal"):
        ctx.report(step=2, odd=Odd())


def test_a_sharded_state_dict_returned_is_named_with_the_fix():
    """A sharded model's state_dict() holds ShardedTensors (TorchRec's): they pickle on the worker but cannot be
    unpickled in the caller (no process group there); the worker refuses them, naming the key and the fix."""
    work = _notebook_function("""
        import rectoolkit as rtk

        def work(ctx):
            from rectoolkit.distributed import DistributedModelParallel, full_state_dict

            ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4,
                                                                      feature_names=["f"])])
            shards = [rtk.ShardMetadata.on_rank(r, 5 * r, 0, 5, 4) for r in range(2)]
            plan = rtk.ShardingPlan({"": {"t": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=shards)}})
            dmp = DistributedModelParallel(ebc, plan=plan)
            whole = full_state_dict(dmp)
            return {"step": 3, "state": dmp.state_dict()} if ctx.rank == 1 else whole
    """, "work")
    with pytest.raises(WorkerError) as info:
        launch(work, 2, echo_output=False)
    error = info.value
    assert error.rank == 1 and error.exc_type == "TypeError", str(error)
    assert "rank 1: the return value['state']['embedding_bags.t.weight'] is a torch ShardedTensor" in \
        error.exc_message, error.exc_message
    assert "full_state_dict(model)" in error.exc_message, error.exc_message
