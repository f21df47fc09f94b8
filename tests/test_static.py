"""Static model-state counts against closed forms (exact integers)."""

import pytest
import torch
from torch import nn

from memcalc.trace.optimizers import optimizer_rule
from memcalc.trace.precision import precision_policy
from memcalc.specs import Precision
from memcalc.model.inputs import InputTensor, ModelInputs
from memcalc.device.static import layer_table, static_estimate


def _model():
    # 3 parameter tensors: weight 64x32, bias 64, weight 10x64 -> N = 2048 + 64 + 640
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Linear(64, 10, bias=False))


N_LINEAR = 32 * 64 + 64 + 64 * 10
N_BN = 2 * 64  # BatchNorm affine weight and bias
N = N_LINEAR + N_BN
TENSORS = 5
BN_BUFFER_FLOATS = 2 * 64  # running mean and var (num_batches_tracked is int64)


def _static(optimizer, precision, batch_shape=(8, 32), batch_dtype=torch.float32):
    inputs = ModelInputs(InputTensor(None, batch_shape[1:], batch_dtype))
    return static_estimate(_model(), inputs, batch_shape[0], precision_policy(precision),
                           optimizer_rule(optimizer))


@pytest.mark.parametrize("optimizer,copies", [("sgd", 0), ("sgd-momentum", 1), ("adam", 2),
                                              ("adamw", 2), ("rmsprop", 1), ("adagrad", 1)])
def test_fp32_optimizer_state_is_copies_times_4n(optimizer, copies):
    static = _static(optimizer, Precision.FP32)
    assert static.parameter_bytes == 4 * N
    assert static.gradient_bytes == 4 * N
    assert static.optimizer_state_bytes == copies * 4 * N
    counters = 0 if optimizer.startswith("sgd") else 4 * TENSORS
    assert static.optimizer_step_counter_bytes == counters


def test_adamw_fp32_states_are_2n_times_4():
    assert _static("adamw", Precision.FP32).optimizer_state_bytes == 2 * N * 4


@pytest.mark.parametrize("precision", [Precision.BF16_MIXED, Precision.FP16_MIXED])
def test_mixed_precision_keeps_fp32_masters(precision):
    static = _static("adam", precision)
    # fp32 master parameters (4N) + fp32 grads (4N) + fp32 Adam moments (8N) = 16N
    assert static.parameter_bytes + static.gradient_bytes + static.optimizer_state_bytes == 16 * N
    pure = _static("adam", Precision.BF16)
    assert static.parameter_bytes - pure.parameter_bytes == 2 * N  # the masters' extra half


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP16])
def test_pure_half_precision_is_2_bytes_everywhere(precision):
    static = _static("adam", precision)
    assert (static.parameter_bytes, static.gradient_bytes, static.optimizer_state_bytes) == (
        2 * N, 2 * N, 2 * 2 * N)
    assert static.buffer_bytes == 2 * BN_BUFFER_FLOATS + 8


def test_buffers_and_input_batch():
    static = _static("sgd", Precision.FP32, batch_shape=(8, 32), batch_dtype=torch.float32)
    assert static.buffer_bytes == 4 * BN_BUFFER_FLOATS + 8  # + int64 num_batches_tracked
    assert static.input_batch_bytes == 8 * 32 * 4
    tokens = _static("sgd", Precision.FP32, batch_shape=(4, 512), batch_dtype=torch.int64)
    assert tokens.input_batch_bytes == 4 * 512 * 8


def test_model_state_total_is_the_sum_of_its_parts():
    static = _static("adam", Precision.FP32)
    assert static.model_state_bytes == (4 * N + 4 * BN_BUFFER_FLOATS + 8 + 4 * N + 8 * N
                                        + 4 * TENSORS)


def test_layer_table_rows_add_up_to_the_parameter_count():
    rows, leaf_elements, error = layer_table(
        _model(), ModelInputs(InputTensor(None, (32,), torch.float32)))
    assert error is None
    assert [row.name for row in rows] == ["0", "1", "2"]
    assert sum(row.parameter_count for row in rows) == N
    assert rows[0].output_shape == [1, 64]
    assert leaf_elements == 64 + 64 + 10
