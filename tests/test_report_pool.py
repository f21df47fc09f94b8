"""Reports made in worker processes are the serial ones; a failure there is raised as in a
serial plan; no worker outlives its pool, whichever way the pool's block is left."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from memcalc.api import plan_spec
from memcalc.errors import ModelSourceError
from memcalc.pipeline import estimate
from memcalc import report_pool
from memcalc.report_pool import MAX_WORKERS, ReportPool, serial_reason, workers_for
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec
from memcalc.strategies.report_cache import ReportCache
from tests.fixtures.planner_cases import MACHINE, capacity_for

START_S = 120        # a spawned worker imports torch: generous on a loaded machine
TINY = TrainingSpec(model="resnet3d", model_args={"depth": 10, "in_channels": 1,
                                                  "num_classes": 4},
                    sample_shape=(16, 16, 16, 1), gpu="T4", machine=MACHINE)
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")


def variants():
    """Three specs whose batch 1 does not fit (two traces each, no long batch search)."""
    spec = capacity_for(TINY, 0.3)
    return [spec.with_changes(precision=precision) for precision in PRECISIONS]


def alive(pids, timeout_s=10.0):
    """The processes among ``pids`` still running after up to ``timeout_s`` (multiprocessing's
    resource tracker, for one, exits a moment after its parent)."""
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, running = psutil.wait_procs(processes, timeout=timeout_s)
    return [p.pid for p in running if p.status() != psutil.STATUS_ZOMBIE]


def worker_pids():
    def command(child):
        try:
            return " ".join(child.cmdline())
        except psutil.Error:    # exited meanwhile, or a zombie another test left unreaped
            return ""
    return {child.pid for child in psutil.Process().children(recursive=True)
            if "spawn_main" in command(child)}


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_a_plan_made_with_workers_is_the_serial_plan():
    spec = capacity_for(TINY, 0.3)       # spatial slabs are searched too
    cluster = ClusterSpec(rank_traces=2)     # ranks are made ahead too, two of them here
    serial = plan_spec(spec, cluster, workers=0)
    with ReportPool(1) as pool:
        assert pool.start(START_S)
        from memcalc.api import pipeline_estimator
        from memcalc.strategies import plan_strategies
        parallel = plan_strategies(spec, cluster, pipeline_estimator(None, pool))
        made_there, pids = pool.made_in_workers, worker_pids()
    assert made_there > 0 and pids
    assert parallel.model_dump_json() == serial.model_dump_json()
    assert not alive(pids)


@pytest.fixture
def started():
    """A started pool of one worker, a cache that asks it first, and the reports made here."""
    made_here = []
    with ReportPool(1) as pool:
        cache = ReportCache(lambda s: made_here.append(s) or estimate(s), ahead=pool.take)
        assert pool.start(START_S)
        yield pool, cache, made_here


def test_reports_from_a_worker_are_those_made_here(started):
    pool, cache, made_here = started
    specs = variants()
    pool.ahead(cache, None, specs)
    reports = [cache.report(spec) for spec in specs]
    assert pool.made_in_workers == len(specs) - len(made_here) > 0
    assert made_here[0] == specs[0]      # the first is the caller's: it asks for it next
    for spec, report in zip(specs, reports):
        assert report.model_dump_json() == estimate(spec).model_dump_json()


def test_the_caller_never_waits_for_reports_it_may_not_ask_for(started):
    pool, cache, made_here = started
    specs = variants()
    pool.ahead(cache, None, specs, sure=False)
    cache.report(specs[1])     # handed to the worker: waited for, nothing made meanwhile
    assert made_here == [] and pool.made_in_workers == 1
    cache.report(specs[0])
    assert made_here == [specs[0]]


def test_a_failure_in_a_worker_is_raised_when_asked_as_in_a_serial_plan():
    bad = [TINY.with_changes(model_args={"depth": depth}) for depth in (7, 9)]
    with pytest.raises(ModelSourceError) as serial:
        estimate(bad[1])
    with ReportPool(1) as pool:
        cache = ReportCache(estimate, ahead=pool.take)
        assert pool.start(START_S)
        pool.ahead(cache, None, bad)        # the second is the worker's
        with pytest.raises(ModelSourceError) as planned:
            cache.report(bad[1])
    assert pool.made_in_workers == 0 and cache.missing(bad) == bad
    assert str(planned.value) == str(serial.value) and "depth must be one of" in str(serial.value)


def test_no_worker_outlives_an_interrupt():
    def interrupted(spec):
        raise KeyboardInterrupt

    specs = variants()
    with pytest.raises(KeyboardInterrupt), ReportPool(1) as pool:
        assert pool.start(START_S)
        pids = worker_pids()
        cache = ReportCache(interrupted, ahead=pool.take)
        pool.ahead(cache, None, specs)
        cache.report(specs[0])
    assert pids and not alive(pids)


@pytest.mark.parametrize("cores, busy, workers", [
    (1, 0.0, 0), (2, 0.1, 1), (2, 0.5, 1), (2, 0.6, 0), (2, 2.0, 0), (4, 1.2, 2),
    (64, 0.0, MAX_WORKERS)])
def test_workers_take_the_cores_nothing_else_keeps_busy(monkeypatch, cores, busy, workers):
    monkeypatch.setattr(report_pool, "usable_cores", lambda: cores)
    monkeypatch.setattr(report_pool, "other_busy_cpus", lambda seconds: busy)
    assert workers_for(TINY) == workers
    assert workers_for(TINY, 2) == 2     # asked for: as many, whatever the load


def test_user_code_and_measured_loaders_stay_in_this_process():
    assert serial_reason(TINY) is None
    user = TINY.with_changes(model="tests.fixtures.models:conv_then_linear")
    assert "not a zoo model" in serial_reason(user)
    assert workers_for(user, 3) == 0 and workers_for(TINY, 3) == 3 and workers_for(TINY, 0) == 0


@pytest.mark.parametrize("signal_name, whole_group, code, line", [
    ("SIGINT", True, 130, "Error: interrupted"),             # Ctrl-C reaches every process
    ("SIGTERM", False, 143, "Error: terminated (SIGTERM)"),  # a kill of the command alone
])
def test_a_stopped_plan_leaves_no_worker_and_prints_one_line(signal_name, whole_group, code,
                                                             line):
    command = [sys.executable, "-m", "tests.fixtures.idle_cli", "plan", "--model", "resnet3d",
               "--shape", "834,224,834,3", "--gpu", "RTX-4090"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    seen, deadline = set(), time.monotonic() + START_S
    while not any("spawn_main" in " ".join(_cmdline(pid)) for pid in seen):
        assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
        seen |= {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
        time.sleep(0.05)
    time.sleep(1.5)         # the workers start with the command: into the plan itself
    number = getattr(signal, signal_name)
    assert process.poll() is None, f"the plan ended before the signal: {process.stderr.read()}"
    os.killpg(process.pid, number) if whole_group else process.send_signal(number)
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr.strip()) == (code, line)
    assert not alive(seen)


def _cmdline(pid):
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def test_a_ctrl_c_while_workers_end_is_acted_on_once_they_are_gone():
    inside = []
    with pytest.raises(KeyboardInterrupt):
        with report_pool._sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)             # the handler runs here, and must not raise
            inside.append("finished")
    assert inside == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
