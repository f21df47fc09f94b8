"""Models compiled with ``torch.compile`` (``memcalc.trace.compiled``): recognised however
they were compiled, traced as their eager twin with a warning on the default screen, and the
caller's compiled model left as it was."""

import pytest
import torch
from torch import nn

import memcalc
from memcalc.trace._torch_internals import compiled_module_names


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def _estimate(model):
    return memcalc.estimate(model, (64,), batch_size=32, device="cpu")


def _warning(report) -> list[str]:
    return [line for line in report.assumptions if "torch.compile" in line]


def test_a_compiled_model_is_traced_as_its_eager_self_and_says_so():
    eager = _estimate(_net())
    compiled = torch.compile(_net())
    report = _estimate(compiled)
    assert report.device.method == "traced"
    assert report.device.peak_bytes == eager.device.peak_bytes
    assert report.model.name == "Sequential (instance)"
    (warning,) = _warning(report)
    assert warning.startswith("WARNING: the model compiled") and not _warning(eager)


def test_blocks_compiled_one_by_one_are_named():
    model = _net()
    for index in (0, 2):
        model[index] = torch.compile(model[index])
    (warning,) = _warning(_estimate(model))
    assert "2 modules (0, 2)" in warning


def test_a_module_compiled_in_place_is_recognised_and_stays_compiled():
    model = _net()
    model.compile()
    assert compiled_module_names(model) == [""]
    (warning,) = _warning(_estimate(model))
    assert "the model compiled" in warning
    assert compiled_module_names(model) == [""]     # the caller's module: still compiled


def test_the_callers_compiled_model_keeps_its_wrapper_and_its_weights():
    compiled = torch.compile(_net())
    before = {name: tensor.clone() for name, tensor in compiled.state_dict().items()}
    _estimate(compiled)
    assert type(compiled).__name__ == "OptimizedModule"
    assert all(torch.equal(before[name], tensor)
               for name, tensor in compiled.state_dict().items())
    assert all(p.device.type == "cpu" for p in compiled.parameters())


@pytest.mark.parametrize("wrap", [lambda m: m, lambda m: torch.compile(m)])
def test_nothing_compiled_is_left_in_the_traced_twin(wrap):
    from memcalc.trace.compiled import eager_model

    twin = eager_model(wrap(_net()).to("meta"))
    assert compiled_module_names(twin) == []
