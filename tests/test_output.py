"""Where a command's answer goes when nobody reads it: a reader that closes the pipe early
(``| head -1``) and a closed standard output are not errors of the estimate."""

import os
import subprocess
import sys

from memcalc.cli.output import PIPE_CLOSED_EXIT_CODE

ESTIMATE = [sys.executable, "-m", "memcalc", "estimate", "--model", "mlp", "--device", "cpu"]


def test_a_reader_closing_the_pipe_early_ends_it_quietly():
    """The reader goes away before the answer is written (as `head` does once it has its
    lines; closing before the first write makes the race with the pipe's buffer certain)."""
    process = subprocess.Popen([*ESTIMATE, "--details"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == PIPE_CLOSED_EXIT_CODE, stderr
    assert "Error" not in stderr and "Traceback" not in stderr


def test_a_closed_standard_output_exits_as_the_answer_says():
    def closed_stdout() -> None:
        os.close(1)

    fits = subprocess.run([sys.executable, "-m", "memcalc", "check", "--model", "mlp",
                           "--gpu", "T4", "--batch-size", "2"], preexec_fn=closed_stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    assert fits.returncode == 0, fits.stderr
    assert "Error" not in fits.stderr
