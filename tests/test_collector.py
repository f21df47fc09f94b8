"""The garbage collector runs no full collection while a step is traced, and afterwards as
before."""

import gc

import pytest

from memcalc.trace.collector import TRACE_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.parametrize("callers", [(700, 10, 10), (1000, 5, 20)])
def test_raised_inside_and_the_callers_own_after(thresholds, callers):
    gc.set_threshold(*callers)
    with fewer_collections():
        assert gc.get_threshold() == (*callers[:2], TRACE_THRESHOLD)
    assert gc.get_threshold() == callers


def test_put_back_when_the_block_raises(thresholds):
    gc.set_threshold(700, 10, 10)
    with pytest.raises(KeyError), fewer_collections():
        raise KeyError("the model's code")
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("callers", [(0, 10, 10), (700, 10, 10 * TRACE_THRESHOLD)])
def test_collection_off_or_rarer_already_is_left_alone(thresholds, callers):
    gc.set_threshold(*callers)
    with fewer_collections():
        assert gc.get_threshold() == callers


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_an_estimate_runs_fewer_full_collections_and_as_many_young_ones(monkeypatch,
                                                                     thresholds):
    from contextlib import nullcontext

    import memcalc.pipeline as pipeline
    import memcalc.trace.tracer as tracer
    from memcalc.specs import TrainingSpec

    spec = TrainingSpec(model="resnet50", sample_shape=(3, 64, 64), batch_size=2, gpu="T4")

    def collections() -> list[int]:
        """Collections of each generation during one estimate."""
        counts = [0, 0, 0]

        def count(phase, info):
            if phase == "start":
                counts[info["generation"]] += 1
        gc.callbacks.append(count)
        try:
            pipeline.estimate(spec)
        finally:
            gc.callbacks.remove(count)
        return counts

    gc.set_threshold(700, 10, 10)
    pipeline.estimate(spec)             # torch's lazy imports and caches out of the way
    fewer = collections()
    for module in (pipeline, tracer):
        monkeypatch.setattr(module, "fewer_collections", nullcontext)
    default = collections()
    assert fewer[2] < default[2] and fewer[0] >= 0.8 * default[0]
