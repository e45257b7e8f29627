"""The run panel (TrainingMonitor) in real JupyterLab: a "starting workers" state before the first report,
then its two measured-vs-estimated charts side by side, neither covering the other, every rank's bars shown;
its first paint as its PaintProbe and its curves' PlotlyView report it to the kernel."""

import ast
import json
import re

import pytest

from lab_helpers import (assert_no_widget_errors, assert_plotly_loaded_after_models_initialized, open_notebook, run_all,
                         run_new_cell, wait_until_idle)

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess, pytest.mark.timeout(420)]


def _box(locator):
    box = locator.bounding_box()
    assert box is not None, "not on screen"
    return box


def _overlap(a, b):
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def test_run_panel_starts_visibly_and_compares_side_by_side(page, lab_server, artifacts):
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1400, "height": 1400})
    open_notebook(page, lab_server, "tests/browser/run_panel_check.ipynb", "run-panel-check")
    run_all(page)
    wait_until_idle(page)
    out = page.locator(".jp-OutputArea-output")
    charts = out.locator(".js-plotly-plot")
    expect(charts).to_have_count(3, timeout=60_000)  # the curves, then bytes and memory (estimates only)
    assert_plotly_loaded_after_models_initialized(page)

    out.get_by_role("button", name="Start").click()
    expect(out.locator(".rtk-starting")).to_contain_text("starting 2 workers", timeout=30_000)
    curves = charts.nth(0)
    expect(curves.locator(".annotation-text")).to_contain_text("no step reported yet")
    out.locator(".widget-vbox").first.screenshot(path=str(artifacts / "run_panel_starting.png"))

    expect(out.get_by_text(re.compile(r"finished: \d+ reports from 2 workers"))).to_be_visible(timeout=300_000)
    expect(out.locator(".rtk-starting")).to_have_count(0)
    expect(curves.locator(".annotation-text")).to_have_count(0)
    assert curves.locator(".scatterlayer .point").count() >= 3 * 6  # loss, AUC, samples/s at 6 reported steps
    bytes_chart, memory_chart = charts.nth(1), charts.nth(2)
    expect(bytes_chart.locator(".gtitle")).to_contain_text("bytes sent per step")
    expect(memory_chart.locator(".gtitle")).to_contain_text("memory per rank")
    # side by side: same row, no overlap; each chart's legend stays clear of its title
    first, second = _box(bytes_chart), _box(memory_chart)
    assert not _overlap(first, second), (first, second)
    assert abs(first["y"] - second["y"]) < 5 and second["x"] >= first["x"] + first["width"] - 1, (first, second)
    for chart in (bytes_chart, memory_chart):
        assert not _overlap(_box(chart.locator(".gtitle")), _box(chart.locator(".legend")))
        # two ranks x (estimated, measured): four bars, each with a height (rank 1's are not hidden)
        bars = chart.locator(".barlayer .point path")
        expect(bars).to_have_count(4)
        heights = [_box(bars.nth(i))["height"] for i in range(4)]
        assert min(heights) > 1, heights
        text = " ".join(t.strip() for t in chart.locator("svg text").all_text_contents())
        assert "iB" in text and not re.search(r"\d\.\d{5,}", text), text
    out.locator(".widget-vbox").first.screenshot(path=str(artifacts / "run_panel_finished.png"))
    # the page told the kernel when it showed the panel and drew its curves (the numbers go to the artifacts)
    first_paint = ast.literal_eval(run_new_cell(page, "monitor.first_paint_ms").strip())
    (artifacts / "run_panel_first_paint.json").write_text(json.dumps(first_paint))
    assert set(first_paint) == {"panel", "curves"}, first_paint
    assert all(isinstance(ms, float) and 0 < ms < 120_000 for ms in first_paint.values()), first_paint
    assert_no_widget_errors(page)
    errors = [m for m in page.console_messages if m.startswith("[pageerror]")]
    assert not errors, errors
