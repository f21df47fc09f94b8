"""The evaluation step (``phase="eval"``): ``model.eval()``, forward and loss under no_grad,
inference_mode or neither, then dropped; no gradients, no optimizer state. Checked against a
real CPU evaluation step measured by the profiler's memory timeline, and against the training
step it must stay below."""

import pytest

import memcalc
from memcalc.errors import InputError, MemoryBudgetError
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from tests.fixtures.cases import TINY_BERT, TINY_GPT2, TINY_LLAMA, TINY_MLP
from tests.fixtures.cpu_truth import measure_spec_cpu_peak

EVAL_CASES = {
    "mlp": dict(model="mlp", model_args=TINY_MLP, sample_shape=(256,), batch_size=64),
    "gpt2": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,), batch_size=4),
    "llama": dict(model="llama_7b", model_args=TINY_LLAMA, sample_shape=(64,), batch_size=4),
    "bert-dropout": dict(model="bert_large", model_args=TINY_BERT, sample_shape=(64,),
                         batch_size=4),
    "gpt2-bf16-mixed": dict(model="gpt2", model_args=TINY_GPT2, sample_shape=(64,),
                            batch_size=4, precision="bf16-mixed"),
}
GRAD_MODES = ("no_grad", "inference_mode", "enabled")


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_an_evaluation_step_within_1_percent_of_a_real_one(case, mode):
    spec = TrainingSpec(device="cpu", phase="eval", eval_grad_mode=mode, **EVAL_CASES[case])
    report = estimate(spec)
    truth = measure_spec_cpu_peak(spec, report.input.traced_batch_shape)
    assert report.device.method == "traced"
    assert report.device.peak_bytes == pytest.approx(truth, rel=0.01)


def test_an_evaluation_step_holds_no_gradients_or_optimizer_state_and_less_than_training():
    spec = TrainingSpec(device="cpu", **EVAL_CASES["gpt2"])
    training = estimate(spec)
    kept = {mode: estimate(spec.with_changes(phase="eval", eval_grad_mode=mode))
            for mode in GRAD_MODES}
    for report in kept.values():
        assert report.device.breakdown.gradients == report.device.breakdown.optimizer_state == 0
        assert report.static.gradient_bytes == report.static.optimizer_state_bytes == 0
        assert report.device.breakdown.parameters == training.device.breakdown.parameters
    # no_grad and inference_mode keep nothing for backward; without either the graph lives
    assert kept["no_grad"].device.peak_bytes == kept["inference_mode"].device.peak_bytes
    assert (kept["no_grad"].device.peak_bytes < kept["enabled"].device.peak_bytes
            < training.device.peak_bytes)


def test_training_options_are_refused_for_an_evaluation_step():
    with pytest.raises(ValueError, match="--checkpointing applies to training"):
        TrainingSpec(model="mlp", phase="eval", activation_checkpointing="full")
    with pytest.raises(ValueError, match="--strategy, --clip-grad-norm apply to training"):
        TrainingSpec(model="mlp", phase="eval", parallel={"strategy": "ddp", "gpus_per_node": 2},
                     clip_grad_norm=1.0)


def test_check_fails_an_evaluation_batch_that_does_not_fit_and_plan_refuses_one():
    args = dict(model_args=TINY_GPT2, gpu_memory_bytes=4 << 30, phase="eval")
    with pytest.raises(MemoryBudgetError, match="does not fit: batch 4096") as caught:
        memcalc.check("gpt2", (128,), batch_size=4096, **args)
    assert caught.value.plan is None                  # the planner plans training jobs
    assert memcalc.check("gpt2", (128,), batch_size=1, **args).device.fits
    with pytest.raises(InputError, match="plans training jobs"):
        memcalc.plan("gpt2", (128,), gpu="T4", model_args=TINY_GPT2, phase="eval")
