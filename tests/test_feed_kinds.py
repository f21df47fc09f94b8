"""The kinds of data users train on (``tests/fixtures/data_kinds.py``) as the probe sees them:
each builds, yields a tensor batch, and is timed with a core to itself.

The feeding model against a real DataLoader on these kinds is a timing comparison, which a
shared 2-core machine makes noisy (single rows moved by 10+ points between runs), so it lives
in ``benchmarks/feed_kinds.py`` (``benchmarks/results-feed.md``); the suite holds the model
to the 10-point bound on a dataset whose samples cost a known CPU time
(``tests/test_feed_check.py``)."""

import pytest

from tests.fixtures.data_kinds import FEED_CASES
from memcalc.host import LoaderSpec, measure_worker
from memcalc.host.probe import handover_timed, main_build_timed

pytestmark = pytest.mark.slow      # real DataLoaders timed: run alone


@pytest.mark.parametrize("kind", sorted(FEED_CASES))
def test_each_kind_is_measured_in_a_real_worker(kind):
    case = FEED_CASES[kind]
    measured = measure_worker(LoaderSpec(dataset=case.reference, probe_seconds=2),
                              case.batch_size)
    assert measured.batch_size == case.batch_size and measured.batch_bytes > 0
    assert measured.core_seconds_per_sample is not None
    # each kind costs real CPU time per sample (decoding, reading, Python loops) ...
    assert 0.0005 < measured.core_seconds_per_sample <= measured.seconds_per_sample
    # ... and a batch takes longer to build than to wait for at the step chosen for it, at
    # one worker: the case is CPU-bound there, not trivially fed
    assert measured.core_seconds_per_sample * case.batch_size > 0.5 * case.step_s
    # the probe also times taking a batch from its worker where its budget allows (whether a
    # worker building its next batch hands it over late, the GIL warning, is in
    # benchmarks/results-feed.md and tests/test_feed_check.py: on a loaded machine the worker
    # may not have started building); a slow CPU's JPEG batches leave no time for it
    batch_s = measured.seconds_per_sample * case.batch_size
    receives = (measured.receive_seconds, measured.busy_receive_seconds)
    if handover_timed(batch_s, prefetch=2):
        assert all(seconds is not None and seconds > 0 for seconds in receives)
    else:
        assert receives == (None, None)
    # and building one in its own process, the 0-worker prediction
    if main_build_timed(batch_s):
        assert measured.main_build_seconds is not None and measured.main_build_seconds > 0
    else:
        assert measured.main_build_seconds is None
