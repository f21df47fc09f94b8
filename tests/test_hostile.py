"""Hostile users through the real CLI in a subprocess: exact exit code, one ``Error:`` line,
no traceback, stdout that is only memcalc's, no process left behind."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = ["--shape", "8", "--batch-size", "2", "--optimizer", "sgd"]


def memcalc(*args, timeout=240):
    """Run the real CLI; the result's ``mark`` is in the environment of every process the run
    started, so ``left_behind`` finds them (and only them) afterwards."""
    return finish(start(*args), timeout)


def start(*args) -> subprocess.Popen:
    """The real CLI started, not waited for (``finish``)."""
    mark = uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-m", "memcalc", *args], cwd=ROOT, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, _MARK: mark})
    process.mark = mark
    return process


def finish(process: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    result.mark = process.mark
    return result


_MARK = "MEMCALC_HOSTILE_RUN"


def left_behind(mark: str) -> list[str]:
    """Processes still alive that a marked run started (children inherit the environment)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get(_MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(process.info["cmdline"] or []))
        except psutil.Error:
            continue
    return found


def assert_one_error_line(result, code, *words):
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    for word in words:
        assert word in errors[0], errors[0]
    assert not left_behind(result.mark)
    return errors[0]


def test_prints_from_builder_and_forward_never_reach_json_stdout():
    result = memcalc("estimate", "--model", "tests.fixtures.hostile:printing", *SPEC, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)            # exactly one JSON document
    assert report["device"]["method"] == "traced"
    assert "builder says hello" in result.stderr and "forward writes to fd 1" in result.stderr


@pytest.mark.parametrize("kind, name", [("runtime", "RuntimeError"), ("key", "KeyError"),
                                        ("import", "ModuleNotFoundError")])
def test_a_builder_that_raises_is_the_users_code_failing(kind, name):
    result = memcalc("estimate", "--model", "tests.fixtures.hostile:raising",
                     "--model-arg", f"kind={kind}", *SPEC)
    assert_one_error_line(result, 4, name, "tests/fixtures/hostile.py:")


@pytest.mark.parametrize("command", ["estimate", "check"])
def test_a_builder_that_exits_zero_is_not_a_success(command):
    result = memcalc(command, "--model", "tests.fixtures.hostile:exiting", *SPEC,
                     "--gpu", "A100-80GB")
    assert_one_error_line(result, 4, "sys.exit(0)")


def test_a_forward_that_raises_makes_check_say_fit_unknown():
    result = memcalc("check", "--model", "tests.fixtures.hostile:forward_raises", *SPEC,
                     "--gpu", "A100-80GB")
    assert result.returncode == 3, result.stderr[-2000:]
    assert "FIT UNKNOWN (STATIC)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, words", [
    (["--gpu", ""], ["--gpu"]),
    (["--gpu-memory", "1e400GB"], ["--gpu-memory"]),
    (["--gpu-memory", "inf"], ["--gpu-memory"]),
    (["--shape", "8,,8"], ["shape"]),
    (["--shape", "100000,100000,100000,100000"], ["--shape", "elements per sample"]),
    (["--sample-time", "inf"], ["--sample-time", "finite"]),
    (["--step-time", "nan"], ["--step-time", "finite"]),
    (["--plot", "no/such/folder/p.png"], ["--plot", "does not exist"]),
    (["--plot", "report.txt"], ["--plot", ".png"]),
])
def test_bad_numbers_and_names_are_bad_input(args, words):
    result = memcalc("estimate", "--model", "tests.fixtures.hostile:tiny", *SPEC, *args)
    assert_one_error_line(result, 2, *words)


def _default_sigint():
    """A suite run in the background inherits SIGINT ignored; a terminal's memcalc has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sent, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_user_code_runs_ends_cleanly(sent, code):
    process = subprocess.Popen([sys.executable, "-m", "memcalc", "estimate", "--model",
                                "tests.fixtures.hostile:sleeping", *SPEC],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               preexec_fn=_default_sigint)
    deadline = time.monotonic() + 120
    line = ""
    while "sleeping" not in line and time.monotonic() < deadline:
        line = process.stderr.readline()       # the builder's print goes to stderr
    assert "sleeping" in line
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr[-2000:]
    assert "Traceback" not in stderr


def test_a_dataset_that_prints_the_probes_protocol_is_measured_anyway():
    result = memcalc("host", "--dataset", "tests.fixtures.hostile:printing_dataset",
                     "--batch-size", "2", "--json", "--probe-seconds", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["measurement"]["batch_bytes"] == 2 * 3 * 16 * 16 * 4
    assert not left_behind(result.mark)


@pytest.fixture(scope="module", autouse=True)
def hanging_dataset_run():
    """Started with the module's first test: it waits about 22 s for the probe's deadline
    (--probe-seconds and the time allowed past it), which the module's other tests use."""
    started = time.monotonic()
    process = start("host", "--dataset", "tests.fixtures.hostile:hanging_dataset",
                    "--batch-size", "2", "--probe-seconds", "2")
    yield started, process
    if process.poll() is None:
        process.kill()
        process.communicate()


def test_a_dataset_that_hangs_is_stopped_at_its_deadline_and_killed(hanging_dataset_run):
    started, process = hanging_dataset_run
    result = finish(process, 240)
    assert_one_error_line(result, 4, "gave no result within")
    assert time.monotonic() - started < 200
    assert not left_behind(result.mark)


def test_a_killed_memcalc_takes_its_probe_with_it():
    """SIGKILL leaves memcalc no time to clean up, and its probe runs in a process group of
    its own: the probe, waiting on a DataLoader worker that hangs in the user's Dataset (it
    writes nothing more, so no broken pipe ends it), must still end with it."""
    process = start("host", "--dataset", "tests.fixtures.hostile:hanging_dataset",
                    "--batch-size", "2", "--probe-seconds", "120")
    deadline, probe, used = time.monotonic() + 120, None, None
    while probe is None or probe.cpu_times() != used:   # until it sits in the Dataset
        assert process.poll() is None and time.monotonic() < deadline, "the probe never hung"
        if probe is not None:
            used = probe.cpu_times()
        else:
            probe = next((child for child in psutil.Process(process.pid).children()
                          if "memcalc.host.probe" in " ".join(child.cmdline())), None)
        time.sleep(1)
    process.kill()
    process.communicate()
    deadline = time.monotonic() + 10
    while left_behind(process.mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left_behind(process.mark)


def test_a_dataset_that_raises_names_its_exception_and_line():
    result = memcalc("host", "--dataset", "tests.fixtures.hostile:raising_dataset",
                     "--batch-size", "2", "--probe-seconds", "5")
    assert_one_error_line(result, 4, "ValueError", "corrupt", "hostile.py:")
    assert not left_behind(result.mark)


@pytest.mark.parametrize("model, words", [
    ("leaves_fake_mode", "refused before allocating"),
    ("numpy_table", "made outside the trace"),
])
def test_real_memory_outside_the_trace_is_refused_and_named(model, words):
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    report = estimate(TrainingSpec(model=f"tests.fixtures.hostile:{model}", sample_shape=(8,),
                                   batch_size=2, optimizer="sgd"))
    assert report.device.method == "static"
    assert any(words in line for line in report.unsupported), report.unsupported


@pytest.mark.parametrize("model, words", [
    ("numpy_in_forward", "asked numpy for a real 1,610,612,736-byte buffer"),
    ("leaves_fake_mode", "would make a real 3,221,225,472-byte tensor"),
])
def test_real_memory_made_in_forward_is_refused_before_it_is_taken(model, words):
    """A forward filling a 1.5 GiB numpy array, or a 3 GiB torch tensor outside the fake
    mode: static with the reason, and the process never held 1 GiB (VmHWM: the high-water
    mark of this process's own memory; the layer table's forward on meta is guarded too)."""
    code = ("import re; from pathlib import Path; from memcalc.pipeline import estimate; "
            "from memcalc.specs import TrainingSpec; "
            f"r = estimate(TrainingSpec(model='tests.fixtures.hostile:{model}', "
            "sample_shape=(8,), batch_size=2, optimizer='sgd')); "
            "print(r.device.method); print(r.unsupported); print(int(re.search("
            "r'VmHWM:\\s+(\\d+) kB', Path('/proc/self/status').read_text())[1]) * 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    method, unsupported, peak_rss = done.stdout.splitlines()[-3:]
    assert method == "static", done.stdout + done.stderr[-2000:]
    assert words in unsupported
    assert int(peak_rss) < 1 << 30


def test_impossible_gpu_counts_are_refused():
    result = memcalc("plan", "--model", "tests.fixtures.hostile:tiny", *SPEC, "--gpu", "T4",
                     "--gpus", "99999999999999999999")
    assert_one_error_line(result, 2, "--gpus")


def test_a_plot_that_cannot_be_written_still_prints_the_report(tmp_path, monkeypatch):
    import errno

    import matplotlib.figure
    from click.testing import CliRunner

    from memcalc.cli.commands import main

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    result = CliRunner().invoke(main, ["estimate", "--model", "tests.fixtures.hostile:tiny",
                                       *SPEC, "--json", "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr
    assert json.loads(result.stdout)["device"]["method"] == "traced"


def test_the_slurm_script_keeps_the_allocations_cpus_and_memory_per_cpu():
    result = memcalc("plan", "--model", "tests.fixtures.hostile:tiny", *SPEC, "--gpu",
                     "A100-80GB", "--cpus", "4", "--mem-per-cpu", "1GB", "--emit", "slurm")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.removeprefix("#SBATCH ").split("=", 1) for line in result.stdout.splitlines()
                 if line.startswith("#SBATCH --") and "=" in line)
    assert lines["--mem-per-cpu"] == f"{10**9 // 2**20}M"          # as given, 1 GB
    assert 1 <= int(lines["--cpus-per-task"]) <= 4                   # within --cpus


def test_the_slurm_script_never_asks_more_cpus_than_the_node_has():
    """Eight GPU processes need at least a CPU each: on a node of 4 the script asks for the
    4 there are and says that it does not fit (it asked for 32 and spoke of 8 CPUs)."""
    result = memcalc("plan", "--model", "tests.fixtures.hostile:tiny", *SPEC, "--gpu",
                     "A100-80GB", "--cpus", "4", "--mem-per-cpu", "1GB", "--gpus", "8",
                     "--emit", "slurm")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.removeprefix("#SBATCH ").split("=", 1) for line in result.stdout.splitlines()
                 if line.startswith("#SBATCH --") and "=" in line)
    assert int(lines["--cpus-per-task"]) <= 4
    assert "sharing its 4 CPUs" in result.stdout
    assert "# DOES NOT FIT: 8 processes need" in result.stdout


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_plan_emit_says_why_when_nothing_fits():
    result = memcalc("plan", "--model", "resnet3d", "--shape", "834,224,834,3", "--gpu", "T4",
                     "--max-gpus", "1", "--emit", "slurm")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "DOES NOT FIT: no launch file to emit: nothing fits" in result.stderr


def test_a_dataloader_workers_exception_keeps_its_message_and_line():
    result = memcalc("feed", "--dataset", "tests.fixtures.hostile:raising_later_dataset",
                     "--step-time", "0.01", "--batch-size", "2", "--workers", "1",
                     "--batches", "4")
    assert_one_error_line(result, 4, "ValueError: sample 7 is corrupt", "worker process 0",
                          "hostile.py:")
