"""The pictures: a valid PNG with the four panels (three without a capacity), drawn from the
report's numbers, each axis in the unit its values read best in, no empty panel, no legend
entry for nothing, phases shaded where they happen."""

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
                      "Own activations at the peak, by module"]
    timeline = figure.axes[2].lines[0].get_ydata()
    unit = figure.axes[2].get_ylabel().split()[-1]
    assert unit in ("KiB", "MiB", "GiB")
    scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    peak = max(p.live_bytes for p in report.device.timeline)
    assert max(timeline) * scale == peak and 1 <= max(timeline) < 1024
    target = tmp_path / "report.png"
    memcalc.plot(report, target)
    pixels = imread(target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pixels.shape[0] > 500


def test_without_a_capacity_there_is_no_empty_batch_panel_nor_a_legend_for_nothing():
    report = estimate(TrainingSpec(**TINY, batch_size=2, device="cpu"))
    figure = plot_report(report)
    assert [axes.get_title() for axes in figure.axes] == [
        "Breakdown at the peak", "Live tensor memory over the traced step",
        "Own activations at the peak, by module"]
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    held = {c.value for c, n in report.device.breakdown.by_category().items() if n > 0}
    assert {entry.split()[0] for entry in legend} == held
    assert not any(" 0.00 " in entry for entry in legend)


def test_the_phase_bands_follow_when_events_happen():
    # a forward tensor freed in backward belongs to backward: one band per phase and
    # iteration, forward → backward → optimizer twice
    report = estimate(TrainingSpec(**TINY, batch_size=4, device="cpu"))
    runs = []
    for point in report.device.timeline:
        if point.phase != "setup" and (not runs or runs[-1] != (point.phase, point.iteration)):
            runs.append((point.phase, point.iteration))
    assert [phase for phase, _ in runs][:3] == ["forward", "backward", "optimizer"]
    assert len(runs) == len(set(runs))


def test_timeline_peak_equals_the_traced_peak():
    report = estimate(TrainingSpec(**TINY, batch_size=4, device="cpu"))
    assert max(p.live_bytes for p in report.device.timeline) == report.device.peak_bytes
    phases = {p.phase for p in report.device.timeline}
    assert {"forward", "backward", "optimizer"} <= phases


def test_writing_a_plot_leaves_the_callers_matplotlib_backend(tmp_path):
    """A notebook's inline backend stays: the written figure has its own canvas (it switched
    the process to Agg)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import matplotlib
        matplotlib.use("svg")
        import memcalc
        from memcalc.render.plot import plot_report
        report = memcalc.estimate("mlp", (64,), device="cpu",
                                  model_args=dict(in_features=64, hidden=64, depth=1))
        plot_report(report, {str(tmp_path / "plot.png")!r})
        print(matplotlib.get_backend())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "svg"
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_an_exploratory_trace_far_past_the_answer_does_not_stretch_the_batch_axis():
    from memcalc.device.report import PlanPoint
    from memcalc.render.plot import AXIS_REACH, plot_batch
    import matplotlib.pyplot as plt

    report = estimate(TrainingSpec(**TINY, gpu_memory_bytes=2 * 2**30))
    plan = report.device.plan
    far = plan.max_batch_size * 20
    stray = PlanPoint(batch_size=far, total_bytes=plan.model_bytes + far * plan.per_sample_bytes,
                       method="traced", fits=False)
    report = report.model_copy(update={"device": report.device.model_copy(update={
        "plan": plan.model_copy(update={"points": [*plan.points, stray]})})})
    figure, axes = plt.subplots()
    plot_batch(axes, report)
    reach = max(plan.max_batch_size + 1, report.device.batch_size or 0, 2) * AXIS_REACH
    assert axes.get_xlim()[1] < 1.2 * reach < far
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    beyond = sum(point.batch_size > reach for point in report.device.plan.points)
    assert beyond >= 1
    assert f"{beyond} traced beyond batch {int(reach)}, not shown" in legend
    plt.close(figure)
