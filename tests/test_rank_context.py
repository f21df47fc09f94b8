"""Context parallelism in the plan (``memcalc.strategies.rank_context``): searched only where
no sample fits a GPU, on the GPUs given, each group size traced as ranks of the job."""

from types import SimpleNamespace

import pytest

from memcalc.api import plan_spec
from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import TraceError
from memcalc.pipeline import estimate
from memcalc.specs import Precision, TrainingSpec
from memcalc.strategies import ClusterSpec
from memcalc.strategies.candidates import PlanContext, rank_report
from memcalc.strategies.rank_candidates import RANK_METHOD
from memcalc.strategies.rank_context import NOT_SEARCHED, group_sizes

LONG = TrainingSpec(model="llama_7b", model_args=dict(dim=256, depth=4, heads=4, hidden=512),
                    sample_shape=(4096,), gpu="H100-80GB", gpu_memory_bytes=int(2.8 * 2**30),
                    batch_size=1, machine={"cpus": 16, "ram_bytes": 256 << 30})
"""A small LLaMA at 4,096 tokens on a card too small for one of its samples, whatever the
single-GPU lever or data-parallel layout: two GPUs sharing each sample hold it."""


@pytest.mark.parametrize("per_node, gpus, sequence, sizes", [
    (8, 8, 4096, [2, 4, 8]), (8, 16, 4096, [2, 4, 8]), (8, 8, 12, [2]), (4, 2, 4096, [2]),
    (8, 8, 6, []), (8, 8, None, [])])
def test_groups_divide_the_node_the_job_and_the_sequence_into_two_chunks_a_rank(
        per_node, gpus, sequence, sizes):
    assert group_sizes(per_node, gpus, sequence) == sizes
    assert all(per_node % cp == 0 and gpus % cp == 0 and sequence % (2 * cp) == 0
               for cp in sizes)


def test_a_rank_whose_trace_failed_is_no_rank_of_the_job():
    """A static count of one GPU is never passed off as a traced rank: it is an error the
    plan turns into a closed-form row with its reason."""
    static = SimpleNamespace(device=SimpleNamespace(method="static"),
                             trace_failure="the model failed in the traced step: "
                                           "RuntimeError: mixed Tensor and DTensor")
    context = PlanContext(ClusterSpec(gpus_per_node=2), None,
                          SimpleNamespace(report=lambda spec: static))
    with pytest.raises(TraceError, match="its trace failed: .*mixed Tensor and DTensor$"):
        rank_report(context, LONG)


@pytest.mark.slow
def test_where_no_sample_fits_a_gpu_the_plan_traces_context_parallel_ranks():
    plan = plan_spec(LONG, ClusterSpec(gpus_per_node=2))
    grouped = [c for c in plan.candidates if c.context_parallel > 1]
    assert not any(c.fits and c.gpus <= 2 for c in plan.candidates if c not in grouped)
    assert [c.context_parallel for c in grouped] == [2]
    row = grouped[0]
    assert row.method.startswith(RANK_METHOD) and "context parallel 2" in row.method
    assert "context-parallel×2" in row.label and row.gpus == 2
    assert any(line.startswith("context parallelism searched") for line in plan.assumptions)
    # the row says what the rank's own estimate says, at the job's batch (per group)
    rank = estimate(LONG.with_changes(
        precision=Precision.FP32, activation_checkpointing="full",
        parallel=ParallelSpec(strategy="fsdp", gpus_per_node=2, cp=2,
                              param_dtype="bfloat16", reduce_dtype="float32")))
    assert rank.device.method == "traced"
    assert row.job_batch_peak_bytes == rank.device.total_bytes
    assert row.fits and rank.device.plan.max_batch_size >= 1
    assert plan.recommended == row.label
    assert "NOT WRITTEN HERE: context parallelism" in plan.train_script
    # its ring is timed: keys and values of 4 layers in bf16, gathered in forward, again in
    # the checkpointed blocks' recomputation and in backward, and their gradients passed
    # round; a rank receives the half it does not hold
    key_value = 4 * 2 * 4096 * 256 * 2
    assert rank.device.ring_exchange_bytes == 4 * key_value // 2
    assert row.communication_s > 4 * key_value // 2 / 300e9


@pytest.mark.slow
def test_a_model_without_attention_is_not_split_and_the_plan_says_so():
    mlp = TrainingSpec(model="mlp", model_args=dict(in_features=1024, hidden=4096, depth=4),
                       sample_shape=(1024,), gpu="T4", gpu_memory_bytes=2**28, batch_size=1,
                       machine={"cpus": 16, "ram_bytes": 256 << 30})
    plan = plan_spec(mlp, ClusterSpec(gpus_per_node=2))
    assert not any(c.context_parallel > 1 for c in plan.candidates)
    assert any(line.startswith(f"{NOT_SEARCHED}: the model ran no scaled_dot_product")
               for line in plan.assumptions)


def test_a_plan_where_nothing_fits_says_context_parallelism_was_tried():
    from memcalc.strategies.plan_text import plan_reason
    from memcalc.strategies.report import Candidate

    def row(label, peak, group):
        return Candidate.model_construct(label=label, per_gpu_peak_bytes=peak, fits=False,
                                         context_parallel=group)

    ranked = [row("amp", 3 << 30, 1), row("fsdp + context-parallel×2 + amp", 2 << 30, 2),
              row("fsdp + context-parallel×4 + amp", 3 << 29, 4)]
    reason = plan_reason(None, ranked, ClusterSpec(gpus_per_node=4), 1 << 30, None)
    assert "context parallelism over up to 4 GPUs per sample did not fit either" in reason
    assert "needs 1.50 GiB per GPU at least (fsdp + context-parallel×4 + amp)" in reason
    plain = plan_reason(None, ranked[:1], ClusterSpec(gpus_per_node=4), 1 << 30, None)
    assert "context parallelism" not in plain
