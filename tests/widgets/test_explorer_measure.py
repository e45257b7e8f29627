"""The explorer's Measure tab: the current and the pinned plan run on local workers, measured beside estimated."""

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.planner.profile import AlphaBeta, CalibrationProfile, LookupTerms
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet

PROFILE = CalibrationProfile(
    collectives={"all_to_all": AlphaBeta(0.3, 1e6), "all_reduce": AlphaBeta(0.6, 1e6)},
    read_curve=((1e5, 2e7), (1e8, 5e6)), write_bytes_per_ms=1e7, step_ms=1.0, group_ms={"table_wise": 1.0},
    shard_ms=0.1, backward_terms={"sgd": LookupTerms(0.0, 1.5, 1.5e-7)}, memory_parallelism=1.5, machine={"host": "test-host"})


def _explorer(tmp_path):
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=100 * (i + 1), embedding_dim=8,
                                 feature_names=[f"f{i}"]) for i in range(3)]
    table_set = TableSet(tables, {f"f{i}": 2.0 for i in range(3)})
    return PlanExplorer(table_set, world_size=2, compute_device="cpu", memory_per_rank_gib=1.0, batch_size=16,
                        workdir=str(tmp_path), profile=PROFILE)


def test_measure_tab_names_the_profile_before_any_run(tmp_path):
    explorer = _explorer(tmp_path)
    explorer.show_tab("Measure")
    assert "Calibration profile" in explorer.measure_note.value and "test-host" in explorer.measure_note.value
    assert explorer.measurements is None


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_measure_runs_current_and_pinned_plans(tmp_path):
    explorer = _explorer(tmp_path)
    explorer.compare_with()  # pin the planner's plan
    explorer.force("t0", "row_wise")
    result = explorer.measure(steps=2, rounds=1)
    assert sorted(result.plans["plan"]) == ["current", "pinned"]
    assert result.plans["bytes_exact"].all() and result.plans["memory_exact"].all()
    explorer.show_tab("Measure")
    estimated, measured = explorer.measure_fig.data
    assert len(measured.y) == 4 and list(measured.y) == list(result.ranks["step_ms"])
    assert "current" in explorer.measure_note.value and "pinned" in explorer.measure_note.value
    factor = result.info["load_probe_before"]["factor"]
    assert f"load factor {factor:.2f}: a synthetic step" in explorer.measure_note.value
    alone = result.info["load_probe_before"]["factor_alone"]
    assert f"{alone:.2f} with one rank working" in explorer.measure_note.value
    assert "est_now_ms" in explorer.measure_note.value
