"""DataLoadingThread (rectoolkit.distributed.train_pipeline.utils): what get_next_batch() hands out (batches, None
at the end, the iterator's error once, retryable errors skipped) equals TorchRec 1.8's DataLoadingThread on the same
iterators; by hand: one batch read ahead and no more, the copy to the device, and no hang where TorchRec's would
(stop() while a batch is buffered or while the iterator blocks, an error in the copy).

Every call that could hang runs under `within(seconds)`: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, List

import pytest
import torch

from rectoolkit.distributed.train_pipeline import DataLoadingThread

TIMEOUT_S = 10.0


def within(function: Callable[[], Any], seconds: float = TIMEOUT_S) -> Any:
    """function(), failing the test if it takes longer than `seconds` (it is left running on a daemon thread)."""
    result: List[Any] = []
    error: List[BaseException] = []

    def run() -> None:
        try:
            result.append(function())
        except BaseException as raised:
            error.append(raised)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(function, '__name__', function)} hung for {seconds} s")
    if error:
        raise error[0]
    return result[0]


class Retryable(RuntimeError):
    is_retryable = True


class Items:
    """tensor([0]), tensor([1]), ... tensor([count - 1]); ValueError in place of item `fail_at`; a retryable error
    (itself, or as the cause of a plain one) in place of the items named (the loader skips those and reads on)."""

    def __init__(self, count: int, fail_at: int = -1, retry_at: int = -1, retry_by_cause_at: int = -1) -> None:
        self.count, self.fail_at, self.retry_at, self.retry_by_cause_at = count, fail_at, retry_at, retry_by_cause_at
        self.index = 0

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        index, self.index = self.index, self.index + 1
        if index >= self.count:
            raise StopIteration
        if index == self.fail_at:
            raise ValueError(f"bad record {index}")
        if index == self.retry_at:
            raise Retryable(f"flaky read {index}")
        if index == self.retry_by_cause_at:
            raise RuntimeError(f"flaky read {index}") from Retryable("cause")
        return torch.tensor([index])


def drain(loader_class, iterator: Iterator[Any], calls: int, none_throws: bool = False) -> List[Any]:
    """What `calls` get_next_batch() calls give: ("batch", value), ("error", type name, message), "None" or
    "StopIteration"."""
    loader = loader_class(torch.device("cpu"), iterator, False)
    loader.start()
    outcomes: List[Any] = []
    for _ in range(calls):
        try:
            batch = within(lambda: loader.get_next_batch(none_throws))
            outcomes.append("None" if batch is None else ("batch", batch.tolist()))
        except StopIteration:
            outcomes.append("StopIteration")
        except Exception as error:
            outcomes.append(("error", type(error).__name__, str(error)))
    loader.stop()
    return outcomes


CASES = {
    "runs out": dict(count=3),
    "empty": dict(count=0),
    "error": dict(count=5, fail_at=2),
    "error first": dict(count=5, fail_at=0),
    "retryable skipped": dict(count=4, retry_at=1),
    "retryable cause skipped": dict(count=4, retry_by_cause_at=2),
}


@pytest.mark.parametrize("none_throws", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_batches_none_and_errors_are_handed_out_as_by_hand(case, none_throws):
    count, fail_at = CASES[case]["count"], CASES[case].get("fail_at", -1)
    skipped = {CASES[case].get("retry_at", -1), CASES[case].get("retry_by_cause_at", -1)}
    end = "StopIteration" if none_throws else "None"
    if fail_at >= 0:
        expected = [("batch", [i]) for i in range(fail_at)] + [("error", "ValueError", f"bad record {fail_at}")]
    else:
        expected = [("batch", [i]) for i in range(count) if i not in skipped]
    expected += [end] * (count + 2 - len(expected))
    assert drain(DataLoadingThread, Items(**CASES[case]), count + 2, none_throws) == expected


@pytest.mark.torchrec
@pytest.mark.parametrize("case", list(CASES))
def test_the_batches_none_and_errors_equal_torchrecs(case):
    pytest.importorskip("torchrec")
    from torchrec.distributed.train_pipeline import DataLoadingThread as TheirDataLoadingThread

    calls = CASES[case]["count"] + 2
    for none_throws in (False, True):
        assert (drain(DataLoadingThread, Items(**CASES[case]), calls, none_throws)
                == drain(TheirDataLoadingThread, Items(**CASES[case]), calls, none_throws))


class Counted:
    """An iterator of tensors that counts the reads; `gate` (when given) makes each read wait for it."""

    def __init__(self, count: int, gate: threading.Event = None) -> None:
        self.reads, self.count, self.gate = 0, count, gate

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        if self.gate is not None:
            self.gate.wait()
        if self.reads == self.count:
            raise StopIteration
        self.reads += 1
        return torch.tensor([self.reads - 1])


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "the loader never got there"
        time.sleep(0.005)


def test_one_batch_is_read_ahead_and_no_more():
    source = Counted(5)
    loader = DataLoadingThread(torch.device("cpu"), source, to_device_non_blocking=False)
    assert loader.daemon and loader.name == "DataLoadingThread"
    loader.start()
    wait_until(lambda: source.reads == 1)  # batch 0 buffered before anyone asks
    for index in range(3):
        assert within(loader.get_next_batch).tolist() == [index]
        wait_until(lambda: source.reads == index + 2)  # the next one is read while the caller trains
        time.sleep(0.02)
        assert source.reads == index + 2  # ... and only that one
    loader.stop()


def test_each_batch_is_copied_with_the_device_and_non_blocking_given():
    class Batch:
        def __init__(self, value):
            self.value, self.copies = value, []

        def to(self, device, non_blocking):
            self.copies.append((device, non_blocking))
            return self

    batches = [Batch(0), Batch(1)]
    loader = DataLoadingThread(torch.device("cpu"), iter(batches), True)
    loader.start()
    assert [within(loader.get_next_batch).value for _ in batches] == [0, 1]
    assert within(loader.get_next_batch) is None
    assert [batch.copies for batch in batches] == [[(torch.device("cpu"), True)]] * 2


def test_stop_returns_at_once_while_the_iterator_blocks_and_the_thread_ends_after_that_read():
    gate = threading.Event()
    source = Counted(5, gate)
    loader = DataLoadingThread(torch.device("cpu"), source, False)
    loader.start()
    within(loader.stop, 1.0)  # the thread is inside next(), waiting for the gate
    assert within(loader.get_next_batch) is None
    gate.set()
    loader.join(TIMEOUT_S)
    assert not loader.is_alive() and source.reads <= 1


def test_stop_with_a_batch_buffered_hands_it_out_then_none_without_hanging():
    # (TorchRec's hangs here: its get_next_batch() clears its "filled" event after handing out that batch, and its
    # thread, ended, never sets it again)
    source = Counted(5)
    loader = DataLoadingThread(torch.device("cpu"), source, False)
    loader.start()
    wait_until(lambda: loader._buffered is not None)
    loader.stop()
    wait_until(lambda: not loader.is_alive())
    assert within(loader.get_next_batch).tolist() == [0]
    assert within(loader.get_next_batch) is None
    assert within(loader.get_next_batch) is None


def test_an_error_in_the_copy_is_raised_to_the_caller():
    class Unmovable:
        def to(self, device, non_blocking):
            raise RuntimeError("cannot copy this batch")

    loader = DataLoadingThread(torch.device("cpu"), iter([Unmovable()]), False)
    loader.start()
    with pytest.raises(RuntimeError, match="cannot copy this batch"):
        within(loader.get_next_batch)
    assert within(loader.get_next_batch) is None


def test_misuse_is_refused_with_the_fix():
    loader = DataLoadingThread(torch.device("cpu"), iter([torch.ones(1)]), False)
    with pytest.raises(RuntimeError, match="call start"):
        loader.get_next_batch()
    with pytest.raises(TypeError, match="iter"):
        DataLoadingThread(torch.device("cpu"), [torch.ones(1)], False)

    class CudaStream:
        device = torch.device("cuda", 0)

    with pytest.raises(ValueError, match="memcpy_stream"):
        DataLoadingThread(torch.device("cpu"), iter([]), False, memcpy_stream=CudaStream())
