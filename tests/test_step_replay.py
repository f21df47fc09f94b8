"""A replayed optimizer step leaves the ledger a real step leaves: every record (size, phase,
iteration, module, category, freed) and every event in order, with the same op names and
bounded uses, over optimizers, options, precisions, tied and unused parameters, and on ranks
of DDP, ZeRO-1/2, FSDP2 (with a param dtype, over tensor parallelism) and pipeline stages; a
step that differs from its recording is run instead."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from memcalc.distributed.specs import ParallelSpec
from memcalc.model.source import resolve_model
from memcalc.specs import LossKind
from memcalc.trace.optimizers import configured_rule
from memcalc.trace.precision import precision_policy
from memcalc.trace.step_replay import MAX_RECORDINGS, forget_recordings, recordings
from memcalc.trace.tracer import StepSetup, trace_training_step


class TiedLm(nn.Module):
    """Embedding and head share one weight; ``spare`` is never used (no gradient)."""

    def __init__(self, vocab=50, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(width, 2, 32, batch_first=True, dropout=0.1)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.spare = nn.Linear(width, width)

    def forward(self, tokens):
        return self.head(self.block(self.embed(tokens)))


class LateBranch(nn.Module):
    """Uses ``late`` from its second forward on while ``LATE`` holds: the second optimizer
    step then sees one gradient more than the first."""

    LATE = True

    def __init__(self):
        super().__init__()
        self.first, self.late = nn.Linear(8, 8), nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x = self.first(x)
        return self.late(x) if self.calls > 1 and LateBranch.LATE else x


def conv_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 10))


def setup_for(build, shape, dtype=torch.float32, optimizer="adam", precision="fp32",
              loss=LossKind.CROSS_ENTROPY, classes_last=False, foreach=True, parallel=None,
              **options):
    def meta_model():
        with torch.device("meta"):
            return build()
    return StepSetup(meta_model, shape, dtype, loss, classes_last=classes_last,
                     optimizer=configured_rule(optimizer, **options), foreach=foreach,
                     policy=precision_policy(precision), cuda_kernels=True, parallel=parallel)


def llama():
    source = resolve_model("llama_7b", dict(vocab=100, dim=32, depth=2, heads=4, hidden=64,
                                            max_positions=16))
    return source.factory(**source.kwargs)


def rank_of(strategy, gpus=4, **options):
    """One rank of a ``gpus``-rank job of the tiny LLaMA, as the planner traces it."""
    return setup_for(llama, (2, 16), torch.int64, optimizer="adamw", classes_last=True,
                     parallel=ParallelSpec(strategy=strategy, gpus_per_node=gpus, **options))


def ledger_of(result):
    ledger = result.ledger
    return ([(r.nbytes, r.phase, r.iteration, r.module_path, r.category, r.freed)
             for r in ledger.records],
            frees_in_order(ledger.events),
            ledger.peak_bytes, result.op_names, result.bounded_sizes, result.flops,
            result.unmodelled_kernels, result.attention_backends, result.cudnn_calls)


def frees_in_order(events):
    """The events, each run of frees with nothing allocated between sorted: autocast frees
    its cast weights in the order of a hash map of addresses, which differs from run to run
    (and leaves the allocator in the same state after the run whatever the order)."""
    ordered, frees = [], []
    for event in events:
        if event.delta_bytes < 0:
            frees.append((event.record_id, event.delta_bytes, event.optional))
            continue
        ordered += sorted(frees) + [(event.record_id, event.delta_bytes, event.optional)]
        frees = []
    return ordered + sorted(frees)


@pytest.fixture
def steps_run():
    """How many optimizer steps really ran (torch's global step hook)."""
    counted = [0]
    handle = register_optimizer_step_pre_hook(
        lambda *_: counted.__setitem__(0, counted[0] + 1))
    forget_recordings()
    yield counted
    handle.remove()
    forget_recordings()


CASES = {
    "adam-foreach-conv": lambda: setup_for(conv_net, (2, 3, 8, 8)),
    "adamw-amsgrad-decay": lambda: setup_for(conv_net, (2, 3, 8, 8), optimizer="adamw",
                                             amsgrad=True, weight_decay=0.01),
    "adam-fused": lambda: setup_for(conv_net, (2, 3, 8, 8), fused=True),
    "adam-for-loop": lambda: setup_for(conv_net, (2, 3, 8, 8), foreach=False),
    "sgd-momentum-decay": lambda: setup_for(conv_net, (2, 3, 8, 8), optimizer="sgd-momentum",
                                            weight_decay=0.1),
    "rmsprop": lambda: setup_for(conv_net, (2, 3, 8, 8), optimizer="rmsprop"),
    "bf16-mixed": lambda: setup_for(mlp, (2, 16), precision="bf16-mixed"),
    "bf16-pure": lambda: setup_for(mlp, (2, 16), torch.bfloat16, precision="bf16"),
    "tied-and-unused": lambda: setup_for(TiedLm, (2, 12), torch.int64, classes_last=True),
    "rank-ddp": lambda: rank_of("ddp"),
    "rank-zero1": lambda: rank_of("zero1"),
    "rank-zero2": lambda: rank_of("zero2"),
    "rank-fsdp-bf16-params": lambda: rank_of("fsdp", param_dtype="bfloat16",
                                             reduce_dtype="float32"),
    "rank-fsdp-tensor-parallel": lambda: rank_of("fsdp", tp=2),
    "rank-pipeline-stages": lambda: rank_of("pipeline", gpus=2),
}


SLOW = {"rank-fsdp-tensor-parallel", "rank-pipeline-stages"}     # 3 s each


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) if case in SLOW
                                  else case for case in CASES])
def test_a_replayed_step_leaves_the_ledger_a_real_step_leaves(case, steps_run):
    setup = CASES[case]()
    truth = ledger_of(trace_training_step(setup, replay=False))
    run = steps_run[0]          # 2 per traced rank (ZeRO-1: its local optimizer's too)
    assert run >= 2 and recordings() == run // 2 // (1 + case.endswith("zero1"))  # recorded
    replayed = ledger_of(trace_training_step(setup))
    assert steps_run[0] == run                          # not run again: replayed
    assert replayed == truth
    # another batch: the same steps, replayed into a ledger that differs elsewhere
    larger = StepSetup(**{**setup.__dict__, "batch_shape": (5, *setup.batch_shape[1:])})
    truth_larger = ledger_of(trace_training_step(larger, replay=False))
    steps_before = steps_run[0]
    assert ledger_of(trace_training_step(larger)) == truth_larger
    assert steps_run[0] == steps_before
    assert truth_larger[2] > truth[2]


def test_a_step_that_differs_from_its_recording_is_run(steps_run):
    setup = setup_for(LateBranch, (2, 8), loss=LossKind.SUM)
    try:
        LateBranch.LATE = False
        truth = ledger_of(trace_training_step(setup, replay=False))
        LateBranch.LATE = True
        trace_training_step(setup, replay=False)    # recorded: step 2 sees late's gradients
        LateBranch.LATE = False
        steps_before = steps_run[0]
        assert ledger_of(trace_training_step(setup)) == truth
        assert steps_run[0] == steps_before + 2     # step 2 differed: traced again, steps run
    finally:
        LateBranch.LATE = True


def test_an_optimizer_with_state_before_its_first_step_is_run_every_time(steps_run):
    setup = setup_for(conv_net, (2, 3, 8, 8), optimizer="adagrad")   # makes "sum" at once
    truth = ledger_of(trace_training_step(setup, replay=False))
    assert ledger_of(trace_training_step(setup)) == truth
    assert steps_run[0] == 4 and recordings() == 0


def test_recordings_are_few_and_only_of_steps_from_an_empty_state(steps_run):
    for width in range(MAX_RECORDINGS + 3):
        trace_training_step(setup_for(lambda width=width: nn.Linear(4, 4 + width), (2, 4),
                                      loss=LossKind.SUM))
    assert recordings() == MAX_RECORDINGS


@pytest.mark.slow      # 4 rank traces
def test_a_ranks_recording_is_not_replayed_on_another_layout(steps_run):
    """The same model sharded over 4 ranks, then over 2: its step steps other shards (and
    ZeRO-1's over 2 ranks another partition), so it is run, not replayed."""
    for first, second in ((rank_of("fsdp"), rank_of("fsdp", gpus=2)),
                          (rank_of("zero1"), rank_of("zero1", gpus=2))):
        truth = ledger_of(trace_training_step(second, replay=False))
        forget_recordings()
        trace_training_step(first)              # the only recording
        before = steps_run[0]
        assert ledger_of(trace_training_step(second)) == truth
        assert steps_run[0] > before
