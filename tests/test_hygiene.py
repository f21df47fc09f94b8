"""A pre-flight leaves the caller's process as it found it: the process is snapshotted before
and after each public call (torch modes and flags, every random stream, ``nn.Module``'s
methods, the multiprocessing context, signal handlers, environment, ``sys.path``, logging,
warnings filters, the garbage collector's thresholds, threads, child processes, open files,
/dev/shm, the working directory, the user's model's tensors) and any difference fails the
test."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
import warnings

import numpy as np
import pytest

try:
    from numpy._core.multiarray import get_handler_name   # numpy 2
except ImportError:
    from numpy.core.multiarray import get_handler_name    # numpy 1
import torch
from torch import nn

import memcalc
from memcalc.errors import MemcalcError

pytestmark = pytest.mark.slow      # snapshots process-wide state (/dev/shm, children): run alone

TINY = dict(model_args=dict(in_features=32, hidden=32, depth=1), device="cpu")
CUDA_TINY = dict(model_args=dict(in_features=32, hidden=32, depth=1), gpu="T4")
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP,
           signal.SIGUSR1]
MODULE_METHODS = ("register_parameter", "register_buffer", "register_module", "to", "cuda",
                  "__call__", "__setattr__", "__getattr__", "_apply", "train", "eval")


def _files(folder: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return frozenset()


def _open_files() -> frozenset[tuple[str, str]]:
    """The process's open files and what each points to (the listing's own is left out: it
    is closed when read)."""
    files = set()
    for fd in _files("/proc/self/fd"):
        try:
            files.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
    return frozenset(files)


def _shm() -> frozenset[str]:
    """/dev/shm, less the segments of other live processes (torch names them
    ``torch_<pid>_…``): a leftover of this process or of a child it started and lost stays."""
    def foreign(name: str) -> bool:
        parts = name.split("_")
        if len(parts) < 3 or parts[0] != "torch" or not parts[1].isdigit():
            return False
        pid = int(parts[1])
        return pid != os.getpid() and os.path.exists(f"/proc/{pid}")
    return frozenset(name for name in _files("/dev/shm") if not foreign(name))


def _loggers() -> dict:
    loggers = {"": logging.getLogger()}
    loggers.update({name: logger for name, logger in logging.Logger.manager.loggerDict.items()
                    if isinstance(logger, logging.Logger)})
    return {name: (logger.level, tuple(logger.handlers), logger.propagate, logger.disabled)
            for name, logger in loggers.items()}


def snapshot() -> dict:
    """What a caller would notice had changed."""
    return {
        "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
        "autocast cpu": torch.is_autocast_enabled("cpu"),
        "autocast dtype": torch.get_autocast_dtype("cpu"),
        "default dtype": torch.get_default_dtype(),
        "default device": torch.empty(0).device,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "threads": torch.get_num_threads(),
        "anomaly": torch.is_anomaly_enabled(),
        "torch rng": hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest(),
        "numpy rng": hashlib.sha1(repr(np.random.get_state()).encode()).hexdigest(),
        "numpy allocator": get_handler_name(),
        "python rng": hash(random.getstate()),
        "module methods": {name: getattr(nn.Module, name) for name in MODULE_METHODS},
        "start method": multiprocessing.get_start_method(allow_none=True),
        "signals": {sig: signal.getsignal(sig) for sig in SIGNALS},
        "env": dict(os.environ), "sys.path": list(sys.path), "cwd": os.getcwd(),
        "cwd files": _files(os.getcwd()), "shm": _shm(),
        "loggers": _loggers(), "warnings": list(warnings.filters),
        "live threads": {thread.name for thread in threading.enumerate()},
        "children": {child.pid for child in multiprocessing.active_children()},
        "fds": _open_files(),
        "distributed": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "gc": (gc.isenabled(), gc.get_threshold()),
    }


def _differences(before: dict, after: dict) -> dict:
    """What changed; loggers that a first import made (matplotlib's, at their defaults) are
    new, not changed: only the loggers that were there before are compared. Of the open
    files, only those opened during the call count (one that closed meanwhile may be an
    earlier test's), each with what it points to."""
    after = {**after, "loggers": {name: value for name, value in after["loggers"].items()
                                  if name in before["loggers"]},
             "fds": before["fds"] | (after["fds"] - before["fds"])}
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


def _model_hash(model: nn.Module) -> str:
    digest = hashlib.sha1()
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        digest.update(name.encode() + str(tensor.device).encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def _user_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))


def _expecting(error: type[BaseException], call):
    def run():
        with pytest.raises(error):
            call()
    return run


def _in_threads():
    threads = [threading.Thread(target=memcalc.estimate, args=("mlp", (32,)), kwargs=TINY)
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _in_event_loop():
    async def main():
        return memcalc.estimate("mlp", (32,), **TINY)

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def _notebook_display():
    from memcalc.notebook import _lazy_renderer

    report = memcalc.estimate("mlp", (32,), **TINY)
    assert "<table" in _lazy_renderer("report_html")(report)


def _plot():
    import tempfile

    report = memcalc.estimate("mlp", (32,), **TINY)
    with tempfile.TemporaryDirectory() as folder:
        memcalc.plot(report, os.path.join(folder, "report.png"))


def _feed_check():
    from memcalc.feed.check import feed_check
    from memcalc.host import LoaderSpec, measure_worker

    dataset = "tests.fixtures.host_datasets:spin_samples"
    sample = measure_worker(LoaderSpec(dataset=dataset, probe_seconds=1), 4)
    feed_check(dataset, 4, 0.01, [0, 1], cpus=2, batches=4,
               seconds_per_sample=sample.feeding_seconds_per_sample)


CALLS = {
    "estimate": lambda: memcalc.estimate("mlp", (32,), **TINY),
    "estimate on a GPU": lambda: memcalc.estimate("mlp", (32,), **CUDA_TINY),
    "estimate isolated": lambda: memcalc.estimate("mlp", (32,), isolate=True, **TINY),
    "check that fits": lambda: memcalc.check("mlp", (32,), batch_size=2, **CUDA_TINY),
    "check that does not fit": _expecting(memcalc.MemoryBudgetError, lambda: memcalc.check(
        "mlp", (32,), batch_size=2, gpu_memory_bytes=1 << 20, **TINY | {"device": "cuda"})),
    "plan": lambda: memcalc.plan("mlp", (32,), gpu="T4", gpus=2, max_gpus=2,
                                 model_args=TINY["model_args"]),
    "bad input": _expecting(MemcalcError, lambda: memcalc.estimate("mlp", (32,),
                                                                  batch_size=0, **TINY)),
    "untraceable model": lambda: memcalc.estimate("tests.fixtures.hostile:forward_raises",
                                                  (8,), device="cpu", batch_size=2),
    "a model object": lambda: memcalc.estimate(MODEL, (32,), device="cpu", batch_size=4),
    "a factory returning the caller's model": lambda: memcalc.estimate(
        lambda: MODEL, (32,), device="cpu", batch_size=4),
    "inside no_grad": lambda: _within(torch.no_grad()),
    "inside inference_mode": lambda: _within(torch.inference_mode()),
    "inside autocast": lambda: _within(torch.autocast("cpu", dtype=torch.bfloat16)),
    "inside torch.device('meta')": lambda: _within(torch.device("meta")),
    "two threads at once": _in_threads,
    "inside an asyncio loop": _in_event_loop,
    "notebook display": _notebook_display,
    "plot": lambda: _plot(),
    "feed check and worker measurement": _feed_check,
}
MODEL = _user_model()


def _within(context):
    with context:
        memcalc.estimate("mlp", (32,), **TINY)


KNOWN: dict[str, set[str]] = {}
"""Differences not removed yet (none)."""


@pytest.mark.parametrize("call", list(CALLS))
def test_a_public_call_leaves_the_process_as_it_found_it(call):
    CALLS["estimate"]()              # torch's lazy imports and caches, once; the plan also
    memcalc.estimate("mlp", (32,), compile=True, **TINY)   # traces compiled: AOTAutograd's
    model_before = _model_hash(MODEL)
    before = snapshot()
    CALLS[call]()
    after = snapshot()
    differences = _differences(before, after)
    if "fds" in differences:           # what the call let go of, collected
        gc.collect()
        time.sleep(0.5)
        differences = _differences(before, {**after, "fds": _files("/proc/self/fd")})
    assert set(differences) <= KNOWN.get(call, set()), differences
    assert _model_hash(MODEL) == model_before
    assert all(p.device.type == "cpu" for p in MODEL.parameters())


FRESH = """
import os, sys, warnings
import torch
environment, filters, path = dict(os.environ), list(warnings.filters), list(sys.path)
import memcalc
memcalc.estimate("mlp", (32,), model_args=dict(in_features=32, hidden=32, depth=1),
                 device="cpu")
changed = {k for k in set(os.environ) | set(environment) if os.environ.get(k) != environment.get(k)}
added = [f for f in warnings.filters if f not in filters]
print(sorted(changed), len(added), sys.path == path)
"""


def test_the_first_import_and_call_in_a_fresh_process_leave_env_and_warnings_alone():
    """torch's lazily imported modules set ``TORCHINDUCTOR_CACHE_DIR`` and a sympy warnings
    filter during a first trace: both are taken back."""
    import subprocess

    run = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == "[] 0 True"


def sockets_on_ports(ports: set[int]) -> set[str]:
    """The open-file names (``socket:[inode]``) of TCP sockets bound to one of ``ports``: a
    kernel's connections to its client. The client makes a new one whenever a heartbeat goes
    unanswered for a second (a frozen or starved kernel), which is the kernel's business."""
    names = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as rows:
                for row in list(rows)[1:]:
                    fields = row.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) in ports:
                        names.add(f"socket:[{fields[9]}]")
        except OSError:
            pass
    return names


def test_sockets_on_ports_names_a_listening_socket_by_its_port_only():
    import socket

    with socket.socket() as listening, socket.socket() as other:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        other.bind(("127.0.0.1", 0))
        name = os.readlink(f"/proc/self/fd/{listening.fileno()}")
        assert name in sockets_on_ports({listening.getsockname()[1]})
        assert name not in sockets_on_ports({other.getsockname()[1]})


KERNEL_SETTLE_TRIES = 20
"""Snapshots 0.1 s apart before a kernel counts as changed: an open file of the kernel's own
threads (sending a cell's output) closes by itself, a leaked one stays."""


KERNEL_CELLS = [
    "%matplotlib inline",
    "import sys, memcalc\n"
    "from tests.test_hygiene import KERNEL_SETTLE_TRIES, TINY, snapshot, _differences,"
    " sockets_on_ports\n"
    "memcalc.plot(memcalc.estimate('mlp', (32,), **TINY))   # torch's lazy imports, once",
    "import matplotlib, IPython\n"
    "from ipykernel.connect import get_connection_info\n"
    "shell = IPython.get_ipython()\n"
    "ports = {value for key, value in get_connection_info(unpack=True).items()"
    " if key.endswith('_port')}\n"
    "def kernel_state():\n"
    "    state = snapshot()\n"
    "    own = sockets_on_ports(ports)   # the client's connections, remade when it likes\n"
    "    state['fds'] = frozenset(fd for fd in state['fds'] if fd[1] not in own)\n"
    "    return {**state, 'backend': matplotlib.get_backend(),\n"
    "            'displayhook': sys.displayhook, 'excepthook': sys.excepthook,\n"
    "            'formatters': dict(shell.display_formatter.formatters['text/html'].type_printers),\n"
    "            'user names': sorted(name for name in shell.user_ns if not name.startswith('_'))}\n"
    "before = kernel_state()",
    "report = memcalc.estimate('mlp', (32,), batch_size=2, gpu='T4', model_args=TINY['model_args'])\n"
    "report",
    "memcalc.plot(report)",
    "memcalc.plan('mlp', (32,), gpu='T4', gpus=2, max_gpus=2, model_args=TINY['model_args'])",
    "memcalc.check('mlp', (32,), batch_size=2, gpu='T4', model_args=TINY['model_args'])",
    "import time\n"
    "def kernel_changes():\n"
    "    after = kernel_state()\n"
    "    changed = _differences(before, after)\n"
    "    changed.pop('user names', None)   # report, the cells' own names\n"
    "    added = set(after['formatters']) - set(before['formatters'])\n"
    "    if all(kind.__module__.startswith('memcalc.') for kind in added)"
    " and before['formatters'].items() <= after['formatters'].items():\n"
    "        changed.pop('formatters', None)   # displaying a plan registers its renderer\n"
    "    return changed\n"
    "for _ in range(KERNEL_SETTLE_TRIES):   # the kernel's own threads sending the cells' output\n"
    "    changed = kernel_changes()\n"
    "    if not changed:\n"
    "        break\n"
    "    time.sleep(0.1)\n"
    "if 'fds' in changed:   # only what was opened, not the whole listing\n"
    "    changed['fds'] = sorted(changed['fds'][1] - changed['fds'][0])\n"
    "print('KERNEL DIFFERENCES', sorted(changed), changed)",
]


@pytest.mark.slow
def test_a_notebook_kernel_is_left_as_it_was():
    """Estimate, display, plot, plan and check in a real IPython kernel (ipykernel through
    nbclient), the inline backend on: the kernel's backend, display and exception hooks and
    everything ``snapshot`` holds are as before; the first display may register memcalc's HTML
    formatters, which is what displaying asks for. A first plot comes before the snapshot:
    showing its PNG starts pyzmq's garbage-collector thread (large messages are sent without
    a copy) and matplotlib's font cache, the kernel's and matplotlib's own for any figure.
    The kernel's TCP connections to its client are left out of its open files: on a starved
    machine a missed heartbeat makes the client connect anew (CI saw one new socket)."""
    import nbformat
    from nbclient import NotebookClient

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)
                                               for source in KERNEL_CELLS])
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": root}}).execute()
    printed = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
    assert "KERNEL DIFFERENCES [] {}" in printed, printed
    shown = notebook.cells[3].outputs[0]["data"]
    assert "text/html" in shown
    assert any("image/png" in output.get("data", {}) for output in notebook.cells[4].outputs)
