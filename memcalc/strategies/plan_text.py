"""The plan's words: why its recommendation (or why nothing fits) and what it assumes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.device.cuda_overheads import NCCL_COMMUNICATOR_BYTES, NCCL_SOURCE
from memcalc.device.speed import HOST_SECONDS_PER_OP
from memcalc.strategies.rank_pipeline import PIPELINE_TRIES
from memcalc.strategies.ranking import TIE_SHARE, rank_key
from memcalc.strategies.report import Candidate
from memcalc.strategies.spatial import MAX_TRACES_PER_BASE
from memcalc.strategies.specs import ClusterSpec
from memcalc.strategies.variants import TracedVariant
from memcalc.trace.checkpointing import repeated_blocks
from memcalc.units import counted, format_bytes

if TYPE_CHECKING:
    from torch import nn


def static_warning(baseline: TracedVariant) -> str:
    """Opens the reason when the model could not be traced: every number is a static count."""
    if baseline.report.device.method == "traced":
        return ""
    return (f"{STATIC_PLAN} (the training step could not be traced; activations are a lower "
            "bound from leaf-layer outputs, so these batches may not fit): ")


STATIC_PLAN = "STATIC ESTIMATE, NOT TRACED"
"""Opens a plan's reason when its base could not be traced."""


def plan_reason(chosen: Candidate | None, ranked: list[Candidate], cluster: ClusterSpec,
            usable: int, not_splittable: str | None) -> str:
    if chosen is None and cluster.strategy is not None:
        return (f"--strategy {cluster.strategy.value} is not applicable here: "
                f"{not_splittable or 'no candidate of it could be built'}")
    if chosen is None:
        best = min(ranked, key=lambda c: c.per_gpu_peak_bytes)
        if not_splittable:
            why = f"and the model cannot split a sample spatially ({not_splittable})"
        elif cluster.gpus == 1 and cluster.max_gpus == 1:
            why = "and one GPU allows no spatial split (--max-gpus 1)"
        else:
            why = f"nor does a sample split spatially over up to {cluster.max_gpus} GPUs"
        groups = [c.context_parallel for c in ranked if c.context_parallel > 1]
        split = (f", context parallelism over up to {max(groups)} GPUs per sample did not fit "
                 "either" if groups else "")
        return (f"nothing fits in {format_bytes(usable)} per GPU on up to "
                f"{counted(cluster.max_gpus, 'GPU')}: one sample needs {format_bytes(best.per_gpu_peak_bytes)} per GPU at "
                f"least ({best.label}); sharding states does not shard the activations of one "
                f"sample{split}, {why} — train on crops (largest_sample_shape) or use a larger "
                "GPU")
    if cluster.strategy is not None:
        return f"forced by --strategy {cluster.strategy.value}" + (
            "" if chosen.fits else f"; it does NOT fit ({format_bytes(chosen.per_gpu_peak_bytes)} "
            f"per GPU > {format_bytes(usable)})")
    fitting = [c for c in ranked if c.fits]
    beyond = chosen.gpus > cluster.gpus
    where = (f"needs {chosen.gpus} GPUs: nothing fits on {cluster.gpus}" if beyond
             else f"on the {counted(cluster.gpus, 'GPU')} given")
    samples = "sample" if chosen.max_batch_size == 1 else "samples"
    group = chosen.sample_group
    holder = ("GPU" if group == 1 else
              f"group of {group} GPUs (each GPU a 1/{group} slab)" if chosen.spatial_parts > 1
              else f"group of {group} GPUs (each GPU 1/{group} of every sequence)")
    # as fast within the tie share (the same key up to the speed's rung), faster still
    tied = [c for c in fitting if c.samples_per_s > chosen.samples_per_s
            and rank_key(c, cluster)[:4] == rank_key(chosen, cluster)[:4]]
    fastest = ("the fastest" if not tied else
               f"the simplest of the fastest (within {TIE_SHARE:.0%}: {tied[0].label}, "
               f"{tied[0].samples_per_s:,.1f} samples/s)")
    reason = (f"{chosen.label}: {chosen.max_batch_size} {samples} per {holder} fit "
              f"({format_bytes(chosen.per_gpu_peak_bytes)} of {format_bytes(usable)} usable), "
              f"{chosen.samples_per_s:,.1f} samples/s {where}; " + (
                  f"{fastest} on the fewest GPUs of the {len(fitting)} candidates that fit"
                  if beyond else f"{fastest} of the {sum(c.gpus <= cluster.gpus for c in fitting)}"
                  " candidates that fit on them"))
    if chosen.method.startswith("derived"):
        reason += "; its row is a closed form (no rank of it was traced)"
    thriftier = max(fitting, key=lambda c: c.samples_per_s / c.gpus)
    if thriftier.samples_per_s / thriftier.gpus > 1.5 * chosen.samples_per_s / chosen.gpus:
        reason += (f"; more per GPU-hour: {thriftier.label} on {thriftier.gpus} GPUs, "
                   f"{thriftier.samples_per_s:,.1f} samples/s")
    return reason


def skipped_text(skipped: list[str]) -> str:
    if not skipped:
        return ""
    return (f"; {counted(len(skipped), 'spatial candidate')} not traced: none could change "
            "this (see the assumptions)")


def plan_assumptions(cluster: ClusterSpec, model: nn.Module,
                     not_splittable: str | None) -> list[str]:
    blocks = repeated_blocks(model)
    spatial = (f"spatial parallelism not applicable: {not_splittable}" if not_splittable else
               "spatial parallelism, when one sample does not fit one GPU: every sample split "
               "along its longest spatial axis over the fewest GPUs (powers of two, at most "
               f"{MAX_TRACES_PER_BASE} traced) whose slab fits, traced on one interior slab with "
               "its halo receive buffers and concatenations; halos timed at the interconnect "
               "bandwidth, weights replicated with DDP's buckets")
    return [
        "single-GPU candidates are traced (their own batch plan); distributed ones are first "
        "screened in closed form on each of them (their traced forward/backward and "
        "optimizer-step lines, sharded states taken out, the allocator's reserve ratio kept: "
        "how 'derive')" + (
            "; then the best row of DDP, ZeRO-1, ZeRO-2, FSDP and pipeline (a pipeline's only "
            "where no traced row outpaces what its schedule's bubble lets it reach), and the "
            f"leading row until it is traced (at most {cluster.rank_traces}), are traced as one "
            "rank of the job with the real wrappers in a fake process group, each with its own "
            "batch plan (how 'rank'); the other rows keep their closed form"
            if cluster.rank_traces
            else "; none traced as a rank (--rank-traces 0): every distributed row is a "
                 "closed form"),
        f"checkpointing wraps {len(blocks)} repeated blocks"
        + (f" ({blocks[0]} … {blocks[-1]})" if blocks else " (none found: not applicable)"),
        (f"step time = FLOPs (FlopCounterMode on the traced step, recomputation included) ÷ "
         f"(catalog peak for the precision × MFU {cluster.mfu:.0%}, --mfu), and no less than "
         f"the host's time to launch the step's ops ({HOST_SECONDS_PER_OP * 1e6:.0f} µs each, "
         "eager)" if cluster.mfu is not None else
         "step time = the traced step's kernels timed one by one (FLOPs at their engine's peak "
         "× its measured efficiency, bytes at the memory bandwidth, issued by the host at "
         f"{HOST_SECONDS_PER_OP * 1e6:.0f} µs per op), scaled to each row's micro-batch; "
         "its constants fitted to timed H100 steps (benchmarks/results-step-time.md)")
        + "; communication not overlapped",
        "traced ranks: ZeRO-1 = DDP with ZeroRedundancyOptimizer, ZeRO-2 and FSDP = FSDP2's "
        "fully_shard per repeated block plus the root (ZeRO-2 without resharding after "
        "forward; mixed precision as its MixedPrecisionPolicy(param_dtype=bfloat16 or float16, "
        "reduce_dtype=float32), not autocast), pipeline = torch.distributed.pipelining's 1F1B "
        "over stages split at the repeated blocks, with two microbatches per stage, its "
        "microbatch searched from the closed form's down to one that fits (at most "
        f"{PIPELINE_TRIES} traces); closed-form FSDP rows gather two units at once",
        f"NCCL's buffers: {format_bytes(NCCL_COMMUNICATOR_BYTES)} per communicator of a rank's "
        f"mesh (data parallel, tensor parallel, pipeline sends), outside the allocator "
        f"({NCCL_SOURCE}); DDP's first-iteration bucket rebuild and the time of pipeline "
        "activation transfers are not modelled",
        f"when one GPU is given, distributed strategies are sized to the fewest GPUs (powers of "
        f"two up to {cluster.max_gpus}) that fit; 8 GPUs per node beyond one node",
        spatial,
        *([] if cluster.compile_levers else [
            "torch.compile not weighed as a lever: --compile-levers traces compile and "
            "mixed-precision+compile (each of their traces captures the graphs again: a plan "
            "several times slower)"]),
    ]
