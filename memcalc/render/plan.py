"""Terminal rendering of the strategy plan: the ranked table, the recommendation, launch.

By default the table fits an 80-column terminal: labels are abbreviated (a legend under the
table names each abbreviation), ``derived from …`` reads ``derived``, and the best
``NARROW_ROWS`` rows are shown; ``wide=True`` (``--wide``) shows full labels and every row."""

from __future__ import annotations

import re

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from memcalc.render.helpers import bullets
from memcalc.strategies.rank_candidates import RANK_METHOD
from memcalc.strategies.report import Candidate, StrategyPlan
from memcalc.units import format_bytes

NARROW_ROWS = 12
ABBREVIATIONS = {
    "baseline": ("base", "the job as given"),
    "mixed-precision": ("amp", "mixed precision (autocast)"),
    "checkpointing": ("ckpt", "activation checkpointing"),
    "offload": ("offl", "activations offloaded to host RAM (save_on_cpu)"),
    "compile": ("comp", "torch.compile"),
    "accumulation": ("accum", "gradient accumulation"),
    "ddp": ("DDP", "DistributedDataParallel"),
    "dataparallel": ("DP", "nn.DataParallel"),
    "zero1": ("Z1", "ZeRO stage 1 (optimizer state sharded)"),
    "zero2": ("Z2", "ZeRO stage 2 (+ gradients sharded)"),
    "fsdp": ("FSDP", "fully sharded data parallel"),
    "fsdp-offload": ("FSDPo", "FSDP2 with CPU offload (states in host RAM, the optimizer "
                              "step on the CPU)"),
    "pipeline": ("PP", "pipeline parallel"),
    "context-parallel": ("CP", "context parallel (×n: each sample's sequence split over a "
                               "group of n GPUs, ring attention; its batch is per group)"),
    "spatial": ("SP", "spatial split of each sample"),
}


def _whole_word(word: str, letters: str) -> re.Pattern:
    return re.compile(rf"(?<![{letters}]){re.escape(word)}(?![{letters}])")


_LONG = [(_whole_word(long, "a-z0-9-"), short) for long, (short, _) in ABBREVIATIONS.items()]
_SHORT = [(_whole_word(short, "A-Za-z0-9"), f"{short} {meaning}")
          for short, meaning in ABBREVIATIONS.values()]


def short_label(label: str) -> str:
    """``zero1 + mixed-precision+checkpointing`` → ``Z1+amp+ckpt``; unknown words stay."""
    compact = label.replace(" + ", "+")
    for pattern, short in _LONG:
        compact = pattern.sub(short, compact)
    return compact


def _legend(labels: list[str]) -> str:
    shortened = [short_label(label) for label in labels]
    return "; ".join(entry for pattern, entry in _SHORT
                     if any(pattern.search(label) for label in shortened))


def _method(candidate: Candidate, wide: bool) -> str:
    if wide:
        return candidate.method
    return ("slab" if candidate.method.startswith("traced slab") else
            "rank" if candidate.method.startswith(RANK_METHOD) else
            "derive" if candidate.method.startswith("derived") else "trace")


def samples_per_s_text(value: float) -> str:
    """A rate as read in a table: whole numbers from 100 up, else 3 significant digits."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"


def _batch(candidate: Candidate, wide: bool) -> str:
    if wide:
        return str(candidate.max_batch_size)
    return candidate.batch_text if candidate.fits else "NO"


_WIDE_COLUMNS = ["strategy", "GPUs", "per-GPU peak", "batch/GPU", "accum", "global", "step",
                 "samples/s", "fits", "method"]
_NARROW_COLUMNS = ["strategy", "GPUs", "peak/GPU", "batch/GPU", "global", "step",
                   "samples/s", "how"]
JOB_BATCH = "at job b"
"""The column of each candidate's per-GPU peak at the job's own batch (``--batch-size``)."""


def _columns(plan: StrategyPlan, wide: bool) -> list[str]:
    """The table's columns: with a job batch, its peak per GPU (narrow: in place of global)."""
    if plan.job_batch_size is None:
        return _WIDE_COLUMNS if wide else _NARROW_COLUMNS
    if wide:
        return [*_WIDE_COLUMNS[:3], JOB_BATCH, *_WIDE_COLUMNS[3:]]
    return [JOB_BATCH if column == "global" else column for column in _NARROW_COLUMNS]


def _job_batch_cell(candidate: Candidate, usable: int, wide: bool) -> str:
    peak = candidate.job_batch_peak_bytes
    if peak is None:
        return "-"
    return format_bytes(peak) + ("" if peak <= usable or not wide else " (does not fit)")


def _cells(candidate: Candidate, wide: bool, columns: list[str], usable: int) -> list[str]:
    cells = {"strategy": candidate.label if wide else short_label(candidate.label),
             "GPUs": str(candidate.gpus),
             "per-GPU peak": format_bytes(candidate.per_gpu_peak_bytes),
             "batch/GPU": _batch(candidate, wide), "accum": str(candidate.accumulation_steps),
             "global": str(candidate.global_batch_size), "step": _seconds(candidate.step_time_s),
             "samples/s": samples_per_s_text(candidate.samples_per_s),
             "fits": "yes" if candidate.fits else "NO", "method": _method(candidate, wide)}
    cells["peak/GPU"], cells["how"] = cells["per-GPU peak"], cells["method"]
    cells[JOB_BATCH] = _job_batch_cell(candidate, usable, wide)
    return [cells[column] for column in columns]


def _table(plan: StrategyPlan, shown: list[Candidate], wide: bool) -> Table:
    table = Table(title=f"Strategies (usable per GPU {format_bytes(plan.usable_bytes)}), best "
                        "first", title_justify="left",
                  **({} if wide else {"box": box.SIMPLE_HEAD, "padding": (0, 0, 0, 1), "show_edge": False,
                                      "pad_edge": False}))
    columns = _columns(plan, wide)
    for column in columns:
        table.add_column(column, no_wrap=not wide,
                         justify="left" if column in ("strategy", "method", "how") else "right")
    for candidate in shown:
        table.add_row(*_cells(candidate, wide, columns, plan.usable_bytes),
                      style="bold" if candidate.label == plan.recommended else None)
    return table


def plan_renderable(plan: StrategyPlan, wide: bool = False) -> Group:
    """The ranked strategies, the recommendation with its launch line, SLURM, assumptions."""
    listed = [c for c in plan.candidates if c.fits or c.gpus == 1 or c.label == plan.recommended]
    shown = listed if wide else listed[:NARROW_ROWS] + [
        c for c in listed[NARROW_ROWS:] if c.label == plan.recommended]
    table = _table(plan, shown, wide)
    recommended = plan.recommended if wide or plan.recommended is None else (
        f"{short_label(plan.recommended)} ({plan.recommended})")
    head = f"[bold]recommended: {recommended or 'none'}[/]\n{plan.reason}"
    if plan.torchrun:
        head += f"\n{plan.torchrun}"
    if plan.largest_sample_shape:
        head += (f"\nlargest sample that fits at batch 1 ({plan.largest_sample_strategy}): "
                 + ",".join(map(str, plan.largest_sample_shape)))
    captions = (["batch/GPU of SP×G: samples per group of G GPUs, each GPU a slab"]
                if any(c.spatial_parts > 1 for c in shown) else [])
    if any(c.context_parallel > 1 for c in shown):
        captions.append("batch/GPU and at job b of CP×G: per group of G GPUs, each GPU 1/G of "
                        "every sequence")
    if not wide:
        captions.append(_legend([c.label for c in shown]))
        if any(c.accumulation_steps > 1 for c in shown):
            captions.append("batch/GPU b×n: n micro-batches of b accumulated per step")
        if not all(c.fits for c in shown):
            captions.append("batch/GPU NO: not even one sample fits (peak at batch 1)")
        captions.append("how: trace (its own traced steps), rank (one rank of the job traced "
                        "with its wrappers), derive (closed form on the traced row of its "
                        "base), slab (one GPU's slab traced)")
    if plan.job_batch_size is not None:
        captions.append(f"{JOB_BATCH}: peak per GPU at the job's batch, "
                        f"{plan.job_batch_size} per GPU (--batch-size); above "
                        f"{format_bytes(plan.usable_bytes)} it does not fit")
    hidden = len(plan.candidates) - len(shown)
    if hidden:
        captions.append(f"{hidden} more candidates in --wide and --json"
                        if not wide else f"{hidden} distributed candidates that do not fit "
                        "are in --json")
    table.caption = "\n".join(captions) or None
    table.caption_justify = "left"
    parts = [table, Panel(head, title="memcalc plan", expand=False)]
    if plan.slurm:
        parts.append(Panel("\n".join(plan.slurm), title="SLURM (--emit slurm)", title_align="left"))
    parts.append(bullets("Plan assumptions", plan.assumptions))
    return Group(*parts)
