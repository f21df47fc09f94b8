"""Run an estimate in a child process, so a crash or a hang in the user's model code cannot
take the caller (a notebook kernel, a training script) down with it."""

from __future__ import annotations

import multiprocessing

from memcalc.errors import InputError, TraceError
from memcalc.model.source import OBJECT_PREFIX
from memcalc.report.models import Report
from memcalc.specs import TrainingSpec

DEFAULT_TIMEOUT_S = 600.0


def _child(spec: TrainingSpec, connection) -> None:
    from memcalc.pipeline import estimate

    try:
        connection.send(("report", estimate(spec)))
    except Exception as error:   # reported to the parent as one line
        connection.send(("error", f"{type(error).__name__}: {str(error).splitlines()[0]}"))
    finally:
        connection.close()


def estimate_isolated(spec: TrainingSpec, timeout_s: float = DEFAULT_TIMEOUT_S) -> Report:
    """``pipeline.estimate`` in a fresh (spawned) interpreter, with a time limit."""
    if spec.model.startswith(OBJECT_PREFIX):
        raise InputError("isolate=True needs a model name or 'package.module:callable': an "
                         "instance or a lambda lives only in this process")
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(spec, sender), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            crashed = not process.is_alive()
            process.kill()
            process.join()
            raise TraceError(_why(process.exitcode if crashed else None, timeout_s))
        kind, payload = receiver.recv()
    except EOFError:
        process.join()
        raise TraceError(_why(process.exitcode, timeout_s)) from None
    finally:
        receiver.close()
    process.join()
    if kind == "error":
        raise TraceError(f"in the isolated process: {payload}")
    return payload


def _why(exitcode: int | None, timeout_s: float) -> str:
    if exitcode is not None and exitcode != 0 and exitcode != -9:
        return (f"the isolated estimate crashed (exit code {exitcode}); the model's code "
                "killed its process — run it without isolate to see the traceback")
    return f"the isolated estimate did not finish in {timeout_s:g} s and was stopped"
