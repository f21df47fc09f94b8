"""Real GPU measurements published by others, with the training setup each one ran.

Each case names its source, hardware and versions, the spec that reproduces the setup, and
the measured figures in bytes (``None`` where the source does not give one). Sources print
MB as 10**6 bytes (optimum-benchmark) or MiB (pynvml ``used // 1024**2``), as noted.
"""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.specs import TrainingSpec

MB, MIB = 10**6, 2**20

OPTIMUM_ROCM = ("https://huggingface.co/datasets/optimum-benchmark/rocm — "
                "cuda_training_transformers_text-generation_openai-community/gpt2/benchmark_report.json")
OPTIMUM_CUDA = ("https://huggingface.co/datasets/optimum-benchmark/cuda — "
                "cuda_training_transformers_text-generation_openai-community/gpt2/benchmark_report.json")
HF_GUIDE = ("https://huggingface.co/docs/transformers/model_memory_anatomy and "
            "perf_train_gpu_one (v4.18-v4.38 text): print_gpu_utilization() after trainer.train()")


@dataclass(frozen=True)
class PublishedCase:
    name: str
    source: str
    hardware: str
    setup: str
    spec: TrainingSpec
    allocated_bytes: int | None
    reserved_bytes: int | None
    nvidia_smi_bytes: int | None
    note: str = ""


# optimum-benchmark's training scenario: HF Trainer, per_device_train_batch_size=2,
# sequence_length=16, random weights, default optim adamw_torch (foreach on CUDA), fp32.
_GPT2 = TrainingSpec(model="gpt2", sample_shape=(16,), batch_size=2, optimizer="adamw")
# The HF guide: bert-large-uncased for sequence classification, sequences of 512, Trainer of
# early 2022 (transformers' own for-loop AdamW, model.zero_grad() keeping zeroed gradients).
_BERT = TrainingSpec(model="bert_large", batch_size=4, optimizer="adamw",
                     optimizer_impl="for-loop", zero_grad_to_none=False,
                     cuda_module_loading="eager")

PUBLISHED_CASES = [
    PublishedCase(
        "gpt2 b2x16 fp32 AdamW (ROCm)", OPTIMUM_ROCM, "AMD MI250, torch 2.3.1+rocm5.7",
        "HF Trainer, transformers 4.42", _GPT2,
        allocated_bytes=int(2506.73664 * MB), reserved_bytes=int(2894.06976 * MB),
        nvidia_smi_bytes=None,
        note="ROCm runs the same caching allocator (HIPified); device total not comparable"),
    PublishedCase(
        "gpt2 b2x16 fp32 AdamW (CUDA)", OPTIMUM_CUDA, "NVIDIA GPU, torch 2.3.0+cu121",
        "HF Trainer, transformers 4.4x", _GPT2,
        allocated_bytes=None, reserved_bytes=int(2910.846976 * MB),
        nvidia_smi_bytes=int(3559.391232 * MB),
        note="the lazy-loading context row is taken from this case, so its total error "
             "equals its reserved error"),
    PublishedCase(
        "bert-large b4x512 fp32 AdamW", HF_GUIDE, "V100-SXM2-16GB, CUDA 11.2, driver 460",
        "HF Trainer (Jan 2022)", _BERT,
        allocated_bytes=None, reserved_bytes=None, nvidia_smi_bytes=14949 * MIB,
        note="the eager-loading context row (1343 MiB) is measured in the same guide"),
    PublishedCase(
        "bert-large b1x512 fp32 AdamW (grad. accumulation 4)", HF_GUIDE,
        "V100-SXM2-16GB, CUDA 11.2", "HF Trainer (Jan 2022)", _BERT.with_changes(batch_size=1),
        allocated_bytes=None, reserved_bytes=None, nvidia_smi_bytes=8681 * MIB,
        note="accumulation keeps gradients between micro-batches, as the traced step does"),
    PublishedCase(
        "bert-large b4x512 fp16-mixed AdamW", HF_GUIDE, "V100-SXM2-16GB, CUDA 11.2",
        "HF Trainer fp16=True (torch.cuda.amp)", _BERT.with_changes(precision="fp16-mixed"),
        allocated_bytes=None, reserved_bytes=None, nvidia_smi_bytes=13939 * MIB),
]
