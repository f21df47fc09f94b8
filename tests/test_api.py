"""The library API: model instances, factories and names; check() in few traces, with fixes."""

import pytest
import torch
from torch import nn

import memcalc
from memcalc.errors import InputError, MemoryBudgetError
from models_zoo import ZOO

MACHINE = {"cpus": 8, "ram_bytes": 64 << 30}
MLP_ARGS = {"in_features": 64, "hidden": 256, "depth": 2}


def test_an_instance_is_traced_without_touching_its_weights():
    model = ZOO["mlp"].build(**MLP_ARGS)
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = memcalc.estimate(model, (64,), batch_size=4, device="cpu", machine=MACHINE)
    for name, parameter in model.named_parameters():
        assert parameter.device.type == "cpu" and parameter.data_ptr() == pointers[name]
        torch.testing.assert_close(parameter.detach(), before[name])
    by_name = memcalc.estimate("mlp", (64,), batch_size=4, device="cpu", model_args=MLP_ARGS,
                               machine=MACHINE)
    assert report.device.peak_bytes == by_name.device.peak_bytes
    assert report.model.name == f"{type(model).__name__} (instance)"


def test_a_meta_instance_and_a_factory_work_too():
    with torch.device("meta"):
        meta_model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    report = memcalc.estimate(meta_model, (32,), batch_size=2, device="cpu", machine=MACHINE)
    assert report.model.parameter_count == 32 * 64 + 64 + 64 * 4 + 4
    factory = memcalc.estimate(lambda: nn.Linear(8, 2), (8,), batch_size=2, device="cpu",
                               machine=MACHINE)
    assert factory.model.parameter_count == 18 and "factory" in factory.model.name


def test_check_returns_the_report_when_it_fits():
    report = memcalc.check("mlp", (64,), batch_size=8, gpu="T4", model_args=MLP_ARGS,
                           machine=MACHINE)
    assert report.device.fits and report.device.batch_size == 8


def _count_traces(monkeypatch) -> list[int]:
    import memcalc.prepared_step as prepared_step

    traced = []
    original = prepared_step.trace_training_step
    monkeypatch.setattr(prepared_step, "trace_training_step",
                        lambda setup, *args, **kwargs: traced.append(setup.batch_shape[0])
                        or original(setup, *args, **kwargs))
    return traced


def test_check_answers_a_clear_fit_with_one_trace(monkeypatch):
    # it ran the whole batch search (13 traces for ResNet-50) to answer yes
    traced = _count_traces(monkeypatch)
    report = memcalc.check("mlp", (64,), batch_size=8, gpu="T4", model_args=MLP_ARGS,
                           machine=MACHINE)
    assert report.device.fits and traced == [8] and report.device.plan is None


def test_a_check_that_does_not_fit_answers_with_two_traces_on_the_safe_side(monkeypatch):
    """No: one trace; about the largest batch: one more (batch 1), on the line through the
    two, never above the largest batch that the search with fixes=True confirms by tracing
    (it ran the whole batch search and a plan for the fixes to answer no)."""
    import memcalc.api as api

    monkeypatch.setattr(api, "workers_for", lambda spec, requested=None: 0)  # all traced here
    traced = _count_traces(monkeypatch)
    job = dict(gpu="T4", model_args=MLP_ARGS, machine=MACHINE, optimizer="sgd")
    with pytest.raises(MemoryBudgetError, match=r"largest batch that fits: about \d+, on the "
                                                r"line through traced batches 1 and 100000000\)"
                                                r".*--fixes") as line:
        memcalc.check("mlp", (64,), batch_size=10**8, **job)
    assert traced == [10**8, 1] and line.value.plan is None
    on_line = line.value.report.device.max_batch_size
    traced.clear()
    with pytest.raises(MemoryBudgetError, match="cheapest fixes") as searched:
        memcalc.check("mlp", (64,), batch_size=10**8, fixes=True, **job)
    confirmed = searched.value.report.device.plan
    assert len(traced) > 2     # searched by tracing (to a hundredth above batch 1024)
    assert 0.9 * confirmed.max_batch_size <= on_line <= confirmed.max_batch_size


def test_a_check_where_not_even_the_smallest_batch_fits_says_so_after_two_traces(monkeypatch):
    traced = _count_traces(monkeypatch)
    with pytest.raises(MemoryBudgetError, match=r"\(not even batch 1 fits\)") as caught:
        memcalc.check("mlp", (64,), batch_size=4, gpu_memory_bytes=1 << 20,
                      model_args=MLP_ARGS, machine=MACHINE)
    plan = caught.value.report.device.plan
    assert traced == [4, 1] and plan.max_batch_size == 0 and plan.confirmed
    assert [point.fits for point in plan.points] == [False, False]


def test_a_check_that_does_not_fit_tells_its_verdict_after_one_trace(monkeypatch):
    """The verdict is announced after the first trace; the search for the largest batch is
    made once: the fixes' plan takes it for its job as given (it made it again before)."""
    import memcalc.api as api
    from memcalc.progress import listening

    monkeypatch.setattr(api, "workers_for", lambda spec, requested=None: 0)  # all traced here
    traced, heard = _count_traces(monkeypatch), []

    def hear(text: str) -> None:
        if text.startswith("DOES NOT FIT"):
            heard.append((text, len(traced)))

    with listening(hear), pytest.raises(MemoryBudgetError) as caught:
        memcalc.check("mlp", (64,), batch_size=10**8, gpu="T4", model_args=MLP_ARGS,
                      machine=MACHINE, optimizer="sgd", fixes=True)
    (verdict, after), *_ = heard
    assert after == 1 and verdict.startswith("DOES NOT FIT: batch 100000000 needs ")
    largest = caught.value.report.device.max_batch_size
    assert largest and traced.count(largest) == 1   # the job's search, once


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_check_raises_with_numbers_and_the_fixes_that_fit():
    with pytest.raises(MemoryBudgetError) as caught:
        memcalc.check("resnet3d", (3, 128, 128, 128), batch_size=8, gpu="T4", machine=MACHINE,
                      fixes=True)
    error = caught.value
    assert isinstance(error, memcalc.MemcalcError)
    assert str(error).startswith("does not fit: batch 8 needs ")
    assert "GiB usable (largest batch that fits: " in str(error)
    assert "cheapest fixes: " in str(error) and "mixed-precision" in str(error)
    assert error.report.device.fits is False
    first = next(c for c in error.plan.candidates if c.fits)
    assert first.label in str(error)


def test_check_raises_when_the_workers_do_not_fit_the_host():
    with pytest.raises(MemoryBudgetError, match=r"8 DataLoader workers need .* host RAM"):
        memcalc.check("resnet3d", (3, 256, 256, 256), batch_size=1, gpu="A100-80GB",
                      model_args={"depth": 10}, num_workers=8,
                      machine={"cpus": 8, "ram_bytes": 4 << 30})


def test_a_login_nodes_host_plan_warns_and_does_not_fail_a_gpu_check():
    """A machine detected here (not given) is often a login node: its host RAM and CPUs are a
    warning on the first line, not a failed check."""
    from memcalc.render.terminal import fits_summary

    report = memcalc.check("resnet3d", (3, 256, 256, 256), batch_size=1, gpu="A100-80GB",
                           model_args={"depth": 10}, num_workers=8,
                           machine={"cpus": 2, "ram_bytes": 4 << 30, "source": "detected"})
    assert not report.host.fits
    line = fits_summary(report)
    assert line.startswith("FITS: batch 1") and "WARNING: this machine's, 2 CPUs" in line
    assert "--cpus and --ram" in line


def test_check_needs_a_capacity():
    with pytest.raises(InputError, match="check needs a capacity"):
        memcalc.check("mlp", (64,), batch_size=2)


def test_check_never_says_fits_for_a_static_estimate():
    from memcalc.errors import UntracedEstimateError

    with pytest.raises(UntracedEstimateError, match=r"fit unknown: .*could not be traced.*"
                                                    r"\.numpy\(\)"):
        memcalc.check("tests.fixtures.models:untraceable", (8,), batch_size=4, gpu="T4",
                      machine={"cpus": 2, "ram_bytes": 8 << 30})


def test_plan_works_on_a_static_model_and_marks_every_candidate():
    plan = memcalc.plan("tests.fixtures.models:untraceable", (8,), gpu="T4", max_gpus=2,
                        machine={"cpus": 2, "ram_bytes": 8 << 30})
    assert plan.reason.startswith("STATIC ESTIMATE, NOT TRACED")
    assert plan.candidates and all(c.method.startswith("STATIC") for c in plan.candidates)


@pytest.mark.parametrize("options, message", [
    (dict(optimiser="adam"), r"unknown argument 'optimiser'; did you mean 'optimizer'\?"),
    (dict(loader={"num_worker": 2}), r"unknown argument .*num_worker.*did you mean 'num_workers'"),
    # a nested spec's field given at the top: its place, never the name given back
    (dict(strategy="fsdp"), r"unknown argument 'strategy'; did you mean "
                            r"parallel=\{'strategy': \.\.\.\}\?$"),
    (dict(num_workers=2), r"did you mean loader=\{'num_workers': \.\.\.\}\?$"),
    (dict(batch_size=float("nan")), r"batch_size=nan: Input should be a finite number"),
    (dict(gpu_memory_bytes=float("inf")), r"gpu_memory_bytes=inf: .*finite"),
    (dict(batch_size=0), r"batch_size=0: Input should be greater than or equal to 1"),
])
def test_api_arguments_are_checked_with_one_line_naming_the_parameter(options, message):
    with pytest.raises(InputError, match=message):
        memcalc.estimate("mlp", (16,), **options)


def test_plan_cluster_arguments_are_named_too():
    with pytest.raises(InputError, match=r"gpus_per_node=0"):
        memcalc.plan("mlp", (16,), gpu="T4", gpus=0)


def test_plan_announces_every_variant_it_estimates_once():
    from memcalc.api import plan_spec
    from memcalc.specs import Precision, TrainingSpec
    from memcalc.strategies import ClusterSpec

    announced = []
    spec = TrainingSpec(model="tests.fixtures.hostile:tiny", sample_shape=(8,), batch_size=2,
                        optimizer="sgd", gpu="T4", machine={"cpus": 2, "ram_bytes": 8 << 30})
    plan = plan_spec(spec, ClusterSpec(), announced.append)
    assert any(variant.precision is not Precision.FP32 for variant in announced)
    traced = [c for c in plan.candidates if c.method == "traced"]
    assert len(traced) > 1
    # one per traced variant (the job fits the GPU given: no rank of 2 GPUs is traced)
    assert len(announced) == len(traced)
    assert len({variant.model_dump_json() for variant in announced}) == len(announced)
