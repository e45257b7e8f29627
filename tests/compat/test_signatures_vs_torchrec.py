"""Every class and function docs/torchrec_compat.md lists takes TorchRec 1.8's arguments: each of TorchRec's
parameters by its name, TorchRec's positional parameters in TorchRec's order (so that a TorchRec call, positional
or keyword, binds the same values here), and nothing required that TorchRec leaves optional. The few that differ on
purpose are named below with the reason (their rows on the page say how)."""

from __future__ import annotations

import enum
import importlib
import inspect
import re
from pathlib import Path

import pytest

torchrec = pytest.importorskip("torchrec")

pytestmark = pytest.mark.torchrec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "torchrec_compat.md"
ROW = re.compile(r"^\| `torchrec\.([\w.]+)\.(\w+)` \| (same|differs|missing) \|")
# built from a plan entry and an env rather than TorchRec's (module, table_name_to_parameter_sharding, ...):
# users get them from a sharder's shard() or a DMP, which take TorchRec's arguments
BUILT_BY_SHARDERS = {
    "distributed.embeddingbag.ShardedEmbeddingBagCollection", "distributed.embedding.ShardedEmbeddingCollection",
    "distributed.mc_modules.ShardedManagedCollisionCollection",
    "distributed.mc_embeddingbag.ShardedManagedCollisionEmbeddingBagCollection",
    "distributed.mc_embedding.ShardedManagedCollisionEmbeddingCollection",
    "distributed.quant_embedding.ShardedQuantEmbeddingCollection",
    "distributed.quant_embeddingbag.ShardedQuantEmbeddingBagCollection",
    "distributed.quant_embeddingbag.ShardedQuantFeatureProcessedEmbeddingBagCollection",
}
DIFFER_ON_PURPOSE = {
    # TorchRec's planner parts (enumerator, proposer, partitioner, ...) have no counterpart in rectoolkit's planner
    "distributed.planner.EmbeddingShardingPlanner", "distributed.planner.planners.EmbeddingShardingPlanner",
    # functional collectives that need a process group's name and size: rectoolkit takes the group itself
    "distributed.comm_ops.reduce_scatter_tensor", "distributed.comm_ops.all_gather_into_tensor",
} | BUILT_BY_SHARDERS


def _rows():
    return [ROW.match(line).groups() for line in PAGE.read_text().splitlines() if ROW.match(line)]


def _resolve(prefix, path, name):
    try:
        return getattr(importlib.import_module(f"{prefix}.{path}"), name)
    except (ImportError, AttributeError):
        return None


def _parameters(obj):
    """The parameters a call passes (a class: its __init__ without self); None: not a callable with a signature."""
    try:
        if inspect.isclass(obj):
            if issubclass(obj, enum.Enum) or obj.__init__ is object.__init__:
                return None
            return list(inspect.signature(obj.__init__).parameters.values())[1:]
        if callable(obj):
            return list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    return None


def _mismatches(theirs, ours):
    """What a TorchRec call could not bind here: missing names, positional order, extra required parameters."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    takes_any_keyword = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in ours)
    takes_any_positional = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in ours)
    names = {p.name for p in ours}
    problems = []
    missing = [p.name for p in theirs if p.kind not in variadic and p.name not in names]
    if missing and not takes_any_keyword:
        problems.append(f"no parameter {missing}")
    their_order = [p.name for p in theirs if p.kind in positional]
    our_order = [p.name for p in ours if p.kind in positional]
    if not takes_any_positional and our_order[:len(their_order)] != their_order:
        problems.append(f"positional order {our_order} where TorchRec's is {their_order}")
    their_required = {p.name for p in theirs if p.default is inspect.Parameter.empty and p.kind not in variadic}
    extra = [p.name for p in ours
             if p.default is inspect.Parameter.empty and p.kind not in variadic and p.name not in their_required]
    if extra:
        problems.append(f"requires {extra}, which TorchRec does not")
    return problems


def test_every_listed_class_and_function_takes_torchrecs_arguments():
    checked, wrong = 0, {}
    for path, name, status in _rows():
        if status == "missing" or f"{path}.{name}" in DIFFER_ON_PURPOSE:
            continue
        theirs, ours = _resolve("torchrec", path, name), _resolve("rectoolkit", path, name)
        their_parameters, our_parameters = _parameters(theirs), _parameters(ours)
        if their_parameters is None or our_parameters is None:
            continue
        checked += 1
        problems = _mismatches(their_parameters, our_parameters)
        if problems:
            wrong[f"{path}.{name}"] = problems
    assert checked > 200, f"only {checked} signatures compared: has the page's format changed?"
    assert not wrong, "\n".join(f"torchrec.{key}: {'; '.join(problems)}" for key, problems in wrong.items())


def test_the_exceptions_still_differ():
    """Each name excused above still differs (else it should be checked like the rest)."""
    for key in sorted(DIFFER_ON_PURPOSE):
        path, name = key.rsplit(".", 1)
        theirs, ours = _parameters(_resolve("torchrec", path, name)), _parameters(_resolve("rectoolkit", path, name))
        assert theirs is not None and ours is not None, key
        assert _mismatches(theirs, ours), f"torchrec.{key} now takes TorchRec's arguments: drop it from the exceptions"


def test_arguments_rectoolkit_cannot_honour_are_refused_by_name():
    from rectoolkit.distributed.embedding import EmbeddingCollectionSharder
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from rectoolkit.distributed.model_parallel import DistributedModelParallel

    with pytest.raises(NotImplementedError, match="sharded_module_order_overwrite"):
        EmbeddingBagCollectionSharder(None, None, ["row_wise", "table_wise"])
    with pytest.raises(NotImplementedError, match="use_index_dedup=True"):
        EmbeddingCollectionSharder(use_index_dedup=True)
    assert EmbeddingCollectionSharder(None, None, False).fused_params is None
    with pytest.raises(NotImplementedError, match="model_tracker_configs"):
        DistributedModelParallel(torch_module(), model_tracker_configs=object())


def torch_module():
    import torch

    return torch.nn.Linear(2, 2)


def test_planner_error_and_lazy_no_wait_bind_torchrecs_arguments():
    from torchrec.distributed.planner.types import PlannerErrorType as TheirType

    from rectoolkit.distributed.planner.types import PlannerError, PlannerErrorType
    from rectoolkit.distributed.types import LazyNoWait

    assert [t.value for t in PlannerErrorType] == [t.value for t in TheirType]
    error = PlannerError("no fit", PlannerErrorType.INSUFFICIENT_STORAGE)
    assert (str(error), error.error_type, error.tables) == ("no fit", PlannerErrorType.INSUFFICIENT_STORAGE, [])
    assert PlannerError("x").error_type is PlannerErrorType.OTHER
    assert LazyNoWait(obj=3).wait() == 3


def test_managed_collision_module_base_takes_torchrecs_arguments():
    import torch

    from rectoolkit.modules.mc_modules import ManagedCollisionModule

    class Custom(ManagedCollisionModule):  # a subclass as a TorchRec user writes one
        def preprocess(self, features):
            return features

    plain = Custom(torch.device("cpu"), [0, 10])
    assert plain.readable_suffix == "_readonly" and "_output_segments_tensor" in dict(plain.named_buffers())
    skipped = Custom(torch.device("cpu"), [0, 10], skip_state_validation=True, read_only_suffix="_ro",
                     enable_per_feature_lookups=True)
    assert skipped.readable_suffix == "_ro" and skipped._enable_per_feature_lookups
    assert dict(skipped.named_buffers()) == {}  # as TorchRec's: neither buffer, no check after loading
