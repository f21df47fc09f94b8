"""The planner's distributed rows traced as one rank of the job (``memcalc.strategies.rank_candidates``):
which rows are traced, and that a traced row says what the rank's own estimate says."""

import pytest

from memcalc.api import plan_spec
from memcalc.device.batch_search import RELATIVE_RESOLUTION
from memcalc.distributed.specs import DataParallel, ParallelSpec
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec, Strategy
from memcalc.strategies.rank_candidates import (CPU_OFFLOADED, FAR_OFF, RANK_METHOD, WRAPPERS,
                                                Screened, closed_forms_found_off)
from memcalc.strategies.specs import DEFAULT_RANK_TRACES

MACHINE = {"cpus": 16, "ram_bytes": 256 << 30}
JOB = TrainingSpec(model="mlp", model_args=dict(in_features=1024, hidden=4096, depth=4),
                   sample_shape=(1024,), gpu="T4", machine=MACHINE, batch_size=64)
"""A parameter-heavy MLP (50 M parameters: its states decide between the layouts)."""


@pytest.fixture(scope="module")
def plan():
    return plan_spec(JOB, ClusterSpec(gpus_per_node=4))


def _ranks(plan):
    return [c for c in plan.candidates if c.method.startswith(RANK_METHOD)]


def test_the_recommendation_and_each_wrappers_best_row_are_traced_ranks(plan):
    chosen = next(c for c in plan.candidates if c.label == plan.recommended)
    assert chosen.method == "traced" or chosen.method.startswith(RANK_METHOD)
    traced = {c.strategy for c in _ranks(plan)}
    # the MLP has no repeated blocks to split into stages: its pipeline row says why
    assert traced == set(WRAPPERS) - {Strategy.PIPELINE} - set(CPU_OFFLOADED)
    assert any(note.startswith("pipeline + mixed-precision on 4 GPUs not traced as a rank")
               and note.endswith("its row is the closed form") for note in plan.assumptions)
    assert 0 < len(_ranks(plan)) <= DEFAULT_RANK_TRACES
    # what was not traced stays a closed form and says it
    assert all(c.method.startswith(("traced", "derived")) for c in plan.candidates)


def test_a_traced_rows_batch_is_the_largest_that_its_rank_runs(plan):
    fsdp = next(c for c in _ranks(plan) if c.strategy is Strategy.FSDP)
    # a mixed-precision FSDP rank runs FSDP2's policy, as torchtitan's jobs do (no autocast)
    mixed = fsdp.label.partition(" + ")[2] == "mixed-precision"
    policy = {"param_dtype": "float16", "reduce_dtype": "float32"} if mixed else {}
    assert any("param float16, reduce float32" in note for note in fsdp.notes) == mixed
    rank = JOB.with_changes(parallel=ParallelSpec(strategy=DataParallel.FSDP, gpus_per_node=4,
                                                  **policy))
    # each replayed at the card's capacity, as the plan decides; a batch this large is known
    # to a hundredth of itself (``memcalc.device.batch_search.RELATIVE_RESOLUTION``)
    above = fsdp.max_batch_size + 1 + fsdp.max_batch_size // RELATIVE_RESOLUTION
    assert estimate(rank.with_changes(batch_size=fsdp.max_batch_size)).device.fits
    assert estimate(rank.with_changes(batch_size=above)).device.fits is False


def test_every_row_gives_its_peak_at_the_jobs_batch(plan):
    assert plan.job_batch_size == JOB.batch_size
    assert all(c.job_batch_peak_bytes for c in plan.candidates)
    # the single-GPU row's figure (on its traced line) agrees with a trace at that batch
    baseline = next(c for c in plan.candidates if c.label == "baseline")
    traced = estimate(JOB).device.total_bytes
    assert baseline.job_batch_peak_bytes == pytest.approx(traced, rel=0.02)
    # sharding states over 4 GPUs holds less per GPU at the same batch than replicating them
    ranks = {c.strategy: c for c in _ranks(plan) if c.label.endswith("mixed-precision")}
    assert ranks[Strategy.FSDP].job_batch_peak_bytes < ranks[Strategy.DDP].job_batch_peak_bytes


def test_a_static_base_has_no_traced_rank():
    spec = TrainingSpec(model="tests.fixtures.models:untraceable", sample_shape=(8,),
                        gpu="T4", machine=MACHINE)
    plan = plan_spec(spec, ClusterSpec(gpus_per_node=2, max_gpus=2))
    assert not _ranks(plan)
    assert all(c.method.startswith("STATIC") for c in plan.candidates if c.gpus > 1)


@pytest.mark.slow
def test_a_pipeline_row_is_traced_at_the_microbatch_that_fits():
    # 8 LLaMA blocks in 4 stages on a 1 GiB card (beside NCCL's buffers for the pipeline's
    # sends): the rank of the largest stage is traced
    from memcalc.device.cuda_overheads import NCCL_COMMUNICATOR_BYTES

    spec = TrainingSpec(model="llama_7b", sample_shape=(256,), gpu="T4", machine=MACHINE,
                        model_args=dict(dim=256, depth=8, heads=4, vocab=1000, hidden=1024),
                        gpu_memory_bytes=(1 << 30) + NCCL_COMMUNICATOR_BYTES, batch_size=4)
    # asked for: traced whether or not a traced row outpaces it
    plan = plan_spec(spec, ClusterSpec(gpus_per_node=4, strategy=Strategy.PIPELINE))
    pipeline = next(c for c in _ranks(plan) if c.strategy is Strategy.PIPELINE)
    micro = pipeline.max_batch_size
    assert micro >= 1 and pipeline.per_gpu_peak_bytes <= plan.usable_bytes
    steps = pipeline.accumulation_steps
    assert steps == 8                        # 1F1B: two microbatches per stage, the bubble small
    # the row's peak is that of the step it shows, estimated on its own on the same card:
    # its microbatches of ``micro`` (with one per stage, the first stages' forwards would
    # miss the gradients)
    base = pipeline.label.partition(" + ")[2]
    rank = spec.with_changes(precision="fp16-mixed" if "mixed" in base else "fp32",
                             activation_checkpointing="full" if "checkpointing" in base else None,
                             batch_size=steps * micro,
                             parallel=ParallelSpec(strategy="pipeline", gpus_per_node=4,
                                                   microbatch_size=micro))
    assert estimate(rank).device.total_bytes == pipeline.per_gpu_peak_bytes
    # at the job's batch (4 per GPU): the rank traced with as many microbatches of 4, whatever
    # the microbatch the row found
    at_job = rank.with_changes(batch_size=steps * 4, parallel=rank.parallel.model_copy(
        update={"microbatch_size": 4}))
    assert pipeline.job_batch_peak_bytes == estimate(at_job).device.total_bytes


def _row(label, micro, steps, method="derived from base"):
    from memcalc.strategies.report import Candidate

    return Candidate.model_construct(strategy=Strategy.PIPELINE, label=label,
                                     max_batch_size=micro, accumulation_steps=steps,
                                     fits=micro > 0, method=method)


def test_a_layout_whose_traced_rank_fits_far_fewer_samples_flags_its_derived_rows():
    closed = [_row("pipeline + ckpt", 37, 4), _row("pipeline", 21, 4)]
    screened = [Screened(c, None, None, None) for c in closed]
    traced = _row("pipeline + ckpt", 1, 4, f"{RANK_METHOD} (2 ranks)")
    [line] = closed_forms_found_off(screened, {id(screened[0]): traced,
                                               id(screened[1]): closed[1]})
    assert "traced as a rank, pipeline + ckpt fits 1×4 per GPU where it said 37×4" in line
    # off by less than FAR_OFF, or nothing left derived: no line
    near = _row("pipeline + ckpt", -(-37 // FAR_OFF), 4, f"{RANK_METHOD} (2 ranks)")
    assert not closed_forms_found_off(screened, {id(screened[0]): near,
                                                 id(screened[1]): closed[1]})
    assert not closed_forms_found_off(screened[:1], {id(screened[0]): traced})


def test_no_rank_is_traced_when_none_is_asked_for_and_the_plan_says_so():
    plan = plan_spec(JOB, ClusterSpec(gpus_per_node=4, rank_traces=0))
    assert not _ranks(plan)
    assert any("none traced as a rank (--rank-traces 0)" in a for a in plan.assumptions)


def test_the_plan_carries_a_train_script_for_its_recommendation(plan):
    import ast

    chosen = next(c for c in plan.candidates if c.label == plan.recommended)
    ast.parse(plan.train_script)
    assert f"the plan: {chosen.label} on {chosen.gpus} GPU(s)" in plan.train_script
    assert plan.torchrun in plan.train_script


@pytest.mark.slow
def test_a_layouts_closed_form_rows_are_never_shown_above_its_traced_ones():
    # llama_7b on 2 A100s (the planner guide's example): the pipeline's checkpointed row,
    # by its closed form 37 x 4 samples, ranked above the traced mixed-precision rank;
    # traced in its turn, a microbatch of 9 does not fit (79.4 GiB with 4 of them)
    spec = TrainingSpec(model="llama_7b", gpu="A100-80GB", machine={"cpus": 32,
                                                                     "ram_bytes": 512 << 30})
    plan = plan_spec(spec, ClusterSpec())
    shown = plan.candidates                                  # in the table's order
    for strategy in WRAPPERS:
        rows = [c for c in shown if c.strategy is strategy]
        traced = [c for c in rows if c.method.startswith(RANK_METHOD)]
        if traced and not any(c.fits for c in traced):      # the next row that fits, traced
            assert not any(c.fits for c in rows if c.gpus <= max(t.gpus for t in traced)), (
                strategy, [(c.label, c.method[:30], c.fits) for c in rows])
        if traced:
            first_traced = shown.index(traced[0])
            assert all(c.method.startswith(RANK_METHOD) or not c.fits
                       for c in rows if shown.index(c) < first_traced), strategy
    pipeline = [c for c in _ranks(plan) if c.strategy is Strategy.PIPELINE]
    checkpointed = next(c for c in pipeline if "checkpointing" in c.label)
    assert 1 <= checkpointed.max_batch_size < 9
    # the pipeline rows left derived are flagged: its closed form was found that far off
    assert any(a.startswith("pipeline's closed form was optimistic here") for a in
               plan.assumptions)


@pytest.mark.slow
def test_a_pipeline_no_trace_could_make_lead_is_left_to_its_closed_form():
    """8 LLaMA blocks on 4 T4s: data-parallel ranks fit, and the pipeline's bubble keeps it
    below them whatever microbatch its rank would fit, so it is not traced; asked for, it is
    traced, and its row stays under the ceiling the plan gave and below the leader."""
    import re

    spec = TrainingSpec(model="llama_7b", sample_shape=(256,), gpu="T4", machine=MACHINE,
                        model_args=dict(dim=256, depth=8, heads=4, vocab=1000, hidden=1024),
                        batch_size=4)
    plan = plan_spec(spec, ClusterSpec(gpus_per_node=4))
    assert not any(c.strategy is Strategy.PIPELINE for c in _ranks(plan))
    note = next(a for a in plan.assumptions if "with its schedule's bubble it reaches" in a)
    found = re.search(r"at most ([\d,.]+) samples/s, below the traced (.+) \(([\d,.]+) samples/s",
                      note)
    ceiling, leader_label = float(found[1].replace(",", "")), found[2]
    leader = next(c for c in plan.candidates if c.label == leader_label and c.gpus == 4)
    assert leader.fits and leader.method.startswith("traced") and leader.samples_per_s > ceiling
    forced = plan_spec(spec, ClusterSpec(gpus_per_node=4, strategy=Strategy.PIPELINE))
    traced = [c for c in _ranks(forced) if c.strategy is Strategy.PIPELINE]
    assert traced and all(c.samples_per_s <= ceiling + 0.05 for c in traced)   # shown to 0.1
