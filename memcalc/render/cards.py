"""Without ``--gpu``: the largest batch on each common card (``memcalc.device.card_fit``)."""

from __future__ import annotations

from rich.table import Table

from memcalc.device.report import DeviceReport
from memcalc.units import format_bytes


def batch_text(batch: int, confirmed: bool) -> str:
    """``9``, or ``~28`` where the batch comes from a line and was not traced."""
    return f"{batch}" if confirmed else f"~{batch}"


def cards_table(device: DeviceReport) -> Table:
    table = Table(title="Largest batch on common cards (no --gpu given)", title_justify="left",
                  caption="~ : from a line through traced batches, not traced at the batch "
                          "itself; --gpu NAME traces it", caption_justify="left")
    for column, justify in (("card", "left"), ("memory", "right"), ("usable", "right"),
                            ("largest batch", "right"), ("needs", "right")):
        table.add_column(column, justify=justify)
    for fit in device.card_fits:
        table.add_row(fit.gpu, format_bytes(fit.memory_bytes), format_bytes(fit.usable_bytes),
                      batch_text(fit.max_batch_size, fit.confirmed) if fit.max_batch_size
                      else "[bold red]none[/]", format_bytes(fit.total_bytes))
    return table


def cards_line(device: DeviceReport) -> str:
    """The table in one line, for the one-screen view."""
    shown = " · ".join(f"{fit.gpu} " + (batch_text(fit.max_batch_size, fit.confirmed)
                                         if fit.max_batch_size else "none")
                       for fit in device.card_fits)
    marked = any(not fit.confirmed for fit in device.card_fits)
    return (f"[bold]Largest batch[/] (no --gpu given): {shown}"
            + (" (~: from a line, not traced there)" if marked else ""))
