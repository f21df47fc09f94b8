"""Values a traced step reads from tensors: the value that keeps the most work, the value
memcalc filled, and the default that may skip work, which the report's head names."""

import pytest
import torch

import memcalc
from memcalc.trace._torch_internals import fake_cpu_mode
from memcalc.trace.bounded_ops import BoundedOps
from memcalc.trace.python_values import SCALAR_DEFAULTS, SCALAR_OP

MODELS = "tests.fixtures.models"


def _estimate(model: str, shape, **options):
    return memcalc.estimate(f"{MODELS}:{model}", shape, batch_size=2, device="cpu", **options)


def _reads(report) -> dict[str, bool]:
    return {use.bound: use.keeps_most_work for use in report.device.bounded_sizes
            if use.op == SCALAR_OP}


def test_a_layer_drop_draw_keeps_every_layer_as_a_step_without_layer_drop_does():
    # torchaudio's wav2vec2 drew 0.0 <= layer_drop: all 12 layers skipped, a third of a real step
    dropping = _estimate("layer_drop", (32,), model_args={"p": 0.0})
    without = _estimate("layer_drop", (32,), model_args={"p": None})
    assert dropping.device.peak_allocated_bytes == without.device.peak_allocated_bytes
    assert dropping.device.breakdown.activations == without.device.breakdown.activations > 0
    assert list(_reads(dropping).values()) == [True]


def test_a_random_choice_takes_its_largest_option():
    report = _estimate("random_size", (3, 4, 4))
    assert report.input.output_shape == (2, 4, 24, 24)
    assert all(_reads(report).values())


def test_a_length_input_memcalc_fills_is_read_back_as_the_sequence_length():
    # torchaudio's Conformer read max(lengths) as 0 and fell back to a static count
    report = _estimate("length_masked", (10, 16), inputs={"lengths": ((), "int64")})
    assert report.device.method == "traced"
    assert report.input.output_shape == (2, 10, 16)
    (meaning, keeps), = _reads(report).items()
    assert meaning.startswith("10: lengths as memcalc fills it") and keeps


def test_a_read_no_rule_covers_gets_the_default_and_is_flagged_as_possibly_short():
    report = _estimate("item_gate", (8,))
    assert _reads(report) == {SCALAR_DEFAULTS["float"].meaning: False}


@pytest.mark.parametrize("make, expected", [
    (lambda: torch.ones(4, 4).min(), 1.0),
    (lambda: torch.full((3,), 2.5).to(torch.float64).max(), 2.5),
    (lambda: torch.zeros(2, 2, dtype=torch.int64)[1, 0], 0),
    (lambda: torch.empty(3).new_full((2,), 7.0).amin(), 7.0),
])
def test_a_constant_an_op_filled_is_read_back_exactly(make, expected):
    with fake_cpu_mode(), BoundedOps() as ops:
        value = make().item()
    assert value == expected
    assert [use.keeps_most_work for use in ops.uses() if use.op == SCALAR_OP] == [True]


def test_a_constant_written_into_is_no_longer_known():
    with fake_cpu_mode(), BoundedOps() as ops:
        mask = torch.ones(4)
        mask[1:].mul_(3.0)
        value = mask.max().item()
    assert value == SCALAR_DEFAULTS["float"].value
    assert [use.keeps_most_work for use in ops.uses() if use.op == SCALAR_OP] == [False]


@pytest.mark.parametrize("make, expected", [
    (lambda: torch.rand(1), 1.0),
    (lambda: torch.empty(1).uniform_(2.0, 5.0), 5.0),
    (lambda: torch.randint(3, 7, (1,)), 6),
    (lambda: torch.randint(7, (1,)), 6),
])
def test_draws_are_read_at_the_top_of_their_range(make, expected):
    with fake_cpu_mode(), BoundedOps():
        value = make().item()
    assert value == pytest.approx(expected) and value <= expected


def _read_back(make):
    with fake_cpu_mode(), BoundedOps() as ops:
        value = make().item()
    return value, [use.bound for use in ops.uses() if use.op == SCALAR_OP]


def _flags_set_one_by_one():
    flags = torch.zeros(4, dtype=torch.int32)
    for index in range(4):
        flags[index] = index + 1            # a Python number copied into one element
    return flags


def test_a_flag_set_by_indexing_is_read_back_at_its_element():
    value, (bound,) = _read_back(lambda: _flags_set_one_by_one()[2])
    assert value == 3 and bound == "3: the element copy_ set it to"


def test_element_values_go_on_through_a_copy_of_the_whole_tensor():
    # DDP's reducer: flags set on the host map, copied to the device map and back
    def copied():
        device_map = torch.empty(4, dtype=torch.int32)
        device_map.copy_(_flags_set_one_by_one())
        return device_map.clone()[3]
    assert _read_back(copied)[0] == 4


def test_an_element_never_set_keeps_the_whole_tensors_fill():
    def partly():
        flags = torch.zeros(4, dtype=torch.int64)
        flags[1] = 7
        return flags[0]
    value, (bound,) = _read_back(partly)
    assert value == 0 and bound == "0: the constant zeros filled it with"


def test_a_part_written_otherwise_is_no_longer_known():
    def overwritten():
        flags = _flags_set_one_by_one()
        flags[1:3].fill_(5)                 # two elements at once
        return flags[0]
    assert _read_back(overwritten) == (SCALAR_DEFAULTS["int"].value, [SCALAR_DEFAULTS["int"].meaning])


def test_ddps_static_graph_reads_back_the_flags_of_the_parameters_it_used():
    # its reducer all-reduces the used-parameter map (a no-op in the fake process group) and
    # reads it back: every parameter used, none read as the default
    report = memcalc.estimate("mlp", (32,), batch_size=2, device="cpu",
                              model_args={"in_features": 32, "hidden": 32, "depth": 2},
                              parallel={"strategy": "ddp", "gpus_per_node": 2,
                                        "static_graph": True})
    reads = [use for use in report.device.bounded_sizes if use.op == SCALAR_OP]
    assert reads and all(use.bound == "1: the element fill_ set it to" for use in reads)
    assert not any("no rule covers" in line for line in report.assumptions)
