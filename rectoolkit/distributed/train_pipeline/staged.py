"""TorchRec's StagedTrainPipeline: a list of stages, each a function of the previous stage's output, run for
successive batches at once; `progress()` returns the last stage's output for the oldest batch and the caller runs
the model on it. With stages [a, b, c], one progress() runs

    c on batch i+1,   b on batch i+2,   a on batch i+3 (read from the dataloader)

and returns c's output for batch i, computed during the previous progress(). The first progress() fills the
pipeline (a, b, c on batch 0; a, b on batch 1; a on batch 2). Once the dataloader has run out, the stages skip
(calling each stage's data_exhausted_callback) and progress() returns None after the last batch, as TorchRec's
does: `while (batch := pipeline.progress(dataloader_iter)) is not None: ...`.

Stages on CPU (stream None or a CPU stream) run in turn on the calling thread; a stage with a CUDA stream runs on
that stream, and the stage after it (or the compute stream, for the output) waits for it, as in TorchRec. The
order of the calls equals TorchRec 1.8's (tests/distributed/test_train_pipeline_staged.py runs both).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch

from rectoolkit.distributed.train_pipeline.pipeline_context import In
from rectoolkit.distributed.train_pipeline.pipeline_stage import PipelineStage, StageOut, is_cuda_stream
from rectoolkit.distributed.train_pipeline.sparse_dist import TrainPipeline

__all__ = ["StagedTrainPipeline"]

logger = logging.getLogger(__name__)

StageOutput = Tuple[Any, Optional[Any]]  # (what the stage returned, the CUDA event after it, or None)


class StagedTrainPipeline(TrainPipeline[In, Optional[StageOut]]):
    """TorchRec's StagedTrainPipeline: the stages of successive batches run together; `progress()` returns the
    last stage's output for the oldest batch (None once every batch has come out).

        >>> stages = [PipelineStage("double", lambda x: 2 * x, None), PipelineStage("add one", lambda x: x + 1, None)]
        >>> pipeline, batches = StagedTrainPipeline(stages), iter([torch.tensor(1), torch.tensor(2)])
        >>> [pipeline.progress(batches) for _ in range(3)]
        [tensor(3), tensor(5), None]

    Args (TorchRec's):
        pipeline_stages: the stages, first to last (a SparseDataDistUtil stage must be the last).
        debug_mode: log every stage run (logging, at INFO).
        compute_stream: the CUDA stream the caller runs the model on (default: the current one), which waits for
            the last stage; None or a CPU stream on CPU.
        on_flush_end: called once the pipeline has been flushed (see set_flush).
    """

    def __init__(self, pipeline_stages: List[PipelineStage], debug_mode: bool = False,
                 compute_stream: Optional[Any] = None, on_flush_end: Optional[Callable[[], None]] = None) -> None:
        if not pipeline_stages:
            raise ValueError("StagedTrainPipeline: give at least one PipelineStage")
        for stage in pipeline_stages:
            if not isinstance(stage, PipelineStage):
                raise TypeError(f"StagedTrainPipeline: a stage is a PipelineStage(name, runnable, stream), got a "
                                f"{type(stage).__name__}")
        self._pipeline_stages = list(pipeline_stages)
        self._debug_mode = debug_mode
        self._stage_outputs: List[Optional[StageOutput]] = [None] * len(pipeline_stages)
        self._initialized = False
        self._num_steps = 0
        self._dataloader_iter: Optional[Iterator[Any]] = None
        self._dataloader_exhausted = False
        first_stream = pipeline_stages[0].stream
        if compute_stream is None and is_cuda_stream(first_stream):
            compute_stream = torch.cuda.current_stream(first_stream.device)
        self._compute_stream = compute_stream
        self._flushing = False
        self.on_flush_end = on_flush_end

    @property
    def num_stages(self) -> int:
        return len(self._pipeline_stages)

    def _advance(self) -> Optional[StageOutput]:
        """Shift every batch one stage on: the oldest batch's output comes out."""
        out = self._stage_outputs[0]
        self._stage_outputs = self._stage_outputs[1:] + [None]
        return out

    def _next_batch(self, dataloader_iter: Iterator[Any]) -> Optional[Any]:
        """The next batch; None once the iterator has run out (a new iterator is read from its start) or while
        flushing."""
        if dataloader_iter is not self._dataloader_iter:
            self._dataloader_iter, self._dataloader_exhausted = dataloader_iter, False
        if self._dataloader_exhausted or self._flushing:
            return None
        batch = next(dataloader_iter, None)
        self._dataloader_exhausted = batch is None
        return batch

    def _run_stage(self, batch_offset: int, stage_index: int, dataloader_iter: Iterator[Any],
                   fill: bool = False) -> None:
        stage = self._pipeline_stages[stage_index]
        if stage_index == 0:
            inputs, event = self._next_batch(dataloader_iter), None
        else:
            inputs, event = self._stage_outputs[batch_offset]
        if self._debug_mode:
            logger.info("stage %d (%s) for batch %d%s", stage_index, stage.name, batch_offset + self._num_steps,
                        "" if inputs is not None else ": no batch, skipped")
        if inputs is not None:
            self._stage_outputs[batch_offset] = _run_on_stream(stage, inputs, event)
        else:
            self._stage_outputs[batch_offset] = (None, None)
            if stage.data_exhausted_callback is not None:
                stage.data_exhausted_callback()
        if fill and stage.fill_callback is not None:
            stage.fill_callback()

    def _fill_pipeline(self, dataloader_iter: Iterator[Any]) -> None:
        for batch_offset in range(self.num_stages):
            for stage_index in range(self.num_stages - batch_offset):
                self._run_stage(batch_offset, stage_index, dataloader_iter, fill=True)
        self._initialized = True

    def set_flush(self, flush: bool) -> None:
        """TorchRec's: while flushing, no batch is read; the batches in flight come out, then on_flush_end is
        called and the pipeline fills again."""
        self._flushing = flush

    def flush_end(self) -> None:
        self.set_flush(False)
        self._initialized = False
        if self.on_flush_end is not None:
            self.on_flush_end()

    def progress(self, dataloader_iter: Iterator[Any]) -> Optional[Any]:
        """Run every stage once (the last on the oldest batch in flight, the first on a new batch) and return the
        last stage's output for the batch before; None once the batches have run out."""
        if not hasattr(dataloader_iter, "__next__"):
            raise TypeError(f"StagedTrainPipeline.progress() takes an iterator, got a {type(dataloader_iter).__name__};"
                            " pass iter(dataloader) and keep passing the same one")
        if not self._initialized:
            self._fill_pipeline(dataloader_iter)
        output = self._advance()
        if output is None:
            return None
        self._num_steps += 1
        for stage_index in range(self.num_stages):
            self._run_stage(self.num_stages - 1 - stage_index, stage_index, dataloader_iter)
        out, event = output
        if event is not None:
            event.wait(self._compute_stream)
            out.record_stream(self._compute_stream)
        if out is None and self._flushing:
            self.flush_end()
            return self.progress(dataloader_iter)
        return out


def _run_on_stream(stage: PipelineStage, inputs: Any, event: Optional[Any]) -> StageOutput:
    """The stage's output for `inputs`; on a CUDA stream, after the previous stage's event, with its own event."""
    if not is_cuda_stream(stage.stream):
        return stage.runnable(inputs), None
    with torch.cuda.stream(stage.stream):
        if event is not None:
            event.wait(stage.stream)
            inputs.record_stream(stage.stream)
        output = stage.runnable(inputs)
        done = torch.cuda.Event()
        done.record(stage.stream)
    return output, done
