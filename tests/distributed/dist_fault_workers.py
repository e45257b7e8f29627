"""Workers of the fault-injection tests (importable by spawned processes): a rank that fails while saving or
loading a checkpoint, and ranks given different plans. Each worker asserts what every rank must see."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.distributed import full_state_dict

import rectoolkit.distributed.checkpoint as checkpoint
import rectoolkit.distributed.checkpoint_format as checkpoint_format
from rectoolkit.distributed import DistributedModelParallel, load_checkpoint, save_checkpoint
from rectoolkit.distributed.agree import PlanMismatchError
from rectoolkit.distributed.checkpoint import CheckpointError
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel
from dist_harness import row_wise, table_wise
from dist_workers import bag_tables, plan_keeping_replicas


def _model(seed: int, W: int, kind: str = "mixed_a") -> DistributedModelParallel:
    torch.manual_seed(seed)  # (other plans keep mixed_a's replicas: a checkpoint holds no fused state for them)
    return DistributedModelParallel(TinyModel(), plan=ShardingPlan({PATH: plan_keeping_replicas(kind, bag_tables(), W, W)}),
                                    local_world_size=W)


def _state(model) -> dict:
    return {k: v.clone() for k, v in full_state_dict(model).items()}


def _equal(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _saved_then_changed(W: int, checkpoint_dir: str):
    """A model saved at step 1 into `checkpoint_dir`, then changed; and the state that was saved."""
    model = _model(0, W)
    saved_state = _state(model)
    save_checkpoint(model, checkpoint_dir, extra={"step": 1})
    with torch.no_grad():
        for p in model.module.parameters():
            p += 1
    return model, saved_state


def failing_save_worker(rank: int, W: int, checkpoint_dir: str) -> None:
    """Rank 1 cannot write its file: every rank raises naming rank 1, and the previous checkpoint still loads."""
    model, saved_state = _saved_then_changed(W, checkpoint_dir)
    if rank == 1:
        def disk_full(obj, path):
            raise OSError(28, f"No space left on device: {path}")
        checkpoint_format.write_file = disk_full
    expected = OSError if rank == 1 else CheckpointError
    with pytest.raises(expected) as info:
        save_checkpoint(model, checkpoint_dir, extra={"step": 2})
    if rank == 0:
        assert "rank(s) [1] failed (rank 1: OSError: [Errno 28] No space left on device" in str(info.value), info.value
        assert f"nothing was saved: the checkpoint at {checkpoint_dir} is unchanged" in str(info.value), info.value
    other = _model(9, W, kind="mixed_b")
    assert load_checkpoint(other, checkpoint_dir) == {"step": 1}
    assert _equal(_state(other), saved_state), "the previous checkpoint did not survive the failed save"


def failing_load_worker(rank: int, W: int, checkpoint_dir: str) -> None:
    """Rank 1 refuses the checkpoint (its copy is unreadable): no rank changes its model."""
    model = _model(0, W)
    save_checkpoint(model, checkpoint_dir, extra={"step": 1})
    other = _model(9, W, kind="mixed_b")
    before = _state(other)
    if rank == 1:
        def unreadable(*args, **kwargs):
            raise CheckpointError(f"{checkpoint_dir}/metadata.json: unreadable on this host")
        checkpoint._prepare_load = unreadable
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(other, checkpoint_dir)
    if rank == 0:
        assert "rank(s) [1] failed (rank 1: CheckpointError:" in str(info.value), info.value
        assert "was not loaded; the model is unchanged" in str(info.value), info.value
    assert _equal(_state(other), before), f"rank {rank}: a refused load changed the model"


def plan_mismatch_worker(rank: int, W: int) -> None:
    """Rank 1 holds a stale plan (t1 table-wise instead of row-wise): every rank refuses, naming ranks and table."""
    tables = bag_tables()
    plan = {"t0": row_wise([0, 1], 40, 8), "t1": row_wise([0, 1], 30, 4), "t2": table_wise(0, 21, 12)}
    if rank == 1:
        plan["t1"] = table_wise(1, 30, 4)
    with pytest.raises(PlanMismatchError) as info:
        DistributedModelParallel(TinyModel(), plan=ShardingPlan({PATH: plan}), local_world_size=W)
    message = str(info.value)
    assert "ranks [0] hold plan" in message and "ranks [1] hold plan" in message, message
    assert "The first table that differs is 'sparse.ebc.t1'" in message, message
    assert "rank 0: row_wise" in message and "rank 1: table_wise" in message, message
    assert len(tables) == 3
    # the same plan on both ranks (built in another order) is accepted
    same = {"t2": table_wise(0, 21, 12), "t1": row_wise([0, 1], 30, 4), "t0": row_wise([0, 1], 40, 8)} \
        if rank == 1 else {"t0": row_wise([0, 1], 40, 8), "t1": row_wise([0, 1], 30, 4), "t2": table_wise(0, 21, 12)}
    DistributedModelParallel(TinyModel(), plan=ShardingPlan({PATH: same}), local_world_size=W)


def corrupted_rank_file_worker(rank: int, W: int, checkpoint_dir: str) -> None:
    """A flipped byte in rank 1's file, which only rank 1 reads back (same plan): rank 1's checksum catches it,
    and rank 0, whose own files are intact, refuses too: no rank changes its model."""
    import torch.distributed as dist
    from pathlib import Path

    model = _model(0, W)
    save_checkpoint(model, checkpoint_dir)
    if rank == 0:
        file = next(Path(checkpoint_dir).glob("data-*")) / "rank1-of-2.pt"
        content = bytearray(file.read_bytes())
        content[len(content) // 2] ^= 0x01
        file.write_bytes(bytes(content))
    dist.barrier()
    other = _model(9, W)
    before = _state(other)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(other, checkpoint_dir)
    assert "rank1-of-2.pt: content checksum mismatch" in str(info.value), info.value
    if rank == 0:
        assert "rank(s) [1] failed (rank 1: CheckpointError:" in str(info.value), info.value
    assert _equal(_state(other), before), f"rank {rank}: a refused load changed the model"


def different_paths_worker(rank: int, W: int, checkpoint_dir: str) -> None:
    """Each rank passes its own directory (disks that are not shared): refused on every rank before anything is
    written, naming the ranks' directories; the good checkpoint in the first one is untouched."""
    model, saved_state = _saved_then_changed(W, checkpoint_dir)
    own = checkpoint_dir if rank == 0 else f"{checkpoint_dir}_rank{rank}"
    with pytest.raises(CheckpointError, match="every rank must pass the same directory") as info:
        save_checkpoint(model, own, extra={"step": 2})
    assert f"rank 1 {checkpoint_dir}_rank1" in str(info.value), info.value
    import os
    assert not os.path.exists(f"{checkpoint_dir}_rank1") or not os.listdir(f"{checkpoint_dir}_rank1")
    other = _model(9, W, kind="mixed_b")
    assert load_checkpoint(other, checkpoint_dir) == {"step": 1}
    assert _equal(_state(other), saved_state), "the previous checkpoint did not survive the refused save"


def different_checkpoints_load_worker(rank: int, W: int, checkpoint_dir: str) -> None:
    """Rank 1's first read of metadata.json sees another checkpoint (as when a save commits between the ranks'
    reads): the ranks read again and load the same one. Ranks given directories holding different checkpoints
    are refused on every rank, naming what each read, and no model changes."""
    model, saved_state = _saved_then_changed(W, checkpoint_dir)
    save_checkpoint(model, f"{checkpoint_dir}_other", extra={"step": 2})  # the changed model, elsewhere
    real_read = checkpoint.read_metadata
    reads = []

    def first_read_elsewhere(path):
        reads.append(path)
        return real_read(f"{checkpoint_dir}_other" if rank == 1 and len(reads) == 1 else path)

    checkpoint.read_metadata = first_read_elsewhere
    try:
        other = _model(9, W, kind="mixed_b")
        assert load_checkpoint(other, checkpoint_dir) == {"step": 1}
    finally:
        checkpoint.read_metadata = real_read
    assert len(reads) == 2, f"rank {rank} read metadata.json {len(reads)} times, not twice"
    assert _equal(_state(other), saved_state), f"rank {rank} did not load the checkpoint every rank agreed on"

    other = _model(9, W, kind="mixed_b")
    before = _state(other)
    own = checkpoint_dir if rank == 0 else f"{checkpoint_dir}_other"
    with pytest.raises(CheckpointError, match="the ranks read different checkpoints") as info:
        load_checkpoint(other, own)
    assert f"rank 1: {checkpoint_dir}_other/metadata.json naming data-" in str(info.value), info.value
    assert _equal(_state(other), before), f"rank {rank}: a refused load changed the model"


def peer_dies_during_save_worker(rank: int, W: int, checkpoint_dir: str, report_file: str) -> None:
    """Rank 1's process ends while writing its part (exit code 0, so that the harness lets rank 0 finish): rank 0
    must get a checkpoint error that blames a peer (the launcher then blames rank 1), not the transport's."""
    import os
    from pathlib import Path

    model, _ = _saved_then_changed(W, checkpoint_dir)
    if rank == 1:
        checkpoint_format.write_file = lambda obj, file: os._exit(0)
    try:
        save_checkpoint(model, checkpoint_dir, extra={"step": 2})
    except BaseException as error:
        Path(report_file).write_text(f"{type(error).__name__}|{getattr(error, 'peer_failure', False)}|{error}")
    os._exit(0)
