"""Managed-collision lookups: rectoolkit's ManagedCollisionEmbeddingBagCollection beside TorchRec 1.8's, eval forward.

    .venv/bin/python benchmarks/bench_managed_collisions.py [--batches 8 512] [--rounds 7] [--calls 100] [--no-write]
                                             # prints a markdown table; writes benchmarks/results/managed_collisions.md

Four tables of 1,000 slots x 16 (MCHManagedCollisionModule, DistanceLFU eviction, eviction interval 1, raw ids below
2^40), one feature each, 1-3 ids per bag. Both collections first train on the same 20 batches (raw ids drawn from a
pool of 3,000 per table, so the slots fill and evict alike), then get rectoolkit's table weights, and must give the same
output on every timed batch (checked before timing). Timed: the eval forward (`model.eval()`, under torch.no_grad) of
one batch, `--calls` calls in a row per contender, contenders alternating round by round, one torch thread; the table
gives the median per call over the rounds, [min, max], and rectoolkit / TorchRec per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

HERE = Path(__file__).resolve().parent
TABLES, SLOTS, DIM, POOL = 4, 1000, 16, 3000


def build(lib):
    """(the collection, the KJT class) of `lib` (rectoolkit or torchrec)."""
    from importlib import import_module

    mc = import_module(lib.__name__ + ".modules.mc_modules")
    mc_embedding = import_module(lib.__name__ + ".modules.mc_embedding_modules")
    configs = [lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=SLOTS, embedding_dim=DIM, feature_names=[f"f{i}"])
               for i in range(TABLES)]
    ebc = lib.EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    modules = {c.name: mc.MCHManagedCollisionModule(zch_size=SLOTS, device=torch.device("cpu"), eviction_interval=1,
                                                    eviction_policy=mc.DistanceLFU_EvictionPolicy(),
                                                    input_hash_size=2 ** 40) for c in configs}
    collection = mc.ManagedCollisionCollection(managed_collision_modules=modules, embedding_configs=configs)
    return mc_embedding.ManagedCollisionEmbeddingBagCollection(ebc, collection, return_remapped_features=False)


def batch(lib, size: int, seed: int, pools: torch.Tensor):
    """A KJT of `size` samples per feature: 1-3 ids per bag, each a raw id of the table's pool (Zipf-like: low pool
    indices more often)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (TABLES * size,), generator=g)
    per_table = lengths.view(TABLES, size).sum(1).tolist()
    values = torch.cat([pools[t][(torch.rand(n, generator=g) ** 3 * POOL).long()] for t, n in enumerate(per_table)])
    return lib.KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(TABLES)], values=values,
                                                   lengths=lengths)


def measure(batch_sizes: List[int], rounds: int, calls: int) -> List[Dict]:
    import torchrec

    import rectoolkit

    torch.set_num_threads(1)
    libs = {"rectoolkit": rectoolkit, "TorchRec": torchrec}
    pools = torch.randint(0, 2 ** 40, (TABLES, POOL), generator=torch.Generator().manual_seed(0))
    models = {}
    for name, lib in libs.items():
        torch.manual_seed(0)
        model = build(lib)
        for step in range(20):  # the same training batches: the same slots and evictions
            model(batch(lib, 64, 1000 + step, pools))
        models[name] = model.eval()
    weights = models["rectoolkit"]._embedding_module.state_dict()
    models["TorchRec"]._embedding_module.load_state_dict(weights)
    rows = []
    for size in batch_sizes:
        kjts = {name: batch(lib, size, size, pools) for name, lib in libs.items()}
        with torch.no_grad():
            outputs = {name: models[name](kjts[name]) for name in libs}
            outputs = {name: (out[0] if isinstance(out, tuple) else out).values() for name, out in outputs.items()}
            assert torch.equal(outputs["rectoolkit"], outputs["TorchRec"]), f"batch {size}: outputs differ"
            for name in libs:  # warm up
                for _ in range(calls):
                    models[name](kjts[name])
            per_call: Dict[str, List[float]] = {name: [] for name in libs}
            for _ in range(rounds):
                for name in libs:
                    started = time.perf_counter()
                    for _ in range(calls):
                        models[name](kjts[name])
                    per_call[name].append((time.perf_counter() - started) / calls * 1e3)
        rows.append({"batch": size, **per_call})
    return rows


def spread(values: List[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", nargs="*", type=int, default=[8, 512], help="samples per feature")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100, help="forwards in a row per contender and round")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = measure(args.batches, args.rounds, args.calls)
    import torchrec

    lines = ["# bench_managed_collisions", "", __doc__.split("\n\n", 2)[2].strip().replace("\n", " "), "",
             f"torch {torch.__version__}, TorchRec {torchrec.__version__}, 1 torch thread; 1-minute load average "
             f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after.", "",
             "| batch | rectoolkit ms per forward | TorchRec ms per forward | rectoolkit / TorchRec |",
             "| ---: | ---: | ---: | ---: |"]
    for row in rows:
        ratios = [ours / theirs for ours, theirs in zip(row["rectoolkit"], row["TorchRec"])]
        lines.append(f"| {row['batch']} | {spread(row['rectoolkit'])} | {spread(row['TorchRec'])} | "
                     f"{spread(ratios, 2)}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (HERE / "results" / "managed_collisions.md").write_text(text)


if __name__ == "__main__":
    main()
