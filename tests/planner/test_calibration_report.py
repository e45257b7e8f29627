"""The calibration workers' report reaches the caller, and workers that end without one are named at once.

A calibration worker ends with os._exit (rectoolkit.planner.calibrate._worker). A multiprocessing Queue's put only
hands the item to a feeder thread, so a plain put followed by os._exit could lose the report: the caller then waited
out its whole timeout (600 s) for a calibration that had finished.
"""

from __future__ import annotations

import os

import pytest
import torch

from rectoolkit.planner.calibrate import CalibrationError, _report, _wait_for_result

PAYLOAD_FLOATS = 2_000_000  # a 16 MB report: far more than a pipe holds, so the feeder thread is mid-write at the exit


def _report_then_exit(results, seed: int) -> None:
    _report(results, ("ok", {"seed": seed, "values": [float(i) for i in range(PAYLOAD_FLOATS)]}))
    os._exit(0)


def _exit_without_report(results) -> None:
    os._exit(0)


def test_a_report_put_right_before_os_exit_arrives_whole():
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    proc = context.Process(target=_report_then_exit, args=(results, 7), daemon=True)
    proc.start()
    try:  # with a plain put before os._exit this report was lost every time (checked by hand)
        status, payload = _wait_for_result([proc], results, timeout_s=120.0)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert status == "ok" and payload["seed"] == 7
    assert len(payload["values"]) == PAYLOAD_FLOATS and payload["values"][-1] == PAYLOAD_FLOATS - 1


def test_workers_that_exit_cleanly_without_a_report_are_named_before_the_timeout():
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_exit_without_report, args=(results,), daemon=True) for _ in range(2)]
    for proc in procs:
        proc.start()
    try:
        with pytest.raises(CalibrationError, match="exited \\(code 0\\) without reporting"):
            _wait_for_result(procs, results, timeout_s=600.0)  # past the test's own limit: the error must come first
    finally:
        for proc in procs:
            proc.join(timeout=30)
