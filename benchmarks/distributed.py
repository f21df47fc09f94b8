"""One rank of a distributed job, traced, against the job run for real on a local gloo group:
every rank's peak (profiler allocation events, ``tests/fixtures/distributed_truth.py``) next
to memcalc's traced rank. Prints the table and writes benchmarks/results-distributed.md.

    python -m benchmarks.distributed
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import torch

from benchmarks.results import publish
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.device.batch_search import plan_batch
from memcalc.pipeline import _prepare
from tests.fixtures.distributed_truth import (MODELS, PIPELINE_LLAMA, SEQUENCE,
                                              measure_rank_peaks, traced_layout)
from tests.fixtures.published_distributed import GIB, PUBLISHED_OUTCOMES, PUBLISHED_RANKS

RESULTS = Path(__file__).with_name("results-distributed.md")
CASES = {
    2: [("gpt2", "ddp", 2, None, False, False),
        ("gpt2", "ddp-bucket-view", 2, None, False, False),
        ("gpt2", "ddp-static-graph", 2, None, False, False),
        ("gpt2", "ddp-small-buckets", 2, None, False, False),
        ("gpt2", "zero1", 2, None, False, False),
        ("gpt2", "zero2", 2, None, False, False),
        ("gpt2", "fsdp", 2, None, False, False), ("gpt2", "fsdp", 2, "bfloat16", False, False),
        ("gpt2", "fsdp", 4, None, True, False), ("gpt2", "fsdp", 2, None, False, True),
        ("llama_7b", "tp", 2, None, False, False), ("llama_7b", "tp-plain", 2, None, False, False),
        ("llama_7b", "pp-gpipe", 4, None, False, False),
        ("llama_7b", "pp-1f1b", 4, None, False, False),
        ("llama_7b", "pp-interleaved-1f1b", 4, None, False, False)],
    4: [("gpt2", "ddp", 2, None, False, False), ("gpt2", "fsdp", 2, None, False, False),
        ("gpt2", "fsdp", 2, "bfloat16", False, True), ("llama_7b", "tp", 2, None, False, False),
        ("llama_7b", "fsdp+tp", 2, None, False, False),
        ("llama_7b", "fsdp+tp-plain", 2, None, False, False),
        ("llama_7b", "pp-gpipe", 8, None, False, False),
        ("llama_7b", "pp-1f1b", 8, None, False, False)],
}
"""Ranks → (zoo model, strategy, local batch, param dtype, checkpointing, foreach Adam)."""


def traced(world: int, model: str, strategy: str, batch: int, param_dtype, checkpointing: bool,
           foreach: bool) -> int:
    layout = traced_layout(strategy, world, param_dtype)
    args = PIPELINE_LLAMA if strategy.startswith("pp-") else MODELS[model]
    report = estimate(TrainingSpec(model=model, model_args=args,
                                   sample_shape=(SEQUENCE,), device="cpu", batch_size=batch,
                                   activation_checkpointing=checkpointing,
                                   optimizer_impl="foreach" if foreach else "default",
                                   parallel=layout))
    return report.device.peak_bytes


def main() -> None:
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}; CPU, gloo. Regenerate with "
        "`python -m benchmarks.distributed`.",
        "",
        "Tiny zoo models (GPT-2: 4 blocks, dim 64, vocab 1000, tied head; LLaMA: 2 blocks, "
        f"dim 64, hidden 172), sequence {SEQUENCE}, Adam, two steps. Real ranks: every rank's "
        "peak of live tensor bytes from the profiler's allocation events (kernel and "
        "collective scratch left out). Trace: `memcalc estimate --device cpu --strategy …`.",
        "",
        "The ranks do the same work; a rank's measured figure can only come out high (a "
        "buffer that gloo's worker thread frees is not seen freed by the profiler), so the "
        "error is against the lowest rank. Pipeline ranks (`pp-…`: every rank a stage of a "
        "4-block LLaMA, one sample per microbatch) hold different stages: memcalc reports the "
        "largest, so the error is against the highest rank.",
        "",
        "| ranks | model | layout | local batch | traced rank (B) | real ranks (B) | "
        "error |",
        "|---:|---|---|---:|---:|---|---:|",
    ]
    for world, cases in CASES.items():
        for case, peaks in zip(cases, measure_rank_peaks(cases, world)):
            model, strategy, batch, param_dtype, checkpointing, foreach = case
            trace = traced(world, *case)
            layout = strategy + "".join(f", {extra}" for extra, on in (
                (f"param {param_dtype}", param_dtype), ("checkpointing", checkpointing),
                ("foreach Adam", foreach)) if on)
            truth = max(peaks) if strategy.startswith("pp-") else min(peaks)
            error = (trace - truth) / truth
            lines.append(f"| {world} | {model} | {layout} | {batch} | {trace:,} | "
                         f"{' / '.join(f'{peak:,}' for peak in peaks)} | {100 * error:+.2f} % |")
    lines += ["", "Published per-rank figures (the metric each source reports: peak reserved), "
              "with memcalc's traced rank at the same batch and its largest batch on the card:",
              "", "| job | source | reported | memcalc | error | largest batch (ran) |",
              "|---|---|---:|---:|---:|---:|"]
    for case in PUBLISHED_RANKS:
        step = _prepare(case.spec, None)
        report = step.device_report(case.spec.batch_size)
        largest = plan_batch(step.device_report, step.target.usable_bytes)[0].max_batch_size
        error = (report.peak_reserved_bytes - case.reserved_bytes) / case.reserved_bytes
        lines.append(f"| {case.name} | {case.source.split(' ')[0]} | "
                     f"{case.reserved_bytes / GIB:.1f} GiB | "
                     f"{report.peak_reserved_bytes / GIB:.1f} GiB | {100 * error:+.1f} % | "
                     f"{largest} ({case.ran_batch}) |")
    lines += ["", "Published outcomes (a local batch that trained, or ran out of memory), with "
              "memcalc's traced rank at that batch on the card's whole capacity "
              "(`tests/fixtures/published_distributed.py`):", "",
              "| job | source | published | memcalc (total per rank) | agrees |",
              "|---|---|---|---|---|"]
    for case in PUBLISHED_OUTCOMES:
        report = _prepare(case.spec, None).device_report(case.spec.batch_size)
        verdict = "fits" if report.fits else "does not fit"
        lines.append(f"| {case.name} | {case.source.split(' ')[0]} | "
                     f"{'ran' if case.ran else 'out of memory'} | "
                     f"{report.total_bytes / GIB:.1f} GiB of "
                     f"{case.spec.gpu_memory_bytes / GIB:.2f} GiB: {verdict} | "
                     f"{'yes' if report.fits is case.ran else 'NO'} |")
    publish(RESULTS, "memcalc distributed-job benchmark", lines)


if __name__ == "__main__":
    main()
