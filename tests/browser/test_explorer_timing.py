"""The explorer as a learner meets it in JupyterLab: how fast it paints, and that what it shows stays right.

Times are taken in the page (performance.now(), a MutationObserver and a requestAnimationFrame poll), from
just before the action to what the learner sees. The asserts have generous margins (the machine is
shared); the strict figures are written to test-artifacts/browser/explorer_timings.json and
benchmarks/bench_browser.py puts them in benchmarks/results/browser.md.
"""

import json
import os
import re
import time
from pathlib import Path

import pytest

from lab_helpers import assert_no_widget_errors, open_notebook, wait_until_idle

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SAVE_DIR = Path("/tmp/rtk-browser-check")

# Records, from the moment it is installed: the first and last DOM change under `root` (visible /
# settled), and the first time each target (selector, text) is on screen.
WATCH = """([rootSel, targets]) => {
  if (window.__rtkObs) window.__rtkObs.disconnect();
  const rec = {t0: performance.now(), first: null, last: null, hits: {}};
  window.__rtk = rec;
  const root = document.querySelector(rootSel) || document.body;
  const obs = new MutationObserver(() => {
    const t = performance.now();
    if (rec.first === null) rec.first = t;
    rec.last = t;
  });
  obs.observe(root, {subtree: true, childList: true, attributes: true, characterData: true});
  window.__rtkObs = obs;
  const tick = () => {
    for (const [name, sel, text] of targets) {
      if (rec.hits[name] !== undefined) continue;
      const seen = [...document.querySelectorAll(sel)].some(
        (e) => e.getClientRects().length > 0 && (!text || e.textContent.includes(text)));
      if (seen) rec.hits[name] = performance.now();
    }
    if (Object.keys(rec.hits).length < targets.length) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


PLACEMENT_PLOT = ".rtk-explorer .rtk-plotly-view.js-plotly-plot"  # the first: the Placement tab's placement
# The plot <div> marked before a change, as it is now: still the one on the page, and the traces it draws.
IN_PLACE = """(selector) => {
  const marked = window.__rtkPlacement;
  return {same: marked.isConnected && marked === document.querySelector(selector),
          names: marked.data.map((trace) => trace.name || "")};
}"""


def watch(page, targets, root=".rtk-explorer"):
    page.evaluate(WATCH, [root, [list(t) for t in targets]])


def measured(page, names, quiet_ms=1500, timeout_ms=120_000, record=None):
    """Wait for every target, then for `quiet_ms` without DOM changes; return ms since the action."""
    page.wait_for_function(f"() => window.__rtk && {json.dumps(list(names))}.every(n => n in window.__rtk.hits)",
                           timeout=timeout_ms)
    deadline = time.time() + 30
    while time.time() < deadline:
        idle = page.evaluate("() => performance.now() - (window.__rtk.last ?? window.__rtk.t0)")
        if idle >= quiet_ms:
            break
        page.wait_for_timeout(200)
    rec = page.evaluate("() => window.__rtk")
    result = {name: rec["hits"][name] - rec["t0"] for name in names}
    result["visible"] = (rec["first"] - rec["t0"]) if rec["first"] is not None else None
    result["settled"] = max([(rec["last"] or rec["t0"]) - rec["t0"]] + [result[n] for n in names])
    print(names, {k: round(v) if v is not None else None for k, v in result.items()}, flush=True)
    return result


def texts(locator):
    return [(t or "").strip() for t in locator.all_text_contents()]


def boxes_overlap(a, b):
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def visible_panel(out):
    return out.locator(".rtk-explorer .widget-tab-contents > *:visible")


def test_explorer_paints_fast_and_stays_consistent(page, lab_server, artifacts):
    from playwright.sync_api import expect

    timings = {}
    page.set_viewport_size({"width": 1400, "height": 1900})
    open_notebook(page, lab_server, "tests/browser/explorer_timing.ipynb", "explorer-timing")
    # cell 1 (imports) runs untimed; Shift+Enter leaves the cursor on cell 2
    page.locator(".jp-CodeCell .jp-InputArea-editor").first.click()
    page.keyboard.press("Shift+Enter")
    wait_until_idle(page)
    page.keyboard.press("Escape")

    # 1. the explorer appears, with its first figure drawn
    watch(page, [("explorer", ".rtk-explorer .rtk-status", "26 tables on 8 ranks"),
                 ("controls", ".rtk-explorer .widget-dropdown select", ""),
                 ("kernel done", ".jp-CodeCell .jp-InputPrompt", "[2]"),
                 ("figure", ".rtk-explorer .js-plotly-plot .gtitle", "Shard placement")], root="body")
    page.keyboard.press("Shift+Enter")
    timings["explorer appears"] = measured(page, ["kernel done", "controls", "explorer", "figure"])
    wait_until_idle(page)
    out = page.locator(".jp-OutputArea-output")
    explorer = out.locator(".rtk-explorer")
    explorer.screenshot(path=str(artifacts / "timing_explorer_first.png"))

    # 2. ranks per host 8, world size 4 then 6: ranks per host follows, a plan (no stale error), views agree
    world = explorer.locator(".widget-dropdown", has_text="world size").locator("select")
    per_host = explorer.locator(".widget-dropdown", has_text="ranks per host").locator("select")
    status = explorer.locator(".rtk-status")
    legend = explorer.locator(".js-plotly-plot .legendtext")
    assert page.evaluate("() => window.__rtkPlotlyFrom") == "jupyterlab"  # the copy Lab compiled with the page
    # the placement plot is updated in place (Plotly.react): the same <div> gets the new plan's data
    page.evaluate(f"() => {{ window.__rtkPlacement = document.querySelector({json.dumps(PLACEMENT_PLOT)}); }}")
    for size in ("4", "6"):
        watch(page, [("status", ".rtk-explorer .rtk-status", f"26 tables on {size} ranks")])
        world.select_option(size)
        timings[f"world size 8 -> {size}" if size == "4" else "world size 4 -> 6"] = measured(page, ["status"])
        expect(status).to_contain_text(f"26 tables on {size} ranks")
        expect(explorer.locator(".rtk-plan-error")).to_have_count(0)
        assert per_host.input_value() == size
        expect(legend.filter(has_text=re.compile(rf"^rank {int(size) - 1}$"))).to_have_count(1)
        expect(legend.filter(has_text=re.compile(rf"^rank {size}$"))).to_have_count(0)
        in_place = page.evaluate(IN_PLACE, PLACEMENT_PLOT)
        ranks = [f"rank {r}" for r in range(int(size))]
        assert in_place["same"] and [n for n in in_place["names"] if n.startswith("rank ")] == ranks, in_place
    world.select_option("8")
    expect(status).to_contain_text("26 tables on 8 ranks", timeout=60_000)

    # 3. each tab's first opening: its figure within a second (strict), readable
    tabs = explorer.locator(".widget-tab .lm-TabBar-tab")
    for tab, title in (("Memory", "Memory per rank"), ("Time", "Estimated step time"),
                       ("Communication", "Bytes per step")):
        watch(page, [("figure", ".rtk-explorer .js-plotly-plot .gtitle", title)])
        tabs.filter(has_text=tab).click()
        timings[f"open {tab} tab"] = measured(page, ["figure"])
        panel = visible_panel(out)
        figure = panel.locator(".js-plotly-plot").first
        expect(figure.locator(".gtitle")).to_contain_text(title)
        all_text = " ".join(texts(figure.locator("svg text")))
        assert not re.search(r"\d\.\d{5,}", all_text), f"{tab}: long raw numbers in {all_text[:300]}"
        assert not re.search(r"\d(\.\d+)?\s?[kMGT]B?\b", all_text), f"{tab}: SI units in {all_text[:300]}"
        title_box = figure.locator(".gtitle").bounding_box()
        legend_box = figure.locator(".legend").bounding_box() if figure.locator(".legend").count() else None
        assert legend_box is None or not boxes_overlap(title_box, legend_box), f"{tab}: legend over the title"
        if tab in ("Memory", "Communication"):
            assert "iB" in all_text, f"{tab}: no binary units in {all_text[:300]}"
        if tab == "Communication":  # 8 ranks: no text in the cells (the hover has the bytes)
            assert figure.locator(".hm text, .heatmaplayer text").count() == 0
        panel.screenshot(path=str(artifacts / f"timing_tab_{tab.lower()}.png"))

    # 4. a control change on an open figure: visible at once (busy state), settled soon after
    tabs.filter(has_text="Memory").click()
    optimizer = explorer.locator(".widget-dropdown", has_text="optimizer").locator("select")
    before = status.inner_text()
    watch(page, [("status", ".rtk-explorer .rtk-status", "")])
    optimizer.select_option("adam")
    page.wait_for_function("(before) => document.querySelector('.rtk-explorer .rtk-status').innerText !== before",
                           arg=before, timeout=60_000)
    timings["optimizer sgd -> adam (Memory tab)"] = measured(page, ["status"])
    expect(explorer.locator(".rtk-busy")).to_have_count(0)

    # 5. the board: 8 ranks wrap (no sideways overflow), colour = rank, a replica refuses with a message
    tabs.filter(has_text="Board").click()
    board = explorer.locator(".rtk-board")
    expect(board.locator(".rtk-board-column")).to_have_count(8, timeout=60_000)
    grid = board.locator(".rtk-board-grid")
    overflow = grid.evaluate("g => g.scrollWidth - g.clientWidth")
    assert overflow <= 1, f"the board overflows sideways by {overflow} px"
    replica = board.locator(".rtk-board-shard.rtk-fixed").first
    assert "replica" in replica.inner_text()
    replica.click()
    source = replica.locator("xpath=ancestor::div[contains(@class,'rtk-board-column')]").get_attribute("data-rank")
    board.locator(f".rtk-board-column[data-rank='{1 if source == '0' else 0}'] .rtk-board-column-head").click()
    message = board.locator(".rtk-board-message.rtk-error")
    expect(message).to_contain_text("DATA_PARALLEL", timeout=30_000)
    # the refusal stands above the columns (in view however many ranks wrap below), labels read on light colours
    assert message.bounding_box()["y"] < grid.bounding_box()["y"]
    light = board.locator(".rtk-board-column[data-rank='7'] .rtk-board-shard:not(.rtk-fixed)").first
    assert light.evaluate("b => getComputedStyle(b).color") == "rgb(17, 24, 39)"  # dark text on light green
    board.screenshot(path=str(artifacts / "timing_board_8_ranks.png"))
    # a drop re-prices the plan: the board says what moved, the explorer counts the hand move
    block = board.locator(".rtk-board-column[data-rank='0'] .rtk-board-shard:not(.rtk-fixed)").first
    moved, shard_id = block.get_attribute("data-table"), block.get_attribute("data-shard")
    watch(page, [("board says", ".rtk-board-message", f"moved {moved} shard {shard_id.rpartition('/')[2]} to rank 1"),
                 ("re-priced", ".rtk-explorer .widget-html", "1 hand move(s) on the board")])
    block.click()
    expect(board.locator(f".rtk-board-shard.rtk-selected[data-shard='{shard_id}']")).to_have_count(1)
    board.locator(".rtk-board-column[data-rank='1'] .rtk-board-column-head").click()
    timings["board move (Board tab)"] = measured(page, ["board says", "re-priced"])
    expect(board.locator(f".rtk-board-column[data-rank='1'] .rtk-board-shard[data-table='{moved}']")).to_have_count(1)
    watch(page, [("status", ".rtk-explorer .rtk-status", "26 tables on 32 ranks")])
    world.select_option("32")  # 32 ranks: the columns wrap into rows, nothing runs off sideways
    timings["world size 8 -> 32 (Board tab)"] = measured(page, ["status"])
    expect(board.locator(".rtk-board-column")).to_have_count(32, timeout=60_000)
    overflow = grid.evaluate("g => g.scrollWidth - g.clientWidth")
    assert overflow <= 1, f"the board overflows sideways by {overflow} px at 32 ranks"
    # many replicas per rank fold into one block per column, which refuses a move like a single replica
    groups = board.locator(".rtk-replica-group")
    expect(groups).to_have_count(32)
    assert board.locator(".rtk-board-shard.rtk-fixed").count() == 32
    assert re.fullmatch(r"\d+ replicas \(data parallel\)", groups.first.inner_text().strip())
    groups.first.click()
    board.locator(".rtk-board-column[data-rank='1'] .rtk-board-column-head").click()
    expect(message).to_contain_text("DATA_PARALLEL", timeout=30_000)
    board.screenshot(path=str(artifacts / "timing_board_32_ranks.png"))

    # 6. Save plan JSON writes where the message says, not into the served folder
    tabs.filter(has_text="Export").click()
    panel = visible_panel(out)
    panel.get_by_role("button", name="Save plan JSON").click()
    message = explorer.locator("code", has_text="plan.json")
    expect(message).to_contain_text(str(SAVE_DIR / "plan.json"), timeout=30_000)
    assert (SAVE_DIR / "plan.json").is_file()
    assert not list(lab_server[2].glob("*.json")), "a file landed in the served notebooks folder"

    assert_no_widget_errors(page)
    errors = [m for m in page.console_messages if m.startswith("[pageerror]")]
    assert not errors, errors
    timings["load average"] = os.getloadavg()
    (artifacts / "explorer_timings.json").write_text(json.dumps(timings, indent=1))
    # generous margins (the strict targets, 2 s / 1 s / 250 ms / 400 ms, are reported by the benchmark)
    assert timings["explorer appears"]["explorer"] < 20_000, timings
    for tab in ("Memory", "Time", "Communication"):
        assert timings[f"open {tab} tab"]["figure"] < 10_000, timings
    change = timings["optimizer sgd -> adam (Memory tab)"]
    assert change["visible"] < 3_000 and change["settled"] < 6_000, timings
    assert timings["board move (Board tab)"]["re-priced"] < 6_000, timings
