"""CUDA's SDPA backend choice (sdp_utils.cpp, select_sdp_backend) and the math kernel."""

import pytest
import torch
import torch.nn.functional as F

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace.sdpa_backend import AttentionCall, cuda_sdpa_backend, math_attention

H100, A100, A10, V100, T4 = (9, 0), (8, 0), (8, 6), (7, 0), (7, 5)


def call(dtype=torch.float16, head=64, head_v=None, seq_q=512, seq_k=512, mask=False,
         dropout=0.0, causal=False, grad=True):
    return AttentionCall(dtype, head, head_v or head, seq_q, seq_k, mask, dropout, causal, grad)


@pytest.mark.parametrize("attention, capability, backend", [
    (call(), H100, "cudnn"),                                  # cuDNN preferred on sm90
    (call(dropout=0.1), H100, "flash"),                       # 0.1 is not a multiple of 1/16
    (call(dropout=0.125), H100, "cudnn"),
    (call(head=256), H100, "flash"),                          # cuDNN limit 128 here
    (call(), A100, "flash"),
    (call(torch.bfloat16), A100, "flash"),
    (call(torch.float32), A100, "efficient"),                 # flash is half-only
    (call(mask=True), A100, "efficient"),                     # flash takes no mask
    (call(head=320), A100, "efficient"),                      # flash head dim <= 256
    (call(causal=True, seq_q=1, seq_k=512), A100, "efficient"),  # flash: causal needs square
    (call(head=200), A10, "efficient"),                       # sm86 training, 192 < d <= 224
    (call(head=200, grad=False), A10, "flash"),
    (call(head=240), A10, "flash"),                           # > 224 without dropout
    (call(head=240, dropout=0.1), A10, "efficient"),
    (call(), V100, "efficient"),                              # flash needs sm80
    (call(torch.bfloat16), V100, "math"),                     # efficient: bf16 needs sm80
    (call(torch.float16, head=36, mask=True), A100, "math"),   # half alignment 8
    (call(torch.float32, head=6), A100, "math"),              # float alignment 4 on sm80
    (call(torch.float32, head=6), V100, "efficient"),         # no tensor cores: alignment 1
    (call(torch.float16, head=36), T4, "math"),               # tensor cores: alignment 8
])
def test_backend_is_the_first_whose_checks_pass(attention, capability, backend):
    assert cuda_sdpa_backend(attention, capability) == backend


@pytest.mark.parametrize("options", [dict(), dict(is_causal=True), dict(scale=0.3),
                                     dict(attn_mask="bool"), dict(attn_mask="float")])
def test_math_attention_computes_attention(options):
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    mask = options.pop("attn_mask", None)
    if mask == "bool":
        options["attn_mask"] = torch.rand(5, 5) > 0.3
        options["attn_mask"][:, 0] = True
    elif mask == "float":
        options["attn_mask"] = torch.randn(5, 5, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, **options)
    torch.testing.assert_close(math_attention(q, k, v, **options, dropout=None), expected)


BATCH, SEQ, HEADS = 2, 256, 4


def test_math_backend_keeps_the_probabilities_and_a_one_byte_mask():
    # head dim 6 in float32: the memory-efficient kernel needs it divisible by 1 on a V100
    # (no tensor cores for float32) but by 4 on an A100, where CUDA falls back to math
    spec = TrainingSpec(model="tests.fixtures.models:attention_with_dropout",
                        model_args={"dim": 24}, sample_shape=(SEQ, 24), loss="sum",
                        optimizer="sgd", batch_size=BATCH)
    fused = estimate(spec.with_changes(gpu="V100-16GB")).device
    math = estimate(spec.with_changes(gpu="A100-80GB")).device
    assert fused.attention_backends == {"efficient": 2} and math.attention_backends == {"math": 2}
    square, rows, head = BATCH * HEADS * SEQ * SEQ, BATCH * HEADS * SEQ, BATCH * HEADS * SEQ * 6
    # math keeps the softmax output and the dropped probabilities (fp32) and the bool dropout
    # mask, plus q and k scaled by sqrt(scale) and v made contiguous for bmm (3 head-sized
    # fp32 copies); the fused kernel keeps q, k, v as views of the qkv projection (also 3
    # head-sized), its output, one fp32 log-sum-exp per row and its RNG seed and offset (two
    # int64 scalars, which CUDA keeps on the host and the fake kernel makes beside the rest)
    expected = square * (4 + 1 + 4) - head * 4 - rows * 4 - 2 * 8
    difference = math.breakdown.activations - fused.breakdown.activations
    # the fused step peaks while the 4-byte summed loss is still alive, the math one after
    assert difference in (expected, expected - 4)
