"""Microseconds per op of rectoolkit's jagged types, side by side with TorchRec (when installed).

    .venv/bin/python benchmarks/bench_sparse.py            # prints a markdown table
                                                           # and writes benchmarks/results/sparse.md

Inputs: the 26 features of the dlrm26 workload (lengths drawn around each feature's pooling factor, int32
lengths, int64 ids), batch 2048 and 8192; KeyedTensor regroup: 26 keys of dim 64, two groups of 13 keys in
shuffled order. Each op is timed call by call on a fresh object (so no cached result is reused); the
table shows the best of 5 rounds of the median of 100 calls, rounds alternating between the libraries.
One intra-op thread for both libraries.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

import rectoolkit
import rectoolkit.sparse as ours
from rectoolkit.kernels import fbgemm_available

try:
    import torchrec.sparse.jagged_tensor as theirs
except Exception:  # TorchRec not installed (or its fbgemm fails to load): ours only
    theirs = None


Spec = Tuple[Callable[[], object], Callable[[object], object], int]


def median_us(make: Callable[[], object], op: Callable[[object], object], repeats: int) -> float:
    """Median time of op(fresh) over `repeats` calls; `make` builds the fresh input (not timed)."""
    for _ in range(3):
        op(make())
    times = []
    for _ in range(repeats):
        fresh = make()
        start = time.perf_counter()
        op(fresh)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def compare(specs: Dict[str, Spec], rounds: int) -> Dict[str, float]:
    """Best-of-`rounds` medians per library, the libraries alternating round by round so that a busy
    machine slows both alike."""
    best = {name: float("inf") for name in specs}
    for _ in range(rounds):
        for name, (make, op, repeats) in specs.items():
            best[name] = min(best[name], median_us(make, op, repeats))
    return best


def kjt_inputs(batch: int, seed: int = 0, lengths_dtype: torch.dtype = torch.int32) -> Dict[str, object]:
    workload = rectoolkit.load_workload("dlrm26")
    generator = torch.Generator().manual_seed(seed)
    keys = list(workload.pooling_factors)
    rows = []
    for key in keys:
        mean = workload.pooling_factors[key]
        rows.append(torch.poisson(torch.full((batch,), mean), generator=generator))
    lengths = torch.cat(rows).to(lengths_dtype)
    values = torch.randint(0, 1_000_000, (int(lengths.sum()),), generator=generator)
    return {"keys": keys, "values": values, "lengths": lengths}


def kjt_specs(lib, batch: int, repeats: int) -> Dict[str, Spec]:
    inputs = kjt_inputs(batch)
    inputs64 = kjt_inputs(batch, lengths_dtype=torch.int64)
    KJT = lib.KeyedJaggedTensor
    keys = inputs["keys"]
    reverse = list(range(len(keys)))[::-1]
    middle = keys[len(keys) // 2]

    def synced():
        return KJT.from_lengths_sync(**inputs)

    def unsynced():
        return KJT(**inputs)

    noop = lambda: None  # noqa: E731
    return {
        "construct KJT(keys, values, lengths)": (noop, lambda _: KJT(**inputs), repeats),
        "construct from_lengths_sync": (noop, lambda _: KJT.from_lengths_sync(**inputs), repeats),
        "construct from_lengths_sync, int64 lengths": (noop, lambda _: KJT.from_lengths_sync(**inputs64), repeats),
        "offsets()": (unsynced, lambda k: k.offsets(), repeats),
        "permute (reverse 26 keys)": (synced, lambda k: k.permute(reverse), repeats),
        "split([8, 8, 10])": (synced, lambda k: k.split([8, 8, 10]), repeats),
        "to_dict()": (synced, lambda k: k.to_dict(), repeats),
        "__getitem__(key)": (synced, lambda k: k[middle], repeats),
    }


def kt_specs(lib, batch: int, repeats: int) -> Dict[str, Spec]:
    generator = torch.Generator().manual_seed(0)
    keys = [f"cat_{i}" for i in range(26)]
    values = torch.randn(batch, 26 * 64, generator=generator)
    kt = lib.KeyedTensor(keys=keys, length_per_key=[64] * 26, values=values)
    shuffled = keys[:]
    random.Random(0).shuffle(shuffled)
    groups = [shuffled[:13], shuffled[13:]]
    noop = lambda: None  # noqa: E731
    return {
        "KeyedTensor.regroup (26 x dim 64 -> 2 groups)": (
            noop, lambda _: lib.KeyedTensor.regroup([kt], groups), max(repeats // 5, 21)
        )
    }


def main(argv: Optional[List[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    libraries = {"ours": ours, "torchrec": theirs} if theirs is not None else {"ours": ours}
    results: Dict[int, Dict[str, Dict[str, float]]] = {}
    for batch in args.batches:
        specs = {
            name: {**kjt_specs(lib, batch, args.repeats), **kt_specs(lib, batch, args.repeats)}
            for name, lib in libraries.items()
        }
        results[batch] = {name: {} for name in libraries}
        for op in specs["ours"]:
            best = compare({name: specs[name][op] for name in libraries}, args.rounds)
            for name in libraries:
                results[batch][name][op] = best[name]

    lines = [
        "# Jagged types: microseconds per op (median), rectoolkit vs TorchRec",
        "",
        f"26 features (dlrm26 pooling factors), int32 lengths; torch {torch.__version__}, "
        f"fbgemm used by rectoolkit: {fbgemm_available()}, 1 thread, {platform.machine()} "
        f"({os.cpu_count()} CPUs). Validation on (rectoolkit's default).",
        "",
    ]
    header = "| op |" + "".join(
        f" rectoolkit B={b} | TorchRec B={b} | speed-up B={b} |" if theirs is not None else f" rectoolkit B={b} |"
        for b in args.batches
    )
    lines += [header, "|---|" + "---:|" * ((3 if theirs is not None else 1) * len(args.batches))]
    for op in results[args.batches[0]]["ours"]:
        row = f"| {op} |"
        for batch in args.batches:
            mine = results[batch]["ours"][op]
            if theirs is None:
                row += f" {mine:.1f} |"
            else:
                other = results[batch]["torchrec"][op]
                row += f" {mine:.1f} | {other:.1f} | {other / mine:.2f}x |"
        lines.append(row)
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    return table


if __name__ == "__main__":
    main()
