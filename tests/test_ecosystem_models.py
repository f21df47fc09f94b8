"""Real models from Hugging Face transformers and MONAI, built from small configs: each trace
(no static fallback), and their parameters are the real model's, tied weights once."""

import pytest

import memcalc
from tests.fixtures import ecosystem_models

pytest.importorskip("transformers")
pytest.importorskip("monai")
pytest.importorskip("einops")

CASES = {
    "t5 fed only encoder ids": ("t5_small_config", dict(sample_shape=(32,), input_dtype="int64")),
    "t5 with labels, its own loss": ("t5_small_config", dict(
        sample_shape=(32,), input_dtype="int64", loss="model",
        inputs={"labels": ((16,), "int64")})),
    "bert with an attention mask": ("bert_small_config", dict(
        sample_shape=(32,), input_dtype="int64", inputs={"attention_mask": ((32,), "int64")})),
    "SwinUNETR (constructor .item())": ("swin_unetr_small", dict(sample_shape=(1, 64, 64, 64),
                                                                 loss="mse")),
    "wav2vec2 on raw audio": ("wav2vec2_small_config", dict(sample_shape=(4000,), loss="sum")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_real_models_trace_with_their_real_parameter_count(case):
    factory, options = CASES[case]
    report = memcalc.estimate(f"tests.fixtures.ecosystem_models:{factory}", batch_size=2,
                              device="cpu", **options)
    assert report.device.method == "traced", report.unsupported
    real = getattr(ecosystem_models, factory)()
    assert report.model.parameter_count == sum(p.numel() for p in real.parameters())
