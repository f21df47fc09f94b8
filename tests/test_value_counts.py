"""Bounds on a tensor's non-zero elements and distinct values: a detector's sampler pattern
bounds ``nonzero`` by the indices it wrote, filled levels bound ``unique``, and any other write
into a counted tensor falls back to its numel."""

import pytest
import torch

from memcalc.trace._torch_internals import fake_cpu_mode
from memcalc.trace.bounded_ops import BoundedOps
from memcalc.trace.value_counts import NONZERO, count_rule

PROPOSALS, POSITIVE, NEGATIVE = 2000, 128, 384


def _sampled_masks():
    """torchvision's BalancedPositiveNegativeSampler: k indices written into zero masks."""
    labels = torch.empty(PROPOSALS)
    positive = torch.where(labels >= 1)[0]               # every proposal, at the bound
    negative = torch.where(labels == 0)[0]
    positive = positive[torch.randperm(positive.numel())[:POSITIVE]]
    negative = negative[torch.randperm(negative.numel())[:NEGATIVE]]
    positive_mask = torch.zeros_like(labels, dtype=torch.uint8)
    negative_mask = torch.zeros_like(labels, dtype=torch.uint8)
    positive_mask[positive] = 1
    negative_mask[negative] = 1
    return positive_mask, negative_mask


def test_the_union_of_two_sampled_masks_holds_the_indices_written_into_them():
    with fake_cpu_mode(), BoundedOps():
        positive_mask, negative_mask = _sampled_masks()
        sampled = torch.where(positive_mask | negative_mask)[0]
        both = torch.where(torch.cat([positive_mask, negative_mask]))[0]
        positives = torch.where(positive_mask > 0)[0]
        selected = torch.empty(PROPOSALS, 4)[positive_mask.bool()]
        common = torch.where(positive_mask.bool() & negative_mask.bool())[0]
    assert sampled.shape == (POSITIVE + NEGATIVE,) == both.shape
    assert positives.shape == (POSITIVE,) and selected.shape == (POSITIVE, 4)
    assert common.shape == (POSITIVE,)


@pytest.mark.parametrize("write", [
    lambda mask: mask.__setitem__(slice(0, 10), 1),          # through a view
    lambda mask: mask.fill_(1),
    lambda mask: mask.__setitem__(mask == 0, 1),             # by a mask: no index count
    lambda mask: torch.add(mask, 1, out=mask),
])
def test_any_other_write_forgets_the_count(write):
    with fake_cpu_mode(), BoundedOps():
        positive_mask, _ = _sampled_masks()
        write(positive_mask)
        rows = torch.where(positive_mask)[0]
    assert rows.shape == (PROPOSALS,)


def test_a_count_rule_registered_twice_is_an_error():
    with pytest.raises(ValueError, match="nonzero count rule for 'aten::zeros' is registered"):
        count_rule(NONZERO, "aten::zeros")(lambda count_of, *args: 0)


def _levels(sizes):
    """torchvision's RPN: one level index per proposal, gathered by the kept proposals."""
    levels = torch.cat([torch.full((size,), level, dtype=torch.int64)
                        for level, size in enumerate(sizes)])
    kept = torch.where(torch.empty(sum(sizes)) >= 0.5)[0]
    return levels.reshape(1, -1).expand(2, -1)[0][kept]


def test_unique_of_gathered_level_indices_holds_one_value_per_level():
    sizes = [2000, 2000, 2000, 507]
    with fake_cpu_mode(), BoundedOps():
        levels = _levels(sizes)
        distinct = torch.unique(levels)
        values = torch.unique(torch.empty(10))
    assert levels.shape == (sum(sizes),)
    assert distinct.shape == (len(sizes),) and values.shape == (10,)


def test_a_write_into_the_levels_forgets_their_distinct_count():
    with fake_cpu_mode(), BoundedOps():
        levels = _levels([30, 20])
        levels.add_(1)
        distinct = torch.unique(levels)
    assert distinct.shape == (50,)
