"""torch.compile benchmark: a DLRM training step (forward + backward) on CPU or CUDA, eager against inductor.

Run: .venv/bin/python benchmarks/bench_compile.py [--batch 512] [--rounds 7] [--steps 10] [--device cpu|cuda]
     [--out benchmarks/results/compile.md (cpu), compile_cuda.md (cuda)]

The model: rectoolkit's DLRM over an EmbeddingBagCollection without a fused optimizer (dense gradients; a fused
optimizer's lookup runs outside the compiled graph, see docs/compile_export.md), 8 tables of 20,000 rows, dim
16, ~4 ids per bag. Contenders (the same weights, the same batches, one thread):
- eager: the collection's kernel (custom autograd function, sorted-id backward);
- compiled: torch.compile(model, fullgraph=True, backend="inductor"): the traced lookup (aten embedding_bag on
  the table Parameters) and the dense layers in one graph, the backward compiled by AOTAutograd.
A step is forward, a BCE loss, backward and zero_grad (no optimizer update: it is the same code for both).
Each round times `--steps` steps of each contender, in turn, the first one alternating; the figure is the median
over rounds of the per-step mean, with its range. Compile time (first calls) is reported apart.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rectoolkit as rtk  # noqa: E402
from rectoolkit.train.model import DLRM  # noqa: E402

NUM_TABLES, ROWS, DIM, DENSE_IN = 8, 20_000, 16, 13


def make_model(seed: int = 0) -> DLRM:
    torch.manual_seed(seed)
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{i}"])
              for i in range(NUM_TABLES)]
    return DLRM(rtk.EmbeddingBagCollection(tables), dense_in_features=DENSE_IN, dense_arch_layer_sizes=[64, DIM],
                over_arch_layer_sizes=[64, 32, 1])


def make_batches(batch_size: int, count: int) -> List[tuple]:
    g = torch.Generator().manual_seed(batch_size)
    batches = []
    for _ in range(count):
        lengths = torch.randint(0, 9, (NUM_TABLES * batch_size,), generator=g)  # mean 4 ids per bag
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        kjt = rtk.KeyedJaggedTensor.from_lengths_sync([f"f{i}" for i in range(NUM_TABLES)], values, lengths)
        batches.append((torch.randn(batch_size, DENSE_IN, generator=g), kjt,
                        torch.randint(0, 2, (batch_size, 1), generator=g).float()))
    return batches


def step_fn(model: torch.nn.Module, forward: Callable) -> Callable[[tuple], None]:
    def step(batch: tuple) -> None:
        dense, kjt, labels = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(forward(dense, kjt), labels)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def to_device(batches: List[tuple], device: torch.device) -> List[tuple]:
    return [(dense.to(device), kjt.to(device), labels.to(device)) for dense, kjt, labels in batches]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(steps: Dict[str, Callable[[tuple], None]], batches: List[tuple], rounds: int,
              steps_per_round: int, device: torch.device = torch.device("cpu")) -> Dict[str, List[float]]:
    """Per round, the mean step time of each contender; the contender that goes first alternates. On CUDA the
    device is synchronized before and after each contender's steps, so a round times the work, not its launch."""
    names = list(steps)
    per_round: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            synchronize(device)
            start = time.perf_counter()
            for i in range(steps_per_round):
                steps[name](batches[i % len(batches)])
            synchronize(device)
            per_round[name].append((time.perf_counter() - start) / steps_per_round)
    return per_round


def main(argv: Optional[List[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (model and batches on that device)")
    parser.add_argument("--out", default=None, help="default: results/compile.md (cpu), compile_cuda.md (cuda)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    out = args.out if args.out is not None else str(
        Path(__file__).parent / "results" / ("compile.md" if device.type == "cpu" else f"compile_{device.type}.md"))
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    eager = make_model().to(device)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend="inductor")
    batches = to_device(make_batches(args.batch, count=4), device)
    steps = {"eager": step_fn(eager, eager), "compiled (inductor, fullgraph)": step_fn(compiled_model, compiled)}

    started = time.perf_counter()
    for batch in batches + batches:  # compiles (and recompiles once for a dynamic number of ids), then warm
        steps["compiled (inductor, fullgraph)"](batch)
    compile_s = time.perf_counter() - started
    for batch in batches:
        steps["eager"](batch)
    load_before = os.getloadavg()
    per_round = alternate(steps, batches, args.rounds, args.steps, device)
    load_after = os.getloadavg()

    eager_median = statistics.median(per_round["eager"])
    where = "CPU" if device.type == "cpu" else f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    lines = [
        f"# torch.compile: DLRM training step, eager vs inductor ({where})",
        "",
        f"DLRM over {NUM_TABLES} tables x {ROWS:,} rows, dim {DIM}, batch {args.batch}, ~4 ids per bag; dense "
        f"gradients (no fused optimizer). Step = forward + BCE loss + backward + zero_grad. torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with other jobs (load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after). {args.rounds} alternating rounds of {args.steps} steps each: median per-step "
        f"time over rounds, range in brackets. Compile (first calls, incl. one recompile for dynamic id counts; inductor's on-disk cache may be warm): "
        f"{compile_s:.0f} s.",
        "",
        "| contender | step time (median) | range over rounds | vs eager |",
        "| --- | --- | --- | --- |",
    ]
    for name, times in per_round.items():
        median = statistics.median(times)
        lines.append(f"| {name} | {median * 1e3:.2f} ms | {min(times) * 1e3:.2f} - {max(times) * 1e3:.2f} ms | "
                     f"{eager_median / median:.2f}x |")
    lines += ["", "Command: `python benchmarks/bench_compile.py " + " ".join(argv if argv is not None else sys.argv[1:])
              + "`"]
    return report("\n".join(lines) + "\n", out)


def report(table: str, out: str) -> str:
    """Print the results table and write it to `out` (benchmarks/results/compile.md; nothing for "")."""
    print(table)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table)
    return table


if __name__ == "__main__":
    main()
