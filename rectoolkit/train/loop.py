"""The demo training recipe: DLRM on synthetic (or Criteo) data, one function per step of the recipe.

    import rectoolkit as rtk
    from rectoolkit.train import TrainConfig, train
    config = TrainConfig(workload="dlrm26", steps=200, batch_size=256, max_rows=10_000)
    rtk.launch(train, 2, config, on_metrics=print)       # 2 local workers, metrics live
    train(rtk.launch.WorkerContext.single_process(), config)   # or inline, in this process

`train(ctx, config)` runs the same in a `launch` worker, under `torchrun` (`python -m rectoolkit.train`) and
inline. Order of the recipe: tables -> model -> shard -> optimizers -> data -> steps, each a plain function.
Every `report_every` steps it calls `ctx.report(step, loss, auc, samples_per_s, ...)`; the AUC is
progressive validation: each batch is scored before the model trains on it. A `RecMetricModule`
(rectoolkit.metrics, reduced across ranks) adds `window_ne`, `lifetime_ne`, `window_calibration`,
`lifetime_calibration` and `window_auc` (the window: the last `auc_window_steps` steps of all ranks).

The steps run through TorchRec's TrainPipelineSparseDist by default (`config.pipeline`; `--no-pipeline` on the
command line turns it off): the next batch's ids travel to the shards' owners while this batch trains, and the
weights come out bit-identical to the plain loop's. Each report carries `comm_wait_s`, the seconds this rank
spent blocked in collectives since the start, and `elapsed_s`, so that its share of the time shows.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rectoolkit.launch.context import WorkerContext
from rectoolkit.metrics import MetricsConfig, RecMetricDef, RecMetricEnum, RecMetricModule, RecTaskInfo, generate_metric_module
from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
from rectoolkit.plan.traffic import COLLECTIVES
from rectoolkit.train.criteo import CriteoTSV
from rectoolkit.train.data import Batch, SyntheticData
from rectoolkit.train.metrics import Throughput, auc
from rectoolkit.train.model import DLRM
from rectoolkit.workloads import load_workload


@dataclass
class TrainConfig:
    """Everything the recipe needs; picklable, so it travels to launch workers.

    workload: "dlrm26", "small3" or a workload JSON path (tables, pooling factors, id skew).
    batch_size: samples per rank per step (default: the workload's batch_size_per_rank).
    max_rows / embedding_dim: cap every table's rows / give every table this dim (tiny demo runs). DLRM needs
        one dim for all tables: by default a workload whose tables have several dims (small3) trains with the
        smallest of them.
    Counts (steps, batch_size, max_rows, embedding_dim, report_every, layer sizes) must be positive and rates
    not negative: anything else raises a ValueError naming the field (never a silent default).
    embedding_lr (fused Adagrad on the tables), dense_lr (Adam on the MLPs).
    plan: a ShardingPlan, or a path to its JSON, for DistributedModelParallel (None: the planner decides).
    criteo_paths: train on these Criteo TSV files instead of synthetic data.
    progress: tqdm bar on rank 0 (None: only when stderr is a terminal).
    pipeline: train through TrainPipelineSparseDist (sharded runs) or TrainPipelineBase (one process, no plan);
        False: the plain loop. The numbers are the same either way.
    sharding_group_size: train 2D (TorchRec's DMPCollection): the tables sharded over each group of this many
        ranks, the groups replicas of each other (it must divide the world size); `plan` is then a plan for the
        group's ranks (None: the planner plans the group). None (default): shard over every rank.
    sync_interval: with sharding_group_size, the replicas are averaged (DMPCollection.sync()) after the backward of
        every `sync_interval`-th step (from the first), as TorchRec's pipeline does.
    """

    workload: str = "dlrm26"
    steps: int = 100
    batch_size: Optional[int] = None
    max_rows: Optional[int] = None
    embedding_dim: Optional[int] = None
    dense_arch_layer_sizes: Optional[List[int]] = None
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 1])
    embedding_lr: float = 0.05
    dense_lr: float = 3e-3
    report_every: int = 10
    auc_window_steps: int = 20
    seed: int = 0
    zipf_alpha: Optional[float] = None
    signal: float = 3.0
    criteo_paths: Optional[List[str]] = None
    plan: Any = None
    progress: Optional[bool] = None
    pipeline: bool = True
    sharding_group_size: Optional[int] = None
    sync_interval: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_rows", "embedding_dim", "report_every", "auc_window_steps",
                     "sharding_group_size", "sync_interval"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"TrainConfig: {name} must be a positive integer, got {value!r}")
        for name in ("dense_arch_layer_sizes", "over_arch_layer_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and (not sizes or any(not isinstance(s, int) or s < 1 for s in sizes)):
                raise ValueError(f"TrainConfig: {name} must be a non-empty list of positive integers, got {sizes!r}")
        for name in ("embedding_lr", "dense_lr", "signal"):
            if not float(getattr(self, name)) >= 0:  # also refuses NaN
                raise ValueError(f"TrainConfig: {name} must be a number >= 0, got {getattr(self, name)!r}")
        if self.zipf_alpha is not None and not float(self.zipf_alpha) >= 0:
            raise ValueError(f"TrainConfig: zipf_alpha must be >= 0 (0: uniform ids), got {self.zipf_alpha!r}")


# ------------------------------------------------------------------------------------------ recipe steps
def make_tables(config: TrainConfig) -> Tuple[List[EmbeddingBagConfig], Dict[str, float], int, float]:
    """The workload's tables (rows capped, dims overridden), pooling factors, dense feature count, Zipf alpha."""
    workload = load_workload(config.workload)
    tables = []
    for table in workload.tables:
        changes: Dict[str, Any] = {}
        if config.max_rows is not None:
            changes["num_embeddings"] = min(table.num_embeddings, config.max_rows)
        if config.embedding_dim is not None:
            changes["embedding_dim"] = config.embedding_dim
        elif len({t.embedding_dim for t in workload.tables}) > 1:  # DLRM's interaction needs one dim
            changes["embedding_dim"] = min(t.embedding_dim for t in workload.tables)
        tables.append(dataclasses.replace(table, **changes))
    alpha = config.zipf_alpha
    if alpha is None:
        alpha = float(workload.id_distribution.get("alpha", 1.05)) if workload.id_distribution.get("kind") == "zipf" else 0.0
    dense_features = 13 if config.criteo_paths else (workload.dense_features or 13)
    return tables, dict(workload.pooling_factors), dense_features, alpha


def sharding_mode(ctx: WorkerContext, plan: Any, sharding_group_size: Optional[int] = None) -> str:
    """"local" (one process, no plan), "dmp" (rectoolkit's DistributedModelParallel) or "2d" (DMPCollection: a
    sharding group smaller than the world)."""
    if sharding_group_size is not None and sharding_group_size < ctx.world_size:
        return "2d"
    return "local" if ctx.world_size == 1 and plan is None else "dmp"


def build_model(config: TrainConfig, tables: List[EmbeddingBagConfig], dense_features: int, fuse_embedding_optimizer: bool,
                device: torch.device) -> DLRM:
    """DLRM over an EmbeddingBagCollection; the tables' Adagrad is fused into backward when asked."""
    torch.manual_seed(config.seed)  # same initial weights on every rank
    optimizer = {"optimizer": "adagrad", "lr": config.embedding_lr} if fuse_embedding_optimizer else {}
    ebc = EmbeddingBagCollection(tables, device=device, **optimizer)
    dim = tables[0].embedding_dim
    dense_sizes = config.dense_arch_layer_sizes or [64, dim]
    return DLRM(ebc, dense_features, dense_sizes, config.over_arch_layer_sizes).to(device)


def load_plan(plan: Any) -> Any:
    """A ShardingPlan given as an object, or read from a JSON file written by `rectoolkit.plan` (save_plan)."""
    if plan is None or not isinstance(plan, (str, Path)):
        return plan
    from rectoolkit.plan.serialization import load_plan as load_plan_file

    return load_plan_file(plan)


def shard_model(model: nn.Module, ctx: WorkerContext, plan: Any, mode: str,
                sharding_group_size: Optional[int] = None) -> nn.Module:
    """Apply the model parallelism: DistributedModelParallel (one call), DMPCollection over groups of
    `sharding_group_size` ranks (mode "2d"), or nothing for a local run."""
    if mode == "local":
        return model
    from rectoolkit.distributed import DistributedModelParallel, DMPCollection

    if mode == "2d":
        return DMPCollection(model, ctx.device, load_plan(plan), ctx.world_size, sharding_group_size)
    return DistributedModelParallel(model, plan=load_plan(plan), device=ctx.device)


def make_optimizers(model: nn.Module, config: TrainConfig) -> List[Any]:
    """Adam for the dense MLPs; the tables use their fused Adagrad (or a torch Adagrad when not fused: in a
    DistributedModelParallel the DATA_PARALLEL replicas, whose dense kernel leaves their averaged gradient in .grad
    as TorchRec's does, and shards planned compute_kernel "dense")."""
    if hasattr(model, "dense_parameters") and hasattr(model, "fused_optimizer"):  # DistributedModelParallel
        shards = {id(p) for collection in model.sharded_modules.values() for p in collection.parameters()}
        plain = model.dense_parameters()
        dmp_optimizers: List[Any] = [torch.optim.Adam([p for p in plain if id(p) not in shards], lr=config.dense_lr),
                                     model.fused_optimizer]
        plain_tables = [p for p in plain if id(p) in shards]
        if plain_tables:
            dmp_optimizers.append(torch.optim.Adagrad(plain_tables, lr=config.embedding_lr))
        return dmp_optimizers
    dense, tables = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad or hasattr(param, "_in_backward_optimizers"):
            continue  # fused into backward (or frozen)
        (tables if "sparse_arch" in name else dense).append(param)
    optimizers: List[Any] = [torch.optim.Adam(dense, lr=config.dense_lr)]
    if tables:
        optimizers.append(torch.optim.Adagrad(tables, lr=config.embedding_lr))
    return optimizers


class AllOptimizers:
    """The recipe's optimizers as one (what a train pipeline steps): zero_grad and step each, in order."""

    def __init__(self, optimizers: List[Any]) -> None:
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


def training_steps(model: nn.Module, optimizers: List[Any], batches: Iterator[Batch], device: torch.device,
                   pipeline: bool, sync_interval: int = 1) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Train on every batch; yield (loss, logits, labels) of each step, detached.

    pipeline=True: through TrainPipelineSparseDist for a DistributedModelParallel (the next batch's input_dist
    overlaps this step), TrainPipelineBase otherwise (the next batch's device copy does); False: the plain loop.
    The updates are the same, bit for bit. A DMPCollection is synced after the backward of every
    `sync_interval`-th step (the pipeline's dmp_collection_sync_interval_batches).
    """
    def forward(batch: Batch):
        logits = model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)

    from rectoolkit.distributed import DistributedModelParallel, DMPCollection, TrainPipelineBase, TrainPipelineSparseDist

    optimizer = AllOptimizers(optimizers)
    if not pipeline:
        for index, batch in enumerate(batches):
            batch = batch.to(device)
            optimizer.zero_grad()
            loss, output = forward(batch)
            loss.backward()
            if isinstance(model, DMPCollection) and index % sync_interval == 0:
                model.sync()
            optimizer.step()
            yield output
        return
    if isinstance(model, DistributedModelParallel):
        runner = TrainPipelineSparseDist(model, optimizer, device, custom_model_fwd=forward,
                                         dmp_collection_sync_interval_batches=sync_interval)
    else:
        runner = TrainPipelineBase(model, optimizer, device, custom_model_fwd=forward)
    while True:
        try:
            output = runner.progress(batches)
        except StopIteration:
            return
        try:
            yield output
        except GeneratorExit:  # the loop stopped early (every rank at the same step)
            if isinstance(runner, TrainPipelineSparseDist):
                runner.finish()  # the next batch's input_dist is in flight on every rank: complete it
            raise


def make_data(config: TrainConfig, ctx: WorkerContext, tables: List[EmbeddingBagConfig],
              pooling_factors: Dict[str, float], dense_features: int, alpha: float, batch_size: int) -> Iterator[Batch]:
    """This rank's batches: Criteo files when given, else the synthetic generator."""
    if config.criteo_paths:
        return iter(CriteoTSV(config.criteo_paths, tables, batch_size, rank=ctx.rank, world_size=ctx.world_size))
    return iter(SyntheticData(tables, pooling_factors, batch_size, dense_features=dense_features, zipf_alpha=alpha,
                              signal=config.signal, seed=config.seed, rank=ctx.rank, world_size=ctx.world_size))


CLICK_TASK = "click"  # the recipe's one task, in the metric keys ("ne-click|window_ne")


def make_metric_module(config: TrainConfig, ctx: WorkerContext, batch_size: int) -> RecMetricModule:
    """NE, calibration and AUC of the click predictions, lifetime and over the last `auc_window_steps` steps of
    all ranks; every rank computes the values (compute() is a collective, called at every report)."""
    window = config.auc_window_steps * batch_size * ctx.world_size
    metrics = {metric: RecMetricDef(rec_task_indices=[0], window_size=window)
               for metric in (RecMetricEnum.NE, RecMetricEnum.CALIBRATION, RecMetricEnum.AUC)}
    metrics_config = MetricsConfig(rec_tasks=[RecTaskInfo(name=CLICK_TASK)], rec_metrics=metrics,
                                   compute_on_all_ranks=True, compute_interval_steps=config.report_every)
    return generate_metric_module(RecMetricModule, metrics_config, batch_size, ctx.world_size, ctx.rank, {},
                                  torch.device("cpu"))


def rec_metric_values(rec_metrics: RecMetricModule) -> Dict[str, float]:
    """The module's values over all ranks, named by what they are: {"window_ne": ..., "lifetime_ne": ...}."""
    return {key.split("|", 1)[1]: float(value) for key, value in rec_metrics.compute().items()}


# ------------------------------------------------------------------------------------------ measurements
def measured_resources(model: nn.Module, ctx: WorkerContext) -> Dict[str, Any]:
    """What this rank holds and has sent so far, measured (no collective is called).

    param_bytes (all local parameters); with DistributedModelParallel also memory_<kind>_bytes from its
    memory_usage(), comm_bytes_sent (the data collectives that rectoolkit.plan.traffic prices, so that it compares
    with the plan's estimate), control_bytes_sent (the small unpriced "metadata" messages) and
    bytes_sent_by_collective ({collective: [bytes to rank j]}, all of them); comm_wait_s, the seconds this rank
    was blocked in the sharded modules' collectives (CommStats.wait_s; DDP's gradient all-reduce not included);
    with DMPCollection (2D: the collectives above within this rank's sharding group) also sync_bytes_sent, what its
    sync() sent to the other replicas.
    """
    out: Dict[str, Any] = {"param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    usage = getattr(model, "memory_usage", None)
    if callable(usage):
        out.update({f"memory_{kind}_bytes": int(value) for kind, value in usage().items()})
    stats = getattr(getattr(model, "env", None), "stats", None)
    if stats is not None and hasattr(stats, "bytes_sent"):
        out["comm_bytes_sent"] = int(stats.total_bytes(COLLECTIVES))
        out["control_bytes_sent"] = int(stats.total_bytes()) - out["comm_bytes_sent"]
        out["bytes_sent_by_collective"] = {name: [int(b) for b in row] for name, row in stats.bytes_sent.items()}
        out["comm_wait_s"] = stats.total_wait_s()
    sync_env = getattr(model, "sync_env", None)  # a DMPCollection: its replicas' averaging, counted apart
    if sync_env is not None:
        out["sync_bytes_sent"] = int(sync_env.stats.total_bytes())
    if ctx.device.type == "cuda" and "memory_cuda_max_allocated_bytes" not in out:
        out["memory_cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
    return out


def _gather(ctx: WorkerContext, tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's tensor concatenated (same shapes on every rank), or the tensor itself on one process.
    The collective runs on ctx.device (NCCL takes CUDA tensors only); the result comes back where `tensor` was."""
    if ctx.world_size == 1 or not dist.is_initialized():
        return tensor
    local = tensor.to(ctx.device)
    parts = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(tensor.device)


def _progress_bar(config: TrainConfig, ctx: WorkerContext):
    show = config.progress if config.progress is not None else sys.stderr.isatty()
    if not (show and ctx.is_main):
        return None
    from tqdm import tqdm

    return tqdm(total=config.steps, desc="train", unit="step", dynamic_ncols=True)


# ------------------------------------------------------------------------------------------ the loop
def train(ctx: WorkerContext, config: TrainConfig) -> Dict[str, Any]:
    """Train DLRM for `config.steps` steps on this rank; report metrics; return a summary dict.

    Returns {"steps", "final_loss", "final_auc", "first_loss", "first_auc", "samples_per_s", "mode", "pipeline"}.
    """
    tables, pooling_factors, dense_features, alpha = make_tables(config)
    batch_size = config.batch_size if config.batch_size is not None else load_workload(config.workload).batch_size_per_rank
    mode = sharding_mode(ctx, config.plan, config.sharding_group_size)
    model = build_model(config, tables, dense_features, fuse_embedding_optimizer=True, device=ctx.device)
    model = shard_model(model, ctx, config.plan, mode, config.sharding_group_size)
    optimizers = make_optimizers(model, config)
    batches = make_data(config, ctx, tables, pooling_factors, dense_features, alpha, batch_size)
    rec_metrics = make_metric_module(config, ctx, batch_size)
    window: List[Tuple[torch.Tensor, torch.Tensor]] = []
    losses: List[float] = []
    summary: Dict[str, Any] = {"mode": mode, "steps": 0, "pipeline": config.pipeline}
    throughput, started = Throughput(), time.perf_counter()
    bar = _progress_bar(config, ctx)
    model.train()
    stop = False
    steps = training_steps(model, optimizers, itertools.islice(batches, config.steps), ctx.device, config.pipeline,
                           config.sync_interval)
    for step, (loss, logits, labels) in enumerate(steps, start=1):  # ends early when Criteo files run out
        throughput.add(labels.numel() * ctx.world_size)
        losses.append(loss.item())
        rec_metrics.update({"prediction": torch.sigmoid(logits.detach()), "label": labels,
                            "weight": torch.ones_like(labels)})
        window = (window + [(logits.detach().float().cpu(), labels.cpu())])[-config.auc_window_steps:]
        if step % config.report_every == 0 or step == config.steps:
            metrics, stop = _step_metrics(ctx, step, losses, window, throughput, ctx.stop_requested())
            metrics.update(measured_resources(model, ctx))
            metrics.update(rec_metric_values(rec_metrics))
            metrics["elapsed_s"] = time.perf_counter() - started
            losses = []
            summary.setdefault("first_loss", metrics["loss"])
            summary.setdefault("first_auc", metrics["auc"])
            summary.update(final_loss=metrics["loss"], final_auc=metrics["auc"])
            ctx.report(**metrics)
            if bar is not None:
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", auc=f"{metrics['auc']:.3f}")
        if bar is not None:
            bar.update(1)
        summary["steps"] = step
        if stop:
            steps.close()  # every rank agreed at this report (a lone rank leaving would hang the others)
            break
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - started
    summary["samples_per_s"] = summary["steps"] * batch_size * ctx.world_size / max(elapsed, 1e-9)
    return summary


def _step_metrics(ctx: WorkerContext, step: int, losses: List[float], window, throughput: Throughput,
                  stop_requested: bool) -> Tuple[Dict[str, Any], bool]:
    """Loss (mean since the last report, over all ranks), AUC over the window of all ranks, samples/s; and
    whether any rank was asked to stop (so that all ranks stop at the same step)."""
    loss = torch.tensor([sum(losses), float(len(losses)), float(stop_requested)], dtype=torch.float64,
                        device=ctx.device)  # NCCL reduces CUDA tensors only
    if ctx.world_size > 1 and dist.is_initialized():
        dist.all_reduce(loss)
    loss = loss.cpu()
    scores = _gather(ctx, torch.cat([s for s, _ in window]))
    labels = _gather(ctx, torch.cat([y for _, y in window]))
    samples_per_s = throughput.rate()
    metrics = {"step": step, "loss": float(loss[0] / loss[1]), "auc": auc(scores, labels),
               "samples_per_s": samples_per_s, "steps_per_s": samples_per_s / (labels.numel() / len(window) or 1)}
    return metrics, bool(loss[2] > 0)


def write_metrics_jsonl(path: Union[str, Path]):
    """An on_metrics callback that appends each metrics dict as one JSON line to `path`."""
    path = Path(path)

    def write(metrics: Dict[str, Any]) -> None:
        with open(path, "a") as handle:
            handle.write(json.dumps(metrics) + "\n")

    return write
