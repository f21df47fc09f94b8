"""Regenerate the README's example outputs from the code: ``python -m benchmarks.readme_examples``.

Every fenced block whose first line is ``$ memcalc …`` (``\\`` continues a line) is run at
80 columns, and the block's output is replaced by the same excerpt of the new output: from
the line that matches the old excerpt's first line to the one that matches its last line
(the k-th such line when the old excerpt holds k of them), lines compared with their digits
masked (a box's bottom edge matches any bottom edge of the same kind). A command that fails or an excerpt that is no longer found is reported and its block
left alone. ``--check`` writes nothing and exits 1 when a block would change.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = "```"
WIDTH = 80
COMMAND_TIMEOUT_S = 900
_DIGITS = re.compile(r"[0-9][0-9.,]*")
_RULES = re.compile(r"[─━═]+")


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


def _run(command: str) -> tuple[list[str] | None, str]:
    env = {**os.environ, "COLUMNS": str(WIDTH), "TERM": "dumb"}
    argv = shlex.split(command)
    try:
        done = subprocess.run([sys.executable, "-m", "memcalc", *argv[1:]], capture_output=True,
                              text=True, env=env, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {COMMAND_TIMEOUT_S} s"
    if done.returncode not in (0, 1, 3):     # done, does not fit, static: all have output
        return None, f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return [line.rstrip() for line in done.stdout.splitlines()], ""


def regenerate(text: str) -> tuple[str, list[str]]:
    """The README with every example block's output regenerated, and what was reported."""
    lines, out, notes, index = text.splitlines(), [], [], 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if line.strip() != FENCE or index >= len(lines) or not lines[index].startswith(
                "$ memcalc"):
            continue
        end = lines.index(FENCE, index)
        command, used = _command(lines[index:end])
        old = lines[index + used:end]
        new, why = _run(command)
        excerpt = _excerpt(old, new) if new is not None else None
        if excerpt is None:
            notes.append(f"kept: {command} ({why or 'excerpt not found in the new output'})")
            excerpt = old
        elif excerpt != old:
            notes.append(f"regenerated: {command}")
        out.extend(lines[index:index + used] + excerpt + [FENCE])
        index = end + 1
    return "\n".join(out) + "\n", notes


def main() -> None:
    check = "--check" in sys.argv[1:]
    before = README.read_text()
    after, notes = regenerate(before)
    print("\n".join(notes) or "no example blocks")
    if check:
        sys.exit(1 if after != before else 0)
    README.write_text(after)


if __name__ == "__main__":
    main()
