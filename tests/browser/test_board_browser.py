"""The placement board (our anywidget ES module) and a live plotly placement figure in real JupyterLab."""

import re

import pytest

from lab_helpers import assert_no_widget_errors, open_notebook, run_all, wait_until_idle

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def test_board_renders_moves_and_follows_kernel(page, lab_server, artifacts):
    from playwright.sync_api import expect

    open_notebook(page, lab_server, "tests/browser/board_check.ipynb", "board-check")
    run_all(page)
    wait_until_idle(page)
    out = page.locator(".jp-OutputArea-output")
    board = out.locator(".rtk-board")
    expect(board).to_have_count(1, timeout=60_000)
    expect(board.locator(".rtk-board-column")).to_have_count(2)
    expect(board.locator(".rtk-board-shard")).to_have_count(2 + 2 + 1)
    legend = out.locator(".js-plotly-plot .legendtext")
    expect(legend.filter(has_text="rank 1")).to_have_count(1, timeout=30_000)
    assert_no_widget_errors(page)
    board.screenshot(path=str(artifacts / "board_before.png"))

    # drag wide's first column block (rank 0) onto rank 1's column: the kernel hears the move
    shard = board.locator(".rtk-board-shard[data-shard='wide/0']")
    shard.drag_to(board.locator(".rtk-board-column[data-rank='1']"))
    label = out.locator(".widget-label", has_text="kernel sees wide")
    if "[1, 1]" not in (label.text_content() or ""):  # HTML5 drag can be flaky headless: click-to-move too
        shard.click()
        board.locator(".rtk-board-column[data-rank='1'] .rtk-board-column-head").click()
    expect(label).to_have_text("kernel sees wide on ranks [1, 1]", timeout=30_000)
    expect(board.locator(".rtk-board-column[data-rank='1'] .rtk-board-shard[data-shard='wide/0']")).to_have_count(1)
    expect(board.locator(".rtk-board-message")).to_contain_text("moved wide shard 0 to rank 1")

    # a forbidden move shows the reason on the board
    board.locator(".rtk-board-shard[data-shard='big/0']").click()
    board.locator(".rtk-board-column[data-rank='1'] .rtk-board-column-head").click()
    expect(board.locator(".rtk-board-message.rtk-error")).to_contain_text("one row block per rank")

    # change the world size in the kernel: the figure and the board redraw
    out.locator(".widget-dropdown select").select_option("4")
    expect(legend.filter(has_text=re.compile(r"^rank 3$"))).to_have_count(1, timeout=30_000)
    expect(board.locator(".rtk-board-column")).to_have_count(4, timeout=30_000)
    expect(label).to_have_text("kernel sees wide on ranks [0, 1]")
    page.screenshot(path=str(artifacts / "board_after.png"), full_page=True)
    assert_no_widget_errors(page)
    errors = [m for m in page.console_messages if m.startswith("[pageerror]")]
    assert not errors, errors
