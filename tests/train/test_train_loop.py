"""The recipe learns (single process), runs on 2 launch workers, and runs under torchrun with the same numbers."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rectoolkit.launch import WorkerContext, start
from rectoolkit.train import SyntheticData, TrainConfig, build_model, make_tables, train

REPO = Path(__file__).resolve().parents[2]
TINY = dict(workload="dlrm26", max_rows=200, embedding_dim=8, batch_size=64)


@pytest.mark.timeout(120)
def test_loss_falls_and_auc_rises_on_synthetic_data(capsys):
    torch.set_num_threads(1)
    ctx = WorkerContext.single_process()
    summary = train(ctx, TrainConfig(steps=240, report_every=40, progress=True, **TINY))
    reports = ctx.history
    assert [m["step"] for m in reports] == [40, 80, 120, 160, 200, 240]
    assert summary["mode"] == "local" and summary["steps"] == 240
    # a constant predictor at the label rate scores the labels' entropy; the model must beat it clearly
    tables, pooling, dense_features, alpha = make_tables(TrainConfig(**TINY))
    data = SyntheticData(tables, pooling, 64, dense_features=dense_features, zipf_alpha=alpha)
    rate = torch.cat([data.batch(step).labels for step in range(200, 240)]).mean().item()
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert reports[-1]["loss"] < entropy - 0.1
    assert reports[-1]["loss"] < reports[0]["loss"] - 0.05
    assert reports[-1]["auc"] > reports[0]["auc"] + 0.05 and reports[-1]["auc"] > 0.75
    assert all(m["samples_per_s"] > 0 and m["param_bytes"] > 0 for m in reports)
    assert "train" in capsys.readouterr().err  # the tqdm bar


def reference_first_loss(config: TrainConfig, world_size: int) -> float:
    """Loss of the untrained model on the step's global batch, computed in this process."""
    tables, pooling, dense_features, alpha = make_tables(config)
    model = build_model(config, tables, dense_features, fuse_embedding_optimizer=False, device=torch.device("cpu"))
    data = SyntheticData(tables, pooling, config.batch_size, dense_features=dense_features, zipf_alpha=alpha,
                         seed=config.seed, world_size=world_size)
    dense, sparse, labels = data.global_batch(0)
    with torch.no_grad():
        return F.binary_cross_entropy_with_logits(model(dense, sparse).squeeze(-1), labels).item()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_two_launch_workers_train_on_the_global_batch_and_stop_together():
    config = TrainConfig(steps=100_000, report_every=1, **TINY)
    job = start(train, 2, config, num_threads=1, echo_output=False)
    reports = []
    for metrics in job.metrics():
        reports.append(metrics)
        if len(reports) == 12:  # both ranks reported steps 1..6 (or more): ask them to stop
            job.request_stop()
    summaries = job.wait(timeout=60)
    assert summaries[0] == {**summaries[1], "samples_per_s": summaries[0]["samples_per_s"]}
    assert 6 <= summaries[0]["steps"] < 1000 and summaries[0]["mode"] == "dmp"
    first = {m["rank"]: m for m in reports if m["step"] == 1}
    assert first[0]["loss"] == first[1]["loss"]  # all-reduced
    assert first[0]["loss"] == pytest.approx(reference_first_loss(config, 2), rel=1e-5)
    for rank in (0, 1):
        assert [m["step"] for m in reports if m["rank"] == rank] == list(range(1, summaries[0]["steps"] + 1))


def plan_json_available() -> bool:
    try:
        from rectoolkit.distributed import DistributedModelParallel  # noqa: F401
        from rectoolkit.plan.serialization import save_plan  # noqa: F401
    except ImportError:
        return False
    return True


def write_table_wise_plan(path: Path) -> Path:
    """Tables alternate between rank 0 and rank 1, whole (TABLE_WISE), for DLRM's embedding collection."""
    from rectoolkit.plan import ParameterSharding, ShardingPlan, ShardMetadata
    from rectoolkit.plan.serialization import save_plan

    tables, _, _, _ = make_tables(TrainConfig(**TINY))
    module_plan = {}
    for index, table in enumerate(tables):
        rank = index % 2
        module_plan[table.name] = ParameterSharding(
            "table_wise", ranks=[rank],
            shards=[ShardMetadata.on_rank(rank, 0, 0, table.num_embeddings, table.embedding_dim)])
    return save_plan(ShardingPlan({"sparse_arch.embedding_bag_collection": module_plan}), path)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_torchrun_entry_point_trains_on_the_global_batch(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    metrics_path = tmp_path / "metrics.jsonl"
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "rectoolkit.train",
               "--workload", "dlrm26", "--steps", "3", "--batch-size", "64", "--max-rows", "200",
               "--embedding-dim", "8", "--report-every", "1", "--metrics-out", str(metrics_path), "--no-progress"]
    if plan_json_available():
        command += ["--plan", str(write_table_wise_plan(tmp_path / "plan.json"))]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = [json.loads(line)["summary"] for line in done.stdout.splitlines() if line.startswith('{"summary"')]
    assert len(summary) == 1 and summary[0]["world_size"] == 2 and summary[0]["backend"] == "gloo"
    assert summary[0]["steps"] == 3
    reports = [json.loads(line) for line in metrics_path.read_text().splitlines()]  # rank 0 only
    assert [m["step"] for m in reports] == [1, 2, 3]
    config = TrainConfig(steps=3, report_every=1, **TINY)
    assert reports[0]["loss"] == pytest.approx(reference_first_loss(config, 2), rel=1e-5)
    if plan_json_available():  # rank 0 holds exactly the even-numbered tables of the plan
        assert summary[0]["mode"] == "dmp"
        tables, _, _, _ = make_tables(config)
        expected = sum(t.num_embeddings * t.embedding_dim * 4 for i, t in enumerate(tables) if i % 2 == 0)
        assert reports[-1]["memory_embedding_weights_bytes"] == expected


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_the_recipe_gives_the_same_numbers_with_and_without_its_train_pipeline():
    runs = {}
    for pipeline in (True, False):  # True is the default; --no-pipeline / pipeline=False the plain loop
        config = TrainConfig(steps=6, report_every=3, pipeline=pipeline, **TINY)
        job = start(train, 2, config, num_threads=1, echo_output=False)
        summaries = job.wait(timeout=100)
        runs[pipeline] = (summaries, [m for m in job.history if "loss" in m])
    (piped, piped_reports), (plain, plain_reports) = runs[True], runs[False]
    assert TrainConfig().pipeline is True and piped[0]["pipeline"] is True and plain[0]["pipeline"] is False
    assert [(m["rank"], m["step"], m["loss"], m["auc"]) for m in sorted(piped_reports, key=lambda m: (m["rank"], m["step"]))] \
        == [(m["rank"], m["step"], m["loss"], m["auc"]) for m in sorted(plain_reports, key=lambda m: (m["rank"], m["step"]))]
    assert piped[0]["final_loss"] == plain[0]["final_loss"]  # bit-identical training, so identical losses
    assert all(m["comm_wait_s"] >= 0 and m["elapsed_s"] > m["comm_wait_s"] for m in piped_reports + plain_reports)


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_the_recipe_trains_2d_over_sharding_groups_syncing_every_interval_with_and_without_its_pipeline():
    runs = {}
    for pipeline in (True, False):
        config = TrainConfig(steps=6, report_every=3, pipeline=pipeline, sharding_group_size=2, sync_interval=2, **TINY)
        job = start(train, 4, config, num_threads=1, echo_output=False)
        summaries = job.wait(timeout=150)
        runs[pipeline] = (summaries, sorted((m for m in job.history if "loss" in m), key=lambda m: (m["rank"], m["step"])))
    (piped, piped_reports), (plain, plain_reports) = runs[True], runs[False]
    assert {s["mode"] for s in piped + plain} == {"2d"}
    assert [(m["rank"], m["step"], m["loss"]) for m in piped_reports] == \
        [(m["rank"], m["step"], m["loss"]) for m in plain_reports]  # the pipeline syncs where the plain loop does
    first = {m["rank"]: m for m in piped_reports if m["step"] == 3}
    last = {m["rank"]: m for m in piped_reports if m["step"] == 6}
    for rank in range(4):
        # synced after steps 1 and 3 by step 3, after 1, 3 and 5 by step 6: the same bytes each time
        assert first[rank]["sync_bytes_sent"] > 0
        assert last[rank]["sync_bytes_sent"] * 2 == first[rank]["sync_bytes_sent"] * 3
    with pytest.raises(ValueError, match="sync_interval must be a positive integer"):
        TrainConfig(sharding_group_size=2, sync_interval=0)
