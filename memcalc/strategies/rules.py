"""One registered rule per strategy: everything that differs between strategies.

A ``TracedRule`` says how its single-GPU variant's spec follows from the job's (None: not
applicable) and how the planner treats the variant. A ``DerivedRule`` says how a traced
base's lines move over N GPUs (``memory``), what crosses the interconnect
(``communication_s``), how the compute is scheduled, how its candidate is named, and how its
GPU count is found (``size``: closed form on the base, or its own traces). Adding a strategy
is a ``Strategy`` member and one ``register(...)`` entry below; registering a strategy twice
is an error.

Known limitations: launch files do not depend on the strategy (one torchrun process per GPU
for all of them), so rules carry no launch flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.specs import Precision, TrainingSpec
from memcalc.strategies.candidates import Sized, fewest_fitting_gpus
from memcalc.strategies.cost import all_reduce_seconds, fsdp_seconds
from memcalc.strategies.lines import Derivation, Line, PerGpuLines
from memcalc.strategies.sharding import (
    ModelStates,
    ddp_bucket_bytes,
    gathered_unit_bytes,
    sharded_state_bytes,
)
from memcalc.strategies.spatial_search import search_spatial
from memcalc.strategies.state_offload import host_side_s, offloaded_lines, sized_within_host
from memcalc.strategies.specs import Strategy

if TYPE_CHECKING:
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.variants import TracedVariant

MIXED_PRECISIONS = (Precision.BF16_MIXED, Precision.FP16_MIXED)
"""Precisions that are autocast over fp32 weights."""


@dataclass(frozen=True)
class VariantContext:
    """What a traced rule needs besides the job's spec."""

    mixed_precision: Precision
    """The autocast the mixed-precision variants use (the job's own when it is mixed)."""
    has_blocks: bool
    """The model has repeated blocks that checkpointing can wrap."""
    compile_levers: bool = False
    """The compile variants are asked for (``ClusterSpec.compile_levers``)."""
    accumulates: bool = True
    """Rows may accumulate micro-batches: the plan has a global batch to reach, or the
    accumulation row is asked for. Without, every row takes one step per batch, and keeping
    the gradients between steps only adds to the job as given."""


@dataclass(frozen=True)
class TracedRule:
    """A single-GPU strategy, traced on its own spec."""

    strategy: Strategy
    variant: Callable[[TrainingSpec, VariantContext], TrainingSpec | None]
    """The spec to trace, from the job's; None when the strategy does not apply."""
    base: bool = True
    """Distributed strategies are derived from this variant."""
    keeps_gradients: bool = False
    """Its trace keeps gradients between steps, as accumulating micro-batches needs."""
    as_given: bool = False
    """The job as given: the planner's reference, left out of derived candidates' labels."""
    adds_to_the_job: bool = False
    """Its step holds everything the job's does at the same batch, and more: when one
    sample of the job does not fit, it cannot, and the planner does not trace it."""
    keeps_the_states: bool = False
    """A single-GPU lever that holds the job's model states whole (no distributed candidate
    is derived from it): where they alone exceed the GPU, the planner does not trace it."""


Sizer = Callable[["DerivedRule", "TracedVariant", ModelStates, "PlanContext"], Sized]
Searcher = Callable[["DerivedRule", "list[tuple[TracedVariant, ModelStates]]", "PlanContext",
                     "list[Candidate]", bool], tuple[list[Sized], list[str]]]
"""Sizes a rule on every base at once: (rule, bases with their states, context, candidates
built so far, prune) → each base's candidate or failure, and notes on bases it skipped."""


def _no_bubble(per_gpu_s: float, steps: int, gpus: int) -> float:
    return per_gpu_s


def _one_in_flight(gpus: int) -> int:
    return 1


@dataclass(frozen=True)
class DerivedRule:
    """A strategy over N GPUs, derived from a traced base variant."""

    strategy: Strategy
    memory: Callable[[Derivation], PerGpuLines]
    communication_s: Callable[[ModelStates, int, float], float]
    """Seconds per optimizer step on the wire: (unsharded states, GPUs, bytes/s)."""
    size: Sizer = fewest_fitting_gpus
    """Finds the GPU count and builds the candidate (or says why it could not)."""
    search: Searcher | None = None
    """Instead of ``size``: sizes every base at once, after every ``size``d candidate is
    built, by tracing (it may skip bases that cannot change the plan)."""
    more_gpus_fit: bool = True
    """False where every GPU keeps the whole states: more GPUs never make it fit."""
    host_s: Callable[[TracedVariant, ModelStates, int], float] | None = None
    """Seconds per optimizer step on the host's side of the GPU (base, unsharded states,
    GPUs): copies across PCIe and an optimizer step on the CPU, timed with the
    communication; None: none."""
    compute_s: Callable[[float, int, int], float] = _no_bubble
    """Step compute from one GPU's busy seconds, accumulation steps and GPUs."""
    micro_batches_in_flight: Callable[[int], int] = _one_in_flight
    """Fewest micro-batches per optimizer step on that many GPUs."""
    traced_per_gpu: bool = False
    """The base is traced on one GPU's share of each sample: its FLOPs count on every GPU."""
    name_format: str = "{strategy}"
    method_format: str = "derived from {base}"

    def name(self, spec: TrainingSpec) -> str:
        """The strategy's own part of a candidate's label."""
        return self.name_format.format(strategy=self.strategy.value, parts=spec.spatial_parts)

    def method(self, base: TracedVariant) -> str:
        """How the candidate was obtained from ``base``."""
        return self.method_format.format(base=base.label, parts=base.spec.spatial_parts)


Rule = TracedRule | DerivedRule
_RULES: dict[Strategy, Rule] = {}


def register(rule: Rule) -> Rule:
    """Add ``rule``; plans try rules in the order they were registered."""
    if rule.strategy in _RULES:
        raise ValueError(f"strategy {rule.strategy.value!r} is registered twice")
    _RULES[rule.strategy] = rule
    return rule


def rule_for(strategy: Strategy) -> Rule:
    """The rule registered for ``strategy``."""
    if strategy not in _RULES:
        raise KeyError(f"no rule for strategy {strategy.value!r}; registered: "
                       f"{', '.join(s.value for s in _RULES)}")
    return _RULES[strategy]


def traced_rules() -> list[TracedRule]:
    """Single-GPU rules, in registration order."""
    return [rule for rule in _RULES.values() if isinstance(rule, TracedRule)]


def derived_rules() -> list[DerivedRule]:
    """Multi-GPU rules, in registration order."""
    return [rule for rule in _RULES.values() if isinstance(rule, DerivedRule)]


# -- single-GPU variants ------------------------------------------------------------------

def _as_given(spec: TrainingSpec, context: VariantContext) -> TrainingSpec:
    return spec


def _mixed(spec: TrainingSpec, context: VariantContext) -> TrainingSpec | None:
    if spec.precision in MIXED_PRECISIONS:
        return None
    return spec.with_changes(precision=context.mixed_precision)


def _checkpointed(precision: bool) -> Callable[[TrainingSpec, VariantContext], TrainingSpec | None]:
    def variant(spec: TrainingSpec, context: VariantContext) -> TrainingSpec | None:
        if not context.has_blocks or spec.activation_checkpointing:
            return None
        mixed = {"precision": context.mixed_precision} if precision else {}
        return spec.with_changes(activation_checkpointing=True, **mixed)
    return variant


def _mixed_offloaded(spec: TrainingSpec, context: VariantContext) -> TrainingSpec | None:
    if spec.offload_activations:
        return None
    return spec.with_changes(offload_activations=True, precision=context.mixed_precision)


def _compiled(precision: bool) -> Callable[[TrainingSpec, VariantContext], TrainingSpec | None]:
    """The job under ``torch.compile`` (with mixed precision): not where the job compiles
    already, nor beside what is not traced compiled yet (checkpointing, offloading, a
    distributed strategy, a spatial split)."""
    def variant(spec: TrainingSpec, context: VariantContext) -> TrainingSpec | None:
        if not context.compile_levers or spec.compile or spec.not_traced_with_compile:
            return None
        if precision and spec.precision in MIXED_PRECISIONS:
            return None
        mixed = {"precision": context.mixed_precision} if precision else {}
        return spec.with_changes(compile=True, **mixed)
    return variant


def _gradients_kept(spec: TrainingSpec, context: VariantContext) -> TrainingSpec | None:
    return spec.with_changes(zero_grad_to_none=False) if context.accumulates else None


# -- per-GPU memory of derived strategies ------------------------------------------------

def _ddp(d: Derivation) -> PerGpuLines:
    buckets = ddp_bucket_bytes(d.states, d.cluster.gradient_as_bucket_view)
    note = ("gradient buckets: a flat copy of the gradients"
            if not d.cluster.gradient_as_bucket_view else "gradient_as_bucket_view")
    return PerGpuLines(d.compute.shifted(buckets), d.step.shifted(buckets), d.gpus, (note,))


def _data_parallel(d: Derivation) -> PerGpuLines:
    # GPU0 holds every GPU's share of the input batch before scattering it
    per_input_sample = d.base.report.static.input_batch_bytes / max(
        d.base.report.device.batch_size, 1)
    compute = Line(d.compute.fixed, d.compute.per_sample + (d.gpus - 1) * per_input_sample)
    return PerGpuLines(compute, d.step, d.gpus, (
        "legacy nn.DataParallel: GPU0 scatters every GPU's inputs and gathers outputs; one "
        "process, slower than DDP",))


def _sharded(stage: int) -> Callable[[Derivation], PerGpuLines]:
    """ZeRO ``stage`` (3 = FSDP) over the base's lines."""
    def memory(d: Derivation) -> PerGpuLines:
        states, gpus = d.states, d.gpus
        unsharded = 1 - 1 / gpus
        # forward/backward: sharded optimizer state (and parameters at stage 3) leave; the
        # gathered units join; gradients are conservatively kept as traced
        compute = d.compute.shifted(gathered_unit_bytes(states, stage) - unsharded * (
            states.optimizer_state_bytes + (states.parameter_bytes if stage >= 3 else 0)))
        # optimizer step: only the shard is stepped, so its temporaries shrink too
        step = Line(sharded_state_bytes(states, gpus, stage)
                    + (d.step.fixed - states.total_bytes) / gpus, d.step.per_sample)
        return PerGpuLines(compute, step, gpus)
    return memory


def _pipeline(d: Derivation) -> PerGpuLines:
    gpus = d.gpus
    return PerGpuLines(
        Line(d.compute.fixed / gpus, d.compute.per_sample),
        Line(d.step.fixed / gpus, d.step.per_sample), 1,
        (f"{gpus} stages; the first stage keeps {gpus} micro-batches of its layers' "
         "activations (1F1B), about one full micro-batch",))


def _spatial(d: Derivation) -> PerGpuLines:
    # weights are replicated over the group, so DDP's buckets come with them
    ddp = _ddp(d)
    parts = d.base.spec.spatial_parts
    data_ranks = d.gpus // parts
    return PerGpuLines(ddp.compute, ddp.step, data_ranks, (
        *ddp.notes,
        f"every sample split over {parts} GPUs along its longest spatial axis, halos "
        "exchanged in every padded convolution (traced on one slab)"
        + (f"; {data_ranks} such groups data-parallel" if data_ranks > 1 else ""),
        f"process groups: init_device_mesh('cuda', ({data_ranks}, {parts}), "
        "mesh_dim_names=('data', 'spatial')); halos within 'spatial', gradients all-reduced "
        "over both"))


# -- communication and schedule ------------------------------------------------------------

def _gradient_all_reduce(states: ModelStates, gpus: int, bandwidth: float) -> float:
    return all_reduce_seconds(states.gradient_bytes, gpus, bandwidth)


def _fsdp_collectives(states: ModelStates, gpus: int, bandwidth: float) -> float:
    return fsdp_seconds(states.parameter_bytes, states.gradient_bytes, gpus, bandwidth)


def _stage_activations(states: ModelStates, gpus: int, bandwidth: float) -> float:
    return 0.0   # activations between stages, small next to the states


def _pipeline_bubble(per_gpu_s: float, steps: int, gpus: int) -> float:
    return per_gpu_s * (steps + gpus - 1) / steps


def _two_per_stage(gpus: int) -> int:
    return 2 * gpus       # micro-batches in flight keep the bubble small


# -- the registry --------------------------------------------------------------------------

register(TracedRule(Strategy.BASELINE, _as_given, as_given=True))
register(TracedRule(Strategy.MIXED_PRECISION, _mixed))
register(TracedRule(Strategy.CHECKPOINTING, _checkpointed(precision=False)))
register(TracedRule(Strategy.MIXED_PRECISION_CHECKPOINTING, _checkpointed(precision=True)))
register(TracedRule(Strategy.MIXED_PRECISION_OFFLOAD, _mixed_offloaded))
register(TracedRule(Strategy.COMPILE, _compiled(precision=False), base=False,
                    keeps_the_states=True))
register(TracedRule(Strategy.MIXED_PRECISION_COMPILE, _compiled(precision=True), base=False,
                    keeps_the_states=True))
register(TracedRule(Strategy.ACCUMULATION, _gradients_kept, base=False, keeps_gradients=True,
                    adds_to_the_job=True))
register(DerivedRule(Strategy.DDP, _ddp, _gradient_all_reduce, more_gpus_fit=False))
register(DerivedRule(Strategy.DATA_PARALLEL, _data_parallel, _gradient_all_reduce,
                     more_gpus_fit=False))
register(DerivedRule(Strategy.ZERO1, _sharded(1), _gradient_all_reduce, more_gpus_fit=False))
register(DerivedRule(Strategy.ZERO2, _sharded(2), _gradient_all_reduce))
register(DerivedRule(Strategy.FSDP, _sharded(3), _fsdp_collectives))
register(DerivedRule(Strategy.FSDP_OFFLOAD, offloaded_lines, _fsdp_collectives,
                     size=sized_within_host, host_s=host_side_s))
register(DerivedRule(Strategy.PIPELINE, _pipeline, _stage_activations,
                     compute_s=_pipeline_bubble, micro_batches_in_flight=_two_per_stage))
register(DerivedRule(Strategy.SPATIAL, _spatial, _gradient_all_reduce, search=search_spatial,
                     traced_per_gpu=True, name_format="spatial×{parts}",
                     method_format="traced slab (1/{parts}) of {base}"))
