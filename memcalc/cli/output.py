"""Where a command's own output goes, kept apart from whatever the user's code prints.

While a command runs, file descriptor 1 and ``sys.stdout`` point at stderr, so a model, a
builder or a C extension that prints cannot corrupt ``--json``; memcalc writes its result to
``out()``, the real standard output saved before.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import TextIO

import click

from memcalc.cli.traps import end_forked_copy

_STREAMS: list[TextIO] = []


def out() -> TextIO:
    """The command's standard output (the real one, while user code's goes to stderr); a copy
    of memcalc forked by the user's code ends here instead of writing a second result."""
    end_forked_copy()
    return _STREAMS[-1] if _STREAMS else sys.stdout


def echo(text: str) -> None:
    click.echo(text, file=out())


def _writes_to_fd_1(stream: TextIO) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False   # a test runner's capture: only sys.stdout is swapped


@contextlib.contextmanager
def contained_stdout() -> Iterator[TextIO]:
    """Send fd 1 and ``sys.stdout`` to stderr for the block; yield the real standard output."""
    real = sys.stdout
    fd_level = _writes_to_fd_1(real)
    saved = None
    if fd_level:
        real.flush()
        saved = os.dup(1)
        stream: TextIO = os.fdopen(saved, "w", buffering=1, encoding=real.encoding or "utf-8",
                                   errors=getattr(real, "errors", None) or "strict",
                                   closefd=False)
        os.dup2(2, 1)
    else:
        stream = real
    sys.stdout = sys.stderr
    _STREAMS.append(stream)
    try:
        yield stream
    finally:
        _STREAMS.pop()
        sys.stderr.flush()
        stream.flush()
        sys.stdout = real
        if saved is not None:
            os.dup2(saved, 1)
            stream.close()
            os.close(saved)
