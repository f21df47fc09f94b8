"""Benchmarks print their table and keep it as markdown next to themselves."""

from __future__ import annotations

from pathlib import Path


def publish(path: Path, title: str, lines: list[str]) -> None:
    text = "\n".join(lines)
    print(text)
    path.write_text(f"# {title}\n\n{text}\n")
