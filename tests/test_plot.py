import pytest

from memcalc.errors import InputError
from memcalc.pipeline import estimate
from memcalc.plot import plot_batch_plan
from memcalc.specs import TrainingSpec

TINY = dict(model="mlp", model_args={"in_features": 64, "hidden": 128}, sample_shape=(64,))


def test_plot_writes_a_png(tmp_path):
    report = estimate(TrainingSpec(**TINY, gpu_memory_bytes=2 * 2**30))
    target = plot_batch_plan(report, tmp_path / "plan.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 10_000


def test_plot_needs_a_plan(tmp_path):
    with pytest.raises(InputError, match="--gpu NAME or --gpu-memory"):
        plot_batch_plan(estimate(TrainingSpec(**TINY, batch_size=2)), tmp_path / "x.png")
