"""The model is built once, on the CPU, with only its parameters and buffers on meta."""

import pytest
import torch

import memcalc
from memcalc.errors import ModelSourceError, UserCodeError
from memcalc.model.source import resolve_model
from tests.fixtures.user_builders import BUILD_CALLS

BUILDERS = "tests.fixtures.user_builders"


def _parameter_count(depth: int = 3) -> int:
    """Closed form for ScheduledNet: 3x3 convs 3→8→16→24, then Linear(24, 10)."""
    widths, channels, total = [8 * (i + 1) for i in range(depth)], 3, 0
    for width in widths:
        total += channels * width * 9 + width
        channels = width
    return total + channels * 10 + 10


@pytest.mark.parametrize("builder", ["scheduled_net", "calls_cuda", "moves_to_cuda"])
def test_constructor_tensor_math_and_cuda_calls_build_on_meta(builder):
    model = resolve_model(f"{BUILDERS}:{builder}").build_meta()
    states = [*model.parameters(), *model.buffers()]
    assert {tensor.device.type for tensor in states} == {"meta"}
    assert sum(p.numel() for p in model.parameters()) == _parameter_count()
    assert model.drop_rates == pytest.approx([0.0, 0.1, 0.2])


@pytest.mark.parametrize("builder", ["scheduled_net", "calls_cuda"])
def test_such_models_trace_and_the_factory_runs_once(builder):
    before = BUILD_CALLS["count"]
    report = memcalc.estimate(f"{BUILDERS}:{builder}", (3, 16, 16), batch_size=2)
    assert report.device.method == "traced"
    assert report.static.parameter_bytes == 4 * _parameter_count()
    assert BUILD_CALLS["count"] - before == 1


def test_a_large_constructor_temporary_is_not_allocated():
    model = resolve_model(f"{BUILDERS}:large_temporary").build_meta()
    assert model.linear.out_features == 4      # the shape was read
    assert model.temporary_device == "meta"    # the 1 GiB was never allocated


@pytest.mark.parametrize("builder, kind", [("raises_runtime_error", "RuntimeError"),
                                           ("raises_key_error", "KeyError"),
                                           ("exits", "sys.exit")])
def test_any_builder_failure_is_the_users_code_failing_at_its_line(builder, kind):
    with pytest.raises(UserCodeError, match=kind) as raised:
        resolve_model(f"{BUILDERS}:{builder}").build_meta()
    assert "user_builders.py:" in str(raised.value)


def test_a_builder_refusing_its_arguments_is_bad_input():
    with pytest.raises(ModelSourceError, match="rejected its arguments"):
        resolve_model("resnet3d", {"depth": 7}).build_meta()


def test_an_instance_keeps_its_weights():
    model = torch.nn.Linear(4, 4)
    weights = model.weight.detach().clone()
    memcalc.estimate(model, (4,), batch_size=2)
    assert model.weight.device.type == "cpu" and torch.equal(model.weight, weights)


def test_a_forward_that_calls_sys_exit_is_a_static_estimate_with_the_reason():
    report = memcalc.estimate(f"{BUILDERS}:exits_in_forward", (8,), batch_size=2, device="cpu")
    assert report.device.method == "static"
    assert any("sys.exit(0)" in line for line in report.unsupported)


def test_overlapping_builds_leave_nn_module_as_it_was_and_other_threads_alone():
    """Two threads building through memcalc at once, and the main thread building its own
    model meanwhile: its weights are real, and nn.Module's methods are torch's afterwards
    (overlapping builds restored each other's hooks and left them installed)."""
    import threading

    from torch import nn

    from memcalc.model.build import build_with_meta_states

    originals = (nn.Module.register_parameter, nn.Module.register_buffer, nn.Module.to,
                 nn.Module.cuda)
    inside, release = threading.Barrier(3), threading.Event()
    built = []

    def slow_factory():
        layer = nn.Linear(8, 8)
        inside.wait(timeout=30)
        release.wait(timeout=30)
        return layer

    threads = [threading.Thread(target=lambda: built.append(build_with_meta_states(
        slow_factory, {}))) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=30)                  # both builds are inside the hooks now
    mine = nn.Linear(8, 8)
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert mine.weight.device.type == "cpu"
    assert [layer.weight.device.type for layer in built] == ["meta", "meta"]
    assert (nn.Module.register_parameter, nn.Module.register_buffer, nn.Module.to,
            nn.Module.cuda) == originals


def test_a_constructor_that_runs_its_layers_is_built_for_real_and_said_so():
    """YOLO-style: the constructor runs a forward on zeros to find its strides, which fails
    with meta weights; it is built for real (small), copied to meta, and the report says so."""
    from memcalc.model.build import built_for_real
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    model = resolve_model("tests.fixtures.user_builders:StrideProbed", {}).build_meta()
    assert built_for_real(model)
    assert all(p.device.type == "meta" for p in model.parameters())
    report = estimate(TrainingSpec(model="tests.fixtures.user_builders:StrideProbed",
                                   sample_shape=(3, 64, 64), device="cpu", batch_size=2))
    assert report.device.method == "traced"
    assert any("built for real on the CPU" in line for line in report.assumptions)


def test_a_real_build_is_stopped_at_its_limit_before_it_fills_the_host():
    import resource

    from memcalc.errors import ModelSourceError

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelSourceError, match="too many to build for real"):
        resolve_model("tests.fixtures.user_builders:huge_stride_probed", {}).build_meta()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 1 << 20          # its 1.6 GB of parameters were never filled
