"""benchmarks/bench_cost_model.py's head to head: the per-round figures it reports, from hand-made step times (the
launch itself is measure_plans, tested in test_measure.py)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

import rectoolkit as rtk
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cost_model.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cost_model", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def steps_frame(wall_ms):
    """plan -> [round][step] -> (rank 0 ms, rank 1 ms), as measure_plans' `steps` rows."""
    rows = [{"plan": plan, "round": r, "step": s, "rank": rank, "wall_ms": ms}
            for plan, rounds in wall_ms.items() for r, steps in enumerate(rounds) for s, pair in enumerate(steps)
            for rank, ms in enumerate(pair)]
    return pd.DataFrame(rows)


def table_wise(owner):
    return ShardingPlan({"": {name: ParameterSharding("table_wise", "fused", ranks=[rank],
                                                       shards=[ShardMetadata.on_rank(rank, 0, 0, 10, 4)])
                              for name, rank in owner.items()}})


def test_per_round_is_the_median_over_steps_of_the_slowest_rank(bench):
    frame = steps_frame({"a": [[(1.0, 3.0), (2.0, 2.0), (9.0, 1.0)], [(4.0, 4.5), (5.0, 1.0), (6.0, 0.0)]]})
    rounds = bench.per_round(types.SimpleNamespace(steps=frame))
    assert rounds["a"].tolist() == [3.0, 5.0]  # slowest ranks 3, 2, 9 -> 3; 4.5, 5, 6 -> 5


def test_head_to_head_pairs_rounds_and_counts_the_slower_ones(bench, monkeypatch):
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=10, embedding_dim=4, feature_names=[f"f{i}"])
              for i in range(2)]
    plans = {"planner": table_wise({"t0": 0, "t1": 1}), "torchrec": table_wise({"t0": 1, "t1": 0}),
             "row_wise_copy": table_wise({"t0": 0, "t1": 1})}
    seen = {}

    def fake_measure(chosen, *args, **kwargs):
        seen.update(names=list(chosen), rounds=kwargs["rounds"], phase_steps=kwargs["phase_steps"],
                    copy_is_the_plan=chosen[bench.COPY].plan == plans["planner"].plan,
                    copy_is_its_own=chosen[bench.COPY] is not plans["planner"])
        # three rounds of one step; the planner 10, 12, 9 ms; TorchRec's 8, 12, 10 ms; the copy 10, 10, 10 ms
        return types.SimpleNamespace(steps=steps_frame({"planner": [[(10.0, 1.0)], [(12.0, 1.0)], [(9.0, 1.0)]],
                                                        "torchrec": [[(8.0, 1.0)], [(12.0, 1.0)], [(10.0, 1.0)]],
                                                        bench.COPY: [[(10.0, 1.0)], [(10.0, 1.0)], [(10.0, 9.0)]]}))

    monkeypatch.setattr(bench, "measure_plans", fake_measure)
    workload = bench.Workload("w", "", tables, {"f0": 1.0, "f1": 1.0}, 8, 0.0)
    args = types.SimpleNamespace(steps=1, warmup=0, head_to_head=3, threads=1)
    # the measured-fastest is a plan equal to the planner's: only TorchRec's runs against it
    out = bench.head_to_head(plans, "row_wise_copy", workload, None, args)
    assert seen == {"names": ["planner", "torchrec", bench.COPY], "rounds": 3, "phase_steps": 0,
                    "copy_is_the_plan": True, "copy_is_its_own": True}
    h = out["head_to_head"]["torchrec"]
    assert (h["median"], h["min"], h["max"]) == (1.0, 0.9, 1.25)  # per round 10/8, 12/12, 9/10
    assert (h["slower_rounds"], h["rounds"]) == (1, 3)
    control = out["head_to_head"][bench.COPY]  # per round 10/10, 12/10, 9/10 (the copy's slowest rank: 10, 10, 10)
    assert (control["median"], control["min"], control["max"], control["slower_rounds"]) == (1.0, 0.9, 1.2, 1)
    summary = {"head_to_head": out["head_to_head"], "missing": {}}
    assert bench.head_to_head_cell(summary, "torchrec") == "1.00x [0.90, 1.25], 1/3 slower"
    assert bench.head_to_head_cell(summary, bench.COPY) == "1.00x [0.90, 1.20], 1/3 slower"
    assert bench.head_to_head_cell(summary, "row_wise_copy") == "same plan"
    assert bench.head_to_head_cell({"head_to_head": {}, "missing": {}}, bench.COPY) == "-"  # no rival ran
    assert bench.head_to_head_cell({"missing": {}}, "torchrec") == "-"
    assert bench.head_to_head_cell({"head_to_head": {}, "missing": {"torchrec": "not installed"}}, "torchrec") == "-"
