"""Without ``--gpu``: the largest batch on each common card (``memcalc.device.card_fit``)."""

from __future__ import annotations

from rich.table import Table

from memcalc.device.report import DeviceReport
from memcalc.units import format_bytes


def batch_text(batch: int, confirmed: bool, upper: int | None = None) -> str:
    """``9``, or ``~28–43`` where the batch comes from lines and was not traced there."""
    if confirmed:
        return f"{batch}"
    return f"~{batch}" + (f"–{upper}" if upper and upper > batch else "")


def cards_table(device: DeviceReport) -> Table:
    table = Table(title="Largest batch on common cards (no --gpu given)", title_justify="left",
                  caption="~low–high: not traced at the batch itself; low keeps the allocator's "
                          "reserve as traced, high is where the allocated bytes alone fill the "
                          "card; --gpu NAME traces it", caption_justify="left")
    for column, justify in (("card", "left"), ("memory", "right"), ("usable", "right"),
                            ("largest batch", "right"), ("needs", "right")):
        table.add_column(column, justify=justify)
    for fit in device.card_fits:
        table.add_row(fit.gpu, format_bytes(fit.memory_bytes), format_bytes(fit.usable_bytes),
                      batch_text(fit.max_batch_size, fit.confirmed, fit.upper_batch_size)
                      if fit.max_batch_size
                      else "[bold red]none[/]", format_bytes(fit.total_bytes))
    return table


def cards_line(device: DeviceReport) -> str:
    """The table in one line, for the one-screen view."""
    shown = " · ".join(f"{fit.gpu} " + (batch_text(fit.max_batch_size, fit.confirmed,
                                                    fit.upper_batch_size)
                                         if fit.max_batch_size else "none")
                       for fit in device.card_fits)
    marked = any(not fit.confirmed for fit in device.card_fits)
    return (f"[bold]Largest batch[/] (no --gpu given): {shown}"
            + (" (~: between lines, not traced there; --details)" if marked else ""))
