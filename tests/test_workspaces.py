"""cuDNN workspaces in the traced event sequence: cuDNN's order, sizes from the rules, and
the plan search once per signature with cudnn.benchmark."""

from dataclasses import replace

import torch

from memcalc.trace.categories import MemoryCategory
from memcalc.trace.cudnn_workspace import ConvKind, WorkspaceModel, WorkspaceRule
from memcalc.trace.ledger import EMPTY_CACHE_RECORD
from memcalc.trace.optimizers import optimizer_rule
from memcalc.trace.precision import precision_policy
from memcalc.specs import LossKind
from memcalc.trace.tracer import StepSetup, trace_training_step

# workspace = input bytes (forward), output bytes (dgrad), weight bytes (wgrad)
COEFFICIENTS = {ConvKind.FORWARD: (1, 0, 0), ConvKind.DGRAD: (0, 1, 0),
                ConvKind.WGRAD: (0, 0, 1)}


def _model(search_scale=0):
    rules = [WorkspaceRule(kind=kind, spatial_dims=2, math="tf32", shape="conv",
                           input_coef=a, output_coef=b, weight_coef=c, calls=1,
                           error_fraction=0, max_error_bytes=0)
             for kind, (a, b, c) in COEFFICIENTS.items()]
    search = [rule.model_copy(update={"input_coef": search_scale}) for rule in rules]
    return WorkspaceModel(rules=rules, find_rules=search if search_scale else [])


def _conv_net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                               torch.nn.Conv2d(8, 4, 3, padding=1, bias=False),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 10))


def _trace(model, benchmark=False):
    with torch.device("meta"):
        built = _conv_net()
    setup = StepSetup(lambda: built, (2, 3, 8, 8), torch.float32, LossKind.CROSS_ENTROPY,
                      classes_last=False, optimizer=optimizer_rule("sgd"), foreach=True,
                      policy=precision_policy("fp32"), cuda_kernels=True, cudnn=model,
                      cudnn_benchmark=benchmark)
    return trace_training_step(setup).ledger, setup


def test_each_call_allocates_its_workspace_after_its_output_and_frees_it_at_once():
    ledger, _ = _trace(_model())
    workspaces = [record for record in ledger.records
                  if record.category is MemoryCategory.WORKSPACE]
    x1, x2 = 2 * 3 * 8 * 8 * 4, 2 * 8 * 8 * 8 * 4            # conv inputs (bytes)
    w1, w2 = 8 * 3 * 9 * 4, 4 * 8 * 9 * 4                     # conv weights
    y1, y2 = x2, 2 * 4 * 8 * 8 * 4                            # conv outputs
    # forward conv1, conv2; backward conv2 (dgrad, wgrad), conv1 (wgrad only: the input
    # needs no gradient); two iterations
    one_iteration = [x1, x2, y2, w2, w1]
    assert [record.nbytes for record in workspaces] == one_iteration * 2
    events = ledger.events
    for record in workspaces:
        index = next(i for i, e in enumerate(events) if e.record_id == record.record_id)
        assert events[index].optional and events[index + 1].delta_bytes == -record.nbytes
        # the allocation just before the workspace is the call's output
        assert events[index - 1].delta_bytes > 0
    assert y1 == x2


def test_benchmark_searches_each_signature_once_then_empties_the_cache():
    ledger, _ = _trace(_model(search_scale=10), benchmark=True)
    markers = [i for i, e in enumerate(ledger.events) if e.record_id == EMPTY_CACHE_RECORD]
    # five distinct calls, searched in the first iteration only
    assert len(markers) == 5
    first_iteration_end = max(i for i, e in enumerate(ledger.events)
                              if e.record_id >= 0 and ledger.records[e.record_id].iteration == 1)
    assert all(index < first_iteration_end for index in markers)
    searched = [ledger.events[i - 2].delta_bytes for i in markers]  # alloc, free, marker
    assert searched[0] == 10 * 2 * 3 * 8 * 8 * 4


def test_no_workspace_model_means_no_workspace_events():
    ledger, setup = _trace(_model())
    trace = trace_training_step(replace(setup, cudnn=None))
    assert not any(r.category is MemoryCategory.WORKSPACE for r in trace.ledger.records)
    assert trace.cudnn_calls == 0 and len(trace.ledger.records) < len(ledger.records)
