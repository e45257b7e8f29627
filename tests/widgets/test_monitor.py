"""TrainingMonitor on real local workers: live curves and progress, Stop really stops, errors show in the panel."""

import os
import time

import numpy as np
import pytest

from rectoolkit.widgets.monitor import TrainingMonitor

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _fake_training(ctx, steps, sleep_s):
    for step in range(1, steps + 1):
        ctx.report(step=step, loss=1.0 / step, auc=0.5 + 0.01 * step, samples_per_s=100.0 * (ctx.rank + 1),
                   comm_bytes_sent=step * (10 * ctx.rank + 20), memory_embedding_weights_bytes=600 + ctx.rank,
                   memory_embedding_optimizer_bytes=400, comm_wait_s=0.01 * step * (ctx.rank + 1),
                   elapsed_s=0.1 * step)
        time.sleep(sleep_s)
    return ctx.rank


def _failing(ctx):
    ctx.report(step=1, loss=1.0)
    raise RuntimeError(f"boom on rank {ctx.rank}")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_monitor_runs_to_the_end():
    monitor = TrainingMonitor(_fake_training, 2, 4, 0.0, total_steps=4, estimated_bytes=[25, 25],
                              estimated_memory=[1000, 1000])
    monitor.start()
    monitor.wait(60)
    assert monitor.results == [0, 1]
    assert monitor.progress.value == 4 and monitor.progress.bar_style == "success"
    curves = monitor.curves.data
    assert list(curves[0].y) == pytest.approx([1.0, 0.5, 1 / 3, 0.25])  # loss, mean over ranks
    assert list(curves[2].y) == pytest.approx([150.0] * 4)  # mean over ranks
    measured = monitor.bytes_figure.data[1]
    assert list(measured.y) == [20, 30]  # bytes counted since the start / steps
    assert list(monitor.memory_figure.data[1].y) == [1000, 1001]
    assert "finished" in monitor.status.value
    # waits: rank r waited 10 (r + 1) ms per step, out of 100 ms per step
    assert monitor.comm_wait.value == ("waiting on collectives: rank 0 10.0 ms/step (10% of the time) · "
                                       "rank 1 20.0 ms/step (20% of the time)")


def test_stop_button_stops_workers():
    monitor = TrainingMonitor(_fake_training, 2, 10_000, 0.05, total_steps=10_000)
    monitor.start_button.click()
    deadline = time.time() + 60
    while not monitor.history() and time.time() < deadline:
        time.sleep(0.1)
    pids = monitor.job.pids
    assert all(_alive(pid) for pid in pids)
    monitor.stop_button.click()
    monitor.wait(30)
    assert not any(_alive(pid) for pid in pids)
    assert "stopped" in monitor.status.value and monitor.progress.bar_style == "warning"
    assert monitor.start_button.disabled is False


def test_worker_error_shows_in_panel():
    """A finished job whose rank 1 raised: the panel shows the error (no processes needed for the widget logic)."""
    from rectoolkit.launch import WorkerError

    class FinishedJob:
        done, history, pids = True, [{"rank": 0, "step": 1, "loss": 1.0}], [1, 2]
        error = WorkerError(1, "RuntimeError", "boom on rank 1", "Traceback ...")

        def wait(self, timeout=None):
            raise self.error

    monitor = TrainingMonitor(_failing, 2)
    monitor.job = FinishedJob()
    monitor.refresh()
    assert monitor.progress.bar_style == "danger"
    assert "boom on rank 1" in monitor.status.value and "WorkerError" in monitor.status.value
    assert list(monitor.curves.data[0].y) == [1.0]


def test_start_failure_shows_in_panel():
    import threading

    monitor = TrainingMonitor(_failing, 1, threading.Lock())  # a lock cannot travel to a worker
    monitor.start()
    assert monitor.job is None and "could not start" in monitor.status.value
    assert monitor.start_button.disabled is False


def test_for_training_runs_the_recipe_beside_estimates():
    from rectoolkit.train import TrainConfig
    from rectoolkit.widgets import ExplorerSettings, for_training

    config = TrainConfig(workload="small3", steps=3, batch_size=32, max_rows=500, embedding_dim=8, report_every=3)
    monitor = for_training(config, 2, settings=ExplorerSettings(world_size=2, forced={"large_table": "row_wise"}))
    assert monitor.plan.plan["sparse_arch.embedding_bag_collection"]["large_table"].sharding_type == "row_wise"
    # adagrad keeps one fp32 accumulator per weight: estimated memory = 2 x weights, summed = all tables once
    assert monitor.estimated_memory.sum() == 2 * 4 * 8 * (500 + 500 + 500)
    monitor.start()
    monitor.wait(90)
    assert monitor.progress.bar_style == "success", monitor.status.value
    measured_memory = np.asarray(monitor.memory_figure.data[1].y, dtype=float)
    np.testing.assert_array_equal(measured_memory, monitor.estimated_memory)
    measured_bytes = np.asarray(monitor.bytes_figure.data[1].y, dtype=float)
    np.testing.assert_allclose(measured_bytes, monitor.estimated_bytes, rtol=0.2)  # random ids vs expected ids
    assert monitor.comm_wait.value.startswith("waiting on collectives: rank 0 ")  # the recipe's own waits
    assert sorted(r["rank"] for r in monitor.history() if "comm_wait_s" in r) == [0, 1]


def _slow_start(ctx, gate_path):
    deadline = time.time() + 60
    while not os.path.exists(gate_path) and time.time() < deadline:  # the test opens the gate
        time.sleep(0.05)
    ctx.report(step=1, loss=1.0)
    return ctx.rank


def test_panel_says_workers_are_starting_until_the_first_report(tmp_path):
    gate = tmp_path / "go"
    monitor = TrainingMonitor(_slow_start, 2, str(gate), total_steps=1)
    monitor.start()
    assert "starting 2 workers" in monitor.status.value  # at once, before any worker reported
    time.sleep(0.5)
    assert "starting 2 workers" in monitor.status.value and not monitor.history()
    gate.write_text("go")
    monitor.wait(60)
    assert monitor.results == [0, 1] and "finished" in monitor.status.value
