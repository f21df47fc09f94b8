"""Pipeline stages: the split at the repeated blocks, its refusals, and the schedules."""

import pytest
import torch
from torch import nn

from memcalc.distributed.pipeline_split import pipeline_stages, split_points
from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import InputError
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace.checkpointing import repeated_blocks
from tests.fixtures.distributed_truth import MODELS, SEQUENCE, TINY_LLAMA

DEEP_LLAMA = {**TINY_LLAMA, "depth": 4}


def test_blocks_are_shared_out_evenly_earlier_stages_taking_the_rest():
    assert [len(r) for r in split_points(10, 4)] == [3, 3, 2, 2]
    assert [list(r) for r in split_points(4, 2)] == [[0, 1], [2, 3]]


def _llama() -> nn.Module:
    from models_zoo.llama import llama_7b
    return llama_7b(**DEEP_LLAMA)


def test_stages_share_the_models_parameters_without_copies():
    model = _llama()
    stages = pipeline_stages(model, repeated_blocks(model), 2)
    owned = [{id(p) for p in stage.parameters()} for stage in stages]
    assert not owned[0] & owned[1]
    assert owned[0] | owned[1] == {id(p) for p in model.parameters()}
    assert isinstance(stages[1].token_embedding, nn.Identity)  # a Passthrough
    assert isinstance(stages[0].lm_head, nn.Identity) and stages[1].lm_head is model.lm_head
    assert len(model.blocks) == 4          # the model itself is left whole


def test_the_stages_chain_to_the_models_output():
    model = _llama()
    tokens = torch.randint(0, 100, (2, SEQUENCE))
    hidden = tokens
    for stage in pipeline_stages(model, repeated_blocks(model), 4):
        hidden = stage(hidden)
    torch.testing.assert_close(hidden, model(tokens))


def test_a_model_without_a_block_container_is_refused_by_name():
    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))

    model = Loose()
    with pytest.raises(InputError, match="children of one"):
        pipeline_stages(model, ["a", "b"], 2)


def _pipeline_report(model, args, **parallel):
    return estimate(TrainingSpec(model=model, model_args=args, sample_shape=(SEQUENCE,),
                                 device="cpu", batch_size=4, input_dtype="int64",
                                 parallel=ParallelSpec(gpus_per_node=2, **parallel)))


def test_weights_tied_across_stages_are_refused():
    """The zoo's GPT-2 ties its head to its embedding: they would sit in two stages."""
    with pytest.raises(InputError, match="tied between pipeline stages 0 and 1"):
        _pipeline_report("gpt2", MODELS["gpt2"], strategy="pipeline")


def test_a_forward_that_does_more_than_chain_its_modules_is_refused():
    """Untied, the zoo's GPT-2 still adds position embeddings in its forward (the position
    table is given positions, not the stage's input): its stages cannot chain."""
    with pytest.raises(InputError, match="does not split into pipeline stages.*stage 1"):
        _pipeline_report("tests.fixtures.user_builders:untied_gpt2", MODELS["gpt2"],
                         strategy="pipeline")


def test_more_stages_than_blocks_is_an_input_error():
    with pytest.raises(InputError, match="at least 8 repeated blocks"):
        estimate(TrainingSpec(model="llama_7b", model_args=DEEP_LLAMA, sample_shape=(SEQUENCE,),
                              device="cpu", batch_size=8,
                              parallel=ParallelSpec(strategy="pipeline", gpus_per_node=8)))


def test_1f1b_with_fewer_microbatches_than_stages_is_an_input_error():
    with pytest.raises(InputError, match="at least 2 microbatches"):
        estimate(TrainingSpec(model="llama_7b", model_args=DEEP_LLAMA, sample_shape=(SEQUENCE,),
                              device="cpu", batch_size=1,
                              parallel=ParallelSpec(strategy="pipeline", gpus_per_node=2)))


def test_gpipe_holds_every_microbatch_and_1f1b_at_most_one_per_stage():
    """GPipe keeps all microbatches' activations until backward, 1F1B at most as many as
    stages: with 8 microbatches GPipe's rank holds more."""
    gpipe = _pipeline_report("llama_7b", DEEP_LLAMA, strategy="pipeline", pp_schedule="gpipe")
    one = _pipeline_report("llama_7b", DEEP_LLAMA, strategy="pipeline", pp_schedule="1f1b")
    assert gpipe.device.method == one.device.method == "traced"
    assert gpipe.device.breakdown.activations > one.device.breakdown.activations


def test_each_rank_holds_its_stages_share_of_the_states():
    whole = estimate(TrainingSpec(model="llama_7b", model_args=DEEP_LLAMA,
                                  sample_shape=(SEQUENCE,), device="cpu", batch_size=4))
    for schedule in ("1f1b", "interleaved-1f1b"):
        rank = _pipeline_report("llama_7b", DEEP_LLAMA, strategy="pipeline",
                                pp_schedule=schedule)
        assert rank.device.method == "traced"
        assert rank.device.breakdown.parameters < 0.8 * whole.device.breakdown.parameters


def test_pipeline_within_fsdp_traces():
    report = estimate(TrainingSpec(
        model="llama_7b", model_args=DEEP_LLAMA, sample_shape=(SEQUENCE,), device="cpu",
        batch_size=4, parallel=ParallelSpec(strategy="fsdp", gpus_per_node=4, pp=2)))
    alone = _pipeline_report("llama_7b", DEEP_LLAMA, strategy="pipeline")
    assert report.device.method == "traced"
    assert report.device.breakdown.parameters < alone.device.breakdown.parameters


def test_the_command_line_traces_a_pipeline_and_refuses_a_bad_one_in_one_line():
    from click.testing import CliRunner

    from memcalc.cli.commands import main
    from tests.fixtures.cli import assert_exited_cleanly

    args = ["estimate", "--model", "llama_7b", "--shape", str(SEQUENCE), "--device", "cpu",
            "--batch-size", "4", *[f"--model-arg={k}={v}" for k, v in DEEP_LLAMA.items()]]
    result = CliRunner().invoke(main, [*args, "--strategy", "pipeline", "--gpus", "2",
                                       "--pp-schedule", "gpipe"])
    assert_exited_cleanly(result)
    assert result.exit_code == 0, result.output
    assert "per pipeline replica" in result.output and "largest stage" in result.output
    result = CliRunner().invoke(main, [*args, "--strategy", "pipeline", "--gpus", "4",
                                       "--pp", "2"])
    assert result.exit_code == 2
    assert result.output.startswith("Error:") and "--pp" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelines_batch_line_predicts_a_traced_batch_far_beyond_it(schedule):
    """A pipeline's batch plan traces 2 and 3 microbatches per stage and extends the line:
    each microbatch adds its receive buffers (and, under GPipe, its activations). The line
    holds at 5 times the upper traced batch, traced there."""
    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=2, pp_schedule=schedule)
    spec = TrainingSpec(model="llama_7b", model_args=DEEP_LLAMA, sample_shape=(SEQUENCE,),
                        device="cuda", gpu_memory_bytes=64 * 2**30, parallel=parallel)
    plan = estimate(spec).device.plan
    low, high = parallel.line_batches
    assert plan.fit_batches == (low, high) and not plan.confirmed
    far = 5 * high
    traced = estimate(spec.with_changes(batch_size=far, gpu_memory_bytes=None)).device
    low_point, high_point = plan.points
    slope = (high_point.allocated_bytes - low_point.allocated_bytes) / (high - low)
    on_line = low_point.allocated_bytes + slope * (far - low)
    assert traced.peak_allocated_bytes == pytest.approx(on_line, rel=0.005)
    assert plan.max_batch_size > far and plan.max_batch_size % parallel.batch_step == 0


@pytest.mark.slow
def test_every_stage_has_its_own_line_and_the_largest_stage_changes_with_the_batch():
    """Under 1F1B a middle stage receives activations and gradients for every microbatch,
    the first and the last only one of them: the middle stages grow twice as fast and
    overtake the first. Each stage's line through the two traced batches predicts its
    traced peak at 10 times the upper one within 0.5 %, and the plan answers by the stage
    that reaches the budget first."""
    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=4, pp_schedule="1f1b")
    spec = TrainingSpec(model="llama_7b", model_args=DEEP_LLAMA, sample_shape=(SEQUENCE,),
                        device="cpu", parallel=parallel)
    low, high = parallel.line_batches
    at = {batch: estimate(spec.with_changes(batch_size=batch)).device.stage_peak_bytes
          for batch in (low, high, 10 * high)}
    predicted = [a + (b - a) / (high - low) * (10 * high - low)
                 for a, b in zip(at[low], at[high])]
    assert at[10 * high] == pytest.approx(predicted, rel=0.005)
    # stages 0, 1 and 3 traced (stage 2 is made like stage 1, with one microbatch fewer)
    largest = [max(range(len(peaks)), key=peaks.__getitem__) for peaks in at.values()]
    assert largest[0] == largest[1] == 0 and largest[2] == 1


def _every_stage_traced(parallel: ParallelSpec, args: dict, checkpointing: str | None):
    """Which stages ``traced_ranks`` keeps, and for each traced batch every stage's peak
    traced for real beside the rank's reported peak."""
    from dataclasses import replace

    from memcalc.distributed.parallelize import stage_rank
    from memcalc.pipeline import _prepare
    from memcalc.trace.rank import traced_ranks
    from memcalc.trace.tracer import _traced, _traced_rank

    spec = TrainingSpec(model="llama_7b", model_args=args, sample_shape=(SEQUENCE,),
                        device="cpu", input_dtype="int64", parallel=parallel,
                        activation_checkpointing=checkpointing)
    setup = _prepare(spec, None).setup
    ranks = traced_ranks(parallel, setup.build_meta_model, setup.checkpoint_blocks)
    kept = [stage for stage in range(parallel.pp) if stage_rank(parallel, stage) in ranks]
    peaks = {}
    for batch in parallel.line_batches:
        at = replace(setup, batch_shape=(batch, SEQUENCE))
        peaks[batch] = ([_traced_rank(at, False, stage_rank(parallel, stage)).ledger.peak_bytes
                         for stage in range(parallel.pp)], _traced(at, False).ledger.peak_bytes)
    return kept, peaks


@pytest.mark.parametrize("schedule", ["gpipe", pytest.param("1f1b", marks=pytest.mark.slow)])
def test_a_middle_stage_like_the_one_before_is_not_traced_and_holds_no_more(schedule):
    """Four stages of one block each: stage 2 is made like stage 1, holds as many (GPipe) or
    one fewer (1F1B) microbatches in flight, so only stages 0, 1 and 3 are traced. Every
    stage traced for real: stage 2's peak is at most stage 1's, at two batches, and the
    rank's figure is the largest of all four."""
    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=4, pp_schedule=schedule)
    kept, peaks = _every_stage_traced(parallel, DEEP_LLAMA, None)
    assert kept == [0, 1, 3]
    for every, reported in peaks.values():
        assert every[2] <= every[1] and reported == max(every)


@pytest.mark.slow
def test_a_middle_stage_like_an_earlier_one_is_not_traced_and_holds_no_more():
    """Eight stages, every third block checkpointed (blocks 2 and 5): stages 3, 4 and 6 are
    made like stage 1 (no block checkpointed), stage 5 like stage 2 (its block
    checkpointed); each holds no more than that earlier stage, traced for real."""
    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=8, pp_schedule="1f1b")
    kept, peaks = _every_stage_traced(parallel, {**TINY_LLAMA, "depth": 8}, "every:3")
    assert kept == [0, 1, 2, 7]
    for every, reported in peaks.values():
        assert max(every[3], every[4], every[6]) <= every[1] and every[5] <= every[2]
        assert reported == max(every)


def test_stages_whose_blocks_are_checkpointed_differently_are_all_traced():
    from memcalc.distributed.parallelize import stage_rank
    from memcalc.trace.rank import traced_ranks

    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=4)
    every = [stage_rank(parallel, stage) for stage in range(4)]
    assert traced_ranks(parallel, _llama, ("blocks.1",)) == every  # stage 1's, not stage 2's
    assert traced_ranks(parallel, _llama, ("blocks.1", "blocks.2")) != every
    assert traced_ranks(parallel, _llama, plain=False) == every
    interleaved = ParallelSpec(strategy="pipeline", gpus_per_node=4,
                               pp_schedule="interleaved-1f1b")
    assert len(traced_ranks(interleaved, _llama)) == 4
