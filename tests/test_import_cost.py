"""`import rectoolkit` loads no compiler or FSDP machinery: every launched worker and subprocess imports it, and
torch._dynamo (torch.compiler.disable at class definition) and torch.distributed.optim (FSDP, DTensor) had doubled
its import time. They load when used (torch.compile; apply_optimizer_in_backward). pandas (0.4 s) loads when a
report, a measurement or a figure builds its frames."""

import subprocess
import sys
import warnings

import torch

HEAVY = ("torch._dynamo", "torch.distributed.optim", "torch.distributed.fsdp", "pandas")


def test_importing_rectoolkit_and_its_worker_loads_no_compiler_or_fsdp():
    code = ("import sys, rectoolkit, rectoolkit.distributed, rectoolkit.planner, rectoolkit.launch._worker\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"imported at `import rectoolkit`: {done.stdout.strip()}"


def test_building_the_collections_loads_no_compiler():
    """Every rank builds its collections: a torch module made with device="meta" runs its random init on meta,
    which imports torch._dynamo (about 3 s per process); the collections give their modules a meta weight instead."""
    code = ("import sys, rectoolkit as rtk\n"
            "bag = rtk.EmbeddingBagConfig(name='t', num_embeddings=10, embedding_dim=4, feature_names=['f'])\n"
            "seq = rtk.EmbeddingConfig(name='s', num_embeddings=10, embedding_dim=4, feature_names=['g'])\n"
            "rtk.EmbeddingBagCollection([bag]), rtk.EmbeddingCollection([seq])\n"
            "rtk.EmbeddingBagCollection([bag], device='meta'), rtk.EmbeddingCollection([seq], device='meta')\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"imported by building the collections: {done.stdout.strip()}"


def test_apply_optimizer_in_backward_records_what_torchs_does_and_warns_as_torchrecs():
    from torch.distributed.optim import _apply_optimizer_in_backward

    from rectoolkit.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    ours, theirs = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(3, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_optimizer_in_backward(torch.optim.SGD, [ours], {"lr": 0.5})
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "_apply_optimizer_in_backward" in str(caught[0].message)
    _apply_optimizer_in_backward(torch.optim.SGD, [theirs], {"lr": 0.5})
    assert ours._optimizer_classes == theirs._optimizer_classes == [torch.optim.SGD]
    assert ours._optimizer_kwargs == theirs._optimizer_kwargs == [{"lr": 0.5}]
    assert [type(o) for o in ours._in_backward_optimizers] == [torch.optim.SGD]
    (ours.sum() * 2).backward()  # the optimizer ran in backward: lr 0.5 x gradient 2
    torch.testing.assert_close(ours.detach(), torch.zeros(3, 2))
