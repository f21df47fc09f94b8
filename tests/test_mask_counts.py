"""Bounds on a mask's non-zero elements: a detector's sampler pattern bounds ``nonzero`` by
the indices it wrote, and any other write into the mask falls back to its numel."""

import pytest
import torch

from memcalc.trace._torch_internals import fake_cpu_mode
from memcalc.trace.bounded_ops import BoundedOps
from memcalc.trace.mask_counts import count_rule

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
    with pytest.raises(ValueError, match="'aten::zeros' is registered already"):
        count_rule("aten::zeros")(lambda count_of, *args: 0)
