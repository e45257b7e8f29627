"""RAUCMetric against TorchRec 1.8's on the same batches (after every step, fused and unfused, through reset and
generate_metric_module), against a pair-counting loop, and across 2 gloo ranks (one of them without batches,
where TorchRec's padding sample counts)."""

import functools
import itertools

import pytest
import torch

from rectoolkit.metrics import RecComputeMode, RecMetricException, RecTaskInfo
from rectoolkit.metrics.rauc import RAUCMetric, count_inversions, regression_auc
from tests.metrics import test_auprc_vs_torchrec as auprc_tests
from tests.metrics.test_auprc_vs_torchrec import generated_modules
from tests.metrics.test_more_metrics_vs_torchrec import BATCH, TASKS, batches

WINDOW = 20  # smaller than the stream: the window drops whole batches and cuts one mid-way


def regression_batches(count, seed=0, ties=False):
    """The usual stream with regression labels (in [0, 3), or 0, 1 or 2 with ties) and some weights 0."""
    generator = torch.Generator().manual_seed(1000 + seed)  # not the predictions' sequence
    stream = []
    for predictions, _, weights in batches(count=count, seed=seed, ties=ties):
        labels = {t: (torch.randint(0, 3, (BATCH,), generator=generator).float() if ties
                      else 3 * torch.rand(BATCH, generator=generator)) for t in TASKS}
        weights = {t: w * (torch.rand(BATCH, generator=generator) > 0.3) for t, w in weights.items()}
        stream.append((predictions, labels, weights))
    return stream


make = functools.partial(auprc_tests.make, module="rauc", class_name="RAUCMetric")


def assert_same_values(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        # TorchRec returns a float32 tensor of the same Python float
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, check_dtype=False, msg=key)


def pair_loop(predictions, labels):
    """RAUC by its definition: the pairs the predictions order against the labels, over all pairs."""
    pairs = list(itertools.combinations(range(len(predictions)), 2))
    discordant = sum(1 for a, b in pairs if (predictions[a] - predictions[b]) * (labels[a] - labels[b]) < 0)
    return 1 - discordant / len(pairs)


@pytest.mark.torchrec
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION",
                                  "FUSED_TASKS_AND_STATES_COMPUTATION"])
def test_values_after_every_step_equal_torchrecs(mode, ties):
    pytest.importorskip("torchrec")
    theirs, ours = make("torchrec", mode), make("rectoolkit", mode)
    for step, (predictions, labels, weights) in enumerate(regression_batches(count=8, ties=ties)):
        for metric in (theirs, ours):
            metric.update(predictions=predictions, labels=labels, weights=weights)
        values = ours.compute()
        assert 0.15 < float(values["rauc-click|window_rauc"]) < 0.85  # labels independent of the predictions
        assert_same_values(values, theirs.compute())
        if step % 3 == 1:
            assert_same_values(ours.local_compute(), theirs.local_compute())
        if step == 4:
            theirs.reset()
            ours.reset()
    assert list(ours.compute()) == [f"rauc-{t}|window_rauc" for t in TASKS]
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []


@pytest.mark.torchrec
def test_generate_metric_module_builds_it_as_torchrec():
    pytest.importorskip("torchrec")
    theirs, ours = generated_modules("RAUC", regression_batches(count=5, seed=1))
    assert_same_values(dict(ours.compute()), dict(theirs.compute()))
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_equals_the_pair_loop_and_ignores_the_weights():
    generator = torch.Generator().manual_seed(5)
    for ties in (False, True):
        predictions = torch.randint(0, 6, (40,), generator=generator) / 5 if ties else torch.rand(40, generator=generator)
        labels = torch.randint(0, 4, (40,), generator=generator).float()
        expected = pair_loop(predictions.tolist(), labels.tolist())
        assert float(regression_auc(predictions, labels)) == pytest.approx(expected, abs=1e-12)
    # hand-worked: by prediction the labels read 0, 1, 1/2, 2: one pair of six is inverted
    metric = RAUCMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")], window_size=4)
    metric.update(predictions={"t": torch.tensor([0.1, 0.4, 0.35, 0.8])}, labels={"t": torch.tensor([0, 0.5, 1, 2])},
                  weights={"t": torch.tensor([1.0, 0.0, 1.0, 1.0])})  # the weight-0 sample counts
    assert metric.compute()["rauc-t|window_rauc"].tolist() == [pytest.approx(5 / 6)]
    assert count_inversions(torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])) == 4 + 1 + 2  # 3 above all, 1 and the 2s above 0


def test_bad_inputs_are_refused_by_name():
    task = [RecTaskInfo(name="t")]
    with pytest.raises(NotImplementedError, match="grouped_rauc=True is not implemented"):
        RAUCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, grouped_rauc=True)
    with pytest.raises(ValueError, match="unknown or unimplemented argument grouped_auc=True"):
        RAUCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, grouped_auc=True)
    metric = RAUCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task,
                        compute_mode=RecComputeMode.FUSED_TASKS_COMPUTATION)
    with pytest.raises(RecMetricException, match="the window holds 1 sample"):
        metric.compute()  # only the padding sample (TorchRec: ZeroDivisionError)
    with pytest.raises(ValueError, match="task 't' has 2 predictions but 3 labels"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(3)}, weights=None)


# ------------------------------------------------------------------------------------------------ 2 ranks
def _two_rank_worker(rank, world_size, stream):
    import torch.distributed as dist

    theirs = make("torchrec", "FUSED_TASKS_COMPUTATION", 4 * BATCH, world_size, rank, compute_on_all_ranks=True)
    ours = make("rectoolkit", "FUSED_TASKS_COMPUTATION", 4 * BATCH, world_size, rank, compute_on_all_ranks=True)
    for step, (predictions, labels, weights) in enumerate(stream):
        # rank 1 first computes with no batch: its padding sample joins rank 0's (only once: TorchRec caches a
        # computed value until the next update, and its rank would then skip the collective)
        if rank == 0 or step >= 1:
            for metric in (theirs, ours):
                metric.update(predictions=predictions[rank], labels=labels[rank], weights=weights[rank])
        expected, got = theirs.compute(), ours.compute()
        assert_same_values(got, expected)
        dist.barrier()


@pytest.mark.torchrec
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_equal_torchrecs_with_its_padding_sample():
    pytest.importorskip("torchrec")
    from tests.distributed.dist_harness import run_workers

    stream = [tuple([first[part], second[part]] for part in range(3))
              for first, second in zip(regression_batches(6, seed=3), regression_batches(6, seed=4))]
    # what the padding changes: rank 0's first batch alone, and with one (0, 0) sample more
    predictions, labels = stream[0][0][0], stream[0][1][0]
    alone = regression_auc(predictions["click"], labels["click"])
    padded = regression_auc(torch.cat([predictions["click"], torch.zeros(1)]),
                            torch.cat([labels["click"], torch.zeros(1)]))
    assert float(alone) != float(padded)
    run_workers(_two_rank_worker, 2, stream)
