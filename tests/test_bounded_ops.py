"""Data-dependent ops traced at bounded sizes: each rule's output against its closed form, the
ops a model uses counted in the trace, the conventional values of ``.item()``, and torch's
fake-tensor logger kept quiet during the trace only."""

import logging

import pytest
import torch
from torch import nn

from memcalc.errors import TraceError
from memcalc.specs import LossKind
from memcalc.trace._torch_internals import (
    DATA_DEPENDENT_FAILURES,
    fake_cpu_mode,
    quiet_fake_tensor_logger,
)
from memcalc.trace.bounded_ops import (
    BoundedOps,
    bounded_op_names,
    bounded_rule,
    register_bounded,
)
from memcalc.trace.optimizers import optimizer_rule
from memcalc.trace.python_values import SCALAR_CONVENTIONS, SCALAR_DEFAULTS
from memcalc.trace.precision import precision_policy
from memcalc.trace.tracer import StepSetup, trace_training_step

BATCH, FEATURES = 3, 8
ITERATIONS = 2


def _trace(module: nn.Module, batch_shape=(BATCH, FEATURES)):
    module = module.to("meta")
    setup = StepSetup(lambda: module, batch_shape, torch.float32, LossKind.SUM,
                      classes_last=False, optimizer=optimizer_rule("sgd"), foreach=False,
                      policy=precision_policy("fp32"), iterations=ITERATIONS)
    return trace_training_step(setup)


def _uses(result) -> dict[str, int]:
    return {use.op: use.count for use in result.bounded_sizes}


class _MaskedRows(nn.Module):
    """Boolean-mask indexing in forward; its backward puts the gradient back by the mask."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        y = self.linear(x)
        return y[y > 0]


def test_mask_indexing_keeps_every_element_and_its_backward_runs():
    result = _trace(_MaskedRows())
    assert result.output_shape == (BATCH * FEATURES,)
    assert _uses(result) == {"aten::index.Tensor": ITERATIONS}   # index_put needs no bound
    selected = [r for r in result.ledger.records if r.module_path == "(model)"
                and r.phase.value == "forward" and r.nbytes == BATCH * FEATURES * 4]
    assert len(selected) == ITERATIONS       # the indexed output, once per iteration


class _Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        rows = torch.nonzero(x)                            # (numel, 2) int64 at the bound
        return self.linear(x) * rows.shape[0]


def test_nonzero_is_traced_with_a_row_per_element_and_the_ledger_holds_its_bytes():
    result = _trace(_Nonzero())
    assert _uses(result) == {"aten::nonzero": ITERATIONS}
    nonzero_bytes = BATCH * FEATURES * 2 * 8
    assert sum(r.nbytes == nonzero_bytes for r in result.ledger.records) == ITERATIONS
    assert "nonzero" in result.op_names


@pytest.mark.parametrize("op,call,shapes", [
    ("aten::nonzero", lambda x: x.nonzero(), [(12, 2)]),
    ("aten::masked_select", lambda x: x.masked_select(x > 0), [(12,)]),
    ("aten::_unique2", lambda x: torch.unique(x, return_inverse=True, return_counts=True),
     [(12,), (3, 4), (12,)]),
    ("aten::unique_dim", lambda x: torch.unique(x, dim=1), [(3, 4)]),
    ("aten::unique_consecutive", lambda x: torch.unique_consecutive(x), [(12,)]),
    ("aten::index.Tensor", lambda x: x[x[:, 0] > 0], [(3, 4)]),
])
def test_each_rule_gives_its_upper_bound(op, call, shapes):
    with fake_cpu_mode(), BoundedOps() as bounded:
        outputs = call(torch.empty(3, 4))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert [tuple(output.shape) for output in outputs] == shapes
    assert [(use.op, use.count) for use in bounded.uses()] == [(op, 1)]
    assert use_bound(bounded) == bounded_rule(op).bound


def use_bound(bounded: BoundedOps) -> str:
    return bounded.uses()[0].bound


def test_writing_by_a_mask_needs_no_bound():
    with fake_cpu_mode(), BoundedOps() as bounded:
        x = torch.empty(3, 4)
        x[x > 0] = torch.empty(12)
        y = x.index_put((x > 0,), torch.zeros(()), accumulate=True)
    assert y.shape == x.shape
    assert bounded.uses() == ()


def test_constants_keep_their_exact_answer():
    with fake_cpu_mode(), BoundedOps() as bounded:
        one = torch.tensor(True)                      # small constants are computed for real
        assert torch.nonzero(one).shape == (1, 0) and one.item() is True
    assert bounded.uses() == ()


class _Checks(nn.Module):
    """The checks detection code makes, and a count read back into Python."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        if (x < 0).any():
            raise ValueError("any() of a check came out True")
        if not torch.isfinite(x).all():
            raise ValueError("all() of a check came out False")
        if not torch.equal(x, x):
            raise ValueError("equal() came out False")
        count = torch.count_nonzero(x > 0).item()               # numel, as nonzero's bound
        scale = x.sum().item()                                   # float default
        offset = int(x.long().max())                             # int default
        return self.linear(x).flatten()[offset:count] * scale


def test_values_handed_to_python_follow_the_documented_conventions():
    result = _trace(_Checks())
    assert result.output_shape == (SCALAR_DEFAULTS["int"][0] or BATCH * FEATURES,)
    bounds = {use.bound for use in result.bounded_sizes
              if use.op == "aten::_local_scalar_dense"}
    conventions = {SCALAR_CONVENTIONS[f"aten::{op}"][1] for op in ("any", "all", "count_nonzero")}
    assert bounds == conventions | {SCALAR_DEFAULTS["float"][1], SCALAR_DEFAULTS["int"][1]}
    assert all(use.count == ITERATIONS for use in result.bounded_sizes)
    assert _uses(result)["aten::equal"] == ITERATIONS


def test_a_custom_op_with_a_dynamic_size_traces_once_it_has_a_rule():
    library = torch.library.Library("memcalc_bounded_tests", "DEF")
    library.define("keep(Tensor boxes, Tensor scores, float iou) -> Tensor")
    library.impl("keep", lambda boxes, scores, iou: torch.arange(boxes.size(0)), "CPU")

    @torch.library.register_fake("memcalc_bounded_tests::keep", lib=library)
    def _(boxes, scores, iou):
        size = torch.library.get_ctx().new_dynamic_size()   # no shape env: data-dependent
        return boxes.new_empty((size,), dtype=torch.int64)

    boxes = torch.empty(5, 4)
    with fake_cpu_mode(), BoundedOps():
        with pytest.raises(DATA_DEPENDENT_FAILURES, match="memcalc_bounded_tests.keep"):
            torch.ops.memcalc_bounded_tests.keep(boxes, torch.empty(5), 0.5)
    nms = bounded_rule("torchvision::nms")
    register_bounded("memcalc_bounded_tests::keep", nms.bound)(nms.make)
    with fake_cpu_mode(), BoundedOps() as bounded:
        kept = torch.ops.memcalc_bounded_tests.keep(torch.empty(5, 4), torch.empty(5), 0.5)
    assert kept.shape == (5,) and kept.dtype == torch.int64
    assert [(use.op, use.count) for use in bounded.uses()] == [("memcalc_bounded_tests::keep", 1)]


def test_a_rule_registered_twice_is_an_error():
    assert "aten::nonzero" in bounded_op_names()
    with pytest.raises(ValueError, match="'aten::nonzero' is registered already"):
        register_bounded("aten::nonzero", "again")(lambda tensor: tensor)


class _NeedsABincount(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        return self.linear(x) * torch.bincount(x.long().flatten()).shape[0]


def test_an_op_without_a_bound_still_fails_with_its_name():
    with pytest.raises(TraceError, match=r"real tensor values \(DynamicOutputShapeException: "
                                         r"aten\.bincount"):
        _trace(_NeedsABincount())


class _MismatchedMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(FEATURES + 1, 2))

    def forward(self, x):
        return x @ self.weight               # the meta kernel raises, torch logs it


def test_a_failing_meta_kernel_logs_no_traceback_during_the_trace(caplog):
    logger = "torch._subclasses.fake_tensor"
    with caplog.at_level(logging.ERROR, logger=logger):
        with fake_cpu_mode():                # outside a trace torch logs the failure
            with pytest.raises(RuntimeError):
                torch.empty(2, FEATURES) @ torch.empty(FEATURES + 1, 2)
        logged = len(caplog.records)
        with pytest.raises(TraceError, match="RuntimeError"):
            _trace(_MismatchedMatmul())
    assert logged >= 1 and len(caplog.records) == logged


def test_the_fake_tensor_logger_is_quiet_only_inside_the_context(caplog):
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    filters = list(logger.filters)
    with caplog.at_level(logging.ERROR, logger=logger.name):
        with quiet_fake_tensor_logger():
            logger.error("inside")
        logger.error("outside")
    assert [r.getMessage() for r in caplog.records] == ["outside"]
    assert logger.filters == filters
