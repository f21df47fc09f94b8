"""The estimate in a terminal: one screen by default, every table with ``--details``, and
top modules that count each activation byte once."""

import pytest
from click.testing import CliRunner

from memcalc.cli.commands import main
from memcalc.pipeline import estimate
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
