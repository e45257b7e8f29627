"""TorchRec's torchrec.distributed.train_pipeline.utils, the part that is public: DataLoadingThread, a thread that
reads the next batch from a dataloader iterator (and copies it to the device) while the caller trains on this one.

    loader = DataLoadingThread(device, iter(dataloader), to_device_non_blocking=True)
    loader.start()
    while (batch := loader.get_next_batch()) is not None:   # None once the dataloader has run out
        train_step(batch)                                    # batch i+1 is read meanwhile
    loader.stop()

One batch is buffered: the thread reads batch i+1 as soon as get_next_batch() has handed out batch i. An error
the iterator raises comes out of get_next_batch() (once; None after it, the thread has ended), except one whose
`is_retryable` (or its `__cause__`'s) is true: that batch is skipped, as TorchRec does. `stop()` never waits:
the thread ends after the `next()` it is in, if any.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Generic, Iterator, Optional

import torch

from rectoolkit.distributed.train_pipeline.batch_fields import tensors_of
from rectoolkit.distributed.train_pipeline.pipeline_context import In

__all__ = ["DataLoadingThread"]

logger = logging.getLogger(__name__)


class DataLoadingThread(threading.Thread, Generic[In]):
    """TorchRec's DataLoadingThread (see the module docstring): a daemon thread buffering the next batch.

        >>> loader = DataLoadingThread(torch.device("cpu"), iter([torch.ones(2), torch.zeros(2)]), False)
        >>> loader.start()
        >>> loader.get_next_batch(), loader.get_next_batch(), loader.get_next_batch()
        (tensor([1., 1.]), tensor([0., 0.]), None)
        >>> loader.get_next_batch(none_throws=True)
        Traceback (most recent call last):
        ...
        StopIteration
        >>> loader.stop()

    Args (TorchRec's):
        device: where each batch is copied (`batch.to(device, non_blocking=to_device_non_blocking)`).
        dataloader_iter: the iterator the batches come from.
        to_device_non_blocking: the copy's `non_blocking`.
        memcpy_stream_priority: on CUDA, the priority of the stream the thread creates for the copies.
        memcpy_stream: on CUDA, the stream of the copies (default: one created with that priority); on CPU None
            (there are no copies to overlap). get_next_batch() makes the current stream wait for the copy (TorchRec
            leaves that to the caller).
    """

    def __init__(self, device: torch.device, dataloader_iter: Iterator[In], to_device_non_blocking: bool,
                 memcpy_stream_priority: int = 0, memcpy_stream: Optional[Any] = None) -> None:
        super().__init__(name="DataLoadingThread", daemon=True)  # the interpreter does not wait for it at exit
        if not hasattr(dataloader_iter, "__next__"):
            raise TypeError(f"DataLoadingThread: dataloader_iter must be an iterator, got a "
                            f"{type(dataloader_iter).__name__}; pass iter(dataloader)")
        self._device = torch.device(device)
        if self._device.type == "cuda":
            self._memcpy_stream = memcpy_stream if memcpy_stream is not None else torch.cuda.Stream(
                self._device, priority=memcpy_stream_priority)
        elif memcpy_stream is not None and torch.device(getattr(memcpy_stream, "device", "cpu")).type != "cpu":
            raise ValueError(f"DataLoadingThread: memcpy_stream is on {memcpy_stream.device} but device is "
                             f"{self._device}; give a stream of the device, or None")
        else:
            self._memcpy_stream = None  # on CPU there is no copy to overlap (TorchRec makes no stream there either)
        self._dataloader_iter = dataloader_iter
        self._to_device_non_blocking = to_device_non_blocking
        self._stop_requested = False
        self._buffer_empty_event = threading.Event()
        self._buffer_filled_event = threading.Event()
        self._buffer_empty_event.set()
        self._buffered: Optional[In] = None
        self._exception: Optional[BaseException] = None

    def run(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)  # the device of the main thread
        try:
            while not self._stop_requested:
                self._buffer_empty_event.wait()
                if self._stop_requested:
                    return
                batch = self._load()
                if batch is None:
                    return
                self._buffered = batch
                self._buffer_empty_event.clear()
                self._buffer_filled_event.set()
        finally:  # every way out unblocks get_next_batch(), which then hands out None or the error
            self._stop_requested = True
            self._buffer_filled_event.set()

    def _load(self) -> Optional[In]:
        """The next batch on the device; None when the thread is to end (the iterator ran out or raised)."""
        while True:
            try:
                batch = next(self._dataloader_iter)
            except StopIteration:
                return None
            except BaseException as error:  # handed to the caller by get_next_batch()
                if _is_retryable(error):
                    logger.warning("DataLoadingThread: retryable error in data loading, batch skipped: %s: %s",
                                   type(error).__name__, error)
                    continue
                self._exception = error
                return None
            try:
                if self._memcpy_stream is None:
                    return batch.to(self._device, non_blocking=self._to_device_non_blocking)
                with torch.cuda.stream(self._memcpy_stream):
                    return batch.to(self._device, non_blocking=self._to_device_non_blocking)
            except BaseException as error:
                self._exception = error
                return None

    def stop(self) -> None:
        """End the thread after what it is doing now; get_next_batch() then returns the batch buffered, if any,
        and None. Returns at once."""
        self._stop_requested = True
        self._buffer_filled_event.set()
        self._buffer_empty_event.set()

    def get_next_batch(self, none_throws: bool = False) -> Optional[In]:
        """The next batch, waiting for it if it is not loaded yet; None (none_throws: StopIteration) once the
        iterator has run out or stop() was called. An error of the iterator (or of the copy) is raised here, once.
        Call it from one thread (the training loop)."""
        if self.ident is None:
            raise RuntimeError("DataLoadingThread.get_next_batch(): the thread was not started; call start() first")
        self._buffer_filled_event.wait()
        if self._exception is not None:
            error, self._exception = self._exception, None
            raise error
        batch = self._buffered
        if batch is None:
            if none_throws:
                raise StopIteration
            return None
        self._buffered = None
        if not self._stop_requested:
            self._buffer_filled_event.clear()
            self._buffer_empty_event.set()
        wait_for_copy(batch, self._memcpy_stream, self._device)
        return batch


def wait_for_copy(batch: Any, memcpy_stream: Optional[Any], device: torch.device) -> None:
    """On CUDA: the current stream waits for the copy of `batch` made on `memcpy_stream`, and the batch's tensors
    are marked as used there (the allocator then keeps them until that stream is done). Nothing to do without a
    stream."""
    if memcpy_stream is None:
        return
    current = torch.cuda.current_stream(device)
    current.wait_stream(memcpy_stream)
    for tensor in tensors_of(batch):
        tensor.record_stream(current)


def _is_retryable(error: BaseException) -> bool:
    """TorchRec's rule: an error (or its cause) with a true `is_retryable` attribute skips the batch."""
    if hasattr(error, "is_retryable"):
        return bool(error.is_retryable)
    return bool(getattr(error.__cause__, "is_retryable", False))
