"""The trace on the line through two traces: figure for figure the trace made there (a real
traced step on the CPU wheel, for a CUDA card's cuDNN workspaces), and no line where two
traces differ in more than numbers affine in the batch."""

from __future__ import annotations

import pytest

from memcalc.api import training_spec
from memcalc.pipeline import _prepare
from memcalc.trace.affine_trace import affine_trace
from memcalc.trace.categories import MemoryCategory
from memcalc.trace.ledger import MemoryLedger, Phase
from memcalc.trace.tracer import TraceResult


def _trace(sizes: list[int], batch: int, category=MemoryCategory.ACTIVATION,
           ops: frozenset = frozenset({"mm"})) -> TraceResult:
    ledger = MemoryLedger()
    records = [ledger.allocate(size, Phase.FORWARD, 1, "layer", category) for size in sizes]
    ledger.free(records[0])
    return TraceResult(ledger, (batch, 2), ops, None)


def test_the_line_gives_each_storage_its_bytes_and_recomputes_the_peak():
    line = affine_trace(1, _trace([108, 64], 1), 3, _trace([124, 64], 3))
    at_ten = line.at(10)
    assert [record.nbytes for record in at_ten.ledger.records] == [180, 64]
    assert [event.delta_bytes for event in at_ten.ledger.events] == [180, 64, -180]
    assert at_ten.ledger.peak_bytes == 244 and at_ten.ledger.live_bytes == 64
    assert at_ten.output_shape == (10, 2)
    assert line.matches(10, _trace([180, 64], 10))
    assert not line.matches(10, _trace([180, 65], 10))


@pytest.mark.parametrize("other", [
    _trace([133, 64], 4),                                   # 25 bytes over 3 samples
    _trace([132], 4),                                       # a storage fewer
    _trace([132, 64], 4, MemoryCategory.TEMPORARY),         # another role
])
def test_no_line_where_the_traces_differ_in_more_than_whole_bytes_per_sample(other):
    assert affine_trace(1, _trace([108, 64], 1), 4, other) is None


def test_op_names_no_report_reads_do_not_break_the_line():
    """``empty_strided`` is named at batch 1 only (another path to the same storages): no
    report reads it, so the line holds; the line names what either trace ran."""
    low = _trace([108, 64], 1, ops=frozenset({"mm", "empty_strided"}))
    line = affine_trace(1, low, 3, _trace([124, 64], 3))
    assert line is not None
    assert line.at(10).op_names == {"mm", "empty_strided"}
    assert line.matches(10, _trace([180, 64], 10))


@pytest.mark.parametrize("ops", [frozenset(), frozenset({"mm", "convolution"}),
                                 frozenset({"mm", "ctc_loss"})])   # cuBLAS, cuDNN, autocast audit
def test_no_line_where_the_traces_differ_in_an_op_a_report_reads(ops):
    assert affine_trace(1, _trace([108, 64], 1), 3, _trace([124, 64], 3, ops=ops)) is None
    line = affine_trace(1, _trace([108, 64], 1), 3, _trace([124, 64], 3))
    assert not line.matches(10, _trace([180, 64], 10, ops=ops))


@pytest.fixture(scope="module")
def conv_step():
    spec = training_spec("tests.fixtures.compiled_models:conv_bn_relu", (3, 32, 32),
                         gpu="A100-80GB", model_args={"channels": 16, "depth": 3})
    return _prepare(spec, None)


def test_a_conv_step_on_the_line_is_the_step_traced_there(conv_step):
    traces = {batch: conv_step._trace(batch, real=True) for batch in (1, 4, 11)}
    line = affine_trace(1, traces[1], 4, traces[4])
    assert line is not None
    # cuDNN's workspaces come from their rule (capped and rounded, not affine in the batch)
    assert traces[11].sized_records
    workspace = {record.record_id: record.nbytes for record in traces[11].ledger.records
                 if record.category is MemoryCategory.WORKSPACE}
    assert workspace and set(traces[11].sized_records) <= set(workspace)
    assert line.at(11) == traces[11]
    assert line.at(11).ledger.peak_bytes == traces[11].ledger.peak_bytes


def test_a_step_with_a_batch_by_batch_tensor_is_off_any_line():
    prepared = _prepare(training_spec("tests.fixtures.models:gram", (64,)), None)
    traces = {batch: prepared._trace(batch, real=True) for batch in (1, 2, 5)}
    line = affine_trace(1, traces[1], 2, traces[2])
    assert line is None or not line.matches(5, traces[5])


def _freed_in_order(batch: int, order: tuple[int, int]) -> TraceResult:
    ledger = MemoryLedger()
    records = [ledger.allocate(size, Phase.FORWARD, 1, "layer", MemoryCategory.ACTIVATION)
               for size in (8 * batch, 16 * batch, 4)]
    for index in order:                     # freed together, in either order
        ledger.free(records[index])
    ledger.allocate(2 * batch, Phase.BACKWARD, 1, "layer", MemoryCategory.ACTIVATION)
    return TraceResult(ledger, (batch, 2), frozenset(), None)


def test_storages_freed_together_in_another_order_are_on_the_line():
    line = affine_trace(1, _freed_in_order(1, (0, 1)), 3, _freed_in_order(3, (1, 0)))
    assert line is not None
    assert line.matches(7, _freed_in_order(7, (1, 0))) and line.matches(7, _freed_in_order(7, (0, 1)))
    assert line.at(7).ledger.peak_bytes == 8 * 7 + 16 * 7 + 4


def test_cuda_embedding_scratch_is_sized_by_its_rule_past_the_vocabulary():
    """``min(lookups, vocabulary)`` and ``lookups // 10``: not affine, recomputed by rule."""
    spec = training_spec("gpt2", (64,), gpu="A100-80GB",
                         model_args={"depth": 1, "dim": 64, "heads": 2, "vocab": 5000})
    prepared = _prepare(spec, None)
    traces = {batch: prepared._trace(batch, real=True) for batch in (61, 71, 91)}
    line = affine_trace(61, traces[61], 71, traces[71])
    assert any(traces[91].sized_records.values())
    assert line is not None and line.matches(91, traces[91])  # 64 × 91 lookups > 5000 words


def test_an_lm_below_the_direct_kernel_threshold_is_on_the_line_above_it():
    """64 tokens a sample: batches 1–48 take CUDA's direct embedding kernel (≤ 3,072 lookups,
    no scratch), larger ones its sort path. The empty scratch records hold their place, so
    the line through batches 1 and 60 is each real trace, on either side of the threshold."""
    spec = training_spec("gpt2", (64,), gpu="A100-80GB",
                         model_args={"depth": 1, "dim": 64, "heads": 2, "vocab": 5000})
    prepared = _prepare(spec, None)
    traces = {batch: prepared._trace(batch, real=True) for batch in (1, 60, 48, 49)}
    line = affine_trace(1, traces[1], 60, traces[60])
    assert line is not None
    empty = [traces[48].ledger.records[key].nbytes for key in traces[48].sized_records]
    assert empty and not any(empty)                  # 48 × 64 = 3,072 lookups: direct kernel
    # the token embedding sorts 49 × 64 lookups; the position embedding's 64 stay direct
    assert any(traces[49].ledger.records[key].nbytes for key in traces[49].sized_records)
    assert line.matches(48, traces[48]) and line.matches(49, traces[49])


def test_a_zero2_rank_at_batch_1_is_on_the_line():
    """FSDP2 as ZeRO-2 makes one gradient by ``empty_strided`` in a rank's first trace only
    (DTensor's caches are cold there; later traces of the same rank keep them), the same
    storages as the others: the line through batches 1 (traced first) and 8 is the rank
    traced at batch 5, figure for figure. Each trace runs its optimizer steps (a replay of
    the first trace's would carry its op names to the others)."""
    from memcalc.trace._torch_internals import _forget_dtensor_shardings
    from memcalc.trace.step_replay import forget_recordings

    def traced(batch):
        forget_recordings()
        return prepared._trace(batch, real=True)

    spec = training_spec("llama_7b", (256,), gpu="H100-80GB",
                         parallel={"strategy": "zero2", "gpus_per_node": 8},
                         model_args={"dim": 64, "depth": 2, "heads": 4, "hidden": 172})
    prepared = _prepare(spec, None)
    _forget_dtensor_shardings()
    traces = {batch: traced(batch) for batch in (1, 8, 5)}
    assert traces[1].op_names != traces[8].op_names      # the case this test is about
    line = affine_trace(1, traces[1], 8, traces[8])
    assert line is not None and line.matches(5, traces[5])
