"""Terminal rendering of the strategy plan: the ranked table, the recommendation, launch."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from memcalc.render.helpers import bullets
from memcalc.strategies.report import StrategyPlan
from memcalc.units import format_bytes


def plan_renderable(plan: StrategyPlan) -> Group:
    """The ranked strategies, the recommendation with its launch line, SLURM, assumptions."""
    table = Table(title=f"Strategies (usable per GPU {format_bytes(plan.usable_bytes)}), best "
                        "first", title_justify="left")
    for column in ("strategy", "GPUs", "per-GPU peak", "batch/GPU", "accum", "global",
                   "step", "samples/s", "fits", "method"):
        table.add_column(column, justify="left" if column in ("strategy", "method") else "right")
    shown = [c for c in plan.candidates if c.fits or c.gpus == 1 or c.label == plan.recommended]
    for candidate in shown:
        style = "bold" if candidate.label == plan.recommended else None
        table.add_row(candidate.label, str(candidate.gpus),
                      format_bytes(candidate.per_gpu_peak_bytes), str(candidate.max_batch_size),
                      str(candidate.accumulation_steps), str(candidate.global_batch_size),
                      f"{candidate.step_time_s:.3g} s", f"{candidate.samples_per_s:,.2f}",
                      "yes" if candidate.fits else "NO", candidate.method, style=style)
    head = f"[bold]recommended: {plan.recommended or 'none'}[/]\n{plan.reason}"
    if plan.torchrun:
        head += f"\n{plan.torchrun}"
    if plan.largest_sample_shape:
        head += (f"\nlargest sample that fits at batch 1 ({plan.largest_sample_strategy}): "
                 + ",".join(map(str, plan.largest_sample_shape)))
    hidden = len(plan.candidates) - len(shown)
    captions = (["batch/GPU of spatial×G: samples per group of G GPUs, each GPU a slab"]
                if any(c.spatial_parts > 1 for c in shown) else [])
    if hidden:
        captions.append(f"{hidden} distributed candidates that do not fit are in --json")
    table.caption = "; ".join(captions) or None
    parts = [table, Panel(head, title="memcalc plan", expand=False)]
    if plan.slurm:
        parts.append(Panel("\n".join(plan.slurm), title="SLURM (--emit slurm)", title_align="left"))
    parts.append(bullets("Plan assumptions", plan.assumptions))
    return Group(*parts)
