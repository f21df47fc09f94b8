"""Estimates against the truth of real CPU runs (profiler memory timeline)."""

import re

import pytest
import torch

from tests.fixtures.cases import CPU_TRUTH_CASES, TINY_GPT2, TINY_MLP
from tests.fixtures.cpu_truth import measure_spec_cpu_peak
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CPU_TRUTH_CASES))
def test_cpu_estimate_within_3_percent_of_real_run(case):
    spec = TrainingSpec(device="cpu", **CPU_TRUTH_CASES[case])
    report = estimate(spec)
    truth = measure_spec_cpu_peak(spec, report.input.traced_batch_shape)
    assert report.device.method == "traced"
    assert report.device.peak_bytes == pytest.approx(truth, rel=0.03)


def test_breakdown_adds_up_to_peak_and_model_states_match_static_count():
    report = estimate(TrainingSpec(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                                   batch_size=4, device="cpu"))
    breakdown, static = report.device.breakdown, report.static
    assert breakdown.total_bytes == report.device.peak_allocated_bytes == report.device.peak_bytes
    assert breakdown.parameters == static.parameter_bytes
    # peak of a small-batch MLP with Adam is in an optimizer step: all grads and states exist
    assert report.device.peak_phase == "optimizer"
    assert breakdown.gradients == static.gradient_bytes
    assert breakdown.optimizer_state <= static.optimizer_state_bytes + static.optimizer_step_counter_bytes


def test_tied_weights_are_counted_once_in_the_trace():
    report = estimate(TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(32,),
                                   device="cpu"))
    dim, vocab, positions, depth = 128, 1000, 128, 2
    per_block = 12 * dim * dim + 13 * dim  # qkv, proj, fc, proj with biases, two LayerNorms
    expected_params = vocab * dim + positions * dim + depth * per_block + 2 * dim
    assert report.model.parameter_count == expected_params
    assert report.device.breakdown.parameters == 4 * expected_params


def test_peak_is_affine_in_batch_size_once_activations_dominate():
    def peak(batch):
        return estimate(TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,),
                                     batch_size=batch, device="cpu")).device.peak_bytes

    p4, p8, p16 = peak(4), peak(8), peak(16)
    assert p4 < p8 < p16
    assert p16 - p8 == pytest.approx(2 * (p8 - p4), rel=0.02)


def test_frozen_parameters_get_no_gradients_or_state():
    report = estimate(TrainingSpec(model="tests.fixtures.models:frozen_backbone",
                                   sample_shape=(64,), batch_size=2, device="cpu"))
    trainable = 64 * 4 + 4
    assert report.model.trainable_parameter_count == trainable
    assert report.static.gradient_bytes == 4 * trainable
    assert report.static.optimizer_state_bytes == 2 * 4 * trainable


def test_untraceable_model_falls_back_to_a_labelled_static_estimate():
    report = estimate(TrainingSpec(model="tests.fixtures.models:untraceable",
                                   model_args={"kind": "bincount"}, sample_shape=(8,),
                                   batch_size=3, device="cpu"))
    assert report.device.method == "static"
    assert any("STATIC estimate" in line and "real tensor values" in line
               for line in report.unsupported)
    static = report.static
    params = 8 * 4 + 4
    assert report.device.breakdown.parameters == 4 * params
    assert report.device.breakdown.input_batch == static.input_batch_bytes == 3 * 8 * 4


def test_cuda_report_predicts_reserved_and_lists_what_it_does_not_model():
    report = estimate(TrainingSpec(model="mlp", model_args=TINY_MLP, sample_shape=(256,)))
    assert report.device.kind == "cuda"
    assert any("foreach" in line for line in report.assumptions)
    assert any("CUDA context" in line for line in report.assumptions)
    assert any("caching allocator" in line for line in report.assumptions)
    assert report.device.peak_bytes == (report.device.peak_reserved_bytes
                                        + report.device.context_bytes)
    cpu = estimate(TrainingSpec(model="mlp", model_args=TINY_MLP, sample_shape=(256,), device="cpu"))
    assert cpu.device.peak_reserved_bytes is None
    assert cpu.device.peak_bytes == cpu.device.peak_allocated_bytes


def test_host_estimate_uses_the_planned_batch_and_the_input_dtype():
    machine = {"cpus": 4, "ram_bytes": 16 << 30}
    spec = TrainingSpec(model="mlp", model_args=TINY_MLP, sample_shape=(256,),
                        gpu_memory_bytes=1 << 30, headroom_fraction=0.0, machine=machine)
    report = estimate(spec)
    host = report.host
    assert host.spec.batch_size == report.device.batch_size == report.device.max_batch_size
    assert host.spec.sample_shape == spec.sample_shape and host.spec.cuda
    assert host.spec.loader.sample_dtype == "float32"
    assert host.batch_bytes == host.spec.batch_size * 4 * spec.sample_shape[0]
    assert host.spec.machine.cpus == 4 and host.recommended_num_workers == 3


@pytest.mark.parametrize("kind,reason", [
    ("numpy", r"\.numpy\(\) is not supported"),
    ("bincount", r"needs real tensor values \(DynamicOutputShapeException: aten\.bincount"),
    ("custom_op", r"op memcalc_tests\.opaque\.default has no fake kernel"),
    ("cuda_only", r"not linked with support for cuda"),
])
def test_untraceable_kinds_fall_back_with_their_reason(kind, reason):
    report = estimate(TrainingSpec(model="tests.fixtures.models:untraceable",
                                   model_args={"kind": kind}, sample_shape=(8,), batch_size=2,
                                   machine={"cpus": 2, "ram_bytes": 4 << 30}))
    assert report.device.method == "static"
    labelled = [line for line in report.unsupported if line.startswith("traced step:")]
    assert len(labelled) == 1 and "STATIC estimate" in labelled[0]
    assert re.search(reason, labelled[0]), labelled[0]
    # the static figure still counts the model states: 8*4+4 parameters, Adam's two copies
    assert report.static.parameter_bytes == 4 * 36
    assert report.static.optimizer_state_bytes == 2 * 4 * 36


@pytest.mark.parametrize("model,kwargs,op", [
    ("untraceable", {"kind": "nonzero"}, "aten::nonzero"),
    ("untraceable", {"kind": "tolist"}, "aten::_local_scalar_dense"),
    ("item_gate", {}, "aten::_local_scalar_dense"),
])
def test_data_dependent_ops_trace_at_bounds_the_report_names(model, kwargs, op):
    report = estimate(TrainingSpec(model=f"tests.fixtures.models:{model}", model_args=kwargs,
                                   sample_shape=(8,), batch_size=2, device="cpu"))
    assert report.device.method == "traced"
    assert op in {bounded.op for bounded in report.device.bounded_sizes}
    stated = [line for line in report.assumptions
              if line.startswith(("data-dependent ops traced at upper bounds",
                                  "values read from tensors that no rule covers"))]
    assert any(op in line for line in stated)


def test_a_real_allocation_during_the_trace_is_refused(monkeypatch):
    import memcalc.trace._torch_internals as internals

    observed = []
    original = internals._refuse_real_allocation

    def spy(func, tensor):
        observed.append(type(tensor).__name__)
        return original(func, tensor)

    monkeypatch.setattr(internals, "_refuse_real_allocation", spy)
    spec = TrainingSpec(model="mlp", model_args=TINY_MLP, sample_shape=(256,), batch_size=4,
                        device="cpu")
    assert estimate(spec).device.method == "traced"
    assert observed and set(observed) == {"FakeTensor"}     # every op output went through it
    real = torch.empty(internals.REAL_ALLOCATION_LIMIT_BYTES + 1, dtype=torch.uint8)
    with pytest.raises(internals.RealAllocationError, match=r"made a real 16,777,217-byte"):
        original(torch.ops.aten.empty.memory_format, real)
    original(torch.ops.aten.empty.memory_format, real[:1024].clone())   # small: allowed


def test_fits_is_the_allocator_replayed_at_the_usable_capacity():
    base = TrainingSpec(model="mlp", model_args={"in_features": 64, "hidden": 256},
                        sample_shape=(64,), batch_size=4, env_profile="h100-torch2.11-cu130")
    unlimited = estimate(base).device
    assert unlimited.runs_at_capacity is None and unlimited.fits is None
    roomy = estimate(base.with_changes(gpu_memory_bytes=8 << 30, headroom_fraction=0.0)).device
    assert roomy.runs_at_capacity is True and roomy.fits is True
    # below what the driver and the context take, nothing runs
    outside = roomy.context_bytes + (480 << 20)
    cramped = estimate(base.with_changes(gpu_memory_bytes=outside + (1 << 20),
                                    headroom_fraction=0.0)).device
    assert cramped.runs_at_capacity is False and cramped.fits is False


def test_a_batch_that_cannot_train_says_so_and_the_line_skips_it():
    from rich.console import Console

    from memcalc.render.terminal import report_renderable

    spec = TrainingSpec(model="tests.fixtures.models:pooled_batchnorm", sample_shape=(3, 8, 8),
                        batch_size=4, gpu_memory_bytes=2 << 30,
                        machine={"cpus": 2, "ram_bytes": 8 << 30})
    report = estimate(spec)
    assert report.device.method == "traced" and report.device.batch_size == 4
    assert not any("STATIC" in line for line in report.unsupported)
    methods = {point.batch_size: point.method for point in report.device.plan.points}
    # the job's batch, traced for the report, is the search's second batch
    assert methods[1] == "cannot train" and methods[4] == "traced" and 8 not in methods
    assert report.device.plan.fit_batches[0] == 4
    console = Console(width=200, record=True)
    console.print(report_renderable(report))
    text = console.export_text()
    assert "1: cannot train at this batch" in text and "STATIC" not in text
    assert "line through traced batches 4 and" in text


def test_a_static_count_plans_no_batch_on_a_gpu():
    # it planned "batch 16777216 needs 1.10 GiB" from a count without activations
    report = estimate(TrainingSpec(model="tests.fixtures.models:untraceable",
                                   model_args={"kind": "bincount"}, sample_shape=(8,), gpu="T4"))
    assert report.device.method == "static"
    assert report.device.batch_size == 1 and report.device.max_batch_size is None
    assert report.host.spec.batch_size == 1
    assert {point.method for point in report.device.plan.points} == {"static"}


def test_one_replay_decides_every_figure_of_a_step_at_capacity():
    # the breakdown came from the unlimited trace and the reserve from the replay at capacity:
    # "allocated 230.77 GiB" beside a 20.84 GiB peak, "CUDA allocator reserve -210.76 GiB"
    base = TrainingSpec(model="resnet3d", sample_shape=(3, 16, 64, 64), batch_size=4)
    free = estimate(base).device
    capped = estimate(base.with_changes(gpu_memory_bytes=1600 << 20,
                                        headroom_fraction=0.0)).device
    assert free.skipped_workspace_bytes == 0 and free.breakdown.workspaces > 0
    assert capped.skipped_workspace_bytes > 0
    assert capped.breakdown.workspaces < free.breakdown.workspaces
    assert capped.breakdown.total_bytes + capped.workspace_bytes == capped.peak_allocated_bytes
    assert capped.peak_allocated_bytes <= capped.peak_reserved_bytes
    assert max(point.live_bytes for point in capped.timeline) == capped.breakdown.total_bytes
