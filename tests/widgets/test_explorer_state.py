"""The PlanExplorer stays consistent for every order of control changes (property-based).

Each step writes a control's value the way a click in the browser does (the widget's `value` trait, which
runs the same observers), then checks that controls, settings, plan, views and message agree. The expected
plan state comes from planning the controls' values afresh (`plan_and_report`), not from the widget.
"""

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet
from rectoolkit.widgets.planning import ExplorerSettings, plan_and_report, torchrec_export_text

pytestmark = pytest.mark.timeout(600)

TABLES = TableSet([
    EmbeddingBagConfig(name="big", num_embeddings=40000, embedding_dim=64, feature_names=["f_big"]),
    EmbeddingBagConfig(name="mid", num_embeddings=8000, embedding_dim=32, feature_names=["f_mid"]),
    EmbeddingBagConfig(name="small", num_embeddings=500, embedding_dim=16, feature_names=["f_small"]),
], {"f_big": 4.0, "f_mid": 2.0, "f_small": 1.0}, batch_size=64)

TABS = ["Placement", "Board", "Memory", "Time", "Communication", "Tables", "Export"]

# one step = (control name, value); values a user can pick in the widget
STEP = st.one_of(
    st.tuples(st.just("world_size"), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16])),
    st.tuples(st.just("local_world_size"), st.sampled_from([1, 2, 3, 4, 6, 8])),
    st.tuples(st.just("memory"), st.sampled_from([0.001, 0.05, 1.0, 16.0])),
    st.tuples(st.just("batch_size"), st.sampled_from([1, 64, 4096])),
    st.tuples(st.just("optimizer"), st.sampled_from(["sgd", "adam", "row_wise_adagrad"])),
    st.tuples(st.just("objective"), st.sampled_from(["time", "memory", "bytes"])),
    st.tuples(st.just("device"), st.sampled_from(["cuda", "cpu"])),
    st.tuples(st.just("table_picker"), st.sampled_from(["big", "mid", "small"])),
    st.tuples(st.just("type_picker"), st.sampled_from(["auto", "row_wise", "table_wise", "column_wise",
                                                       "data_parallel", "table_row_wise"])),
    st.tuples(st.just("tab"), st.sampled_from(TABS)),
    st.tuples(st.just("export_button"), st.just("click")),
)


def click(explorer: PlanExplorer, name: str, value) -> None:
    """What the browser does for a click: set the control's value (only if the widget offers it)."""
    if name == "tab":
        explorer.tabs.selected_index = explorer.TAB_NAMES.index(value)
        return
    if value == "click":
        getattr(explorer, name).click()
        return
    control = getattr(explorer, name)
    if hasattr(control, "options") and value not in control.options:
        return  # the dropdown does not offer it: nobody can click it
    control.value = value


def check_consistent(explorer: PlanExplorer) -> None:
    world, local = int(explorer.world_size.value), int(explorer.local_world_size.value)
    # ranks per host only offers divisors of the world size, and shows one of them
    assert list(explorer.local_world_size.options) == [d for d in range(1, world + 1) if world % d == 0]
    assert local in explorer.local_world_size.options
    settings_now = explorer.settings
    assert (settings_now.world_size, settings_now.local_world_size) == (world, local)
    assert settings_now.memory_per_rank_gib == float(explorer.memory.value)
    assert settings_now.batch_size == int(explorer.batch_size.value)
    assert (settings_now.optimizer, settings_now.objective, settings_now.compute_device) == (
        explorer.optimizer.value, explorer.objective.value, explorer.device.value)
    # the type picker shows the forced type of the picked table
    assert explorer.type_picker.value == settings_now.forced.get(explorer.table_picker.value, "auto")
    # the plan (or error) is what planning the shown settings gives
    fresh = plan_and_report(ExplorerSettings(
        world_size=world, local_world_size=local, memory_per_rank_gib=float(explorer.memory.value),
        batch_size=int(explorer.batch_size.value), optimizer=explorer.optimizer.value,
        objective=explorer.objective.value, compute_device=explorer.device.value,
        forced=dict(settings_now.forced)), TABLES)
    assert explorer.error == fresh.error
    status = explorer.status.value
    tab = explorer.TAB_NAMES[explorer.tabs.selected_index or 0]
    if fresh.error is not None:
        assert "No plan" in status and "rtk-plan-error" in status
        check_no_plan_shown(explorer, tab, world)
        return
    assert explorer.plan == fresh.plan
    assert f"3 tables on {world} ranks" in status and "No plan" not in status
    assert set(explorer.plan.ranks_used()) <= set(range(world))
    # the visible view shows this plan's ranks
    ranks = [f"rank {r}" for r in range(world)]
    if tab == "Placement":
        assert list(explorer.rank_table_fig.data[0].y) == ranks
    elif tab == "Memory":
        assert list(explorer.memory_fig.data[0].x) == ranks
    elif tab == "Time":
        assert list(explorer.time_fig.data[0].x) == ranks
    elif tab == "Communication":
        assert len(explorer.comm_fig.data[0].z) == world
    elif tab == "Board":
        assert explorer.board.world_size == world
    elif tab == "Tables":
        assert all(re.search(f"<td>{name}</td>", explorer.choices.value) for name in ("big", "mid", "small"))
    elif tab == "Export" and explorer.export_text.layout.display != "none":
        path = str(explorer.workdir / explorer.plan_path.value)  # the export shown is the current plan's
        assert explorer.export_text.value == torchrec_export_text(fresh.plan, path)


def check_no_plan_shown(explorer: PlanExplorer, tab: str, world: int) -> None:
    """Without a plan, the visible view says so instead of showing the previous plan."""
    figures = {"Placement": [explorer.placement_fig, explorer.rank_table_fig], "Memory": [explorer.memory_fig],
               "Time": [explorer.time_fig], "Communication": [explorer.comm_fig], "Compare": [explorer.diff_fig]}
    for figure in figures.get(tab, []):
        assert figure.data == () and "No plan" in figure.container.children[0].value
    if tab == "Board":
        assert explorer.board.message_kind == "error" and explorer.board.message == explorer.error
        assert explorer.board.plan.ranks_used() == [] and explorer.board.world_size == world
    elif tab == "Tables":
        assert "No plan" in explorer.choices.value and "<td>big</td>" not in explorer.choices.value
    elif tab == "Export":
        assert explorer.export_text.layout.display == "none"
    elif tab == "Compare" and explorer.baseline is not None:
        assert explorer.diff_fig.data == () and "No plan" in explorer.diff_note.value


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=6))
@example(steps=[("world_size", 4), ("local_world_size", 2), ("world_size", 6)])  # the order
@example(steps=[("export_button", "click"), ("tab", "Export"), ("device", "cpu"), ("memory", 0.001),
                ("tab", "Board"), ("memory", 16.0)])  # no plan, then a plan again
def test_every_order_of_changes_leaves_the_explorer_consistent(steps):
    explorer = PlanExplorer(TABLES, world_size=8, local_world_size=8, memory_per_rank_gib=16, batch_size=64)
    check_consistent(explorer)
    for name, value in steps:
        click(explorer, name, value)
        check_consistent(explorer)


@pytest.mark.parametrize("world_size", [4, 6])
def test_smaller_world_size_brings_ranks_per_host_along(world_size):
    """The issue's case: ranks per host 8, then world size 4 (or 6): a plan on the new shape, no stale error."""
    explorer = PlanExplorer(TABLES, world_size=8, local_world_size=8, memory_per_rank_gib=16)
    explorer.world_size.value = world_size
    assert explorer.local_world_size.value == world_size  # 8 does not divide it: the largest divisor
    assert explorer.error is None, explorer.error
    assert f"on {world_size} ranks" in explorer.status.value
    assert list(explorer.rank_table_fig.data[0].y) == [f"rank {r}" for r in range(world_size)]


def test_set_refuses_ranks_per_host_that_do_not_divide_the_world_size():
    explorer = PlanExplorer(TABLES, world_size=8, local_world_size=8, memory_per_rank_gib=16)
    with pytest.raises(ValueError, match=r"ranks per host 8 must divide the world size \(4\)"):
        explorer.set(world_size=4, local_world_size=8)
    assert explorer.world_size.value == 8 and explorer.local_world_size.value == 8  # nothing changed
    check_consistent(explorer)
    explorer.set(world_size=6, local_world_size=3)
    assert (explorer.settings.world_size, explorer.settings.local_world_size) == (6, 3)
    check_consistent(explorer)


def test_without_a_plan_no_view_keeps_the_previous_plan():
    """A plan that does not fit (1 MiB of DDR per rank): every tab says "no plan"; a fitting one comes back."""
    explorer = PlanExplorer(TABLES, world_size=8, local_world_size=8, memory_per_rank_gib=16, compute_device="cpu")
    explorer.export_button.click()
    explorer.pin_button.click()
    explorer.redraw_all()  # every view shows the 8-rank plan
    explorer.memory.value = 0.001
    assert explorer.error is not None and "do not fit" in explorer.error
    for tab in TABS + ["Compare"]:
        explorer.show_tab(tab)
        check_consistent(explorer)
        check_no_plan_shown(explorer, tab, 8)
    explorer.world_size.value = 4  # still no plan, on the new shape
    explorer.show_tab("Board")
    check_no_plan_shown(explorer, "Board", 4)
    explorer.memory.value = 16.0
    for tab in TABS + ["Compare"]:
        explorer.show_tab(tab)
        check_consistent(explorer)
    assert list(explorer.memory_fig.data[0].x) == [f"rank {r}" for r in range(4)]
    assert explorer.diff_fig.data and "No plan" not in explorer.diff_note.value  # baseline vs the 4-rank plan
