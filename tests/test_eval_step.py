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
    with pytest.raises(InputError, match="plans the training step"):
        memcalc.plan("gpt2", (128,), gpu="T4", model_args=TINY_GPT2, phase="eval")


def test_a_jobs_validation_step_holds_the_optimizers_state_as_a_real_job_does():
    import torch

    from memcalc.specs import GradMode, LossKind
    from memcalc.trace.optimizers import optimizer_rule
    from memcalc.trace.step import StepBody, TrainingIteration
    from tests.fixtures.cpu_truth import TrainingStep, measure_cpu_peak_bytes
    from memcalc.model.source import resolve_model

    spec = TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(16,), batch_size=2,
                        device="cpu", optimizer="adam", eval_sample_shape=(128,),
                        eval_batch_size=16)
    report = estimate(spec)
    torch.manual_seed(0)
    model = resolve_model("gpt2", TINY_GPT2).factory(**TINY_GPT2)
    train = TrainingStep(model, torch.randint(0, 100, (2, 16)), LossKind.CROSS_ENTROPY,
                         optimizer_rule("adam"), classes_last=True)

    def job():                                      # two training steps, then validation
        train(), train()
        TrainingIteration(StepBody(LossKind.CROSS_ENTROPY, True, evaluation=GradMode.NO_GRAD),
                          model, torch.randint(0, 100, (16, 128)))()
    real = measure_cpu_peak_bytes(job, iterations=1)
    validation = report.validation
    assert validation is not None and validation.batch_size == 16
    assert validation.breakdown.optimizer_state == (report.static.optimizer_state_bytes
                                                    + report.static.optimizer_step_counter_bytes)
    assert report.device.peak_bytes < validation.peak_bytes    # validation sets the peak
    assert validation.peak_bytes == pytest.approx(real, rel=0.01)


def test_check_fails_a_job_whose_validation_does_not_fit_though_training_does():
    args = dict(model_args=TINY_GPT2, gpu_memory_bytes=4 << 30, eval_sample_shape=(128,))
    assert memcalc.check("gpt2", (16,), batch_size=2, eval_batch_size=1, **args).validation.fits
    with pytest.raises(MemoryBudgetError, match="validation batch 4096 needs") as caught:
        memcalc.check("gpt2", (16,), batch_size=2, eval_batch_size=4096, **args)
    assert caught.value.report.device.fits and not caught.value.report.validation.fits
    with pytest.raises(ValueError, match="with --phase eval the evaluated sample is --shape"):
        TrainingSpec(model="gpt2", phase="eval", eval_sample_shape=(128,))


def test_check_never_passes_a_job_whose_validation_step_could_only_be_counted_statically():
    from memcalc.errors import UntracedEstimateError

    args = dict(batch_size=2, gpu_memory_bytes=4 << 30, eval_sample_shape=(16,))
    with pytest.raises(UntracedEstimateError, match="the validation step could not be traced"):
        memcalc.check("tests.fixtures.user_builders:numpy_in_eval", (16,), **args)
    report = memcalc.estimate("tests.fixtures.user_builders:numpy_in_eval", (16,), **args)
    assert report.device.method == "traced" and report.validation.method == "static"


def test_check_on_the_command_line_exits_1_when_only_validation_does_not_fit():
    from click.testing import CliRunner

    from memcalc.cli.commands import main

    args = ["check", "--model", "gpt2", "--shape", "16", "--batch-size", "2",
            "--gpu-memory", "4GiB", "--eval-shape", "128", "--cpus", "2", "--ram", "16GiB"]
    for name, value in TINY_GPT2.items():
        args += ["--model-arg", f"{name}={value}"]
    fits = CliRunner().invoke(main, [*args, "--eval-batch-size", "1"])
    assert fits.exit_code == 0, fits.output
    over = CliRunner().invoke(main, [*args, "--eval-batch-size", "4096"])
    assert over.exit_code == 1
    assert "validation batch 4096 needs" in over.output + over.stderr
