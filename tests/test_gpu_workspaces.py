"""The built-in cuDNN workspace rules and the allocator model against a real GPU far beyond
the batch the rules were fitted at (no GPU needed).

The truth (``benchmarks/gpu_data/h200-workspaces.json.gz``, ``benchmarks.gpu_workspaces``):
on an H200 (cuDNN 9.19, the H100 profile's versions and architecture), every cuDNN call of
the 3D ResNet's step at batches 16-253, and one step at batch 115 with the caching allocator
capped as an emulated 24 GB card leaves it, with the allocator's own history.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.fixtures import gpu_data
from memcalc.device.allocator import CachingAllocatorModel
from memcalc.device.env_profile import builtin_profile
from memcalc.trace.cudnn_workspace import _nearest, rule_key

STORED = gpu_data.workspaces()["cases"]
RULES = builtin_profile(f"{gpu_data.PROFILE}.json").cudnn
FREE = sorted(name for name, case in STORED.items() if not case["spec"].get("card"))


@pytest.mark.parametrize("name", FREE)
def test_each_kind_of_call_sums_within_its_rules_stated_error(name):
    # the rules were fitted at batch 4: here 4-60× further out, each kind's transients over
    # the step (what the allocator holds in turn) stay within the error each rule states
    measured, predicted, stated = defaultdict(int), defaultdict(int), {}
    for conv in STORED[name]["convs"]:
        key = rule_key(conv.call)
        measured[key] += conv.transient_peak_bytes
        predicted[key] += RULES.workspace_bytes(conv.call)
        stated[key] = _nearest(RULES.rules, key).error_fraction
    assert len(measured) == 3       # forward, data gradient, weight gradient convolutions
    for key, nbytes in measured.items():
        assert abs(predicted[key] - nbytes) <= stated[key] * nbytes, (key, predicted[key], nbytes)


def _replayed(trace: list[list], limit_bytes: int | None) -> CachingAllocatorModel:
    """The real allocator's successful requests and completed frees, in its order."""
    model, live = CachingAllocatorModel(limit_bytes=limit_bytes), {}
    for action, size, address, _ in trace:
        if action == "alloc":
            live[address] = model.malloc(size)
        elif action == "free_completed" and address in live:
            model.free(live.pop(address))
    return model


def test_the_capped_steps_own_allocations_fit_the_allocator_model_at_its_budget():
    # the real allocator served this sequence within the cap (freeing its cache and
    # retrying where it ran short); the model, given the same requests and frees, must too
    case = STORED["fp32-b115-24GB"]
    budget = case["allowed_reserved_bytes"]
    assert _replayed(case["trace"], budget).peak_reserved_bytes <= budget
    # ... and with no cap it would have reserved more: the cap was binding
    assert _replayed(case["trace"], None).peak_reserved_bytes > budget
