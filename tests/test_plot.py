"""The pictures: a valid PNG with the four panels, drawn from the report's numbers."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.image import imread  # noqa: E402

import memcalc  # noqa: E402
from memcalc.pipeline import estimate  # noqa: E402
from memcalc.render.plot import plot_report  # noqa: E402
from memcalc.specs import TrainingSpec  # noqa: E402

TINY = dict(model="mlp", model_args={"in_features": 64, "hidden": 128}, sample_shape=(64,),
            machine={"cpus": 4, "ram_bytes": 16 << 30})


def test_report_plot_writes_a_png_with_four_panels(tmp_path):
    report = estimate(TrainingSpec(**TINY, gpu_memory_bytes=2 * 2**30))
    figure = plot_report(report)
    titles = [axes.get_title() for axes in figure.axes]
    assert titles == ["Breakdown at the peak", "Memory against batch size",
                      "Live tensor memory over the traced step",
                      "Activations alive at the peak, by module"]
    timeline = figure.axes[2].lines[0].get_ydata()
    assert max(timeline) * 2**30 == max(p.live_bytes for p in report.device.timeline)
    target = tmp_path / "report.png"
    memcalc.plot(report, target)
    pixels = imread(target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pixels.shape[0] > 500


def test_without_a_capacity_the_batch_panel_says_so(tmp_path):
    figure = plot_report(estimate(TrainingSpec(**TINY, batch_size=2)))
    texts = [text.get_text() for text in figure.axes[1].texts]
    assert texts == ["no capacity given (--gpu / --gpu-memory)"]


def test_timeline_peak_equals_the_traced_peak():
    report = estimate(TrainingSpec(**TINY, batch_size=4, device="cpu"))
    assert max(p.live_bytes for p in report.device.timeline) == report.device.peak_bytes
    phases = {p.phase for p in report.device.timeline}
    assert {"forward", "backward", "optimizer"} <= phases
