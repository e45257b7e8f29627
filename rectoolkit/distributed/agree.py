"""The ranks agree before they act: the same plan on every rank, and every rank ready before a commit.

    check_same_plan(plan, env)            # DistributedModelParallel calls it at sharding time
    replies = all_gather_bytes(env, b"")  # every rank's bytes, in rank order (checkpoints gather their status)

A plan is fingerprinted by the SHA-256 of its canonical JSON (sorted keys). The ranks exchange the 32-byte
digests; only if they differ do they exchange the plans themselves, to name the ranks and the first table that
differs. These collectives are not counted in `env.stats` (they are not part of a training step's traffic) and
use tensors on `env.device`, so they run on gloo and NCCL alike.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.plan.serialization import plan_to_dict
from rectoolkit.plan.types import ShardingPlan
from rectoolkit.plan.validation import PlanValidationError


class PlanMismatchError(PlanValidationError):
    """Ranks were given different plans: names the ranks and the first table whose plan differs."""


def all_gather_bytes(env: ShardingEnv, data: bytes) -> List[bytes]:
    """Every rank's `data`, in rank order (any lengths); world size 1 needs no process group."""
    if env.world_size == 1:
        return [bytes(data)]
    length = torch.tensor([len(data)], dtype=torch.int64, device=env.device)
    lengths = [torch.empty_like(length) for _ in range(env.world_size)]
    dist.all_gather(lengths, length, group=env.pg)
    sizes = [int(n) for n in lengths]
    padded = torch.zeros(max(max(sizes), 1), dtype=torch.uint8)
    padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
    padded = padded.to(env.device)
    gathered = [torch.empty_like(padded) for _ in range(env.world_size)]
    dist.all_gather(gathered, padded, group=env.pg)
    return [bytes(t[:n].cpu().numpy().tobytes()) for t, n in zip(gathered, sizes)]


def plan_tables(plan: ShardingPlan) -> Dict[str, Any]:
    """Label ("path.table") -> the table's canonical JSON entry: what must be equal on every rank."""
    entries = plan_to_dict(plan)["plan"]
    return {(f"{path}.{name}" if path else name): entry for path, tables in entries.items() for name, entry in tables.items()}


def plan_fingerprint(plan: ShardingPlan) -> bytes:
    """SHA-256 of the plan's canonical JSON: equal plans, equal fingerprints, whatever their dict order."""
    return hashlib.sha256(json.dumps(plan_tables(plan), sort_keys=True).encode()).digest()


def check_same_plan(plan: ShardingPlan, env: ShardingEnv) -> None:
    """Raise PlanMismatchError on every rank unless all ranks hold the same plan (a collective)."""
    digests = all_gather_bytes(env, plan_fingerprint(plan))
    if len(set(digests)) == 1:
        return
    plans = [json.loads(text) for text in all_gather_bytes(env, json.dumps(plan_tables(plan), sort_keys=True).encode())]
    groups: Dict[bytes, List[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    holders = "; ".join(f"ranks {ranks} hold plan {digest.hex()[:12]}" for digest, ranks in groups.items())
    first = next(label for label in sorted(set().union(*plans))
                 if len({json.dumps(p.get(label), sort_keys=True) for p in plans}) > 1)
    per_rank = "; ".join(f"rank {rank}: {_describe(p.get(first))}" for rank, p in enumerate(plans))
    raise PlanMismatchError(
        f"rank {env.rank}: the ranks were given different sharding plans ({holders}). The first table that "
        f"differs is {first!r}: {per_rank}. Give every rank the same plan (e.g. the same plan file, or plan on rank 0 "
        "and broadcast); nothing was sharded")


def _describe(entry: Any) -> str:
    if entry is None:
        return "not in its plan"
    shards = ", ".join(f"{s['shard_offsets']}+{s['shard_sizes']}@{s['placement']}" for s in entry["shards"])
    return f"{entry['sharding_type']} ({entry['compute_kernel']}) shards {shards}"
