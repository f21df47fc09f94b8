"""Where the batch search traces next, from closed forms."""

from types import SimpleNamespace

from memcalc.device.search_guesses import MAX_BATCH, floor_bytes, floor_ceiling, over_secant


def test_the_floor_is_allocated_bytes_plus_what_lies_outside_the_allocator():
    report = SimpleNamespace(total_bytes=1_000, peak_reserved_bytes=900, peak_allocated_bytes=700)
    assert floor_bytes(report) == 800
    assert floor_bytes(SimpleNamespace(total_bytes=1_000)) == 1_000   # no replay: the total


def test_the_floor_ceiling_is_the_first_batch_whose_floor_passes_the_usable_memory():
    floors = {1: 1_000 + 10, 100: 1_000 + 1_000}            # 10 bytes a sample
    ceiling = floor_ceiling(floors, 100, usable_bytes=3_005)
    assert 1_000 + 10 * ceiling > 3_005 >= 1_000 + 10 * (ceiling - 1)
    assert floor_ceiling({1: 5, 8: 5}, 8, 100) == MAX_BATCH      # flat: no ceiling known


def test_from_above_the_secant_of_two_overs_stops_at_the_need_not_past_it():
    totals = {900: 10_000, 950: 11_000}                          # 20 bytes a sample
    guess = over_secant(totals, fitting=500, lowest=900, next_over=950, usable_bytes=9_000)
    assert guess == 850 and totals[900] - 20 * (900 - guess) <= 9_000
    assert over_secant(totals, 500, 900, 950, 1) == 501          # never below the bracket
