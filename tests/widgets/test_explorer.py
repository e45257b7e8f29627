"""PlanExplorer: each control re-plans through the real planner and redraws; errors show in the widget."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.traffic import expected_id_counter, step_traffic
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet, as_table_set

pytestmark = pytest.mark.timeout(120)

MIB = 2 ** 20


@pytest.fixture(scope="module")
def table_set():
    """Four tables: 16 MiB, 4 MiB, 1 MiB and 64 KiB of fp32 weights."""
    tables = [
        EmbeddingBagConfig(name="huge", num_embeddings=65536, embedding_dim=64, feature_names=["f_huge"]),
        EmbeddingBagConfig(name="mid", num_embeddings=16384, embedding_dim=64, feature_names=["f_mid"]),
        EmbeddingBagConfig(name="wide", num_embeddings=1024, embedding_dim=256, feature_names=["f_wide"]),
        EmbeddingBagConfig(name="tiny", num_embeddings=512, embedding_dim=32, feature_names=["f_tiny"]),
    ]
    factors = {"f_huge": 4.0, "f_mid": 2.0, "f_wide": 1.0, "f_tiny": 8.0}
    return TableSet(tables, factors, batch_size=64)


@pytest.fixture
def explorer(table_set):
    return PlanExplorer(table_set, world_size=2, memory_per_rank_gib=1.0, batch_size=64, compute_device="cuda")


def _rank_traces(figure):
    return [t.name for t in figure.data if t.name.startswith("rank ")]


def test_world_size_control_replans_and_redraws(explorer):
    assert explorer.error is None
    assert _rank_traces(explorer.placement_fig) == ["rank 0", "rank 1"]
    explorer.world_size.value = 4  # what a click in the browser does
    assert explorer.settings.world_size == 4 and explorer.error is None
    assert set(explorer.plan.ranks_used()) <= {0, 1, 2, 3}
    assert _rank_traces(explorer.placement_fig) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    heat = explorer.rank_table_fig.data[0]
    assert list(heat.y) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    # every table's bytes over all ranks = rows x dim x 4 (one copy; no table is replicated here)
    z = np.nan_to_num(np.asarray(heat.z, dtype=float))
    sizes = {t.name: t.num_embeddings * t.embedding_dim * 4 for t in explorer.table_set.tables}
    replicated = {n for n in sizes if explorer.plan.plan[""][n].sharding_type == "data_parallel"}
    for column, name in enumerate(heat.x):
        assert z[:, column].sum() == sizes[name] * (4 if name in replicated else 1)
    assert list(explorer.local_world_size.options) == [1, 2, 4]  # ranks per host follows the world size
    explorer.show_tab("Memory")
    assert list(explorer.memory_fig.data[0].x) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    explorer.show_tab("Board")
    assert [c["rank"] for c in explorer.board.columns] == [0, 1, 2, 3]


def test_forcing_a_type(explorer):
    explorer.force("huge", "row_wise")
    ps = explorer.plan.plan[""]["huge"]
    assert ps.sharding_type == "row_wise"
    assert sum(s.shard_sizes[0] for s in ps.shards) == 65536 and sorted(s.rank for s in ps.shards) == [0, 1]
    assert "huge=row_wise" in explorer.forced_label.value
    explorer.force("huge", "auto")
    assert "huge" not in explorer.settings.forced


def test_batch_size_changes_comm_matrix_as_protocol_says(explorer, table_set):
    explorer.show_tab("Communication")
    before = np.asarray(explorer.comm_fig.data[0].z, dtype=float).copy()
    explorer.set(batch_size=256)
    after = np.asarray(explorer.comm_fig.data[0].z, dtype=float)
    assert not np.array_equal(before, after)
    # what the heatmap shows = the traffic protocol applied to the plan with 256 samples per rank
    batch = [256, 256]
    rows = {f: t.num_embeddings for t in table_set.tables for f in t.feature_names}
    expected = step_traffic(explorer.plan.plan[""], table_set.tables, 2, 2, batch,
                            expected_id_counter(batch, table_set.pooling_factors, rows))
    total = sum(np.asarray(m, dtype=float) for m in expected.values())
    np.testing.assert_allclose(after, total, rtol=1e-9)


def test_optimizer_changes_memory(explorer):
    explorer.show_tab("Memory")
    names = [t.name for t in explorer.memory_fig.data]
    optimizer = names.index("optimizer")
    assert float(np.sum(explorer.memory_fig.data[optimizer].y)) == 0  # sgd keeps no state
    explorer.set(optimizer="adam")
    weights = float(np.sum(explorer.memory_fig.data[names.index("weights")].y))
    state = float(np.sum(explorer.memory_fig.data[optimizer].y))
    assert state == pytest.approx(2 * weights)  # adam: two fp32 moments per weight


def test_not_fitting_shows_the_planner_error_then_recovers(explorer):
    # on cpu the memory per rank is all there is (on cuda UVM kernels would spill to host memory)
    explorer.set(device="cpu", memory_per_rank_gib=4 / 1024)  # 4 MiB per rank for 21 MiB of tables
    assert explorer.plan is None and explorer.error
    assert "do not fit" in explorer.error and "over its" in explorer.error
    assert "No plan" in explorer.status.value and "Traceback" not in explorer.status.value
    explorer.show_tab("Board")
    assert explorer.board.message_kind == "error"
    explorer.set(memory_per_rank_gib=1.0)
    assert explorer.error is None and "No plan" not in explorer.status.value


def test_board_move_updates_plan_and_figures(explorer):
    explorer.force("wide", "table_wise")
    owner = explorer.plan.plan[""]["wide"].shards[0].rank
    target = 1 - owner
    explorer.show_tab("Board")
    explorer.board.move_request = {"id": "wide/0", "rank": target, "nonce": 1}  # a drop in the browser
    assert explorer.plan.plan[""]["wide"].shards[0].rank == target
    assert explorer.settings.moves == [("wide", 0, target)]
    assert "by hand" in explorer.status.value
    # the board still says what moved once the explorer has re-priced and redrawn it
    assert explorer.board.message == f"moved wide shard 0 to rank {target}"
    explorer.set(optimizer="adam")  # a later change that is not a move: the board's message goes
    assert explorer.plan.plan[""]["wide"].shards[0].rank == target and explorer.board.message == ""
    explorer.show_tab("Placement")
    heat = explorer.rank_table_fig.data[0]
    column = list(heat.x).index("wide")
    assert np.nan_to_num(np.asarray(heat.z, dtype=float))[target, column] == 1024 * 256 * 4
    explorer.board.move_request = {"id": "wide/0", "rank": 7, "nonce": 2}  # no rank 7: refused, plan kept
    assert explorer.plan.plan[""]["wide"].shards[0].rank == target
    assert "ranks are 0..1" in explorer.board.message


def test_save_export_and_compare(explorer, tmp_path):
    path = tmp_path / "plan.json"
    explorer.plan_path.value = str(path)
    explorer.save_button.click()
    saved = json.loads(path.read_text())
    assert set(saved["plan"][""]) == {"huge", "mid", "wide", "tiny"}
    assert "saved the plan" in explorer.export_message.value
    explorer.export_button.click()
    assert "load_plan" in explorer.export_text.value and "huge" in explorer.export_text.value
    explorer.load_button.click()  # compare with the saved plan: identical so far
    assert "identical" in explorer.diff_note.value
    explorer.set(world_size=4)
    explorer.show_tab("Compare")
    deltas = np.asarray(explorer.diff_fig.data[0].y, dtype=float)
    assert len(deltas) == 4 and deltas[2:].sum() > 0  # ranks 2 and 3 held nothing in the saved plan
    assert "identical" not in explorer.diff_note.value


def test_compare_with_missing_file_shows_error(explorer, tmp_path):
    explorer.plan_path.value = str(tmp_path / "nope.json")
    explorer.load_button.click()
    assert "No plan" in explorer.export_message.value or "nope.json" in explorer.export_message.value


def test_tables_tab_and_explain(explorer):
    explorer.show_tab("Tables")
    assert "runner_up" in explorer.choices.value and "huge" in explorer.choices.value
    explorer.table_picker.value = "huge"
    explorer.explain_button.click()
    assert "huge" in explorer.explain_out.value and "chose" in explorer.explain_out.value


def test_inputs_dataframe_csv_and_module(tmp_path):
    frame = pd.DataFrame({"name": ["a", "b"], "rows": [1000, 200], "dim": [16, 8],
                          "feature_names": ["fa1, fa2", None], "pooling_factor": [3.0, 1.0]})
    table_set = as_table_set(frame)
    assert [t.feature_names for t in table_set.tables] == [["fa1", "fa2"], ["b"]]
    assert table_set.pooling_factors == {"fa1": 3.0, "fa2": 3.0, "b": 1.0}
    csv = tmp_path / "tables.csv"
    frame.to_csv(csv, index=False)
    assert [t.num_embeddings for t in as_table_set(str(csv)).tables] == [1000, 200]
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=table_set.tables, device="meta")
    assert [t.name for t in as_table_set(ebc).tables] == ["a", "b"]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), ebc)
    from_model = PlanExplorer(model, world_size=2, compute_device="cpu", memory_per_rank_gib=1)
    assert from_model.error is None and sorted(from_model.plan.plan["1"]) == ["a", "b"]  # the model's module path
    with pytest.raises(ValueError, match="embedding dim"):
        as_table_set(pd.DataFrame({"name": ["x"], "rows": [3]}))
    explorer = PlanExplorer(frame, world_size=2, compute_device="cpu", memory_per_rank_gib=1)
    assert explorer.error is None and sorted(explorer.plan.plan[""]) == ["a", "b"]


def test_topology_sets_the_start_values(table_set):
    from rectoolkit.planner import Topology

    topology = Topology(world_size=4, compute_device="cpu", local_world_size=2, ddr_cap=2 ** 30, batch_size=128)
    explorer = PlanExplorer(table_set, topology=topology)
    s = explorer.settings
    assert (s.world_size, s.local_world_size, s.memory_per_rank_gib, s.batch_size, s.compute_device) == (
        4, 2, 1.0, 128, "cpu")
    assert (explorer.world_size.value, explorer.local_world_size.value, explorer.device.value) == (4, 2, "cpu")
    explorer.show_tab("Memory")
    capacity = [t for t in explorer.memory_fig.data if t.name == "capacity"][0]
    assert list(capacity.y) == [2 ** 30] * 4


def test_saved_plan_goes_where_the_message_says(table_set, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the served notebooks folder: nothing may land here
    workdir = tmp_path / "work"
    explorer = PlanExplorer(table_set, world_size=2, memory_per_rank_gib=1.0, batch_size=64, workdir=str(workdir))
    assert explorer.plan_path.value == str(workdir / "plan.json")  # the box shows the whole path
    explorer.save_button.click()
    saved = workdir / "plan.json"
    assert saved.is_file() and json.loads(saved.read_text())
    assert str(saved) in explorer.export_message.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    explorer.export_button.click()
    assert str(saved) in explorer.export_text.value and str(saved) in explorer.export_message.value
    default = PlanExplorer(table_set, world_size=2, memory_per_rank_gib=1.0, batch_size=64)
    assert default.plan_path.value == str(Path.home() / "rectoolkit-work" / "plan.json")
