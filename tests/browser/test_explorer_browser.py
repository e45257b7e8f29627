"""The PlanExplorer in real JupyterLab: renders (with plotly.js sent by the kernel), re-plans on a control change,
board drags, errors in-widget."""

import re

import pytest

from lab_helpers import (assert_no_widget_errors, assert_plotly_loaded_after_models_initialized, open_notebook, run_all,
                         wait_until_idle)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_explorer_renders_and_replans(page, lab_server, artifacts):
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1400, "height": 1900})  # room for the whole widget in the pictures
    open_notebook(page, lab_server, "tests/browser/explorer_check.ipynb", "explorer-check")
    # as on a page without JupyterLab's plotly renderer (VS Code, Voila): plotly.js comes from the kernel
    page.evaluate("() => { delete window._JUPYTERLAB['jupyterlab-plotly']; }")
    run_all(page)
    wait_until_idle(page)
    out = page.locator(".jp-OutputArea-output")
    status = out.locator(".rtk-status")
    expect(status).to_contain_text("26 tables on 8 ranks", timeout=60_000)
    placement = out.locator(".js-plotly-plot").first
    legend = placement.locator(".legendtext")
    expect(legend.filter(has_text=re.compile(r"^rank 7$"))).to_have_count(1, timeout=60_000)
    expect(placement.locator(".gtitle")).to_contain_text("Shard placement")
    assert page.evaluate("() => window.__rtkPlotlyFrom") == "kernel"
    assert_no_widget_errors(page)
    assert_plotly_loaded_after_models_initialized(page)
    page.wait_for_timeout(500)  # let plotly finish its transitions before the pictures
    explorer = out.locator(".rtk-explorer")
    explorer.screenshot(path=str(artifacts / "explorer_8_ranks.png"))

    # a control change in the browser: the kernel re-plans and the chart redraws with 4 ranks
    world = out.locator(".widget-dropdown", has_text="world size").locator("select")
    world.select_option("4")
    expect(status).to_contain_text("26 tables on 4 ranks", timeout=60_000)
    expect(legend.filter(has_text=re.compile(r"^rank 7$"))).to_have_count(0, timeout=30_000)
    expect(legend.filter(has_text=re.compile(r"^rank 3$"))).to_have_count(1)
    page.wait_for_timeout(500)
    explorer.screenshot(path=str(artifacts / "explorer_4_ranks.png"))

    # the placement board tab: 4 rank columns; moving a table-wise shard re-prices the edited plan
    out.locator(".widget-tab .lm-TabBar-tab", has_text="Board").click()
    board = out.locator(".rtk-board")
    expect(board.locator(".rtk-board-column")).to_have_count(4, timeout=30_000)
    shard_id = board.locator(".rtk-board-shard:not(.rtk-fixed)").first.get_attribute("data-shard")
    # that shard by its id from here on: `.first` is looked up again at each use, and a board drawn again in between
    # (its traits arrive one by one) can put another shard first, which the clicks would then move
    shard = board.locator(f".rtk-board-shard[data-shard='{shard_id}']")
    source = shard.locator("xpath=ancestor::div[contains(@class,'rtk-board-column')]").get_attribute("data-rank")
    target = "0" if source != "0" else "1"
    shard.click()
    board.locator(f".rtk-board-column[data-rank='{target}'] .rtk-board-column-head").click()
    expect(status).to_contain_text("by hand", timeout=30_000)
    expect(board.locator(f".rtk-board-column[data-rank='{target}'] .rtk-board-shard[data-shard='{shard_id}']")
           ).to_have_count(1, timeout=30_000)
    board.screenshot(path=str(artifacts / "explorer_board.png"))

    # a plan that cannot fit: the planner's explanation shows inside the widget, not a traceback
    out.locator(".widget-dropdown", has_text="device").locator("select").select_option("cpu")
    memory = out.locator(".widget-text", has_text="memory per rank").locator("input")
    memory.fill("0.001")
    memory.press("Enter")
    error = out.locator(".rtk-plan-error")
    expect(error).to_contain_text("do not fit", timeout=60_000)
    assert_no_widget_errors(page)
    explorer.screenshot(path=str(artifacts / "explorer_error.png"))
    # without a plan the views say so instead of showing the last plan; a plan that fits brings them back
    out.locator(".widget-tab .lm-TabBar-tab", has_text="Placement").click()
    note = out.locator(".rtk-figure-note")
    expect(note.first).to_contain_text("No plan", timeout=30_000)
    expect(placement.locator(".gtitle")).to_have_count(0)
    memory.fill("16")
    memory.press("Enter")
    expect(status).to_contain_text("26 tables on 4 ranks", timeout=60_000)
    expect(note).to_have_count(0, timeout=30_000)
    expect(out.locator(".js-plotly-plot .gtitle", has_text="Shard placement")).to_have_count(1, timeout=30_000)
    errors = [m for m in page.console_messages if m.startswith("[pageerror]")]
    assert not errors, errors
