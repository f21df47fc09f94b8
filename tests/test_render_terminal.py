"""The estimate in a terminal: one screen by default, every table with ``--details``, top
modules that count each activation byte once, and a batch plan whose figures explain
themselves."""

import pytest
from click.testing import CliRunner
from rich.console import Console

from memcalc.cli.commands import main
from memcalc.device.report import PlanPoint
from memcalc.pipeline import estimate
from memcalc.render.terminal import _plan_panel
from memcalc.specs import TrainingSpec
from memcalc.trace.categories import MemoryCategory

SEED = ["estimate", "--model", "resnet3d", "--shape", "834,224,834,3", "--model-arg",
        "depth=10", "--cpus", "8", "--ram", "64GiB"]
DETAIL_TITLES = ("Static count (no trace)", "Assumptions", "Not modelled",
                 "Host RAM arithmetic", "Host assumptions")


@pytest.fixture(scope="module")
def views():
    wide = {"COLUMNS": "100"}
    short = CliRunner().invoke(main, SEED, env=wide)
    full = CliRunner().invoke(main, [*SEED, "--details"], env=wide)
    assert short.exit_code == full.exit_code == 0, short.output
    return short.stdout, full.stdout


def test_the_default_view_fits_one_screen_and_says_where_the_rest_is(views):
    short, full = views
    lines = short.splitlines()
    assert len(lines) <= 50 < len(full.splitlines())
    assert lines[0].startswith("batch 1 needs ") and "largest batch" in lines[0]
    for shown in ("memcalc estimate", "Live tensor bytes at the peak", "Top modules",
                  "memcalc host", "--details", "Largest batch (no --gpu given)"):
        assert shown in short
    assert not any(title in short for title in DETAIL_TITLES)


def test_details_shows_every_table(views):
    _, full = views
    for title in DETAIL_TITLES:
        assert title in full
    assert "Largest batch on common cards" in full
    assert "--details (everything" not in full


def test_top_modules_count_each_activation_byte_once():
    spec = TrainingSpec(model="mlp", model_args={"in_features": 64, "hidden": 128},
                        sample_shape=(64,), batch_size=8, device="cpu",
                        machine={"cpus": 2, "ram_bytes": 8 << 30})
    device = estimate(spec).device
    activations = device.breakdown.by_category()[MemoryCategory.ACTIVATION]
    assert 0 < len(device.top_modules) < 10     # every module that made one is listed
    assert sum(row.activation_bytes for row in device.top_modules) == activations


def _plan_text(points: list[PlanPoint]) -> str:
    """The batch plan panel of a small estimate, its plan's points replaced by ``points``."""
    spec = TrainingSpec(model="mlp", model_args={"in_features": 64, "hidden": 128},
                        sample_shape=(64,), batch_size=8, gpu="T4")
    report = estimate(spec)
    plan = report.device.plan.model_copy(update={"points": points})
    report = report.model_copy(update={"device": report.device.model_copy(update={"plan": plan})})
    console = Console(width=400, record=True)
    console.print(_plan_panel(report))
    return console.export_text()


def test_a_batch_that_needs_more_than_a_larger_one_says_why():
    gib = 1 << 30

    def point(batch, total, allocated, fits=False):
        return PlanPoint(batch_size=batch, total_bytes=int(total * gib), fits=fits,
                         allocated_bytes=allocated * gib, method="line")

    odd = _plan_text([point(108, 74, 70, True), point(109, 85, 71), point(110, 75, 72)])
    assert "109: 85.00 GiB over (on the line) (more than batch 110 needs" in odd
    assert odd.count("split otherwise") == 1          # not on 108 or 110
    steady = _plan_text([point(108, 74, 70, True), point(109, 75, 71), point(110, 76, 72)])
    assert "split otherwise" not in steady
    # within the least-limit search's tolerance (0.5 %): no remark
    searched = _plan_text([point(108, 74, 70, True), point(109, 75.2, 71), point(110, 75, 72)])
    assert "split otherwise" not in searched
