"""Accuracy of models that only now trace (issue 16): memcalc's traced peak with
``device="cpu"`` (``report.device.peak_bytes``, as benchmarks.core compares) against a real CPU
training step measured by the profiler memory timeline (tests/fixtures/cpu_truth.py, with the
same call the tracer makes: named inputs, decoder ids, detection targets with valid boxes).

Environment (torchvision here only ships wheels built against CUDA torch, so its own venv):

    python -m venv /tmp/tvenv
    /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm monai transformers
    /tmp/tvenv/bin/pip install -e .
    /tmp/tvenv/bin/python -m benchmarks.newly_traced [NAME ...]

Expectation (README, "Accuracy against real CPU runs" / "Convolutional models on CPU"):
linear/attention models within 1 %; convolutional models carry the documented oneDNN gap.
Writes benchmarks/results-newly-traced.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from tests.fixtures.cpu_truth import measure_cpu_peak_bytes, spec_call_training_step

RESULTS = Path(__file__).with_name("results-newly-traced.md")
EM = "benchmarks.ecosystem_models:"


def swin_unetr_small():
    from monai.networks.nets import SwinUNETR
    return SwinUNETR(in_channels=1, out_channels=2, feature_size=12)


def _ids(length: int = 32) -> dict:
    return {"input_ids": ((length,), "int64")}


# name: (kind, spec fields)
CASES: dict[str, tuple[str, dict]] = {
    "hf Mixtral MoE (labels, loss=model)": ("linear", dict(
        model=EM + "hf_mixtral", inputs={**_ids(), "labels": ((32,), "int64")}, loss="model")),
    "hf Qwen2-MoE (labels, loss=model)": ("linear", dict(
        model=EM + "hf_qwen2_moe", inputs={**_ids(), "labels": ((32,), "int64")}, loss="model")),
    "hf T5 (decoder_input_ids, labels)": ("linear", dict(
        model=EM + "hf_t5", inputs={**_ids(), "decoder_input_ids": ((16,), "int64"),
                                    "labels": ((16,), "int64")}, loss="model")),
    "hf BART (decoder_input_ids, labels)": ("linear", dict(
        model=EM + "hf_bart", inputs={**_ids(), "decoder_input_ids": ((16,), "int64"),
                                      "labels": ((16,), "int64")}, loss="model")),
    "hf BERT (attention_mask, labels)": ("linear", dict(
        model=EM + "hf_bert", inputs={**_ids(), "attention_mask": ((32,), "int64"),
                                      "labels": ((32,), "int64")}, loss="model")),
    "hf CLIP (pixel_values, input_ids, return_loss)": ("patch conv", dict(
        model=EM + "hf_clip", inputs={"pixel_values": ((3, 224, 224), "float32"), **_ids(16)},
        forward_args={"return_loss": True}, loss="model")),
    "hf wav2vec2 (raw audio 16000)": ("convolutional", dict(
        model=EM + "hf_wav2vec2", sample_shape=(16000,), loss="sum")),
    "MONAI SwinUNETR 64^3 fs=12": ("convolutional", dict(
        model="benchmarks.newly_traced:swin_unetr_small", sample_shape=(1, 64, 64, 64),
        loss="mse")),
    "timm vit_tiny_patch16_224": ("linear", dict(
        model="timm:create_model", model_args={"model_name": "vit_tiny_patch16_224"},
        sample_shape=(3, 224, 224))),
    "timm convnext_atto 3x128x128": ("convolutional", dict(
        model="timm:create_model", model_args={"model_name": "convnext_atto"},
        sample_shape=(3, 128, 128))),
    "torchvision regnet_y_400mf 3x128x128": ("convolutional", dict(
        model="torchvision.models:regnet_y_400mf", sample_shape=(3, 128, 128))),
    "torchvision fasterrcnn_mobilenet_v3_large_320_fpn": ("convolutional", dict(
        model="torchvision.models.detection:fasterrcnn_mobilenet_v3_large_320_fpn",
        model_args={"weights": None, "weights_backbone": None}, sample_shape=(3, 320, 320),
        loss="model")),
}


def run_case(fields: dict, batch_size: int = 2) -> tuple[int, int, float]:
    spec = TrainingSpec(device="cpu", batch_size=batch_size, **fields)
    start = time.perf_counter()
    report = estimate(spec)
    if report.device.method != "traced":
        raise RuntimeError(f"static estimate: {getattr(report.device, 'static_reason', '')}")
    traced = report.device.peak_bytes
    truth = measure_cpu_peak_bytes(spec_call_training_step(spec, batch_size))
    return traced, truth, time.perf_counter() - start


def main(names: list[str]) -> None:
    rows = []
    for name, (kind, fields) in CASES.items():
        if names and not any(part in name for part in names):
            continue
        try:
            traced, truth, seconds = run_case(fields)
            row = [name, kind, f"{traced:,}", f"{truth:,}",
                   f"{100 * (traced - truth) / truth:+.2f} %", f"{seconds:.0f}"]
        except Exception as error:          # noqa: BLE001 - one failure does not stop the table
            row = [name, kind, "-", "-", f"failed: {type(error).__name__}: {str(error)[:120]}", "-"]
        print(" | ".join(row), flush=True)
        rows.append(row)
    header = ["model", "kind", "traced bytes", "measured bytes", "error", "seconds"]
    table = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                      + ["| " + " | ".join(row) + " |" for row in rows])
    if names:                               # a partial run does not overwrite the results
        print(table)
        return
    RESULTS.write_text(
        "# Newly traced models against a real CPU training step\n\n"
        "`python -m benchmarks.newly_traced` (batch 2, Adam, fp32, `device=\"cpu\"`). "
        "Expectation: linear/attention models within 1 %; convolutional models with the "
        "oneDNN gap the README documents.\n\n" + table + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
