"""Signals while the user's code runs, through the real CLI, one at a time: the exit code
of the signal, one ``Error:`` line, and no probe, helper or worker left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.fixtures.hostile_harness import (
    LEFTOVER_WARNING,
    MARKER_PREFIX,
    MORE,
    PROBE,
    ROOT,
    SPEC,
    TINY,
    _default_sigint,
    _environment,
    assert_one_error_line,
    leftovers,
)

pytestmark = pytest.mark.slow      # signals sent to CLI subprocesses at set moments


def _wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _probes_of(reference: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"{PROBE} .*{reference}"], capture_output=True,
                           text=True)
    return found.stdout.split()


@pytest.mark.parametrize("command, sent, code", [
    (("host", "--dataset", f"{MORE}:dataset_slow", "--batch-size", "2", "--probe-seconds",
      "30", "--json"), signal.SIGTERM, 143),
    (("feed", "--dataset", f"{MORE}:dataset_slow", "--step-time", "0.01", "--batch-size", "1"),
     signal.SIGINT, 130),
    (("estimate", *TINY, "--batch-size", "2", "--optimizer", "sgd", "--dataset",
      f"{MORE}:dataset_slow", "--probe-seconds", "30"), signal.SIGTERM, 143),
], ids=["host-sigterm", "feed-sigint", "estimate-sigterm"])
def test_a_signal_during_a_dataset_probe_leaves_no_probe(command, sent, code, tmp_path):
    marker = f"{MARKER_PREFIX}-signal-{command[0]}"
    process = subprocess.Popen([sys.executable, "-m", "memcalc", *command], cwd=ROOT,
                               env=_environment(marker, str(tmp_path)), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sigint)
    try:
        assert _wait_for(lambda: _probes_of(f"{MORE}:dataset_slow"), 60), "no probe started"
        time.sleep(1.0)                    # the probe is inside __getitem__ now
        process.send_signal(sent)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code, stderr[-2000:]
    assert_one_error_line(stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert stdout == ""
    assert not leftovers(marker)
    assert not _probes_of(f"{MORE}:dataset_slow")
    # the probe and its worker were memcalc's: not reported as the user's leftovers
    assert LEFTOVER_WARNING not in stderr


@pytest.mark.parametrize("builder", ["spawning_then_hanging", "spawning_then_swallowing"])
def test_sigterm_while_a_builder_hangs_ends_its_helper_too(builder, tmp_path):
    """Also where the builder swallows the exception SIGTERM raised: it is raised again."""
    marker = f"{MARKER_PREFIX}-signal-builder"
    process = subprocess.Popen([sys.executable, "-m", "memcalc", "estimate", "--model",
                                f"{MORE}:{builder}", *SPEC], cwd=ROOT,
                               env=_environment(marker, str(tmp_path)), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sigint)
    helper = ["pgrep", "-f", f"time.sleep\\(120\\) +# {marker}"]
    try:
        assert _wait_for(lambda: subprocess.run(helper, capture_output=True).returncode == 0, 60)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, stderr[-2000:]
    assert_one_error_line(stderr, "terminated")
    assert LEFTOVER_WARNING in stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert not leftovers(marker)
