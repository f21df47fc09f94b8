"""A model that only now traces (issue 16: grouped_mm MoE, named inputs, --loss model) held to
its real CPU training step, within the README's tolerance for linear/attention models (1 %)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from tests.fixtures.cpu_truth import measure_cpu_peak_bytes, spec_call_training_step


def test_tiny_mixtral_moe_matches_its_real_cpu_step():
    spec = TrainingSpec(model="benchmarks.ecosystem_models:hf_mixtral", device="cpu",
                        batch_size=2, loss="model",
                        inputs={"input_ids": ((32,), "int64"), "labels": ((32,), "int64")})
    report = estimate(spec)
    assert report.device.method == "traced"
    truth = measure_cpu_peak_bytes(spec_call_training_step(spec, 2))
    assert abs(report.device.peak_bytes - truth) <= 0.01 * truth
