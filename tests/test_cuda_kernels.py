import pytest

from memcalc.cuda_kernels import cuda_substitute, substituted_functions
from memcalc.estimate import estimate
from memcalc.specs import TrainingSpec

BATCH, SEQ, HEADS = 2, 256, 4


def test_sdpa_with_dropout_keeps_no_attention_matrix_on_cuda():
    spec = TrainingSpec(model="tests.models_for_tests:attention_with_dropout",
                        sample_shape=(SEQ, 64), loss="sum", optimizer="sgd", batch_size=BATCH)
    on_cpu = estimate(spec.with_changes(device="cpu")).device
    on_cuda = estimate(spec).device
    probabilities = BATCH * HEADS * SEQ * SEQ * 4
    # CPU's math kernel keeps three S x S fp32 tensors for backward (the probabilities, the
    # scaled float dropout mask, the dropped probabilities); CUDA's kernels keep instead one
    # fp32 log-sum-exp per row (the output is kept by both)
    log_sum_exp = BATCH * HEADS * SEQ * 4
    difference = on_cpu.breakdown.activations - on_cuda.breakdown.activations
    assert difference == 3 * probabilities - log_sum_exp


def test_double_registration_is_an_error():
    import torch.nn.functional as F

    assert "scaled_dot_product_attention" in substituted_functions()
    with pytest.raises(ValueError, match="registered already"):
        cuda_substitute(F.scaled_dot_product_attention)(lambda *a, **k: None)
