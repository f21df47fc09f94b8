"""Run real training iterations on fake tensors and record every storage in a ledger.

Each iteration is forward (under autocast when mixed precision), loss, backward, optimizer
step, ``zero_grad(set_to_none=True)``. Two iterations are run so the optimizer state that
appears lazily at the first step is present during the second.

Known limitations: storages resized in place (``UntypedStorage.resize_``, used by FSDP) keep
their first size; tensors a model creates outside ATen ops (e.g. from numpy) are not seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from memcalc.trace._torch_internals import (
    FAKE_TENSOR_FAILURES,
    UNSUPPORTED_OPERATOR,
    REAL_ALLOCATION_LIMIT_BYTES,
    RealAllocationError,
    StorageWatcher,
    fake_cpu_mode,
    local_tensor,
    materialize_fake,
    quiet_fake_tensor_logger,
)
from memcalc.trace.attention_workspace import AttentionWorkspaces, first_taker
from memcalc.trace.bounded_ops import BoundedOps, BoundedUse
from memcalc.trace.categories import MemoryCategory
from memcalc.trace.checkpointing import apply_checkpointing
from memcalc.trace.collector import fewer_collections
from memcalc.trace.rank import (pipeline_rank, rank_of, remember_sequence_parallel_failure,
                                sequence_parallel_failure, traced_ranks, wrapped)
from memcalc.distributed.parallelize import job_optimizer, local_optimizer
from memcalc.distributed.specs import ParallelSpec
from memcalc.trace.context_parallel import context_parallel_step
from memcalc.trace.cuda_kernels import ASSUMED_CAPABILITY, CudaKernelMode
from memcalc.trace.legacy_autograd import LegacyAutogradMode
from memcalc.trace.numpy_limit import numpy_buffer_limit
from memcalc.trace.cudnn_workspace import WorkspaceModel
from memcalc.errors import MemcalcError, TraceError, at_user_frame, first_line
from memcalc.model.inputs import (InputTensor, ModelCall, ModelInputs, make_call,
                                  require_binding)
from memcalc.trace.ledger import MemoryLedger, Phase, StorageRecord
from memcalc.trace.compiled import compiled_regions, fallbacks
from memcalc.trace.host_states import HostStates
from memcalc.trace.host_tensors import HostTensorCounter
from memcalc.trace.offload import OffloadCounter
from memcalc.trace.optimizers import OptimizerRule
from memcalc.trace.precision import PrecisionPolicy
from memcalc.trace.flops import StepFlops
from memcalc.trace.halos import ZeroHalos, apply_halo_exchange
from memcalc.trace.interrupts import DeferredInterrupts
from memcalc.trace.step import StepBody, TrainingIteration, prime_optimizer_state
from memcalc.trace.step_observer import Cursor, LedgerObserver, label, track_modules
from memcalc.trace.step_replay import OptimizerSteps, ReplayMismatch, TraceSide
from memcalc.trace.streams import StreamNumbers
from memcalc.trace.size_rules import SizeRule, noting
from memcalc.trace.workspaces import ConvWorkspaces
from memcalc.trace.cpu_conv_columns import CpuConvColumns
from memcalc.specs import GradMode, LossKind

@dataclass(frozen=True)
class StepSetup:
    """Everything needed to run the traced iterations."""

    build_meta_model: Callable[[], nn.Module]
    """A fresh meta-device copy of the model (called outside the fake mode, once per trace;
    the pipeline copies its one build, so the user's factory runs once)."""
    batch_shape: tuple[int, ...]
    """The positional sample's batch shape; with ``positional_input`` False only its first
    dim (the batch size) is used."""
    batch_dtype: torch.dtype
    loss: LossKind
    classes_last: bool
    optimizer: OptimizerRule
    foreach: bool
    policy: PrecisionPolicy
    cuda_kernels: bool = False
    """Apply ``memcalc.trace.cuda_kernels`` substitutions (the target is a CUDA GPU)."""
    cpu_kernels: bool = False
    """The target runs PyTorch's own CPU kernels: the im2col columns of its slow
    convolutions are inserted (``memcalc.trace.cpu_conv_columns``)."""
    cuda_capability: tuple[int, int] | None = None
    """Compute capability of the target GPU; None: ``cuda_kernels.ASSUMED_CAPABILITY``."""
    softmax_saves_input: bool = False
    """torch < 1.11's softmax formula (``memcalc.trace.legacy_autograd``)."""
    keep_zeroed_grads: bool = False
    """``zero_grad(set_to_none=False)``: gradients stay allocated (PyTorch < 2.0 default)."""
    free_output: bool = False
    """The loop drops the model's output before backward (``StepBody.free_output``)."""
    clip_grad_norm: float | None = None
    """``clip_grad_norm_`` before the optimizer step (``StepBody.clip_grad_norm``)."""
    checkpoint_blocks: tuple[str, ...] = ()
    checkpoint_policy: str = "full"
    """``full`` or ``every:N``: the blocks in full; ``selective``: per-op inside them."""
    """Modules whose forward runs under non-reentrant activation checkpointing."""
    offload_activations: bool = False
    """Saved activations go to host memory in forward and come back in backward."""
    halo_axis: int | None = None
    """Spatial parallelism: the batch axis split over GPUs; padded convs/pools exchange halos."""
    cudnn: WorkspaceModel | None = None
    """cuDNN workspace rules; None: no workspaces are inserted (CPU targets)."""
    cudnn_benchmark: bool = False
    cudnn_tf32: bool = True
    named_inputs: tuple[InputTensor, ...] = ()
    """Named input tensors of ``forward`` (per sample)."""
    forward_kwargs: tuple[tuple[str, object], ...] = ()
    positional_input: bool = True
    boxes_per_image: int = 8
    iterations: int = 2
    compile_regions: tuple[str, ...] = ()
    """Modules run as ``torch.compile`` runs them (``""``: the whole model), each a
    ``memcalc.trace.compiled.CompiledRegion``."""
    host_tensors: bool = False
    """The step keeps tensors in host RAM (a sliding window's volume or aggregation on the
    CPU): ``memcalc.trace.host_tensors`` counts them."""
    evaluation: GradMode | None = None
    """An evaluation step under this grad mode (``StepBody.evaluation``); None: training."""
    optimizer_state_held: bool = False
    """The evaluation step runs with the job's optimizer state resident (``prime_optimizer_state``)."""
    parallel: ParallelSpec | None = None
    """One rank of a distributed job: traced in a fake process group of its world size, the
    model wrapped as ``memcalc.distributed.parallelize`` applies the layout."""

    @property
    def inputs(self) -> ModelInputs:
        positional = (InputTensor(None, self.batch_shape[1:], self.batch_dtype)
                      if self.positional_input else None)
        return ModelInputs(positional, self.named_inputs, self.forward_kwargs,
                           self.boxes_per_image)

    @property
    def body(self) -> StepBody:
        # inference_mode allocates what no_grad does without autocast's weight cache (real CPU
        # steps measure the same bytes); fake tensors made under it are not all seen
        inference = self.evaluation is GradMode.INFERENCE_MODE
        return StepBody(self.loss, self.classes_last, self.policy.autocast_dtype,
                        self.keep_zeroed_grads, self.free_output, self.clip_grad_norm,
                        GradMode.NO_GRAD if inference else self.evaluation, not inference)


@dataclass
class TraceResult:
    ledger: MemoryLedger
    output_shape: tuple[int, ...]
    op_names: frozenset[str]
    """ATen op names the step ran (``mm``, ``convolution``...)."""
    flops: StepFlops | None
    """FLOPs of the first iteration's forward, loss and backward."""
    offloaded_bytes: int = 0
    """Host bytes the offloaded activations of one iteration take (0 without offloading)."""
    host_bytes: int = 0
    """Peak of the tensors the step makes in host RAM (``StepSetup.host_tensors``), its
    input batch aside."""
    halo_bytes: int = 0
    """Halo rows one rank receives in one iteration (0 without spatial parallelism)."""
    cudnn_calls: int = 0
    """cuDNN calls given a workspace (0 when no workspace model was applied)."""
    bounded_sizes: tuple[BoundedUse, ...] = ()
    """Data-dependent ops traced at a bound or a conventional value (``bounded_ops``)."""
    attention_backends: dict[str, int] = field(default_factory=dict)
    """CUDA attention backend -> scaled-dot-product calls it ran (CUDA targets only)."""
    unmodelled_kernels: tuple[str, ...] = ()
    """CUDA kernels the step used whose own tensors are not modelled (``cuda_kernels``)."""
    stage_peak_bytes: tuple[int, ...] = ()
    """A pipeline: every stage's traced rank's peak live bytes, by stage (the result is
    the largest one's)."""
    compile_fallbacks: tuple[str, ...] = ()
    """Compiled regions that could not be captured and ran eagerly: ``name: reason``."""
    sequence_parallel_dropped: str = ""
    """Why the rank was traced without the sequence parallelism it asked for ("": it was
    not asked for, or traced with it)."""
    ring_bytes: int = 0
    """Context parallelism: keys, values and their gradients (whole sequence) one iteration's
    ring attention moves round, of which a rank receives a share
    (``context_parallel.ring_exchange_bytes``)."""
    sized_records: dict[int, SizeRule] = field(default_factory=dict)
    """Ledger records whose bytes a rule gives (cuDNN workspaces, CUDA's embedding backward
    scratch), by record id."""
    offloaded_state_bytes: int = 0
    """Peak host bytes of an FSDP2 rank's offloaded states (``host_states``): parameter and
    gradient shards, the optimizer's state and its step's temporaries; 0 without offload."""


def step_model(setup: StepSetup, halos: ZeroHalos, meta_model: nn.Module) -> nn.Module:
    """``meta_model`` as the step runs it, inside a fake mode: materialised in training mode,
    its repeated blocks checkpointed, its padded layers taking ``halos`` under spatial
    parallelism."""
    model = materialize_fake(meta_model, setup.policy.parameter_dtype).train()
    apply_checkpointing(model, list(setup.checkpoint_blocks), setup.checkpoint_policy)
    if setup.halo_axis is not None:
        apply_halo_exchange(model, setup.halo_axis, halos)
    return model


def trace_training_step(setup: StepSetup, replay: bool = True) -> TraceResult:
    """Trace ``setup.iterations`` training iterations; raise TraceError if the model can't be.
    ``replay``: the optimizer steps are replayed when an earlier trace recorded the same
    ones (``memcalc.trace.step_replay``), else run (False: always run)."""
    with fewer_collections():
        return _traced_or_again(setup, replay)


def _traced_or_again(setup: StepSetup, replay: bool) -> TraceResult:
    """The trace, again with the optimizer steps run where their replay did not match, or
    without sequence parallelism where the model's forward refused it."""
    if setup.parallel is not None and setup.parallel.cpu_offload:
        replay = False      # the host-held states are counted by the step run, not replayed
    parallel = setup.parallel
    dropped = sequence_parallel_failure(setup.build_meta_model)
    if dropped is None:
        try:
            return _traced(setup, replay)
        except ReplayMismatch:
            return _traced(setup, replay=False)
        except TraceError as error:
            if parallel is None or parallel.tp == 1 or not parallel.sequence_parallel:
                raise
            # the layout allowed it, the model's forward did not (positions taken from the
            # sharded stream outside the projections, as Hugging Face models take theirs)
            dropped = f"its trace failed: {str(error).removeprefix(FAILED_IN_STEP)}"
            remember_sequence_parallel_failure(setup.build_meta_model, dropped)
    plain = dataclasses.replace(setup, parallel=parallel.model_copy(
        update={"sequence_parallel": False}))
    return dataclasses.replace(_traced(plain, replay), sequence_parallel_dropped=dropped)


FAILED_IN_STEP = "the model failed in the traced step: "


def _traced(setup: StepSetup, replay: bool) -> TraceResult:
    """The step of the job's rank (of each pipeline stage's first rank, or of the first and
    last rank of a context-parallel group, the largest kept; ``traced_ranks`` says which)."""
    ranks = traced_ranks(setup.parallel, setup.build_meta_model, setup.checkpoint_blocks,
                         plain=not setup.compile_regions and setup.halo_axis is None)
    results = [_traced_rank(setup, replay, rank) for rank in ranks]
    largest = max(results, key=lambda result: result.ledger.peak_bytes)
    if len(results) == 1:
        return largest
    return dataclasses.replace(largest, stage_peak_bytes=tuple(
        result.ledger.peak_bytes for result in results))


def _traced_rank(setup: StepSetup, replay: bool, rank: int) -> TraceResult:
    meta_model = setup.build_meta_model()
    refused_numpy: list[int] = []
    try:
        with (DeferredInterrupts() as interrupts, quiet_fake_tensor_logger(),
              numpy_buffer_limit() as refused_numpy,
              rank_of(setup.parallel, rank) as mesh, fake_cpu_mode()):
            return _trace(setup, meta_model, replay, mesh, rank, interrupts.check)
    except (MemcalcError, ReplayMismatch):
        raise
    except RealAllocationError as error:
        raise TraceError(f"refused: {error}") from error
    except MemoryError as error:
        if not refused_numpy:
            raise
        raise TraceError(
            f"refused: the model asked numpy for a real {refused_numpy[-1]:,}-byte buffer while "
            f"tracing (limit {REAL_ALLOCATION_LIMIT_BYTES:,}): memory the trace cannot count; "
            f"make it a torch tensor in forward{at_user_frame(error)}") from error
    except UNSUPPORTED_OPERATOR as error:
        raise TraceError(f"op {first_line(error)} has no fake kernel (a custom or extension "
                         "op; register one with torch.library.register_fake)") from error
    except FAKE_TENSOR_FAILURES as error:
        raise TraceError(f"the model needs real tensor values ({type(error).__name__}: "
                         f"{first_line(error)})") from error
    except Exception as error:  # the user's model code may raise anything
        raise TraceError(f"{FAILED_IN_STEP}{type(error).__name__}: "
                         f"{first_line(error)}{at_user_frame(error)}") from error
    except SystemExit as error:  # a forward that exits must not end memcalc with its code
        raise TraceError(f"the model called sys.exit({error.code!r}) in the traced step"
                         f"{at_user_frame(error)}") from error


def _trace(setup: StepSetup, meta_model: nn.Module, replay: bool, mesh, rank: int,
           safe_point: Callable[[], None]) -> TraceResult:
    ledger, cursor, streams = MemoryLedger(), Cursor(safe_point), StreamNumbers()

    def on_new(storage: torch.UntypedStorage, empty_too: bool = False) -> StorageRecord | None:
        nbytes = storage.nbytes()
        if nbytes == 0 and not empty_too:
            return None
        return ledger.allocate(nbytes, cursor.phase, cursor.iteration, cursor.module_path,
                               MemoryCategory.TEMPORARY, stream=streams.current())

    sized: dict[int, SizeRule] = {}

    def transient(nbytes: int, size: SizeRule | None = None, optional: bool = True) -> None:
        if nbytes > 0:
            record = ledger.allocate(nbytes, cursor.phase, cursor.iteration,
                                     cursor.module_path, MemoryCategory.WORKSPACE,
                                     optional=optional, stream=streams.current())
            if size is not None:
                sized[record.record_id] = size
            ledger.free(record)

    workspaces = (ConvWorkspaces(setup.cudnn, transient, ledger.empty_cache,
                                 benchmark=setup.cudnn_benchmark, tf32=setup.cudnn_tf32)
                  if setup.cudnn is not None else None)
    columns = CpuConvColumns(transient) if setup.cpu_kernels else None
    states = HostStates() if setup.parallel is not None and setup.parallel.cpu_offload else None
    attention = (AttentionWorkspaces(setup.cuda_capability or ASSUMED_CAPABILITY,
                                     lambda nbytes: transient(nbytes, optional=False))
                 if setup.cuda_kernels else None)
    watcher = StorageWatcher(on_new, ledger.free, first_taker(workspaces or columns, attention),
                             host=states)
    halo = ZeroHalos()
    model = step_model(setup, halo, meta_model)
    model, regions = compiled_regions(model, setup.compile_regions, setup.cuda_kernels)
    stages = (pipeline_rank(setup.parallel, model, setup.inputs, mesh)
              if setup.parallel is not None and setup.parallel.pp > 1 else None)
    if stages is None:
        model = wrapped(setup.parallel, model, True, mesh,
                        cross_entropy=setup.loss is LossKind.CROSS_ENTROPY)
        batch = make_call(model, setup.inputs, setup.batch_shape[0])
    else:
        batch = (make_call(model, setup.inputs, setup.batch_shape[0]) if stages.first
                 else ModelCall(()))
        model = stages.container
    if states is not None:         # FSDP2 offloads every parameter shard it manages
        states.hold(local_tensor(parameter) for parameter in model.parameters())
    if stages is None or stages.first:
        require_binding(meta_model, batch)
    label(watcher, model.parameters(), MemoryCategory.PARAMETER)
    label(watcher, model.buffers(), MemoryCategory.BUFFER)
    label(watcher, batch.tensors(), MemoryCategory.INPUT)
    handles = track_modules(model, cursor)
    kernels = CudaKernelMode(setup.cuda_capability) if setup.cuda_kernels else None
    legacy = LegacyAutogradMode(setup.softmax_saves_input)
    offload = OffloadCounter()
    bounded = BoundedOps()     # below the watcher, which then records what its rules make
    for name, length in setup.inputs.filled_lengths().items():
        if isinstance(batch.kwargs.get(name), torch.Tensor):
            bounded.values.fill(batch.kwargs[name], length,
                                f"{length}: {name} as memcalc fills it (every sample full length)")
    host = HostTensorCounter()   # not the batch: the host estimate holds it already
    host.watch(batch.tensors(), counted=False)
    try:
        with (bounded, watcher, legacy, kernels or contextlib.nullcontext(),
              host if setup.host_tensors else contextlib.nullcontext(),
              states.copies() if states is not None else contextlib.nullcontext(),
              noting(partial(_note_rule, watcher, sized))):
            job_model = wrapped(setup.parallel, model, False, mesh) if stages is None else model
            optimizer = job_optimizer(setup.parallel, mesh,
                                      lambda params: setup.optimizer.build(params, setup.foreach),
                                      list(model.parameters()))
            observer = LedgerObserver(watcher, cursor, ledger, model, local_optimizer(optimizer))
            steps = OptimizerSteps(optimizer, TraceSide(
                ledger, watcher.op_names, bounded.use_counts,
                lambda: (cursor.phase, cursor.iteration, cursor.module_path),
                lambda: (kernels and (set(kernels.target.unmodelled),
                                      dict(kernels.target.attention_backends)),
                         workspaces and workspaces.calls),
                bounded.forget_values, lambda: observer.counter and observer.counter.kernels),
                repr(_step_context(setup, rank)), replay, local_optimizer(optimizer))
            iteration = (TrainingIteration(setup.body, job_model, batch, optimizer, observer,
                                           steps) if stages is None else
                         stages.iteration(setup, job_model, batch, optimizer, observer, steps))
            try:
                if setup.optimizer_state_held:
                    prime_optimizer_state(optimizer, setup.keep_zeroed_grads, observer)
                with context_parallel_step(setup.parallel, mesh, batch, setup.cuda_kernels,
                                           lambda: cursor.phase is Phase.BACKWARD) as ring:
                    output_shape = _iterations(setup, iteration, cursor, offload, halo)
                steps.finish()
            finally:   # the counter is the innermost mode: it must leave before the others
                observer.stop_counting()
    finally:
        for handle in handles:
            handle.remove()
    return TraceResult(ledger, output_shape, frozenset(watcher.op_names), observer.flops,
                       offload.peak_bytes, host.peak_bytes, halo.peak_bytes,
                       workspaces.calls if workspaces else 0, bounded.uses(),
                       dict(kernels.target.attention_backends) if kernels else {},
                       tuple(sorted(kernels.target.unmodelled if kernels else
                                    columns.unmodelled if columns else ())),
                       compile_fallbacks=fallbacks(regions), sized_records=sized,
                       offloaded_state_bytes=states.peak_bytes if states is not None else 0,
                       ring_bytes=ring.moved_bytes // setup.iterations if ring else 0)


def _note_rule(watcher: StorageWatcher, sized: dict[int, SizeRule], tensor: torch.Tensor,
               rule: SizeRule) -> None:
    record = watcher.watch(tensor, empty_too=True)   # a rule's empty storage holds its place
    if record is not None:
        sized[record.record_id] = rule


def _step_context(setup: StepSetup, rank: int) -> tuple:
    """What of the setup an optimizer step's recording also depends on: with a layout, the
    layout and the rank (which shard of each state the rank steps, which stage's)."""
    return (setup.iterations, setup.keep_zeroed_grads, setup.cuda_kernels, setup.cuda_capability,
            setup.parallel and setup.parallel.model_dump_json(), rank)


def _iterations(setup: StepSetup, iteration: TrainingIteration, cursor: Cursor,
                offload: OffloadCounter, halo: ZeroHalos) -> tuple[int, ...]:
    output_shape: tuple[int, ...] = ()
    for number in range(1, setup.iterations + 1):
        cursor.iteration = number
        halo.start_iteration()
        offload.start_iteration()
        saved = offload.hooks() if setup.offload_activations else contextlib.nullcontext()
        with saved:
            output_shape = iteration()
    return output_shape
