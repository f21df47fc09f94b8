"""The validation step's panel and notebook paragraph: the same numbers as the report."""

import memcalc
from memcalc.render.html import report_html
from memcalc.render.validation import validation_lines
from memcalc.units import format_bytes

NET = "tests.fixtures.ecosystem_models:voxel_mlp"


def _report(**window):
    return memcalc.estimate(NET, (1, 32, 32, 32), batch_size=2, loss="sum",
                            gpu_memory_bytes=8 << 30, eval_sample_shape=(1, 64, 64, 64),
                            sliding_window=dict(roi=(32, 32, 32), **window),
                            machine={"cpus": 2, "ram_bytes": 64 << 30})


def test_the_panel_shows_the_reports_gpu_and_host_figures_and_where_the_buffers_live():
    report = _report(output_device="cpu")
    text = "\n".join(validation_lines(report))
    assert "1×64×64×64" in text and "output aggregated on the cpu" in text
    assert format_bytes(report.validation.total_bytes) in text
    assert f"largest validation batch {report.validation.max_batch_size}" in text
    assert format_bytes(report.validation_host.peak_bytes) in text
    assert format_bytes(report.validation.host_tensor_bytes) in text


def test_without_validation_there_is_no_panel_and_the_notebook_shows_it_when_there_is():
    plain = memcalc.estimate(NET, (1, 32, 32, 32), batch_size=2, loss="sum")
    assert validation_lines(plain) == [] and "validation" not in report_html(plain)
    html = report_html(_report())
    assert "<b>validation</b>" in html and "[bold]" not in html
