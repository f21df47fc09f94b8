"""The largest batch on each common card, against closed forms of synthetic totals: exact
where the search confirms it, from the line where it does not, never beyond the trace budget."""

from types import SimpleNamespace

import pytest

from memcalc.device.card_fit import CONFIRM_MAX_BATCH, card_fits

GIB = 2**30
CARDS = {"small": 22 * GIB, "large": 70 * GIB}


def _largest(total_at, usable, limit=1 << 21):
    low, high = 0, limit         # totals rise with the batch: bisect the last that fits
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total_at(middle) <= usable else (low, middle)
    return low


def _fits(total_at, budget=8, cards=CARDS):
    """``card_fits`` over reports whose totals come from ``total_at`` (the same for every
    card: only the usable bytes differ); the batches it traced."""
    traced = set()

    def report_at(card, batch):
        traced.add(batch)
        return SimpleNamespace(total_bytes=total_at(batch), fits=None, method="traced",
                               peak_allocated_bytes=total_at(batch),
                               compute_peak_bytes=0, optimizer_peak_bytes=0, context_bytes=0,
                               runs_at_capacity=None)

    fits = card_fits(report_at, cards, {card: usable + GIB for card, usable in cards.items()},
                     traced=lambda: set(traced), budget=budget)
    return {fit.gpu: fit for fit in fits}, traced


@pytest.mark.parametrize("total_at", [
    lambda b: 2 * GIB + b * 700 * 2**20,                       # straight
    lambda b: GIB + b * GIB // 4 + (b // 7) * 20 * 2**20,      # allocator steps
], ids=["linear", "stepped"])
def test_confirmed_batches_are_the_largest_that_fit(total_at):
    fits, traced = _fits(total_at, budget=40)
    for card, usable in CARDS.items():
        assert fits[card].confirmed and fits[card].upper_batch_size is None
        assert fits[card].max_batch_size == _largest(total_at, usable)
        assert fits[card].total_bytes == total_at(fits[card].max_batch_size)


def test_the_budget_bounds_the_traces_and_unconfirmed_answers_say_so():
    total_at = lambda b: GIB + b * b * 2**24         # curved: the line is off  # noqa: E731
    fits, traced = _fits(total_at, budget=2)
    assert len(traced - {1, 8}) <= 2
    for card, usable in CARDS.items():
        fit = fits[card]
        if not fit.confirmed:
            # between what the traces showed: at least the largest traced batch that fits,
            # below the smallest traced one that does not
            fitting = [b for b in traced if total_at(b) <= usable]
            over = [b for b in traced if total_at(b) > usable]
            assert max(fitting) <= fit.max_batch_size < min(over, default=1 << 30)
            # the allocated bytes' line through batches 1 and 8 bounds it from above (here
            # the totals are allocated bytes, and convex: the line runs below them)
            assert fit.upper_batch_size >= _largest(total_at, usable)
        else:
            assert fit.max_batch_size == _largest(total_at, usable)


def test_large_batches_come_from_the_line_without_tracing():
    total_at = lambda b: GIB + b * 2**20             # 1 MiB a sample  # noqa: E731
    fits, traced = _fits(total_at)
    assert traced == {1, 8}
    for card, usable in CARDS.items():
        assert fits[card].max_batch_size == _largest(total_at, usable) > CONFIRM_MAX_BATCH
        assert not fits[card].confirmed


def test_a_step_that_fits_no_card_says_none_fits():
    fits, traced = _fits(lambda b: 100 * GIB + b * GIB)
    assert traced == {1}
    assert all(fit.max_batch_size == 0 and fit.confirmed for fit in fits.values())


def test_a_confirmed_card_batch_is_what_the_estimate_for_that_card_plans():
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    spec = TrainingSpec(model="resnet3d", sample_shape=(128, 128, 128, 1),
                        model_args={"depth": 10, "in_channels": 1, "num_classes": 4})
    fits = estimate(spec).device.card_fits
    assert [fit.gpu for fit in fits] == ["RTX-4090", "A100-40GB", "L40S", "H100-80GB", "H200"]
    confirmed = [fit for fit in fits if fit.confirmed]
    assert confirmed
    for fit in confirmed[:1]:
        planned = estimate(spec.with_changes(gpu=fit.gpu)).device
        assert planned.max_batch_size == fit.max_batch_size > 0


def test_no_card_is_searched_with_too_few_traces_left_to_confirm_it():
    from memcalc.device.card_fit import MIN_TO_CONFIRM

    total_at = lambda b: GIB + b * GIB // 4 + (b // 7) * 20 * 2**20  # noqa: E731
    first = next(iter(CARDS))
    _, alone = _fits(total_at, budget=40, cards={first: CARDS[first]})
    used = len(alone - {1, 8})
    budget = used + MIN_TO_CONFIRM - 1
    fits, traced = _fits(total_at, budget=budget)
    assert fits[first].confirmed
    assert traced == alone       # the traces left could not confirm another card: none spent
