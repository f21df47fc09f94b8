"""Property-based tests (hypothesis, bounded budgets): no input crashes the parsers or the CLI,
estimates grow with the batch, breakdowns add up."""

import json
import re

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memcalc.cli.commands import main
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.units import _SIZE_FACTORS, parse_size
from tests.fixtures.cli import assert_exited_cleanly

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
TRACED = settings(max_examples=12, deadline=None)
UNITS = sorted(unit for unit in _SIZE_FACTORS if unit)


@FAST
@given(st.text(max_size=12))
def test_parse_size_returns_positive_bytes_or_a_value_error(text):
    try:
        value = parse_size(text)
    except ValueError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert isinstance(value, int) and value >= 0


@FAST
@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(UNITS))
def test_parse_size_reads_every_unit(number, unit):
    assert parse_size(f"{number}{unit.upper() if unit.endswith('b') else unit}") == (
        number * _SIZE_FACTORS[unit])


shape_text = st.one_of(
    st.lists(st.integers(min_value=-3, max_value=300), min_size=0, max_size=5).map(
        lambda dims: ",".join(map(str, dims))),
    st.text(alphabet="0123456789,x- ", max_size=12))
size_text = st.one_of(st.sampled_from(["24GiB", "24GB", "-5GB", "24G", "0GB", "1.5TiB", "abc",
                                       "8 GiB", "100MB"]), st.text(max_size=6))


@FAST
@given(shape_text, size_text, st.integers(min_value=-2, max_value=300),
       st.integers(min_value=-2, max_value=64))
def test_host_command_never_crashes(shape, ram, cpus, workers):
    args = ["host", "--shape", shape, "--ram", ram, "--cpus", str(cpus), "--num-workers",
            str(workers), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 2), result.output
    assert_exited_cleanly(result)
    if result.exit_code == 0:
        host = json.loads(result.stdout)
        assert host["max_num_workers"] <= cpus
    else:
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and re.match(r"Error: \S", errors[0])


@TRACED
@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=64))
def test_estimates_grow_with_the_batch_and_breakdowns_add_up(batch, extra):
    spec = TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 64},
                        sample_shape=(32,), machine={"cpus": 2, "ram_bytes": 8 << 30})
    # the steps themselves: no common-card search
    small = estimate(spec.with_changes(batch_size=batch), card_fits=False).device
    large = estimate(spec.with_changes(batch_size=batch + extra), card_fits=False).device
    assert small.peak_bytes <= large.peak_bytes
    assert small.peak_allocated_bytes <= large.peak_allocated_bytes
    for device in (small, large):
        assert device.breakdown.total_bytes + device.workspace_bytes == device.peak_allocated_bytes
        assert device.peak_reserved_bytes >= device.peak_allocated_bytes
