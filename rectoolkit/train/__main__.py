"""`python -m rectoolkit.train`: the demo recipe from the command line, alone or under torchrun.

    torchrun --standalone --nproc-per-node 2 -m rectoolkit.train --workload dlrm26 --steps 100 \\
        --batch-size 256 --max-rows 10000 --plan plan.json
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m rectoolkit.train ...

Without torchrun's environment (RANK unset) it trains in this one process. Rank 0 prints one JSON line per
report (unless a progress bar is shown) and a final {"summary": ...} line; --metrics-out also writes the
reports as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch.distributed as dist

from rectoolkit.launch.context import WorkerContext
from rectoolkit.launch.torchrun import torchrun_context
from rectoolkit.train.loop import TrainConfig, train, write_metrics_jsonl
from rectoolkit.workloads import WORKLOAD_NAMES


def _int_list(text: str) -> List[int]:
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 64,32,1, got {text!r}") from None


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in --help (as its help says it, or the value)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


# TrainConfig field -> the option that sets it (for error messages)
_OPTION_OF_FIELD = {"dense_arch_layer_sizes": "--dense-arch", "over_arch_layer_sizes": "--over-arch"}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rectoolkit.train", description=__doc__.split("\n\n")[0],
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--workload", default="dlrm26", help=f"one of {WORKLOAD_NAMES} or a workload JSON file")
    parser.add_argument("--plan", default=None, help="sharding plan JSON for DistributedModelParallel "
                        "(default: the planner decides)")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="samples per rank per step (default: the workload's batch_size_per_rank)")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="cap every table's rows, for small demo runs (default: the workload's rows)")
    parser.add_argument("--embedding-dim", type=int, default=None, help="one embedding dim for every table "
                        "(default: the workload's dim; the smallest one when its tables differ)")
    parser.add_argument("--dense-arch", type=_int_list, default=None,
                        help="dense MLP sizes, e.g. 64,16; the last must be the embedding dim (default: 64,<dim>)")
    parser.add_argument("--over-arch", type=_int_list, default=[64, 32, 1],
                        help="over MLP sizes (default: 64,32,1)")
    parser.add_argument("--embedding-lr", type=float, default=0.05, help="fused Adagrad lr of the tables")
    parser.add_argument("--dense-lr", type=float, default=3e-3, help="Adam lr of the MLPs")
    parser.add_argument("--report-every", type=int, default=10, help="steps between metric reports")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the synthetic data")
    parser.add_argument("--zipf-alpha", type=float, default=None,
                        help="Zipf skew of the synthetic ids, 0 = uniform (default: the workload's)")
    parser.add_argument("--criteo", nargs="+", default=None, metavar="TSV", help="train on Criteo TSV files (default: synthetic data)")
    parser.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                        help="under torchrun (default: nccl when every local rank has a GPU, else gloo)")
    parser.add_argument("--metrics-out", default=None, help="rank 0 appends each report here as a JSON line (default: none)")
    parser.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True,
                        help="train through TrainPipelineSparseDist: the next batch's input_dist overlaps this step "
                        "(same numbers); --no-pipeline: the plain loop (default: on)")
    parser.add_argument("--sharding-group-size", type=int, default=None,
                        help="train 2D (TorchRec's DMPCollection): shard over groups of this many ranks, the groups "
                        "replicas synced every --sync-interval steps; --plan is then the group's (default: shard "
                        "over every rank)")
    parser.add_argument("--sync-interval", type=int, default=1,
                        help="with --sharding-group-size: steps between syncs of the replicas (default: 1)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on rank 0 (default: when stderr is a terminal)")
    args = parser.parse_args(argv)
    try:
        args.config = TrainConfig(
            workload=args.workload, steps=args.steps, batch_size=args.batch_size, max_rows=args.max_rows,
            embedding_dim=args.embedding_dim, dense_arch_layer_sizes=args.dense_arch,
            over_arch_layer_sizes=args.over_arch, embedding_lr=args.embedding_lr, dense_lr=args.dense_lr,
            report_every=args.report_every, seed=args.seed, zipf_alpha=args.zipf_alpha, criteo_paths=args.criteo,
            plan=args.plan, progress=args.progress, pipeline=args.pipeline,
            sharding_group_size=args.sharding_group_size, sync_interval=args.sync_interval)
    except ValueError as error:  # "TrainConfig: batch_size must be ..." -> "argument --batch-size: must be ..."
        field, _, problem = str(error).removeprefix("TrainConfig: ").partition(" ")
        option = _OPTION_OF_FIELD.get(field, "--" + field.replace("_", "-"))
        parser.error(f"argument {option}: {problem}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    config = args.config
    show_bar = args.progress if args.progress is not None else sys.stderr.isatty()
    writer = write_metrics_jsonl(args.metrics_out) if args.metrics_out else None

    def on_metrics(metrics: dict) -> None:
        if writer is not None:
            writer(metrics)
        if not show_bar:
            print(json.dumps(metrics), flush=True)

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if under_torchrun:
        ctx = torchrun_context(backend=args.backend)
    else:
        ctx = WorkerContext.single_process()
    if ctx.is_main:
        ctx._send = on_metrics
    else:
        ctx._send = lambda metrics: None  # only rank 0 prints; metrics are already global (all-reduced)
    try:
        summary = train(ctx, config)
        if ctx.is_main:
            print(json.dumps({"summary": {**summary, "world_size": ctx.world_size, "backend": ctx.backend}}),
                  flush=True)
        if under_torchrun and dist.is_initialized():
            dist.barrier()  # tear down together: a peer's closed sockets must not race this rank's last op
    finally:
        if under_torchrun and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
