"""What the report says it assumed, for the cases a user would otherwise not be told."""

import pytest

import memcalc

TINY = dict(model_args=dict(in_features=32, hidden=32, depth=1), batch_size=2)


@pytest.mark.parametrize("gpu, precision, warned", [
    ("T4", "bf16-mixed", True), ("V100-16GB", "bf16", True),
    ("T4", "fp16-mixed", False), ("A100-80GB", "bf16-mixed", False)])
def test_bf16_on_a_card_without_bf16_tensor_cores_is_said_first(gpu, precision, warned):
    report = memcalc.estimate("mlp", (32,), gpu=gpu, precision=precision, **TINY)
    first = report.assumptions[0]
    assert first.startswith(f"WARNING: {gpu} has no bf16 tensor cores") is warned


def test_a_warning_is_on_the_screen_without_details():
    from click.testing import CliRunner

    from memcalc.cli.commands import main

    result = CliRunner().invoke(main, ["estimate", "--model", "mlp", "--gpu", "T4",
                                       "--precision", "bf16-mixed", "--batch-size", "2"])
    assert result.exit_code == 0 and "no bf16 tensor cores" in result.output
