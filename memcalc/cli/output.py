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

PIPE_CLOSED_EXIT_CODE = 141
"""A reader closed the pipe before the answer was written (``| head -1``): 128 + SIGPIPE, as
shells report a command that SIGPIPE ended."""


class OutputClosed(Exception):
    """Standard output's reader went away; not an error of the command."""


class _PipeAware(io.TextIOBase):
    """The command's output: a reader that closes the pipe early ends the command quietly
    (``OutputClosed``) and the rest of the output goes nowhere, instead of an EPIPE."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            raise OutputClosed from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()
            raise OutputClosed from None

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def _silence(self) -> None:
        """Point the stream's descriptor at /dev/null: its unwritten buffer then flushes
        without a second EPIPE when the interpreter exits."""
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)


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
    if real is None:           # started with standard output closed: the answer goes nowhere
        with open(os.devnull, "w") as nowhere:
            _STREAMS.append(nowhere)
            try:
                yield nowhere
            finally:
                _STREAMS.pop()
        return
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
    stream = _PipeAware(stream)
    _STREAMS.append(stream)
    try:
        yield stream
    finally:
        _STREAMS.pop()
        sys.stderr.flush()
        with contextlib.suppress(OutputClosed):
            stream.flush()
        sys.stdout = real
        if saved is not None:
            os.dup2(saved, 1)
            stream.close()
            os.close(saved)
