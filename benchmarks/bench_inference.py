"""Inference benchmark on dlrm26: pooled-lookup latency and table memory for fp32, fp16, int8, int4.

Run: .venv/bin/python benchmarks/bench_inference.py [--batches 512 2048] [--iters 10] [--out benchmarks/results/inference.md]

Contenders (forward only, under torch.inference_mode, same KJTs):
- fp32 EmbeddingBagCollection (rectoolkit's float module, as trained; no optimizer -> its torch kernel)
- rectoolkit QuantEmbeddingBagCollection, per storage type, fbgemm's int-n-bit TBE op and the pure-torch path
- TorchRec's quantized EmbeddingBagCollection (torchrec.quant), per storage type, same quantized bytes

Memory is the bytes of the stored tables (rows x padded row bytes; TorchRec: its TBEs' weight buffers).
Rows are padded to 16 bytes (TorchRec's layout); "int8 / row_alignment=4" is fbgemm's unpadded CPU layout.
Ids are Zipf (the workload's alpha) per table, bag sizes from the workload's pooling factors
(rectoolkit.train.SyntheticData). Latency = the fastest of --iters x --rounds calls, contenders called in turn with the fp32 module.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rectoolkit as rtk  # noqa: E402
from rectoolkit.kernels import fbgemm_available  # noqa: E402
from rectoolkit.quant import QuantEmbeddingBagCollection  # noqa: E402
from rectoolkit.train.data import SyntheticData  # noqa: E402

DTYPES = [("fp32", torch.float32), ("fp16", torch.float16), ("int8", torch.int8), ("int4", torch.quint4x2)]


def round_robin(calls: Dict[str, Callable[[int], object]], iters: int, warmup: int = 2) -> Dict[str, float]:
    """Fastest call of each contender, calling them in turn so that background load hits all alike."""
    best = {name: float("inf") for name in calls}
    for i in range(warmup + iters):
        for name, call in calls.items():
            start = time.perf_counter()
            call(i)
            if i >= warmup:
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def torchrec_quant_ebc(qebc: QuantEmbeddingBagCollection):
    """TorchRec's quantized EBC holding exactly our quantized rows (no second float copy needed)."""
    import torchrec
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchRecQEBC

    from rectoolkit.quant.rowwise import INTEGER_DATA_TYPES, SCALE_BIAS_BYTES, data_bytes_per_row

    tables, weights = [], {}
    for config, module in zip(qebc.embedding_bag_configs(), qebc.embedding_bags.values()):
        tables.append(torchrec.EmbeddingBagConfig(
            name=config.name, num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
            feature_names=list(config.feature_names), data_type=torchrec.DataType(config.data_type.value)))
        rows = module.weight
        nbytes = data_bytes_per_row(config.embedding_dim, config.data_type)
        if config.data_type in INTEGER_DATA_TYPES:
            weights[config.name] = (rows[:, SCALE_BIAS_BYTES:SCALE_BIAS_BYTES + nbytes], rows[:, :SCALE_BIAS_BYTES])
        else:
            weights[config.name] = (rows[:, :nbytes], None)
    theirs = TorchRecQEBC(tables, is_weighted=False, device=torch.device("cpu"),
                          table_name_to_quantized_weights=weights)
    storage = sum(m.weights_host.numel() for m in theirs._emb_modules)
    return theirs, storage


def main(argv: Optional[List[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="dlrm26")
    parser.add_argument("--batches", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--no-torchrec", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "inference.md"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    workload = rtk.load_workload(args.workload)
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(workload.tables)
    fp32_bytes = sum(p.numel() * p.element_size() for p in ebc.parameters())
    use_torchrec = not args.no_torchrec
    torchrec = None
    if use_torchrec:
        try:
            import torchrec
        except ImportError:
            use_torchrec = False

    kjts = {}
    for batch in args.batches:
        data = SyntheticData.from_workload(workload, batch_size=batch, dense_features=0, seed=batch)
        kjts[batch] = [data.batch(step).sparse_features for step in range(3)]

    # Contenders of one storage type are timed round-robin (one call each, in turn) with the fp32 module, so the
    # machine's background load hits them alike; each keeps its fastest call.
    float_times = {b: float("inf") for b in args.batches}
    rows = []  # (contender, storage, bytes, {batch: seconds})
    backends = ["fbgemm", "torch"] if fbgemm_available() else ["torch"]
    configs = [(label, dtype, 16) for label, dtype in DTYPES] + [("int8", torch.int8, 4)]
    for label, dtype, row_alignment in configs:
        qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, row_alignment=row_alignment)
        suffix = "" if row_alignment == 16 else f", row_alignment={row_alignment}"
        contenders = {}
        for backend in backends:
            contenders[f"rectoolkit QuantEBC ({backend}{suffix})"] = (backend, qebc, qebc.storage_bytes(), False)
        theirs = None
        if use_torchrec and row_alignment == 16:
            theirs, storage = torchrec_quant_ebc(qebc)
            contenders["TorchRec quant EBC (fbgemm)"] = (None, theirs, storage, True)
        times = {name: {} for name in contenders}
        with torch.inference_mode():
            for batch, batch_kjts in kjts.items():
                torchrec_kjts = [torchrec.KeyedJaggedTensor(keys=k.keys(), values=k.values(), lengths=k.lengths())
                                 for k in batch_kjts] if theirs is not None else []
                calls = {"fp32": lambda i: ebc(batch_kjts[i % 3])}
                for name, (backend, module, _, is_torchrec) in contenders.items():
                    def call(i, backend=backend, module=module, is_torchrec=is_torchrec):
                        if is_torchrec:
                            return module(torchrec_kjts[i % 3])
                        module._lookup.backend = backend
                        return module(batch_kjts[i % 3])
                    calls[name] = call
                best = round_robin(calls, args.iters * args.rounds)
                float_times[batch] = min(float_times[batch], best.pop("fp32"))
                for name, seconds in best.items():
                    times[name][batch] = seconds
        for name, (_, _, nbytes, _) in contenders.items():
            rows.append((name, label, nbytes, times[name]))
            print(f"  {name:45s} {label:5s} {nbytes / 2**20:8.1f} MiB  "
                  + "  ".join(f"B={b}: {t * 1e3:7.2f} ms" for b, t in times[name].items()), flush=True)
        del qebc, theirs, contenders
        gc.collect()
    rows.insert(0, ("EmbeddingBagCollection (float, torch kernel)", "fp32", fp32_bytes, float_times))

    header = ["contender", "weights", "table memory", "vs fp32"] + [f"B={b} latency" for b in args.batches]
    lines = [
        "# Inference: quantized embedding lookups on " + args.workload,
        "",
        f"{len(workload.tables)} tables, dim {workload.tables[0].embedding_dim}, "
        f"{sum(t.num_embeddings for t in workload.tables):,} rows; torch {torch.__version__}, "
        f"fbgemm {'on' if fbgemm_available() else 'off'}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}. Forward (pooled KeyedTensor), fastest of "
        f"{args.iters} x {args.rounds} calls.",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] * len(header)) + " |",
    ]
    for name, storage, nbytes, times in rows:
        lines.append(f"| {name} | {storage} | {nbytes / 2**20:.1f} MiB | {nbytes / fp32_bytes:.1%} | "
                     + " | ".join(f"{times[b] * 1e3:.2f} ms" for b in args.batches) + " |")
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table)
    return table


if __name__ == "__main__":
    main()
