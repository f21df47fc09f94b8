"""The ``memcalc`` command's entry point: click's group, then an exit that does not wait for
threads the user's code started and left running (a non-daemon thread would otherwise keep
the finished command alive for ever)."""

from __future__ import annotations

import os
import sys
import threading

import click

from memcalc.cli.commands import main


def run() -> None:
    try:
        main()
        code: object = 0
    except SystemExit as done:
        code = done.code
    stray = [thread for thread in threading.enumerate()
             if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()]
    if not stray:
        sys.exit(code)
    click.echo(f"Warning: stopped {len(stray)} thread{'s' if len(stray) > 1 else ''} that your "
               "code started and left running", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
