"""Driving JupyterLab from Playwright: open a notebook, run it, wait for the kernel, look for widget errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def open_notebook(page, lab_server, notebook_path: str, workspace: str) -> Path:
    """Copy a notebook (path relative to the repo) into Lab's scratch root, open it in its own workspace and
    wait for an idle kernel. Returns the copy's path."""
    from playwright.sync_api import expect

    base, token, root = lab_server
    copy = root / Path(notebook_path).name
    shutil.copyfile(ROOT / notebook_path, copy)
    page.goto(f"{base}/lab/workspaces/{workspace}/tree/{copy.name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    expect(page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"ipykernel\) \| Idle"))).to_be_visible(
        timeout=90_000)
    return copy


def run_all(page) -> None:
    """Run > Run All Cells, retried until the first prompt shows the cell ran (a click can be lost)."""
    prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    for _ in range(4):
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        try:
            page.wait_for_function(
                "el => !el.textContent.includes('[ ]')", arg=prompt.element_handle(), timeout=15_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError("Run All did not start the notebook")


def wait_until_idle(page, timeout_ms: int = 120_000) -> None:
    """Wait until no cell shows [*] and the kernel is idle."""
    from playwright.sync_api import expect

    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
        ".some(p => p.textContent.includes('[*]'))", timeout=timeout_ms)
    expect(page.locator(".jp-StatusBar-Widget").get_by_text(re.compile(r"ipykernel\) \| Idle"))).to_be_visible(
        timeout=timeout_ms)


def assert_no_widget_errors(page) -> None:
    text = page.locator(".jp-NotebookPanel").inner_text()
    for bad in ("Error displaying widget", "model not found", "Traceback (most recent call last)"):
        assert bad not in text, f"the notebook shows {bad!r}"


def assert_plotly_loaded_after_models_initialized(page) -> None:
    """The page's first plotly.js load (a main-thread task of seconds) waited until every rectoolkit model of the
    notebook had initialized: anywidget rejects a model that takes over 2 s (widgets/plotly_view.js)."""
    wait = page.evaluate("() => window.__rtkPlotlyLoadWait")
    assert wait is not None, "plotly.js was loaded without waiting for the page's models"
    assert wait["waiting"] <= 0, f"plotly.js was loaded with {wait['waiting']} rectoolkit models still initializing"


def run_new_cell(page, code: str, timeout_ms: int = 120_000) -> str:
    """Add a cell below the last one, type `code` (keep it free of brackets and quotes: the editor closes them
    itself), run it and return the text of its output."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    before = cells.count()
    page.keyboard.press("Escape")
    cells.last.locator(".jp-InputPrompt").click()  # selects the last cell (command mode)
    page.keyboard.press("b")
    page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length > {before}",
                           timeout=30_000)
    page.keyboard.press("Enter")
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    output = cells.nth(before).locator(".jp-OutputArea-output")
    output.first.wait_for(timeout=timeout_ms)
    wait_until_idle(page, timeout_ms)
    return output.first.inner_text()
