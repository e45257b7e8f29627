"""TrainingMonitor: start a job on W local workers, watch loss / AUC / samples/s / NE / calibration live, stop it
for real.

The job is a `rectoolkit.launch` job: any worker function `fn(ctx, *args)` that calls `ctx.report(step=...,
loss=..., auc=..., samples_per_s=...)`, such as `rectoolkit.train.train`. Measured per-rank bytes and memory
(metrics named by `bytes_key` / `memory_key`; rectoolkit.train reports `comm_bytes_sent`, counted since the
start, and `memory_embedding_weights_bytes` + `memory_embedding_optimizer_bytes`) are drawn beside the
planner's estimates when given. The time each rank spent waiting on collectives (`comm_wait_s` and
`elapsed_s`, since the start, as rectoolkit.train reports them) shows under the status line, per step and as a
share of the time. `for_training(config, W)` sets all of this up for the DLRM recipe (through its train
pipeline unless `pipeline=False`).

    monitor = TrainingMonitor(train_fn, 2, config, total_steps=50,
                              estimated_bytes=report_bytes_per_rank, estimated_memory=report_memory_per_rank)
    monitor                      # Start / Stop buttons, progress bar, live curves
    monitor.start(); monitor.wait()
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import ipywidgets as w
import numpy as np

from rectoolkit.viz.training import measured_vs_estimated_traces, metrics_frame, training_curves_traces
from rectoolkit.widgets.live_figure import SPINNER, LazyFigure, LiveFigure, PaintProbe

REFRESH_S = 0.3


class TrainingMonitor(w.VBox):
    """A run panel for one training job on local workers.

    Args:
        fn: the worker function, called as fn(ctx, *args, **kwargs) on every rank.
        world_size: number of local worker processes.
        args, kwargs: passed to fn.
        total_steps: steps for the progress bar (the largest `step` reported counts).
        estimated_bytes / estimated_memory: per-rank estimates (e.g. from the planner's report).
        bytes_key / memory_key: metric name(s) holding the bytes a rank sent and the memory it holds (several
            names are added up).
        bytes_cumulative: the bytes metric counts since the start (divided by `step` to get bytes per step).
        wait_key: metric holding the seconds a rank waited on collectives since the start (with `elapsed_s`).
        launch_options: extra keyword arguments for `rectoolkit.launch.start` (timeout_s, backend, ...).
    """

    def __init__(self, fn: Callable[..., Any], world_size: int, *args: Any, kwargs: Optional[Mapping] = None,
                 total_steps: Optional[int] = None, estimated_bytes: Optional[Sequence[float]] = None,
                 estimated_memory: Optional[Sequence[float]] = None, bytes_key: str = "comm_bytes_sent",
                 memory_key: Union[str, Sequence[str]] = ("memory_embedding_weights_bytes",
                                                          "memory_embedding_optimizer_bytes"),
                 bytes_cumulative: bool = True, wait_key: str = "comm_wait_s",
                 launch_options: Optional[Mapping] = None,
                 title: str = "Training run") -> None:
        self.fn, self.world_size, self.args, self.kwargs = fn, world_size, args, dict(kwargs or {})
        self.total_steps = total_steps
        self.estimated_bytes = None if estimated_bytes is None else np.asarray(estimated_bytes, dtype=float)
        self.estimated_memory = None if estimated_memory is None else np.asarray(estimated_memory, dtype=float)
        self.bytes_key, self.memory_key, self.bytes_cumulative = bytes_key, memory_key, bytes_cumulative
        self.wait_key = wait_key
        self.launch_options = dict(launch_options or {})
        self.launch_options.setdefault("echo_output", False)
        self.job = None
        self.results: Optional[List[Any]] = None
        self._poller: Optional[threading.Thread] = None
        self._started_at = 0.0
        self._lock = threading.Lock()

        self.start_button = w.Button(description="Start", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=max(1, total_steps or 1), description="steps",
                                      bar_style="info")
        self.status = w.HTML(f"<b>{html.escape(title)}</b>: not started ({world_size} workers)")
        self.comm_wait = w.HTML("")  # per rank: time waiting on collectives
        self.start_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        traces, layout = training_curves_traces([], title="Loss, AUC, samples/s, NE and calibration")
        self.curves = LiveFigure(traces, layout)
        self.bytes_figure, self.memory_figure = LazyFigure(), LazyFigure()  # made when there is something to show
        # side by side, each chart at its own fixed width; they wrap under each other in a narrow notebook
        self.comparison = w.HBox([self.bytes_figure.container, self.memory_figure.container],
                                 layout=w.Layout(flex_flow="row wrap"))
        if estimated_bytes is not None or estimated_memory is not None:
            self._draw_comparison([])
        self._paint_probe = PaintProbe()  # says when a page shows the panel (first_paint_ms)
        self._displayed_at: Optional[float] = None
        super().__init__([w.HBox([self.start_button, self.stop_button, self.progress, self._paint_probe]),
                          self.status, self.comm_wait, self.curves.widget, self.comparison])

    def _repr_mimebundle_(self, **kwargs):
        if self._displayed_at is None:
            self._displayed_at = time.perf_counter()
        return super()._repr_mimebundle_(**kwargs)

    @property
    def first_paint_ms(self) -> Dict[str, Optional[float]]:
        """Milliseconds from the panel's first display to a page showing it: "panel" (its buttons and status,
        reported by a PaintProbe) and "curves" (the live figure drawn, reported by its PlotlyView); None until
        a page reports (or before the panel is displayed)."""
        def since_display(at: Optional[float]) -> Optional[float]:
            if at is None or self._displayed_at is None:
                return None
            return 1e3 * (at - self._displayed_at)

        return {"panel": since_display(self._paint_probe.painted_at),
                "curves": since_display(self.curves.widget.first_drawn_at)}

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the workers (no-op while a job runs). Errors starting the job show in the panel."""
        if self.job is not None and not self.job.done:
            return
        from rectoolkit.launch import start

        self.results = None
        self.progress.value = 0
        self.progress.bar_style = "info"
        try:
            self.job = start(self.fn, self.world_size, *self.args, kwargs=self.kwargs, **self.launch_options)
        except Exception as error:  # shown in the panel, not as a traceback
            self._show_error(f"could not start: {type(error).__name__}: {error}")
            return
        self.start_button.disabled, self.stop_button.disabled = True, False
        self._started_at = time.perf_counter()
        self._show_starting()
        self._poller = threading.Thread(target=self._poll, name="rectoolkit-monitor", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        """Stop every worker now (they are terminated, then killed) and show the final state."""
        if self.job is None:
            return
        self.stop_button.disabled = True
        self.job.stop()
        self.refresh()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the job is over and the panel shows its final state."""
        if self._poller is not None:
            self._poller.join(timeout)

    # ------------------------------------------------------------------ drawing

    def _poll(self) -> None:
        while self.job is not None and not self.job.done:
            self.refresh()
            time.sleep(REFRESH_S)
        self.refresh()

    def history(self) -> List[Dict[str, Any]]:
        return list(self.job.history) if self.job is not None else []

    def refresh(self) -> None:
        """Redraw curves, progress and comparisons from the metrics received so far."""
        with self._lock:
            records = self.history()
            frame = metrics_frame([r for r in records if "step" in r])
            traces, layout = training_curves_traces(frame, title="Loss, AUC, samples/s, NE and calibration")
            self.curves.show(traces, layout)
            if len(frame):
                last_step = int(frame["step"].max())
                self.progress.value = min(last_step, self.progress.max)
                if self.job is not None and not self.job.done:
                    self.status.value = (f"running on {self.world_size} workers (pids {self.job.pids}): "
                                         f"step {last_step}")
            elif self.job is not None and not self.job.done:
                self._show_starting()
            self._draw_comparison(records)
            waits = [self._latest_per_rank(records, key) for key in (self.wait_key, "step", "elapsed_s")]
            self.comm_wait.value = comm_wait_html(*waits) if all(v is not None for v in waits) else ""
            if self.job is not None and self.job.done:
                self._finish()

    def _show_starting(self) -> None:
        """Until the first report: the workers are starting (Python, torch and the process group take
        10-20 s on a busy machine), so the empty charts do not look broken."""
        waited = time.perf_counter() - self._started_at
        self.status.value = (f'<span class="rtk-starting" style="color:#b45309">{SPINNER}starting '
                             f"{self.world_size} workers (pids {self.job.pids}): {waited:.0f} s, waiting for the "
                             "first step (importing torch and joining the process group)</span>")

    def _latest_per_rank(self, records: List[Dict[str, Any]], key: Union[str, Sequence[str]],
                         per_step: bool = False) -> Optional[np.ndarray]:
        keys = [key] if isinstance(key, str) else list(key)
        values = np.full(self.world_size, np.nan)
        for record in records:
            if "rank" in record and all(k in record for k in keys):
                value = sum(_as_number(record[k]) for k in keys)
                if per_step:
                    value /= max(1, int(record.get("step", 1)))
                values[int(record["rank"])] = value
        return None if np.isnan(values).all() else np.nan_to_num(values)

    def _draw_comparison(self, records: List[Dict[str, Any]]) -> None:
        for key, estimate, live, quantity, per_step in (
                (self.bytes_key, self.estimated_bytes, self.bytes_figure, "bytes sent per step", self.bytes_cumulative),
                (self.memory_key, self.estimated_memory, self.memory_figure, "memory per rank", False)):
            measured = self._latest_per_rank(records, key, per_step)
            if measured is None and estimate is None:
                continue
            est = estimate if estimate is not None else np.zeros(self.world_size)
            meas = measured if measured is not None else np.zeros(self.world_size)
            traces, layout = measured_vs_estimated_traces(est, meas, quantity, "bytes")
            live.show(traces, layout)

    def _finish(self) -> None:
        job = self.job
        self.start_button.disabled, self.stop_button.disabled = False, True
        error = job.error
        if error is None:
            try:
                self.results = job.wait(0)
            except Exception as exc:  # e.g. an on_metrics callback error
                error = exc
        if error is None:
            self.progress.bar_style = "success"
            if self.total_steps:
                self.progress.value = self.progress.max
            self.status.value = f"finished: {len(job.history)} reports from {self.world_size} workers"
        elif type(error).__name__ == "JobStopped":
            self.progress.bar_style = "warning"
            self.status.value = f"stopped: {html.escape(str(error))}; no worker is left running"
        else:
            self._show_error(f"{type(error).__name__}: {error}")

    def _show_error(self, text: str) -> None:
        self.progress.bar_style = "danger"
        self.start_button.disabled, self.stop_button.disabled = False, True
        self.status.value = (f'<div style="color:#b91c1c; white-space:pre-wrap; font-family:monospace">'
                             f"{html.escape(text)}</div>")


def for_training(config: Any, world_size: int, settings: Any = None, pipeline: Optional[bool] = None,
                 **kwargs: Any) -> "TrainingMonitor":
    """A run panel for `rectoolkit.train.train(ctx, config)` on `world_size` local workers.

    The recipe's own model (its tables, capped by `config.max_rows`) is planned with the explorer's
    `settings` (an ExplorerSettings: objective, forced types, ranks per host; the device is "cpu" and the
    optimizer the recipe's fused Adagrad), unless `config.plan` is already set. The plan goes into the
    config, and the planner's estimates of bytes per step and embedding memory per rank are shown beside
    what the workers measure. `monitor.plan` and `monitor.report` hold them. `pipeline` overrides
    `config.pipeline` (True by default: TrainPipelineSparseDist; False: the plain loop).
    """
    import dataclasses

    import torch

    from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology, WorkloadStats
    from rectoolkit.train import build_model, make_tables, train
    from rectoolkit.viz.frames import total_matrix
    from rectoolkit.workloads import load_workload

    if pipeline is not None:
        config = dataclasses.replace(config, pipeline=bool(pipeline))
    tables, pooling_factors, dense_features, _ = make_tables(config)
    batch_size = config.batch_size or load_workload(config.workload).batch_size_per_rank
    model = build_model(config, tables, dense_features, fuse_embedding_optimizer=True, device=torch.device("meta"))
    local = getattr(settings, "local_world_size", world_size) if settings is not None else world_size
    local = local if local and world_size % local == 0 else world_size
    forced = {name: kind for name, kind in (getattr(settings, "forced", None) or {}).items()
              if name in {t.name for t in tables}}
    planner = EmbeddingShardingPlanner(
        Topology(world_size=world_size, compute_device="cpu", local_world_size=local, batch_size=batch_size),
        constraints={name: ParameterConstraints(sharding_types=[kind]) for name, kind in forced.items()},
        objective=getattr(settings, "objective", "time"), optimizer="adagrad",
        stats=WorkloadStats(pooling_factors=pooling_factors, batch_size=batch_size))
    if config.plan is None:
        plan = planner.plan(model)
        report = planner.report()
        config = dataclasses.replace(config, plan=plan)
    else:
        plan = config.plan
        report = planner.report(plan, tables=model)
    estimated_bytes = total_matrix({k: v.to_numpy() for k, v in report.traffic.items()}).sum(axis=1)
    estimated_memory = (report.memory["weights"] + report.memory["optimizer"]).to_numpy(dtype=float)
    kwargs.setdefault("total_steps", config.steps)
    kwargs.setdefault("title", f"Training {config.workload} on {world_size} workers")
    monitor = TrainingMonitor(train, world_size, config, estimated_bytes=estimated_bytes,
                              estimated_memory=estimated_memory, **kwargs)
    monitor.plan, monitor.report = plan, report
    return monitor


def comm_wait_html(wait_s: Sequence[float], steps: Sequence[float], elapsed_s: Sequence[float]) -> str:
    """One line: each rank's time waiting on collectives per step and as a share of its time (all since the start).

        >>> comm_wait_html([0.5, 0.2], [10, 10], [2.0, 2.0])
        'waiting on collectives: rank 0 50.0 ms/step (25% of the time) · rank 1 20.0 ms/step (10% of the time)'
    """
    parts = [f"rank {rank} {1000 * wait / max(step, 1):.1f} ms/step ({100 * wait / elapsed:.0f}% of the time)"
             if elapsed > 0 else f"rank {rank}: no time yet" for rank, (wait, step, elapsed)
             in enumerate(zip(wait_s, steps, elapsed_s))]
    return "waiting on collectives: " + " · ".join(parts)


def _as_number(value: Any) -> float:
    """A metric as one number: dicts of per-collective [W] vectors or [W, W] matrices are summed per rank."""
    if isinstance(value, Mapping):
        return float(sum(_as_number(v) for v in value.values()))
    array = np.asarray(value, dtype=float)
    return float(array.sum())
