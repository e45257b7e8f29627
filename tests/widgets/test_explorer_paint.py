"""First paint of the explorer: shown at once with placeholders, its figures sent right after the display."""

import asyncio
import concurrent.futures

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet

pytestmark = pytest.mark.timeout(120)


def _explorer():
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=16,
                                 feature_names=[f"f{i}"]) for i in range(3)]
    return PlanExplorer(TableSet(tables, {f"f{i}": 2.0 for i in range(3)}, batch_size=32), world_size=2,
                        memory_per_rank_gib=1.0, compute_device="cuda")


def _shows_placeholder(lazy):
    return lazy.container.children == (lazy.placeholder,)


def _display_in_a_kernel(explorer, page_paints: bool, fallback_wait_s: float = 0.0):
    """Display the explorer as ipykernel does (the cell runs on a running event loop), then let the loop run
    on: with `page_paints` the probe's view sends "painted" (what widgets/paint_probe.js does in a browser).
    Returns the bundle and whether the figures showed placeholders before and after."""
    placement, rank_table = explorer.placement_fig, explorer.rank_table_fig

    def held():
        return _shows_placeholder(placement) and _shows_placeholder(rank_table)

    async def run():
        bundle = explorer._repr_mimebundle_()
        before = held()
        await asyncio.sleep(0.05)  # the cell is over; nothing released without a paint
        between = held()
        if page_paints:
            explorer._paint_probe._handle_custom_msg({"event": "painted"}, [])
        await asyncio.sleep(fallback_wait_s)
        return bundle, before, between, held()

    # On a thread of its own: the kernel's loop is the only one running there (in the whole suite, the browser
    # tests' session-wide sync Playwright keeps an event loop running on the main thread).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result(timeout=60)


def test_first_display_paints_placeholders_then_the_figures_follow_the_page():
    explorer = _explorer()
    placement, rank_table = explorer.placement_fig, explorer.rank_table_fig
    assert not _shows_placeholder(placement) and not _shows_placeholder(rank_table)  # drawn for Python users
    bundle, before, between, after = _display_in_a_kernel(explorer, page_paints=True)
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert before and between and not after
    assert placement.container.children == (placement.widget,)
    assert rank_table.container.children == (rank_table.widget,)
    # the figures stayed current in Python while the page showed their placeholders
    assert [t.name for t in placement.data if t.name.startswith("rank ")] == ["rank 0", "rank 1"]
    assert "drawing the shard placement" in placement.placeholder.value
    explorer._repr_mimebundle_()  # a second display has the figures in place at once
    assert placement.container.children == (placement.widget,)


def test_figures_follow_after_a_while_where_no_page_paints():
    explorer = _explorer()
    explorer._paint_probe.fallback_s = 0.2
    _, before, between, after = _display_in_a_kernel(explorer, page_paints=False, fallback_wait_s=0.5)
    assert before and between and not after


def test_a_figure_first_drawn_while_held_appears_on_release():
    explorer = _explorer()
    memory = explorer.memory_fig
    assert memory.live is None and not memory.hold()  # nothing drawn yet: nothing to hold
    explorer.placement_fig.hold()
    explorer.set(world_size=4)
    assert _shows_placeholder(explorer.placement_fig)
    explorer.placement_fig.release()
    assert [t.name for t in explorer.placement_fig.data if t.name.startswith("rank ")] == [
        f"rank {r}" for r in range(4)]
    assert explorer.placement_fig.container.children == (explorer.placement_fig.widget,)
