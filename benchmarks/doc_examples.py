"""The documentation's examples, run against the current tool: ``python -m benchmarks.doc_examples``.

Pages: ``README.md`` and every page under ``docs/``. Two kinds of example are run:

- a fenced block whose first line is ``$ memcalc …`` (``\\`` continues a line), at 80 columns.
  Its output is the same excerpt of the new output: from the line that matches the old
  excerpt's first line to the one that matches its last line (the k-th such line when the old
  excerpt holds k of them), lines compared with their digits masked (a box's bottom edge
  matches any bottom edge of the same kind). A command that fails with an ``Error:`` line shows
  that line (standard error);
- a ```` ```python ```` block followed by a ```` ```text ```` block: the code is run in a fresh
  interpreter and the text block is what it prints.

A line ``<!-- measured: … -->`` just before a block (times and memory measured on this
machine, which vary from run to run) checks that the command still prints that excerpt (its
first and last lines found, digits aside) within four lines of its length, not its words (a
forecast measured beside other load can head with a range that takes three more lines);
``<!-- not run: … -->`` leaves a block alone (a GPU needed). Without arguments the pages are rewritten with the new outputs; ``--check`` writes
nothing, prints each difference and exits 1 when there is one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = "```"
WIDTH = 80
COMMAND_TIMEOUT_S = 900
MEASURED = "<!-- measured"
MEASURED_LINES_SLACK = 4
NOT_RUN = "<!-- not run"
_DIGITS = re.compile(r"[0-9][0-9.,]*")
_RULES = re.compile(r"[─━═]+")


def pages() -> list[Path]:
    """The README and the documentation site's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _mask(line: str) -> str:
    """The line with its digits masked and its horizontal rules one character long (a box's
    width follows the terminal and its content)."""
    return _RULES.sub("─", _DIGITS.sub("#", line)).strip()


def _opens(old_first: str, line: str) -> bool:
    """``line`` can open the excerpt that ``old_first`` opened: the same line with its digits
    masked, or the same verdict word(s) before the first colon (``PLAN:``, ``FITS in host
    RAM:``) when the verdict's own words changed."""
    if _mask(line) == _mask(old_first):
        return True
    head = old_first.split(":", 1)[0]
    return ":" in old_first and head.split()[0].isupper() and line.startswith(head + ":")


def _command(lines: list[str]) -> tuple[str, int]:
    """The shell command the block starts with and how many lines it takes."""
    text, used = "", 0
    for line in lines:
        used += 1
        text += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(text.split()).removeprefix("$ "), used


def _closes(old_last: str, line: str) -> bool:
    """``line`` can close the excerpt that ``old_last`` closed: the same line with its digits
    masked, or any box's bottom edge when ``old_last`` is one (a box's width follows its
    content)."""
    edge = old_last.lstrip()[:1]
    if edge in ("╰", "└"):
        return line.lstrip()[:1] == edge
    return _mask(line) == _mask(old_last)


def _excerpt(old: list[str], new: list[str]) -> list[str] | None:
    """The part of ``new`` that plays ``old``'s part, or None when it is not found."""
    if not old:
        return new
    start = next((i for i, line in enumerate(new) if _opens(old[0], line)), None)
    if start is None:
        return None
    ends_needed = sum(1 for line in old[1:] if _closes(old[-1], line)) or 1
    seen = 0
    for j in range(start + (len(old) > 1), len(new)):
        if _closes(old[-1], new[j]):
            seen += 1
            if seen == ends_needed:
                return new[start:j + 1]
    return None


def _environment() -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(WIDTH), "TERM": "dumb", "PYTHONPATH": str(ROOT)}


def _run(command: str) -> tuple[list[str] | None, str]:
    """The command's output lines (its ``Error:`` line when it refused), or None and why."""
    argv = shlex.split(command)
    try:
        done = subprocess.run([sys.executable, "-m", "memcalc", *argv[1:]], capture_output=True,
                              text=True, env=_environment(), timeout=COMMAND_TIMEOUT_S,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {COMMAND_TIMEOUT_S} s"
    if done.returncode in (0, 1, 3):     # done, does not fit, static: all have output
        return [line.rstrip() for line in done.stdout.splitlines()], ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    if errors:
        return errors, ""
    return None, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"


def _run_python(code: str) -> tuple[list[str] | None, str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_environment(), timeout=COMMAND_TIMEOUT_S, cwd=ROOT)
    if done.returncode != 0:
        return None, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return [line.rstrip() for line in done.stdout.splitlines()], ""


@dataclass
class Example:
    """One example block: where its shown output lies in the page and how it is checked."""

    label: str            # the command, or the first line of the Python code
    output_start: int     # index of the first output line in the page's lines
    output_end: int       # index of the closing fence
    new: list[str] | None
    why: str
    measured: bool


def _examples(lines: list[str], run: bool = True) -> list[Example]:
    """The page's example blocks, each run when ``run`` (else ``new`` is None)."""
    found, index = [], 0
    while index < len(lines):
        marker = lines[index - 1] if index else ""
        line = lines[index]
        index += 1
        if not line.startswith(FENCE) or index >= len(lines):
            continue
        end = lines.index(FENCE, index)
        if marker.startswith(NOT_RUN):
            index = end + 1
            continue
        measured = marker.startswith(MEASURED)
        if line.strip() == FENCE and lines[index].startswith("$ memcalc"):
            command, used = _command(lines[index:end])
            new, why = _run(command) if run else (None, "")
            found.append(Example(command, index + used, end, new, why, measured))
        elif line.strip() == FENCE + "python" and end + 2 < len(lines) and \
                lines[end + 1] == "" and lines[end + 2] == FENCE + "text":
            output_end = lines.index(FENCE, end + 3)
            new, why = _run_python("\n".join(lines[index:end])) if run else (None, "")
            found.append(Example(lines[index], end + 3, output_end, new, why, measured))
            end = output_end
        index = end + 1
    return found


def _shown(example: Example, old: list[str]) -> list[str] | None:
    """What the block should show now: the new excerpt (the whole output of Python, the
    ``Error:`` line of a refusal)."""
    if example.new is None:
        return None
    refused = example.new[:1] and example.new[0].startswith("Error:")
    if example.label.startswith("memcalc") and not refused:
        return _excerpt(old, example.new)
    return example.new


def regenerate(text: str) -> tuple[str, list[str]]:
    """The page with every example block's output regenerated, and what was reported."""
    lines, notes = text.splitlines(), []
    for example in reversed(_examples(lines)):
        old = lines[example.output_start:example.output_end]
        shown = _shown(example, old)
        if shown is None:
            notes.append(f"kept: {example.label} ({example.why or 'excerpt not found'})")
        elif shown != old:
            notes.append(f"regenerated: {example.label}")
            lines[example.output_start:example.output_end] = shown
    return "\n".join(lines) + "\n", notes[::-1]


def differences(text: str) -> list[str]:
    """Each example whose shown output no longer matches the tool (a measured one: no longer
    found, or longer or shorter by more than the slack), named with its label and the first
    line that differs."""
    lines, found = text.splitlines(), []
    for example in _examples(lines):
        old = lines[example.output_start:example.output_end]
        shown = _shown(example, old)
        if shown is None:
            found.append(f"{example.label}: {example.why or 'excerpt not found'}")
            continue
        same = (abs(len(shown) - len(old)) <= MEASURED_LINES_SLACK if example.measured
                else shown == old)
        if not same:
            first = next((s for s, o in zip(shown, old) if s != o), "(length)")
            found.append(f"{example.label}: now {first!r}")
    return found


def main() -> None:
    check = "--check" in sys.argv[1:]
    failed = False
    for page in pages():
        before = page.read_text()
        if check:
            for difference in differences(before):
                failed = True
                print(f"{page.relative_to(ROOT)}: {difference}")
            continue
        after, notes = regenerate(before)
        for note in notes:
            print(f"{page.relative_to(ROOT)}: {note}")
        if after != before:
            page.write_text(after)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
