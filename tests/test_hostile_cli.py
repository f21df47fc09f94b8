"""More hostile users, each through the real CLI (or the Python API) in a subprocess.

Every case asserts: the exact documented exit code; exactly one line on stderr starting with
``Error:`` when the command fails (2, 4, 70, 130, 143) and none when it answers (0, 1, 3); no
traceback anywhere; stdout that is exactly one JSON document when ``--json`` is given and a
report is printed; no process left behind (every process a case starts carries the case's own
marker, in its environment and, for the fixtures' helpers, in its command line).

The one-shot cases run a few at a time (the machine is small, most of a case is waiting for
imports or for a timeout), started when the first of them is requested; each test then checks
its own outcome. Cases that send signals are in ``tests/test_hostile_signals.py``; the harness
is ``tests/fixtures/hostile_harness.py``.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.fixtures.hostile_harness import (
    ANSWER_CODES,
    CHDIR_PLOT,
    FAILURE_CODES,
    IMPORT_MODULES,
    LEFTOVER_WARNING,
    MORE,
    ROOT,
    SPEC,
    TINY,
    WORKERS,
    Case,
    _method,
    _names_no_memcalc_file,
    _plot_where_asked,
    _slurm_only,
    _static,
    api,
    assert_one_error_line,
    cli,
    run_case,
    strict_json,
)

pytestmark = pytest.mark.slow      # each case a CLI subprocess (about two minutes in all)

CASES = [
    # -- builders that raise: the user's code failed (4), its exception and file:line named
    cli("builder-memory-error", "check", "--model", f"{MORE}:raising", "--model-arg",
        "kind=memory", *SPEC, "--gpu", "T4", code=4, words=("MemoryError", "hostile_more.py:")),
    cli("builder-recursion-error", "estimate", "--model", f"{MORE}:raising", "--model-arg",
        "kind=recursion", *SPEC, code=4, words=("RecursionError",)),
    cli("builder-multiline-custom-error", "plan", "--model", f"{MORE}:raising", "--model-arg",
        "kind=multiline", *SPEC, "--gpu", "T4", code=4,
        words=("CustomError", "first line of the custom error"), stderr_lacks=("second line",)),
    cli("builder-exception-whose-str-raises", "estimate", "--model", f"{MORE}:raising",
        "--model-arg", "kind=unprintable", *SPEC, code=4, words=("UnprintableError",)),
    cli("builder-type-error-inside", "estimate", "--model", f"{MORE}:type_error_inside",
        *SPEC, code=4, words=("TypeError", "hostile_more.py:")),
    cli("builder-raises-keyboard-interrupt", "estimate", "--model", f"{MORE}:raising",
        "--model-arg", "kind=interrupt", *SPEC, code=4, words=("KeyboardInterrupt",)),
    cli("builder-input-prompt-then-eof", "estimate", "--model",
        "tests.fixtures.hostile:reading_stdin", *SPEC, code=4, words=("EOFError",)),
    cli("builder-partial-line-then-raises", "estimate", "--model",
        f"{MORE}:partial_line_then_raising", *SPEC, "--json", code=4,
        words=("RuntimeError", "the weights are corrupt"), stdout_lacks=("loading weights",)),

    # -- builders that exit: never a success
    cli("builder-sys-exit-text", "check", "--model", f"{MORE}:exiting", "--model-arg",
        "code=text", *SPEC, "--gpu", "T4", code=4, words=("sys.exit('text')",)),
    cli("builder-sys-exit-none", "plan", "--model", f"{MORE}:exiting", "--model-arg",
        "code=none", *SPEC, "--gpu", "T4", code=4, words=("sys.exit(None)",)),
    cli("builder-os-exit-0-check", "check", "--model", f"{MORE}:hard_exiting", *SPEC,
        "--gpu", "T4", code=4),

    # -- what the reference names is not a model builder (2)
    cli("builder-returns-none", "estimate", "--model", f"{MORE}:returns_none", *SPEC, code=2,
        words=("NoneType", "torch.nn.Module")),
    cli("reference-not-callable", "estimate", "--model", f"{MORE}:NOT_CALLABLE", *SPEC, code=2,
        words=("int", "not a callable")),
    cli("reference-relative", "estimate", "--model", "..os:system", *SPEC, code=2,
        words=("relative",)),
    cli("reference-no-colon", "check", "--model", "nocolon", *SPEC, "--gpu", "T4", code=2,
        words=("unknown model 'nocolon'",)),
    cli("reference-missing-name", "estimate", "--model", "tests.fixtures.hostile:missing_name",
        *SPEC, code=2, words=("missing_name",)),
    cli("model-arg-without-equals", "estimate", *TINY, "--model-arg", "noequals", *SPEC, code=2,
        words=("--model-arg", "noequals")),

    # -- modules whose import fails (written to a temporary folder on PYTHONPATH)
    cli("module-import-raises", "estimate", "--model", "hostile_more_import_raises:build", *SPEC,
        code=4, words=("RuntimeError", "import-time failure", "hostile_more_import_raises.py:1"),
        stderr_lacks=("second line",)),
    cli("module-syntax-error", "estimate", "--model", "hostile_more_syntax:build", *SPEC, code=4,
        words=("syntax error", "hostile_more_syntax.py:1")),
    cli("module-exits-at-import", "check", "--model", "hostile_more_import_exits:build", *SPEC,
        "--gpu", "T4", code=4, words=("sys.exit('leaving at import')",)),
    cli("dataset-module-import-raises", "host", "--dataset", "hostile_more_import_raises:build",
        "--batch-size", "2", "--probe-seconds", "1", code=4,
        words=("RuntimeError", "import-time failure", "hostile_more_import_raises.py:1"),
        check=lambda outcome: _names_no_memcalc_file(outcome.stderr)),

    # -- forwards that misbehave: estimate answers with the static figure, check/plan say 3
    cli("forward-returns-strings", "estimate", "--model", f"{MORE}:forward", "--model-arg",
        "behaviour=strings", *SPEC, "--json", code=0, check=_static("tuple")),
    cli("forward-calls-sys-exit", "estimate", "--model", f"{MORE}:forward", "--model-arg",
        "behaviour=exit", *SPEC, "--json", code=0, check=_static("sys.exit(5)")),
    cli("forward-returns-dict-of-strings-check", "check", "--model", f"{MORE}:forward",
        "--model-arg", "behaviour=dict", *SPEC, "--gpu", "T4", "--json", code=3,
        verdict="FIT UNKNOWN (STATIC)", check=_method("static")),
    cli("forward-returns-int-plan", "plan", "--model", f"{MORE}:forward", "--model-arg",
        "behaviour=int", *SPEC, "--gpu", "T4", "--json", code=3, verdict="FIT UNKNOWN (STATIC)"),
    cli("forward-prints-plan-emit", "plan", "--model", f"{MORE}:forward", "--model-arg",
        "behaviour=print", *SPEC, "--gpu", "T4", "--emit", "slurm", code=0,
        stdout_lacks=("prints json", "raw bytes"), check=_slurm_only),

    # -- a zoo plan starts its workers with the command: ended on every way out
    cli("zoo-plan-bad-card", "plan", "--model", "resnet3d", "--shape", "8,8,8,1", "--gpu",
        "NO-SUCH-CARD", code=2, words=("NO-SUCH-CARD",), stderr_lacks=(LEFTOVER_WARNING,)),
    cli("zoo-plan-timeout", "plan", "--model", "resnet3d", "--shape", "16,16,16,3", "--gpu",
        "T4", "--timeout", "1", code=4, words=("--timeout 1",),
        stderr_lacks=(LEFTOVER_WARNING,)),

    # -- hangs: --timeout ends them (4); the watchdog when no signal handler can run
    cli("forward-loops-timeout", "estimate", "--model", "tests.fixtures.hostile:forward_loops",
        *SPEC, "--timeout", "3", "--json", code=4, words=("--timeout 3",)),
    cli("forward-blocks-sigalrm-watchdog", "estimate", "--model", f"{MORE}:forward",
        "--model-arg", "behaviour=block_alarm", *SPEC, "--timeout", "1", "--json", code=4,
        words=("--timeout 1",)),
    cli("builder-helper-then-blocks-watchdog", "estimate", "--model",
        f"{MORE}:spawning_then_blocking", *SPEC, "--timeout", "1", code=4,
        words=("--timeout 1",), stderr_has=(LEFTOVER_WARNING,)),
    cli("builder-helper-then-hangs-timeout", "estimate", "--model",
        f"{MORE}:spawning_then_hanging", *SPEC, "--timeout", "2", code=4, words=("--timeout 2",),
        stderr_has=(LEFTOVER_WARNING,)),
    # no --timeout: the work itself may take seconds on a loaded machine; a wait for the
    # thread at exit (an hour) is caught by the case's own time bound
    cli("builder-leaves-thread-running", "estimate", "--model", f"{MORE}:threading_forever",
        *SPEC, "--json", code=0),

    # -- processes the user's code leaves running are ended, with a warning
    cli("builder-leaves-daemon", "check", "--model", f"{MORE}:daemonizing", *SPEC, "--gpu", "T4",
        code=0, stderr_has=(LEFTOVER_WARNING,)),
    cli("builder-leaves-sigterm-ignoring-helper", "estimate", "--model", f"{MORE}:stubborn",
        *SPEC, code=0, stderr_has=(LEFTOVER_WARNING,)),
    cli("builder-leaves-helper-then-raises", "estimate", "--model",
        f"{MORE}:spawning_then_raising", *SPEC, code=4, words=("RuntimeError",),
        stderr_has=(LEFTOVER_WARNING,)),
    cli("builder-forks", "estimate", "--model", f"{MORE}:forking", *SPEC, "--json", code=0,
        check=_method("traced")),

    # -- --plot
    cli("plot-relative-after-builder-chdir", "estimate", "--model",
        f"{MORE}:changing_directory", *SPEC, "--json", "--plot", CHDIR_PLOT, code=0,
        check=_plot_where_asked),
    cli("plot-unwritable", "estimate", *TINY, *SPEC, "--json", "--plot", "/proc/p.png", code=2,
        words=("--plot",), check=lambda outcome: strict_json(outcome.stdout)),
    cli("plot-empty-name", "estimate", *TINY, *SPEC, "--plot", "", code=2, words=("--plot",)),

    # -- Datasets (host, feed, estimate --dataset)
    cli("dataset-returns-none-host", "host", "--dataset", f"{MORE}:dataset_none",
        "--batch-size", "2", "--probe-seconds", "1", "--json", code=2, words=("NoneType",)),
    cli("dataset-sys-exit-host", "host", "--dataset", f"{MORE}:dataset_exit", "--batch-size", "2",
        "--probe-seconds", "1", code=4, words=("sys.exit(7)",)),
    cli("dataset-len-raises-host", "host", "--dataset", f"{MORE}:dataset_len_raises",
        "--batch-size", "2", "--probe-seconds", "1", code=4,
        words=("TypeError", "no length yet", "hostile_more.py:")),
    cli("dataset-empty-feed", "feed", "--dataset", f"{MORE}:empty_dataset", "--step-time", "0.01",
        "--batch-size", "2", "--batches", "2", code=2, words=("0 samples",)),
    cli("dataset-builder-returns-int-feed", "feed", "--dataset",
        f"{MORE}:dataset_builder_returns_number", "--step-time", "0.01", "--batch-size", "2",
        "--batches", "2", code=2, words=("int",)),
    cli("dataset-iterable-host", "host", "--dataset", f"{MORE}:fine_iterable", "--batch-size",
        "2", "--probe-seconds", "1", code=2, words=("IterableDataset",)),
    cli("dataset-leaves-helpers-host", "host", "--dataset", f"{MORE}:dataset_spawns",
        "--batch-size", "2", "--probe-seconds", "1", "--json", code=0,
        stderr_has=(LEFTOVER_WARNING,)),
    cli("dataset-builder-hangs-host-timeout", "host", "--dataset",
        f"{MORE}:dataset_builder_hangs", "--batch-size", "2", "--probe-seconds", "1",
        "--timeout", "3", code=4, words=("--timeout 3",)),
    cli("dataset-getitem-hangs-feed-timeout", "feed", "--dataset", f"{MORE}:dataset_slow",
        "--step-time", "0.01", "--batch-size", "1", "--timeout", "3", "--json", code=4,
        words=("--timeout 3",)),
    cli("dataset-prints-estimate", "estimate", *TINY, "--batch-size", "2", "--optimizer", "sgd",
        "--dataset", f"{MORE}:dataset_print", "--probe-seconds", "1", "--json", code=0,
        check=_method("traced")),

    # -- bad numbers, names and options: bad input (2), the option named
    cli("batch-size-zero", "estimate", *TINY, "--shape", "8", "--batch-size", "0", code=2,
        words=("--batch-size",)),
    cli("batch-size-huge", "estimate", *TINY, "--shape", "8", "--optimizer", "sgd",
        "--batch-size", "99999999999999999999", "--json", code=2, words=("--batch-size",)),
    cli("shape-negative", "estimate", *TINY, "--shape=-3", "--batch-size", "2", code=2,
        words=("--shape",)),
    cli("shape-wrong-width", "estimate", *TINY, "--shape", "7", "--batch-size", "2", code=2,
        words=("in_features=8",)),
    cli("gpu-unknown", "check", *TINY, *SPEC, "--gpu", "NOPE", code=2, words=("NOPE",)),
    cli("timeout-nan", "estimate", *TINY, *SPEC, "--timeout", "nan", code=2,
        words=("--timeout",)),
    cli("optimizer-unknown", "estimate", *TINY, "--shape", "8", "--optimizer", "lamb", code=2,
        words=("--optimizer",)),
    cli("command-unknown", "frobnicate", code=2, words=("frobnicate",)),
    cli("command-missing", code=2),
    cli("feed-workers-empty-item", "feed", "--dataset", f"{MORE}:dataset_fine", "--step-time",
        "0.01", "--workers", "0,,1", "--batches", "2", code=2, words=("--workers",)),
    cli("feed-workers-huge", "feed", "--dataset", f"{MORE}:dataset_fine", "--step-time", "0.01",
        "--workers", "100000", "--batches", "2", code=2, words=("--workers",)),
    cli("gpus-json", "gpus", "--json", code=0,
        check=lambda outcome: [g["name"] for g in strict_json(outcome.stdout)].index("T4")),
    cli("check-does-not-fit-json", "check", *TINY, *SPEC, "--gpu-memory", "1KB", "--json",
        code=1, verdict="DOES NOT FIT", check=_method("traced")),

    # -- the Python API: one-line memcalc errors of the right type
    api("api-batch-size-zero",
        'memcalc.estimate("tests.fixtures.hostile:tiny", (8,), batch_size=0, optimizer="sgd")',
        "InputError", "batch_size"),
    api("api-misspelled-argument",
        'memcalc.estimate("tests.fixtures.hostile:tiny", (8,), batch_size=2, optimzer="sgd")',
        "InputError", "did you mean 'optimizer'"),
    api("api-shape-not-a-tuple",
        'memcalc.estimate("tests.fixtures.hostile:tiny", 8, batch_size=2)',
        "InputError", "sample_shape"),
    api("api-check-untraceable",
        'memcalc.check("tests.fixtures.hostile:forward_raises", (8,), batch_size=2, gpu="T4", '
        'optimizer="sgd")', "UntracedEstimateError", "forward broke"),
    api("api-isolated-hang",
        'memcalc.estimate("tests.fixtures.hostile_more:spawning_then_hanging", (8,), '
        "batch_size=2, isolate=True, timeout_s=3)", "TraceError", "did not finish in 3 s"),
    api("api-isolated-os-exit",
        'memcalc.estimate("tests.fixtures.hostile_more:hard_exiting", (8,), batch_size=2, '
        "isolate=True)", "TraceError", "exit code 0"),
]




@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, Future]:
    """Start every selected case (a few at a time); each test waits for its own."""
    modules = tmp_path_factory.mktemp("hostile_more_modules")
    for name, source in IMPORT_MODULES.items():
        (modules / f"{name}.py").write_text(source)
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.originalname == "test_hostile_case" and hasattr(item, "callspec")]
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    # the slow ones (hangs, timeouts) first, so they wait while the quick ones run
    selected.sort(key=lambda case: not {"--timeout", "--probe-seconds"} & set(case.argv))
    futures = {case.name: pool.submit(run_case, case, str(modules)) for case in selected}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)
    for path in (os.path.join(ROOT, CHDIR_PLOT), os.path.join("/", CHDIR_PLOT)):
        if os.path.exists(path):         # a failed case's plot, wherever it went
            os.remove(path)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_case(case: Case, outcomes: dict[str, Future]) -> None:
    outcome = outcomes[case.name].result()
    shown = f"exit {outcome.returncode} after {outcome.seconds:.1f} s\n{outcome.stderr[-3000:]}"
    assert outcome.returncode is not None, f"still running after {case.limit:g} s: {shown}"
    assert outcome.returncode == case.code, shown
    assert "Traceback" not in outcome.stderr and "Traceback" not in outcome.stdout, shown
    if case.code in FAILURE_CODES:
        assert_one_error_line(outcome.stderr, *(() if case.verdict else case.words))
    else:
        errors = [line for line in outcome.stderr.splitlines() if line.startswith("Error:")]
        assert not errors, shown
    if case.verdict:
        verdicts = [line for line in outcome.stderr.splitlines() if line.startswith(case.verdict)]
        assert len(verdicts) == 1, shown
        for word in case.words:
            assert word in verdicts[0], verdicts[0]
    if case.one_line_stderr:
        assert len(outcome.stderr.strip().splitlines()) == 1, shown
    if case.json and (case.code in ANSWER_CODES or outcome.stdout.strip()):
        strict_json(outcome.stdout)
    for text in case.stderr_has:
        assert text in outcome.stderr, shown
    for text in case.stdout_lacks:
        assert text not in outcome.stdout, outcome.stdout[-2000:]
    for text in case.stderr_lacks:
        assert text not in outcome.stderr, shown
    assert outcome.seconds <= case.max_seconds, shown
    assert not outcome.left, outcome.left
    if case.check is not None:
        case.check(outcome)
