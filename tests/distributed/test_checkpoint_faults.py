"""Checkpoints under faults: killed ranks, truncated and corrupted files, mismatched models.

- kill -9 of either rank at 10 random points of a save over an existing checkpoint (2 ranks, each case its own
  processes with a timeout): the directory always loads, as exactly the previous or exactly the new checkpoint;
- every corruption (truncated, flipped bytes, missing file, bad metadata) and every mismatch (table shape or
  name, dense keys, dtypes, dense optimizer) is refused naming the file, and the model is left unchanged;
- a save that fails on one rank commits nothing: every rank raises naming it, the previous checkpoint loads.

Expected states come from TinyModel built with the same seed (old) and old + 1 (new), never from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch

import rectoolkit
import rectoolkit.distributed.checkpoint as checkpoint
from rectoolkit.distributed import checkpoint_commit, checkpoint_format, checkpoint_resharding
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, full_state_dict, load_checkpoint, save_checkpoint
from rectoolkit.distributed.checkpoint import CheckpointError
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel
from dist_fault_workers import (corrupted_rank_file_worker, different_checkpoints_load_worker, different_paths_worker,
                                failing_load_worker, failing_save_worker, peer_dies_during_save_worker)
from ckpt_kill_worker import logged_main
from dist_harness import run_workers
from dist_workers import bag_tables, plan_for, plan_keeping_replicas



def local_model(seed: int, kind: str = "row_wise", model: torch.nn.Module = None, keep_replicas: bool = False):
    """keep_replicas: the tables the 2-rank (mixed_a) checkpoints replicate stay replicas (those hold no fused state
    for them, as TorchRec's)."""
    torch.manual_seed(seed)
    module = model if model is not None else TinyModel()
    plan = (plan_keeping_replicas if keep_replicas else plan_for)(kind, bag_tables(), 1, 1)
    return DistributedModelParallel(module, env=ShardingEnv.local(), plan=ShardingPlan({PATH: plan}))


def expected_states():
    """TinyModel(seed 0)'s state (the first save of the kill test) and that state + 1 (the second save)."""
    torch.manual_seed(0)
    old = {k: v.clone() for k, v in TinyModel().state_dict().items()}
    return old, {k: v + 1 for k, v in old.items()}


def states_equal(a, b) -> bool:
    """The same keys (a DMP's come sorted, as TorchRec's; a plain module's in module order) and the same values."""
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ kill -9 during save
def run_ranks(case_dir: Path, checkpoint_dir: Path, kill_at: dict, timeout_s: float):
    """Start one process per rank (forked from the harness's forkserver: torch and rectoolkit already imported);
    kill_at[rank]: 0 count, n > 0 SIGKILL at traced line n, -1 untraced. Returns (return codes, line counts).
    When a victim dies, the other ranks are killed too, as a launcher would."""
    init_file = case_dir / "rendezvous"
    context = multiprocessing.get_context("forkserver")
    procs = [context.Process(target=logged_main, args=(str(case_dir / f"rank{rank}.log"), rank, 2, str(init_file),
                                                       str(checkpoint_dir), kill_at[rank], str(case_dir / f"count{rank}")))
             for rank in range(2)]
    for p in procs:
        p.start()
    try:
        victims = [r for r in range(2) if kill_at[r] > 0]
        for rank in victims or range(2):
            procs[rank].join(timeout=timeout_s)
            if procs[rank].exitcode is None:
                pytest.fail(f"ranks did not finish within {timeout_s} s; logs in {case_dir}:\n"
                            + "\n".join((case_dir / f"rank{r}.log").read_text()[-2000:] for r in range(2)))
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    counts = [json.loads((case_dir / f"count{r}").read_text()) if (case_dir / f"count{r}").exists() else None
              for r in range(2)]
    return codes, counts


@pytest.mark.multiprocess
@pytest.mark.timeout(1500)
def test_kill_any_rank_at_random_points_of_a_save_leaves_a_loadable_checkpoint(tmp_path):
    old, new = expected_states()
    count_dir = tmp_path / "count"
    count_dir.mkdir()
    codes, counts = run_ranks(count_dir, count_dir / "ckpt", {0: 0, 1: 0}, timeout_s=300)
    assert codes == [0, 0], [(count_dir / f"rank{r}.log").read_text()[-3000:] for r in range(2)]
    lines = [c["lines"] for c in counts]
    commit_at, cleanup_at = counts[0]["commit"], counts[0]["remove_stale"]
    assert 50 < commit_at < cleanup_at < lines[0] and lines[1] > 50, counts

    # 8 kills anywhere in either rank's save, then 2 of rank 0 after its commit (so both outcomes are exercised)
    rng = random.Random(13)
    cases = [(v, rng.randint(1, lines[v])) for v in [rng.randrange(2) for _ in range(8)]]
    cases += [(0, rng.randint(cleanup_at, lines[0])) for _ in range(2)]
    outcomes = []
    for case, (victim, kill_at) in enumerate(cases):
        case_dir = tmp_path / f"case{case}"
        case_dir.mkdir()
        codes, _ = run_ranks(case_dir, case_dir / "ckpt", {victim: kill_at, 1 - victim: -1}, timeout_s=300)
        log = (case_dir / f"rank{victim}.log").read_text()
        assert codes[victim] == -signal.SIGKILL, f"case {case}: rank {victim} was not killed at line {kill_at}: {log}"
        model = local_model(seed=5, keep_replicas=True)
        extra = load_checkpoint(model, case_dir / "ckpt")  # never raises: the old or the new checkpoint is there
        version = extra["version"]
        assert states_equal(full_state_dict(model), old if version == 1 else new), \
            f"case {case} (rank {victim} killed at line {kill_at}): weights are not those of version {version}"
        if victim == 0 and kill_at < commit_at:
            assert version == 1, f"case {case}: rank 0 died before its commit, yet version {version} loads"
        if victim == 0 and kill_at >= cleanup_at:
            assert version == 2, f"case {case}: rank 0 died after its commit, yet version {version} loads"
        outcomes.append((victim, kill_at, version))
        # leftovers of the killed save are ignored above, and removed by the next save
        save_checkpoint(model, case_dir / "ckpt", extra={"version": 3})
        left = sorted(p.name for p in (case_dir / "ckpt").iterdir())
        assert left[-1] == "metadata.json" and len(left) == 2 and left[0].startswith("data-"), left
        shutil.rmtree(case_dir)
    print(f"traced lines of the save: rank 0 {lines[0]} (commit at {commit_at}), rank 1 {lines[1]}; "
          f"kills (rank, line, version loaded): {outcomes}")


# ------------------------------------------------------------------------------------------------ corrupted files
@pytest.fixture
def saved(tmp_path):
    """A checkpoint of TinyModel(seed 0) with a dense SGD-momentum optimizer after one step; returns its path."""
    model = local_model(seed=0)
    optimizer = torch.optim.SGD(model.dense_parameters(), lr=0.1, momentum=0.9)
    for p in model.dense_parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    save_checkpoint(model, tmp_path / "ckpt", dense_optimizer=optimizer, extra={"step": 1})
    return tmp_path / "ckpt"


def data_file(path: Path, name: str) -> Path:
    return next(path.glob("data-*")) / name


def fresh_model_and_optimizer():
    model = local_model(seed=7, kind="table_wise")
    return model, torch.optim.SGD(model.dense_parameters(), lr=0.1, momentum=0.9)


def assert_load_refused(path: Path, match: str, model=None, optimizer=None) -> None:
    """Loading must raise naming `match`, and leave the model's weights and optimizer exactly as they were."""
    if model is None:
        model, optimizer = fresh_model_and_optimizer()
    before = {k: v.clone() for k, v in full_state_dict(model).items()}
    optimizer_before = repr(optimizer.state_dict()) if optimizer is not None else None
    with pytest.raises((CheckpointError, FileNotFoundError), match=match):
        load_checkpoint(model, path, dense_optimizer=optimizer)
    assert states_equal(full_state_dict(model), before), "a failed load changed the model"
    if optimizer is not None:
        assert repr(optimizer.state_dict()) == optimizer_before, "a failed load changed the optimizer"


def test_round_trip_loads_the_saved_weights_and_optimizer(saved):
    model, optimizer = fresh_model_and_optimizer()
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}
    torch.manual_seed(0)
    reference = TinyModel()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if not name.startswith("sparse."):
                p -= 0.1  # the SGD step above: grad 1, lr 0.1
    assert states_equal(full_state_dict(model), full_state_dict(reference))
    assert all(torch.equal(s["momentum_buffer"], torch.ones_like(s["momentum_buffer"]))
               for s in optimizer.state_dict()["state"].values())


@pytest.mark.parametrize("name", ["rank0-of-1.pt", "dense.pt"])
def test_truncated_file_is_named(saved, name):
    file = data_file(saved, name)
    size = file.stat().st_size
    file.write_bytes(file.read_bytes()[:size // 2])
    assert_load_refused(saved, rf"{name}: {size // 2} bytes, but {size} were written: the file is truncated")


@pytest.mark.parametrize("name", ["rank0-of-1.pt", "dense.pt"])
def test_flipped_bytes_are_caught_by_the_checksum(saved, name):
    file = data_file(saved, name)
    rng = random.Random(name)
    for position in sorted(rng.sample(range(file.stat().st_size), 5)):  # anywhere: header, tensor data, index
        content = bytearray(file.read_bytes())
        original = bytes(content)
        content[position] ^= 0x10
        file.write_bytes(bytes(content))
        assert_load_refused(saved, rf"{name}: content checksum mismatch")
        file.write_bytes(original)
    model, optimizer = fresh_model_and_optimizer()
    load_checkpoint(model, saved, dense_optimizer=optimizer)  # restored: loads again


@pytest.mark.parametrize("name", ["rank0-of-1.pt", "dense.pt"])
def test_missing_file_is_named(saved, name):
    data_file(saved, name).unlink()
    assert_load_refused(saved, rf"{name}: missing")


@pytest.mark.parametrize("cut", [0, 1, 40, -2])
def test_truncated_metadata_is_named(saved, cut):
    file = saved / "metadata.json"
    text = file.read_text()
    file.write_text(text[:cut] if cut >= 0 else text[:len(text) + cut])
    assert_load_refused(saved, r"metadata.json is not valid JSON .* truncated or corrupted")


def with_checksum(metadata: dict) -> str:
    """The metadata as save writes it: with the SHA-256 of its canonical JSON (sorted keys) under "checksum"."""
    digest = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest()
    return json.dumps(dict(metadata, checksum=digest))


GOOD = {"format": "rectoolkit.checkpoint", "format_version": 2, "directory": "data-0000000000000000",
        "files": {}, "tables": {}, "world_size": 1}


@pytest.mark.parametrize("content,match", [
    ("[]", "not the metadata of a rectoolkit checkpoint"),
    ('{"format": 1, "world_size": 1, "files": ["rank0-of-1.pt", "dense.pt"]}', r"format 1, written by rectoolkit"),
    (json.dumps(dict(GOOD, checksum="0" * 64)), "metadata.json: content checksum mismatch"),
    (with_checksum(dict(GOOD, format_version=99)), "format_version 99"),
    (with_checksum(dict(GOOD, files=[])), "'files' is missing or not a dict"),
    (with_checksum(dict(GOOD, directory="..")), "'directory' is '..', not a data directory name"),
    (with_checksum(GOOD), r"metadata.json lists files \[\]; a checkpoint of world size 1 has \['dense.pt', 'rank0-of-1.pt'\]"),
])
def test_invalid_metadata_is_named(saved, content, match):
    (saved / "metadata.json").write_text(content)
    assert_load_refused(saved, match)


def test_missing_metadata_and_missing_directory(saved, tmp_path):
    assert_load_refused(tmp_path / "nowhere", "does not exist")
    (saved / "metadata.json").unlink()
    assert_load_refused(saved, "not a complete checkpoint: it has no metadata.json")


def model_with_tables(tables):
    model = TinyModel()
    model.sparse.ebc = rectoolkit.EmbeddingBagCollection(tables, optimizer="adagrad", lr=0.1)
    return DistributedModelParallel(model, env=ShardingEnv.local(),
                                    plan=ShardingPlan({PATH: plan_for("row_wise", tables, 1, 1)}))


def test_table_of_another_shape_or_name_is_refused_before_any_table_is_loaded(saved):
    tables = bag_tables()
    tables[2].num_embeddings = 22  # t2: 21 rows saved; t0 and t1 come first and would be overwritten
    assert_load_refused(saved, r"metadata.json: table 't2' of collection 'sparse.ebc' was saved as \[21, 12\] "
                               r"\(rows, dim\); the model has \[22, 12\]", model=model_with_tables(tables))
    tables = bag_tables()
    tables[1].name = "t1_renamed"
    assert_load_refused(saved, r"table 't1' of collection 'sparse.ebc' was saved as \[30, 4\] \(rows, dim\); the "
                               r"model has None", model=model_with_tables(tables))


def test_dense_mismatch_and_optimizer_mismatch_are_refused(saved):
    model = TinyModel()
    model.dense = torch.nn.Linear(3, 8, bias=False)
    assert_load_refused(saved, r"dense.pt: dense keys differ: missing \[\], unexpected \['dense.bias'\]",
                        model=local_model(2, model=model))
    dmp = local_model(3)
    two_groups = torch.optim.SGD([{"params": dmp.dense_parameters()[:1]}, {"params": dmp.dense_parameters()[1:]}],
                                 lr=0.1, momentum=0.9)
    assert_load_refused(saved, "dense.pt: the dense optimizer was saved with parameter groups of sizes", dmp,
                        two_groups)


def test_optimizer_state_without_a_saved_one_is_refused(tmp_path):
    model = local_model(seed=0)
    save_checkpoint(model, tmp_path / "ckpt")
    other, optimizer = fresh_model_and_optimizer()
    assert_load_refused(tmp_path / "ckpt", "dense.pt holds no dense optimizer state", other, optimizer)


def test_fused_optimizer_state_must_be_there(tmp_path):
    model = DistributedModelParallel(TinyModel(optimizer="sgd"), env=ShardingEnv.local(),
                                     plan=ShardingPlan({PATH: plan_for("row_wise", bag_tables(), 1, 1)}))
    save_checkpoint(model, tmp_path / "ckpt")  # plain SGD: no optimizer state saved
    assert_load_refused(tmp_path / "ckpt", r"rank0-of-1.pt: table 'sparse.ebc.t0' has no optimizer state",
                        model=local_model(4))


def test_failed_save_keeps_the_previous_checkpoint(saved):
    model, optimizer = fresh_model_and_optimizer()
    with pytest.raises(Exception, match="pickle"):
        save_checkpoint(model, saved, extra={"not picklable": lambda: None})  # dense.pt fails to write
    assert [p.name for p in saved.iterdir() if p.name.startswith("data-")].__len__() == 1
    assert not [p for p in saved.iterdir() if ".tmp-" in p.name], "a temporary file was left behind"
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}


def test_a_save_into_a_directory_another_save_holds_is_refused(saved):
    model, optimizer = fresh_model_and_optimizer()
    other = checkpoint_commit.DirectoryLock(saved)  # what a save from another job or thread holds while it runs
    other.acquire()
    try:
        with pytest.raises(CheckpointError, match="another save into this directory is in progress"):
            save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})
        assert len([p for p in saved.iterdir() if p.name.startswith("data-")]) == 1
    finally:
        other.release()
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}  # the first save's checkpoint
    save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})  # once it is done: saved
    left = sorted(p.name for p in saved.iterdir())  # and no lock file left behind
    assert len(left) == 2 and left[0].startswith("data-") and left[1] == "metadata.json", left
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 2}


def test_a_save_committed_during_a_load_leaves_the_data_the_load_reads(saved, monkeypatch):
    """Another job saves into the directory while a load is between reading metadata.json and reading the files:
    the load still gets the checkpoint it began with; the save's old data directory is removed by the save after."""
    saver, saver_optimizer = fresh_model_and_optimizer()  # seed 7, not the saved seed 0
    first, _ = fresh_model_and_optimizer()
    assert load_checkpoint(first, saved) == {"step": 1}  # the checkpoint as a load with no save beside it reads it
    verified = checkpoint_format.verified_files

    def a_save_commits_meanwhile(path, metadata, checksum_of=None):
        save_checkpoint(saver, saved, dense_optimizer=saver_optimizer, extra={"step": 2})
        return verified(path, metadata, checksum_of)

    monkeypatch.setattr(checkpoint_format, "verified_files", a_save_commits_meanwhile)
    model, optimizer = fresh_model_and_optimizer()
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}
    monkeypatch.undo()
    assert states_equal(full_state_dict(model), full_state_dict(first))
    assert not states_equal(full_state_dict(model), full_state_dict(saver))
    assert len(list(saved.glob("data-*"))) == 2  # the previous data directory was left to the load
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 2}  # the save did commit
    save_checkpoint(saver, saved, dense_optimizer=saver_optimizer, extra={"step": 3})
    assert len(list(saved.glob("data-*"))) == 1  # and with no load reading, the next save removes what is stale


def test_a_commit_refuses_a_file_rank0_does_not_see(saved, monkeypatch):
    model, optimizer = fresh_model_and_optimizer()
    commit = checkpoint_commit.commit

    def lose_a_file(path, data, metadata):  # a rank's file written where rank 0 cannot see it, or removed
        (data / "rank0-of-1.pt").unlink()
        commit(path, data, metadata)

    monkeypatch.setattr(checkpoint_commit, "commit", lose_a_file)
    with pytest.raises(CheckpointError, match=r"rank0-of-1.pt is missing as rank 0 sees it \(rank 0 wrote it\)"):
        save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}


def test_a_save_into_a_path_under_a_file_names_it(saved, tmp_path):
    model, _ = fresh_model_and_optimizer()
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"a_file/ckpt: the checkpoint directory cannot be created on rank 0"):
        save_checkpoint(model, tmp_path / "a_file" / "ckpt")


def test_leftovers_of_a_crashed_save_are_ignored_then_removed(saved):
    stale = saved / "data-0123456789abcdef"
    stale.mkdir()
    (stale / "rank0-of-1.pt").write_bytes(b"half a file")
    (saved / ".metadata.json.tmp-data-0123456789abcdef").write_text('{"format": "rect')
    model, optimizer = fresh_model_and_optimizer()
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}
    save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})
    left = sorted(p.name for p in saved.iterdir())
    assert len(left) == 2 and left[0].startswith("data-") and left[0] != stale.name and left[1] == "metadata.json"


def test_random_corruptions_are_always_named(saved):
    """Any file, any damage (truncate anywhere, flip any byte, append): refused naming that file, model unchanged."""
    rng = random.Random(2026)
    files = [data_file(saved, "rank0-of-1.pt"), data_file(saved, "dense.pt"), saved / "metadata.json"]
    for _ in range(12):
        file = rng.choice(files)
        original = file.read_bytes()
        damage = rng.choice(["truncate", "flip", "append"])
        if damage == "truncate":
            file.write_bytes(original[:rng.randrange(len(original))])
        elif damage == "flip":
            position = rng.randrange(len(original))
            file.write_bytes(original[:position] + bytes([original[position] ^ (1 << rng.randrange(8))])
                             + original[position + 1:])
        else:
            file.write_bytes(original + b"\0")
        assert_load_refused(saved, re.escape(file.name))
        file.write_bytes(original)


# ------------------------------------------------------------------------------------------------ one rank fails
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_save_failing_on_one_rank_commits_nothing(tmp_path):
    run_workers(failing_save_worker, 2, str(tmp_path / "ckpt"))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_ranks_saving_into_different_directories_are_refused(tmp_path):
    run_workers(different_paths_worker, 2, str(tmp_path / "ckpt"))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_load_refused_on_one_rank_changes_no_rank(tmp_path):
    run_workers(failing_load_worker, 2, str(tmp_path / "ckpt"))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_corrupted_file_read_by_one_rank_only_stops_every_rank(tmp_path):
    run_workers(corrupted_rank_file_worker, 2, str(tmp_path / "ckpt"))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_ranks_reading_different_checkpoints_read_again_or_are_refused(tmp_path):
    run_workers(different_checkpoints_load_worker, 2, str(tmp_path / "ckpt"))


def test_a_dense_optimizer_of_another_class_is_refused_before_the_model_changes(saved):
    """Saved from SGD with momentum: an Adam cannot take that state (torch's load_state_dict fails deep inside),
    and a plain SGD would take it silently and fail at its next step: both refused, naming the file, nothing
    loaded."""
    model, _ = fresh_model_and_optimizer()
    adam = torch.optim.Adam(model.dense_parameters(), lr=1e-3)
    assert_load_refused(saved, r"dense.pt: the dense optimizer state was saved from a SGD; this dense_optimizer is a "
                               r"Adam", model, adam)
    assert adam.param_groups[0]["lr"] == 1e-3 and "momentum" not in adam.param_groups[0]


def test_trial_load_refuses_a_state_torch_would_refuse(tmp_path):
    """(checkpoints written before the optimizer's class was recorded: the trial load is what refuses them)"""
    model, _ = fresh_model_and_optimizer()
    adam = torch.optim.Adam(model.dense_parameters(), lr=1e-3)
    sgd = torch.optim.SGD(model.dense_parameters(), lr=0.1, momentum=0.9)
    for p in model.dense_parameters():
        p.grad = torch.ones_like(p)
    sgd.step()
    with pytest.raises(CheckpointError, match=r"x/dense.pt: the dense optimizer's groups were saved without "
                                              r"\['amsgrad', 'beta"):
        checkpoint_resharding.trial_load(adam, sgd.state_dict(), tmp_path / "x" / "dense.pt")
    assert not adam.state  # untouched


def test_a_commit_failing_on_a_full_disk_names_the_file_and_leaves_nothing(saved, monkeypatch):
    import errno

    model, optimizer = fresh_model_and_optimizer()
    before = sorted(p.name for p in saved.iterdir())

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(src))

    monkeypatch.setattr(checkpoint.os, "replace", full_disk)
    with pytest.raises(OSError, match=r"No space left on device.*rank 0 committing .*ckpt/metadata.json; the "
                                      r"checkpoint at .*ckpt is the previous one, unchanged") as info:
        save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert sorted(p.name for p in saved.iterdir()) == before  # no second data directory, no temporary file
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}


def test_an_interrupted_save_removes_what_it_wrote(saved, monkeypatch):
    model, optimizer = fresh_model_and_optimizer()
    before = sorted(p.name for p in saved.iterdir())

    def interrupted(obj, file):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_format, "write_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, saved, dense_optimizer=optimizer, extra={"step": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in saved.iterdir()) == before  # no data directory, no lock file
    assert load_checkpoint(model, saved, dense_optimizer=optimizer) == {"step": 1}


def test_a_model_that_is_not_distributed_model_parallel_is_named(saved):
    for call in (save_checkpoint, load_checkpoint):
        with pytest.raises(TypeError, match=rf"{call.__name__} takes a DistributedModelParallel .* got a Linear; .*"
                                            r"torch.save\(model.state_dict\(\)"):
            call(torch.nn.Linear(2, 2), saved)
    with pytest.raises(CheckpointError, match=r"metadata.json is a file, not a checkpoint directory"):
        checkpoint.read_metadata(saved / "metadata.json")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_peer_dying_during_a_save_is_a_peer_error_and_the_checkpoint_survives(tmp_path):
    report = tmp_path / "rank0.txt"
    run_workers(peer_dies_during_save_worker, 2, str(tmp_path / "ckpt"), str(report))
    kind, peer, message = report.read_text().split("|", 2)
    assert (kind, peer) == ("CheckpointPeerError", "True"), message
    assert "another rank stopped answering" in message and "nothing was saved" in message, message
    data = [p.name for p in (tmp_path / "ckpt").glob("data-*")]  # the previous checkpoint's, and nothing new
    assert [checkpoint.read_metadata(tmp_path / "ckpt")["directory"]] == data


def test_data_directory_pattern_is_what_save_writes(saved):
    assert checkpoint.DATA_DIRECTORY.match(next(saved.glob("data-*")).name)
