"""Embedding lookup benchmark on the dlrm26 workload: forward and forward+backward+update, samples/s.

Run: .venv/bin/python benchmarks/bench_embeddings.py [--batch 2048] [--iters 10] [--rounds 2] [--ab-steps 30] [--quick]
     [--device cuda]

With --device cuda every contender runs on the GPU (tables, batches and updates in GPU memory; each timed call
ends with torch.cuda.synchronize()), the copy bandwidth is the GPU's device-to-device copy, and the table goes
to results/embeddings_cuda.md. The fbgemm rows need fbgemm-gpu's CUDA build (n/a without it).

Contenders (all fp32, SGD lr=0.01 so every path does the same update):
- rectoolkit EBC, fbgemm kernel (fused EXACT_SGD in backward)
- rectoolkit EBC, pure-torch kernel (fused exact SGD in backward)
- a Python loop of torch.nn.EmbeddingBag, dense grads + torch.optim.SGD
- TorchRec's unsharded EmbeddingBagCollection, dense grads + torch.optim.SGD
- fbgemm's SplitTableBatchedEmbeddingBagsCodegen called directly (fused EXACT_SGD)

Ids follow a Zipf law (alpha from the workload, 1.05 for dlrm26) over each table's rows, scattered by a fixed
permutation; bag sizes are uniform with each feature's mean pooling factor. Effective bandwidth = bytes of
embedding rows the lookup reads (ids x dim x 4) per second; copy bandwidth = (read + written bytes) per second
of a 256 MiB tensor copy, measured in the same run. Times are the median of --iters calls after 4 warm-up
calls, pooled over --rounds rounds.

The target "our fbgemm path within 10% of fbgemm's TBE called directly" is also measured head to head: the two
are called in turn, step after step (--ab-steps of each), so both see the same load from other processes; the
table reports each one's median step time and the median of the per-step ratios.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rectoolkit as rtk  # noqa: E402
from rectoolkit.kernels import fbgemm_available  # noqa: E402


def zipf_ids(num_rows: int, count: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """`count` ids in [0, num_rows) with P(rank k) ~ 1/k^alpha, ranks scattered over the table."""
    ranks = torch.arange(1, num_rows + 1, dtype=torch.float64)
    cdf = torch.cumsum(ranks.pow(-alpha), 0)
    cdf /= cdf[-1].clone()
    rank = torch.searchsorted(cdf, torch.rand(count, generator=generator, dtype=torch.float64)).clamp(max=num_rows - 1)
    return (rank * 2_654_435_761) % num_rows  # a fixed scatter: hot ids are not neighbours


def make_batches(workload, batch_size: int, num_batches: int, seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    alpha = float(workload.id_distribution.get("alpha", 1.05))
    features = [(f, t.num_embeddings) for t in workload.tables for f in t.feature_names]
    batches = []
    for _ in range(num_batches):
        lengths, values = [], []
        for feature, rows in features:
            mean = workload.pooling_factors[feature]
            if mean <= 1:
                length = torch.ones(batch_size, dtype=torch.int64)
            else:
                length = torch.randint(1, int(2 * mean), (batch_size,), generator=g)
            lengths.append(length)
            values.append(zipf_ids(rows, int(length.sum()), alpha, g))
        lengths_t, values_t = torch.cat(lengths), torch.cat(values)
        batches.append({
            "keys": [f for f, _ in features], "values": values_t, "lengths": lengths_t,
            "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths_t.cumsum(0)]),
        })
    return batches


DEVICE = torch.device("cpu")  # set by --device


def _sync() -> None:
    """Wait for the GPU's queued work, so that a call's time includes it (nothing to wait for on the CPU)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def time_it(step: Callable[[int], None], iters: int, warmup: int = 4) -> List[float]:
    """Seconds of each of `iters` calls after `warmup` calls."""
    for i in range(warmup):
        step(i)
    times = []
    for i in range(iters):
        _sync()
        start = time.perf_counter()
        step(i)
        _sync()
        times.append(time.perf_counter() - start)
    return times


def interleaved(steps: List[Callable[[int], None]], iters: int, warmup: int = 4) -> List[List[float]]:
    """Seconds per call of each step, the steps called in turn (a, b, a, b, ...) so that they share the load."""
    for i in range(warmup):
        for step in steps:
            step(i)
    times: List[List[float]] = [[] for _ in steps]
    for i in range(iters):
        for step, out in zip(steps, times):
            _sync()
            start = time.perf_counter()
            step(i)
            _sync()
            out.append(time.perf_counter() - start)
    return times


def copy_bandwidth_bytes_per_s() -> float:
    src = torch.rand(64 * 1024 * 1024, device=DEVICE)  # 256 MiB
    dst = torch.empty_like(src)
    seconds = min(time_it(lambda _: dst.copy_(src), iters=5))  # the least disturbed copy
    return 2 * src.numel() * 4 / seconds


def rectoolkit_steps(workload, batches, backend: str, ids_out_of_range: str = "error"):
    ebc = rtk.EmbeddingBagCollection(workload.tables, optimizer="sgd", lr=0.01, backend=backend,
                                     ids_out_of_range=ids_out_of_range, device=DEVICE)
    assert ebc.kernel.backend == backend, ebc.kernel
    kjts = [rtk.KeyedJaggedTensor(keys=b["keys"], values=b["values"], lengths=b["lengths"]).to(DEVICE)
            for b in batches]

    def forward(i):
        with torch.no_grad():
            ebc(kjts[i % len(kjts)])

    def train(i):
        out = ebc(kjts[i % len(kjts)]).values()
        out.backward(torch.ones_like(out))

    return forward, train


def loop_steps(workload, batches):
    bags = torch.nn.ModuleList([torch.nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode="sum",
                                                      include_last_offset=True) for t in workload.tables]).to(DEVICE)
    feature_table = [t for t, table in enumerate(workload.tables) for _ in table.feature_names]
    opt = torch.optim.SGD(bags.parameters(), lr=0.01)

    def run(i):
        b = batches[i % len(batches)]
        batch_size = b["lengths"].numel() // len(feature_table)
        outs = []
        for f, t in enumerate(feature_table):
            lo, hi = int(b["offsets"][f * batch_size]), int(b["offsets"][(f + 1) * batch_size])
            outs.append(bags[t](b["values"][lo:hi], b["offsets"][f * batch_size:(f + 1) * batch_size + 1] - lo))
        return torch.cat(outs, 1)

    def forward(i):
        with torch.no_grad():
            run(i)

    def train(i):
        out = run(i)
        out.backward(torch.ones_like(out))
        opt.step()
        opt.zero_grad()

    return forward, train


def torchrec_steps(workload, batches):
    import torchrec

    tables = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                          feature_names=list(t.feature_names)) for t in workload.tables]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=DEVICE)
    opt = torch.optim.SGD(ebc.parameters(), lr=0.01)
    kjts = [torchrec.KeyedJaggedTensor(keys=b["keys"], values=b["values"], lengths=b["lengths"]).to(DEVICE)
            for b in batches]

    def forward(i):
        with torch.no_grad():
            ebc(kjts[i % len(kjts)])

    def train(i):
        out = ebc(kjts[i % len(kjts)]).values()
        out.backward(torch.ones_like(out))
        opt.step()
        opt.zero_grad()

    return forward, train


def tbe_steps(workload, batches):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    on_gpu = DEVICE.type == "cuda"
    placement = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if on_gpu else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(t.num_embeddings, t.embedding_dim, *placement) for t in workload.tables],
        feature_table_map=[t for t, table in enumerate(workload.tables) for _ in table.feature_names],
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.01, bounds_check_mode=BoundsCheckMode.NONE)
    with torch.no_grad():  # real values (fbgemm starts at zeros, which would read the shared zero page)
        for weight in tbe.split_embedding_weights():
            weight.uniform_(-0.01, 0.01)

    def forward(i):
        b = batches[i % len(batches)]
        with torch.no_grad():
            tbe(b["values"], b["offsets"])

    def train(i):
        b = batches[i % len(batches)]
        out = tbe(b["values"], b["offsets"])
        out.backward(torch.ones_like(out))

    return forward, train


def timed(steps, iters: int):
    forward, train = steps
    return time_it(forward, iters), time_it(train, iters)


def main(argv: Optional[List[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="dlrm26")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="run every contender this many times; pool the calls")
    parser.add_argument("--ab-steps", type=int, default=30, help="interleaved steps of ours vs direct TBE (0: skip)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="fewer calls (iters 4, rounds 1, ab-steps 10)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (tables and batches on that device)")
    parser.add_argument("--out", default=None, help="default: results/embeddings.md (cpu), embeddings_cuda.md (cuda)")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if args.out is None:
        args.out = str(Path(__file__).parent / "results" / ("embeddings_cuda.md" if DEVICE.type == "cuda"
                                                              else "embeddings.md"))
    if args.quick:
        args.iters, args.rounds, args.ab_steps = 4, 1, 10

    if args.threads:
        torch.set_num_threads(args.threads)
    workload = rtk.load_workload(args.workload)
    batches = make_batches(workload, args.batch, num_batches=4)
    if DEVICE.type == "cuda":
        batches = [{k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in batches]
    ids_per_batch = statistics.mean(b["values"].numel() for b in batches)
    dim = workload.tables[0].embedding_dim
    row_bytes_per_batch = ids_per_batch * dim * 4
    copy_bw = copy_bandwidth_bytes_per_s()

    contenders = [
        ("rectoolkit EBC, fbgemm kernel (fused SGD)", lambda: timed(rectoolkit_steps(workload, batches, "fbgemm"), args.iters), fbgemm_available()),
        ("rectoolkit EBC, fbgemm kernel, ids unchecked", lambda: timed(rectoolkit_steps(workload, batches, "fbgemm", "unchecked"), args.iters), fbgemm_available()),
        ("rectoolkit EBC, pure-torch kernel (fused SGD)", lambda: timed(rectoolkit_steps(workload, batches, "torch"), args.iters), True),
        ("fbgemm TBE called directly (fused EXACT_SGD)", lambda: timed(tbe_steps(workload, batches), args.iters), fbgemm_available()),
        ("TorchRec EBC, unsharded (dense grads + SGD)", lambda: timed(torchrec_steps(workload, batches), args.iters), _has_torchrec()),
        ("loop of nn.EmbeddingBag (dense grads + SGD)", lambda: timed(loop_steps(workload, batches), args.iters), True),
    ]
    calls: Dict[str, List[List[float]]] = {}
    for _ in range(args.rounds):  # rounds spread out the interference of other processes
        for name, run, available in contenders:
            if not available:
                continue
            forward_times, train_times = run()
            pooled = calls.setdefault(name, [[], []])
            pooled[0] += forward_times
            pooled[1] += train_times
            print(f"{name}: forward {args.batch / statistics.median(forward_times):,.0f}/s, "
                  f"train {args.batch / statistics.median(train_times):,.0f}/s", file=sys.stderr)
            gc.collect()
        copy_bw = max(copy_bw, copy_bandwidth_bytes_per_s())

    lines = [
        f"### Embedding lookup, {args.workload} ({len(workload.tables)} tables, batch {args.batch}, "
        f"{ids_per_batch:,.0f} ids/batch, Zipf alpha {workload.id_distribution.get('alpha', 1.05)})",
        "",
        f"Machine: {_device_name()}, torch threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}, load average {_load_average()}; {DEVICE.type} copy bandwidth (read+write) "
        f"{copy_bw / 1e9:.1f} GB/s. Medians of {args.iters * args.rounds} calls per contender.",
        "",
        "| contender | forward samples/s | fwd+bwd+update samples/s | forward row bandwidth GB/s | % of copy bw |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, _, _ in contenders:
        if name not in calls:
            lines.append(f"| {name} | n/a | n/a | n/a | n/a |")
            continue
        forward_s, train_s = (statistics.median(times) for times in calls[name])
        bw = row_bytes_per_batch / forward_s
        lines.append(f"| {name} | {args.batch / forward_s:,.0f} | {args.batch / train_s:,.0f} | "
                     f"{bw / 1e9:.1f} | {100 * bw / copy_bw:.0f}% |")
    if fbgemm_available() and args.ab_steps:
        lines += ["", *head_to_head(workload, batches, args.batch, args.ab_steps)]
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")
    return table


def head_to_head(workload, batches, batch_size: int, steps: int) -> List[str]:
    """Our EBC on the fbgemm kernel against fbgemm's TBE, called in turn: medians and the median per-step ratio."""
    ours, direct = rectoolkit_steps(workload, batches, "fbgemm"), tbe_steps(workload, batches)
    lines = [f"Head to head, called in turn ({steps} steps each): rectoolkit EBC (fbgemm kernel, ids checked) "
             "vs fbgemm TBE called directly (ids unchecked).", "",
             "| step | rectoolkit median ms | direct TBE median ms | direct / ours (median of per-step ratios) |",
             "| --- | ---: | ---: | ---: |"]
    for label, index in (("forward", 0), ("fwd+bwd+update", 1)):
        ours_times, direct_times = interleaved([ours[index], direct[index]], steps)
        ratio = statistics.median(d / o for d, o in zip(direct_times, ours_times))
        lines.append(f"| {label} | {1e3 * statistics.median(ours_times):.2f} | "
                     f"{1e3 * statistics.median(direct_times):.2f} | {100 * ratio:.0f}% |")
        print(f"head to head {label}: ours/direct speed {100 * ratio:.0f}%", file=sys.stderr)
    return lines


def _device_name() -> str:
    if DEVICE.type == "cuda":
        return f"{torch.cuda.get_device_name(DEVICE)} (CUDA {torch.version.cuda}), host {platform.machine()}"
    return platform.processor() or platform.machine()


def _load_average() -> str:
    try:
        import os

        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"


def _has_torchrec() -> bool:
    try:
        import torchrec  # noqa: F401
    except Exception:
        return False
    return True


if __name__ == "__main__":
    main()
