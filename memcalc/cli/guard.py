"""Every command's errors as one ``Error:`` line and a documented exit code."""

from __future__ import annotations

import sys

import click
from pydantic import ValidationError

from memcalc.errors import InputError, MemcalcError


def run_guarded(ctx: click.Context, work) -> None:
    """Turn memcalc's errors into one line and an exit code (2 bad input, 1 otherwise)."""
    try:
        work()
    except (MemcalcError, ValidationError) as error:
        if ctx.obj.get("debug"):
            raise
        message = _one_line(error)
        click.echo(f"Error: {message}", err=True)
        sys.exit(2 if isinstance(error, (InputError, ValidationError)) else 1)


def _one_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        return f"{field}: {message}" if field else message
    return str(error).splitlines()[0]
