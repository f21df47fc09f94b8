"""Rendering pieces shared by the terminal renderers (report, host, feed, plan)."""

from __future__ import annotations

from rich.panel import Panel


def bullets(title: str, lines: list[str]) -> Panel:
    """A titled panel with one ``•`` line per entry (assumptions, warnings, advice)."""
    return Panel("\n".join(f"• {line}" for line in lines), title=title, title_align="left")
