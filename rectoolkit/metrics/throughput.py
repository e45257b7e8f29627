"""Throughput (`torchrec.metrics.throughput.ThroughputMetric`): examples trained over all ranks per second,
measured from the steps' wall-clock times (`time.monotonic`), as TorchRec's.

Each update() is one step of batch_size examples on each of world_size ranks (no communication: every rank
counts the same steps). The first warmup_steps steps are counted but not timed. compute() returns TorchRec's
keys: `throughput-throughput|total_examples` and `|attempt_examples` (examples since the start and since this
process started; TorchRec saves only the first), and after the warm-up `|lifetime_throughput` (examples after
the warm-up over the time since), `|window_throughput` (the last window_seconds of steps) and
`|attempt_throughput`.

    >>> metric = ThroughputMetric(batch_size=512, world_size=4, window_seconds=100, warmup_steps=1)
    >>> metric.update()
    >>> {key: int(value) for key, value in metric.compute().items()}   # still warming up: no rate yet
    {'throughput-throughput|total_examples': 2048, 'throughput-throughput|attempt_examples': 2048}
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional

import torch
from torch import nn

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix, compose_metric_key

MAX_WINDOW_TS: int = 2 * 60 * 60  # seconds: a longer window is capped, as TorchRec's (its window stays fresh)

logger = logging.getLogger(__name__)


class ThroughputMetric(nn.Module):
    """Examples per second over all ranks (TorchRec's constructor; `batch_size_stages` is not implemented).

    Args:
        batch_size: examples per rank per step.
        world_size: ranks training together.
        window_seconds: the span of the window throughput (at least 1; capped at MAX_WINDOW_TS).
        warmup_steps: steps counted but not timed (at least 1).

    Its state_dict holds TorchRec's buffers: total_examples, warmup_examples, time_lapse_after_warmup.
    """

    _namespace = MetricNamespace.THROUGHPUT
    _metric_name = MetricName.THROUGHPUT

    def __init__(self, *, batch_size: int, world_size: int, window_seconds: int, warmup_steps: int = 100,
                 batch_size_stages: Optional[List[Any]] = None) -> None:
        super().__init__()
        if window_seconds < 1:
            raise ValueError(f"ThroughputMetric: window_seconds={window_seconds} must be at least 1")
        if warmup_steps < 1:
            raise ValueError(f"ThroughputMetric: warmup_steps={warmup_steps} must be at least 1")
        if batch_size_stages is not None:
            raise NotImplementedError(f"ThroughputMetric: batch_size_stages={batch_size_stages!r} is not "
                                      "implemented in rectoolkit; pass None (one batch size)")
        if window_seconds > MAX_WINDOW_TS:
            logger.warning(f"ThroughputMetric: window_seconds={window_seconds} is capped to {MAX_WINDOW_TS}")
            window_seconds = MAX_WINDOW_TS
        self._batch_size, self._world_size = batch_size, world_size
        self._window_seconds, self._warmup_steps = window_seconds, warmup_steps
        for name, dtype, persistent in (("total_examples", torch.long, True), ("warmup_examples", torch.long, True),
                                        ("time_lapse_after_warmup", torch.double, True),
                                        ("attempt_examples", torch.long, False),
                                        ("attempt_warmup_examples", torch.long, False),
                                        ("attempt_time_lapse_after_warmup", torch.double, False)):
            self.register_buffer(name, torch.tensor(0, dtype=dtype), persistent=persistent)
        self._window_time_lapse_buffer: Deque[float] = deque(maxlen=MAX_WINDOW_TS)  # seconds of each timed step
        self._window_time_lapse = 0.0
        self._previous_ts = 0.0
        self._steps = 0

    def _key(self, name: MetricName, prefix: MetricPrefix = MetricPrefix.DEFAULT) -> str:
        return compose_metric_key(self._namespace, str(self._namespace), name, prefix)

    def _batch_examples(self) -> int:
        return self._batch_size * self._world_size

    def update(self) -> None:
        """One step trained on every rank: count its examples and, after the warm-up, the time since the last."""
        now = time.monotonic()
        self._steps += 1
        examples = self._batch_examples()
        self.total_examples += examples
        self.attempt_examples += examples
        if self._steps <= self._warmup_steps:
            self.warmup_examples += examples
            self.attempt_warmup_examples += examples
            if self._steps == self._warmup_steps:
                self._previous_ts = now
            return
        time_lapse = now - self._previous_ts
        self.time_lapse_after_warmup += time_lapse
        self.attempt_time_lapse_after_warmup += time_lapse
        self._window_time_lapse += time_lapse
        self._window_time_lapse_buffer.append(time_lapse)
        while self._window_time_lapse > self._window_seconds:
            self._window_time_lapse -= self._window_time_lapse_buffer.popleft()
        self._previous_ts = now

    def compute(self) -> Dict[str, torch.Tensor]:
        """The example counts, and the rates once a timed step has passed (a rate of 0 is left out, as TorchRec)."""
        out = {self._key(MetricName.TOTAL_EXAMPLES): self.total_examples.clone(),
               self._key(MetricName.ATTEMPT_EXAMPLES): self.attempt_examples.clone()}
        if self._steps <= self._warmup_steps or math.isclose(self.time_lapse_after_warmup.item(), 0):
            return out
        lifetime = (self.total_examples - self.warmup_examples) / self.time_lapse_after_warmup
        attempt = (self.attempt_examples - self.attempt_warmup_examples) / self.attempt_time_lapse_after_warmup
        window = 0.0
        if not math.isclose(self._window_time_lapse, 0):
            window = len(self._window_time_lapse_buffer) * self._batch_examples() / self._window_time_lapse
        if not math.isclose(lifetime.item(), 0):
            out[self._key(self._metric_name, MetricPrefix.LIFETIME)] = lifetime.clone()
            out[self._key(self._metric_name, MetricPrefix.WINDOW)] = torch.tensor(window, dtype=torch.double)
        if not math.isclose(attempt.item(), 0):
            out[self._key(self._metric_name, MetricPrefix.ATTEMPT)] = attempt.clone()
        return out


__all__ = ["MAX_WINDOW_TS", "ThroughputMetric"]
