"""Models under ``torch.compile`` (``memcalc.trace.compiled``): recognised however they were
compiled (whole, block by block, ``Module.compile()``) or asked for with ``--compile``, traced
through AOTAutograd's partition as Inductor runs them, checked against real compiled CPU
steps (Inductor's C++ backend, profiler memory timeline); a graph break runs eagerly and is
said; the caller's compiled model is left as it was."""

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import memcalc
from memcalc.cli.commands import main
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace._torch_internals import compiled_module_names
from tests.fixtures.cases import TINY_BERT, TINY_GPT2, TINY_LLAMA, TINY_MLP, TINY_VIT

FIXTURES = "tests.fixtures.compiled_models"
COMPILE_CASES = {
    "linear-norm-gelu MLP": dict(model=f"{FIXTURES}:mlp_norm_gelu", sample_shape=(512,),
                                 batch_size=2048, loss="mse"),
    "residual MLP blocks": dict(model=f"{FIXTURES}:residual_mlp_blocks", sample_shape=(128, 256),
                                batch_size=32, loss="mse"),
    "conv-bn-relu 2D": dict(model=f"{FIXTURES}:conv_bn_relu", sample_shape=(3, 32, 32),
                            batch_size=32, loss="mse"),
    "resnet3d-10": dict(model="resnet3d", model_args={"depth": 10, "in_channels": 1,
                                                      "num_classes": 4},
                        sample_shape=(1, 32, 32, 32), batch_size=2),
    "gpt2 (tiny)": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,), batch_size=4),
    "mlp (zoo, tiny)": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,), batch_size=32),
    "resnet50 2D": dict(model="resnet50", model_args={"num_classes": 10}, sample_shape=(3, 32, 32),
                        batch_size=2),
    "unet3d (base 8)": dict(model="unet3d", model_args={"base_channels": 8},
                            sample_shape=(1, 32, 32, 32), batch_size=1),
    "vit (tiny)": dict(model="vit_b16", model_args=TINY_VIT, sample_shape=(3, 64, 64),
                       batch_size=4),
    "bert (tiny, dropout)": dict(model="bert_large", model_args=TINY_BERT, sample_shape=(64,),
                                 batch_size=4),
    "llama (tiny)": dict(model="llama_7b", model_args=TINY_LLAMA, sample_shape=(64,),
                         batch_size=2),
}
TRUTHS = ("linear-norm-gelu MLP", "conv-bn-relu 2D", "llama (tiny)")
"""Cases where compiling changes the step by more than 2 %: its change is checked too."""


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 10))


def _estimate(model, **options):
    return memcalc.estimate(model, (64,), batch_size=2048, device="cpu", loss="mse", **options)


def _said(report) -> list[str]:
    return [line for line in report.assumptions if "torch.compile" in line or "compiled" in line]


@pytest.mark.slow
@pytest.mark.parametrize("case", TRUTHS)
def test_a_compiled_step_within_3_percent_of_a_real_one_and_its_saving_within_10(case):
    from tests.fixtures.compiled_models import measure_real_step

    spec = TrainingSpec(device="cpu", **COMPILE_CASES[case])
    eager, compiled = estimate(spec), estimate(spec.with_changes(compile=True))
    shape = eager.input.traced_batch_shape
    real_eager = measure_real_step(spec, shape, compiled=False)
    real_compiled = measure_real_step(spec, shape, compiled=True)
    assert compiled.device.method == "traced" and not compiled.device.compile_fallbacks
    assert compiled.device.peak_bytes == pytest.approx(real_compiled, rel=0.03)
    saving = real_eager - real_compiled
    assert saving > 0.02 * real_eager          # the case is one where compiling matters
    assert eager.device.peak_bytes - compiled.device.peak_bytes == pytest.approx(saving, rel=0.1)


@pytest.mark.slow
def test_a_compiled_3d_unet_within_3_percent_of_a_real_one():
    from tests.fixtures.compiled_models import measure_real_step

    spec = TrainingSpec(device="cpu", compile=True, **COMPILE_CASES["unet3d (base 8)"])
    report = estimate(spec)
    real = measure_real_step(spec, report.input.traced_batch_shape, compiled=True)
    assert report.device.method == "traced" and not report.device.compile_fallbacks
    assert report.device.peak_bytes == pytest.approx(real, rel=0.03)


def test_compile_saves_what_the_partitioner_recomputes():
    # LayerNorm and GELU are recomputed in backward: their inputs are not all saved
    eager, compiled = _estimate(_net), _estimate(_net, compile=True)
    assert compiled.device.breakdown.activations < eager.device.breakdown.activations
    assert compiled.device.peak_bytes < eager.device.peak_bytes
    assert compiled.model.compiled_modules == [""] and eager.model.compiled_modules == []
    assert _said(compiled)[0].startswith("torch.compile: the model traced as Inductor")


def test_a_model_passed_compiled_is_traced_compiled_and_named_after_its_module():
    report = _estimate(torch.compile(_net()))
    assert report.device.peak_bytes == _estimate(_net, compile=True).device.peak_bytes
    assert report.model.name == "Sequential (instance)"
    assert report.model.compiled_modules == [""]


def test_blocks_compiled_one_by_one_are_traced_compiled_each():
    model = _net()
    for index in (1, 2):
        model[index] = torch.compile(model[index])
    report = _estimate(model)
    assert report.model.compiled_modules == ["1", "2"]
    assert "2 modules (1, 2)" in _said(report)[0]
    assert report.device.peak_bytes <= _estimate(_net).device.peak_bytes


def test_a_module_compiled_in_place_is_recognised_and_stays_compiled():
    model = _net()
    model.compile()
    assert _estimate(model).model.compiled_modules == [""]
    assert compiled_module_names(model) == [""]     # the caller's module: still compiled


def test_the_callers_compiled_model_keeps_its_wrapper_and_its_weights():
    compiled = torch.compile(_net())
    before = {name: tensor.clone() for name, tensor in compiled.state_dict().items()}
    _estimate(compiled)
    assert type(compiled).__name__ == "OptimizedModule"
    assert all(torch.equal(before[name], tensor)
               for name, tensor in compiled.state_dict().items())


def test_a_graph_break_runs_eagerly_and_is_said_on_the_default_screen():
    gated = f"{FIXTURES}:data_dependent_branch"
    report = _estimate(gated, compile=True)
    assert report.device.method == "traced"
    (fallback,) = report.device.compile_fallbacks
    assert fallback.startswith("(model) not captured whole (")
    assert fallback.endswith("its 1 submodules compiled each on its own, the rest traced eager")
    assert any(line.startswith("WARNING: torch.compile: (model)") for line in report.assumptions)
    assert report.device.peak_bytes == _estimate(gated).device.peak_bytes


def test_compile_is_refused_with_what_it_is_not_traced_with_yet():
    result = CliRunner().invoke(main, ["estimate", "--model", "mlp", "--shape", "1024",
                                       "--compile", "--checkpointing"])
    assert result.exit_code == 2
    assert "--compile with --checkpointing is not traced together yet" in result.stderr


def test_attention_heads_laid_out_by_a_transpose_trace_compiled():
    # an in-place write into a transposed buffer would give later views its strides
    report = estimate(TrainingSpec(device="cpu", compile=True,
                                   **COMPILE_CASES["bert (tiny, dropout)"]))
    assert report.device.method == "traced" and report.device.compile_fallbacks == []


def test_a_compiled_step_that_cannot_be_traced_is_traced_eager_and_says_why(monkeypatch):
    from memcalc.trace import compiled_graph

    def refuse(self, node):
        raise RuntimeError("an op memcalc cannot run compiled")
    monkeypatch.setattr(compiled_graph._FusingInterpreter, "run_node", refuse)
    report = _estimate(_net, compile=True)
    assert report.device.method == "traced"
    (fallback,) = report.device.compile_fallbacks
    assert fallback.startswith("(step): ") and "an op memcalc cannot run compiled" in fallback
    assert report.device.peak_bytes == _estimate(_net).device.peak_bytes
    assert any(line.startswith("WARNING: torch.compile: (step)") for line in report.assumptions)


def test_an_in_place_write_takes_the_out_overload_of_the_same_argument_types():
    from memcalc.trace._torch_internals import out_variant

    aten = torch.ops.aten
    assert out_variant(aten.pow.Tensor_Scalar) == (aten.pow.Tensor_Scalar_out, "out")
    assert out_variant(aten.fmod.Scalar) == (aten.fmod.Scalar_out, "out")
    assert out_variant(aten.gelu_backward.default) == (aten.gelu_backward.grad_input,
                                                      "grad_input")
