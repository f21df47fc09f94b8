"""The plan table in an 80-column terminal: nothing cut, every label distinct, a legend for
every abbreviation; ``wide`` shows the full labels and every candidate."""

import re

import pytest
from rich.console import Console

from memcalc.render.plan import ABBREVIATIONS, NARROW_ROWS, plan_renderable, short_label
from memcalc.render.verdict import plan_verdict
from memcalc.strategies import ClusterSpec
from memcalc.strategies.report import Candidate, StrategyPlan
from memcalc.strategies.specs import Strategy

BASES = ["baseline", "mixed-precision", "checkpointing", "mixed-precision+checkpointing",
         "mixed-precision+offload", "accumulation"]
SHARDED = ["zero1", "zero2", "ddp", "dataparallel", "fsdp", "pipeline", "spatial×16"]


def _candidate(label: str, gpus: int, fits: bool = True, accumulation: int = 1) -> Candidate:
    strategy = Strategy(label.split(" + ")[0].split("×")[0])
    return Candidate(
        strategy=strategy, label=label, gpus=gpus, spatial_parts=16 if "spatial" in label else 1,
        method="traced" if gpus == 1 else f"derived from {label.split(' + ')[-1]}",
        per_gpu_peak_bytes=151_234_567_890 if fits else 1_234_567_890_123,
        max_batch_size=1234 if fits else 0, accumulation_steps=accumulation,
        global_batch_size=1234 * accumulation * gpus, flops_per_step=1e15, compute_s=12.3,
        communication_s=0.5, step_time_s=12.8, samples_per_s=12345.6, fits=fits, notes=[])


def _plan(recommended: str | None = "fsdp + mixed-precision+checkpointing") -> StrategyPlan:
    candidates = [_candidate(base, 1, fits=base != "baseline") for base in BASES]
    candidates += [_candidate(f"{sharded} + {base}", 1024, accumulation=16)
                   for sharded in SHARDED for base in BASES]
    return StrategyPlan(cluster=ClusterSpec(gpus_per_node=8, nodes=128), usable_bytes=150 << 30,
                        candidates=candidates, recommended=recommended,
                        reason="a reason that is long enough to wrap in a narrow terminal " * 3,
                        torchrun="torchrun --nnodes=128 --nproc-per-node=8 train.py", slurm=None,
                        assumptions=["an assumption"])


def _lines(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def test_every_label_shortens_to_a_distinct_name():
    labels = [c.label for c in _plan().candidates]
    assert len({short_label(label) for label in labels}) == len(labels)
    assert short_label("zero1 + mixed-precision+checkpointing") == "Z1+amp+ckpt"
    assert short_label("spatial×16 + mixed-precision+offload") == "SP×16+amp+offl"


def test_the_table_reads_at_80_columns():
    plan = _plan()
    lines = _lines(plan_renderable(plan), 80)
    assert all(len(line) <= 80 for line in lines)
    assert not any("…" in line for line in lines)
    text = "\n".join(lines)
    rows = [line.split()[0] for line in lines if re.match(r"\S+ +\d+ +[\d.]+ [KMGT]iB ", line)]
    shown = [c for c in plan.candidates if c.fits or c.gpus == 1][:NARROW_ROWS]
    assert rows == [short_label(c.label) for c in shown] + [short_label(plan.recommended)]
    header = next(line for line in lines if line.startswith("strategy"))
    assert header.split() == ["strategy", "GPUs", "peak/GPU", "batch/GPU", "global", "step",
                                "samples/s", "how"]
    assert " NO " in lines[lines.index(header) + 2] and "not even one sample fits" in " ".join(text.split())
    legend = " ".join(text.split())
    used = {word for row in rows for word in re.split("[+×]", row) if not word.isdigit()}
    for long, (short, meaning) in ABBREVIATIONS.items():
        assert (f"{short} {meaning}" in legend) == (short in used), long
    assert "1234×16" in text and "derive" in text and f"{len(plan.candidates) - len(rows)} more candidates" in legend


@pytest.mark.parametrize("recommended", ["fsdp + mixed-precision+checkpointing", None])
def test_wide_shows_full_labels_and_every_fitting_candidate(recommended):
    plan = _plan(recommended)
    text = "\n".join(_lines(plan_renderable(plan, wide=True), 250))
    for candidate in plan.candidates:
        assert (candidate.label in text) == (candidate.fits or candidate.gpus == 1)
    assert "derived from mixed-precision+offload" in text


def test_the_verdict_names_the_recommendation_or_says_nothing_fits():
    assert plan_verdict(_plan()).startswith(
        "PLAN: FSDP+amp+ckpt on 1024 GPUs: batch 1234/GPU needs 140.85 GiB / 150.00 GiB usable")
    assert plan_verdict(_plan(None)) == "NOTHING FITS: " + _plan(None).reason
