"""AUC against exact pair counting (ties count 1/2), log loss against the formula."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rectoolkit.train.metrics import Throughput, auc, log_loss


def pair_counting_auc(scores, labels):
    """O(P N) reference: fraction of (positive, negative) pairs ordered correctly, ties 1/2."""
    positives = [s for s, y in zip(scores, labels) if y == 1]
    negatives = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def test_hand_worked_cases():
    # positives 0.35, 0.8 vs negatives 0.1, 0.4: pairs (0.35>0.1), (0.35<0.4), (0.8>0.1), (0.8>0.4) -> 3/4
    assert auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert auc(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auc(torch.tensor([2.0, 1.0]), torch.tensor([0.0, 1.0])) == 0.0
    assert auc(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([0, 1, 1])) == 0.5
    assert math.isnan(auc(torch.tensor([0.3, 0.2]), torch.tensor([1, 1])))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 1)), min_size=2, max_size=40)
       .filter(lambda rows: 0 < sum(y for _, y in rows) < len(rows)))
def test_auc_equals_pair_counting_with_ties(rows):
    scores = [float(s) for s, _ in rows]  # few distinct values: many ties
    labels = [y for _, y in rows]
    assert auc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(pair_counting_auc(scores, labels), abs=1e-12)


def test_auc_on_random_scores_matches_reference():
    generator = torch.Generator().manual_seed(3)
    scores = torch.rand(300, generator=generator)
    labels = (torch.rand(300, generator=generator) < scores).long()
    assert auc(scores, labels) == pytest.approx(pair_counting_auc(scores.tolist(), labels.tolist()), abs=1e-12)


def test_log_loss_formula():
    logits = torch.tensor([0.0, 2.0, -1.0])
    labels = torch.tensor([1.0, 0.0, 0.0])
    expected = (math.log(2) + math.log(1 + math.exp(2)) + math.log(1 + math.exp(-1))) / 3
    assert log_loss(logits, labels) == pytest.approx(expected, rel=1e-6)


def test_throughput_counts_samples_per_second():
    meter = Throughput()
    meter._since = 10.0
    meter.add(500)
    assert meter.rate(now=12.0) == 250.0
    meter.add(100)
    assert meter.rate(now=13.0) == 100.0
